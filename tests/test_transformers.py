"""Tiny randomly initialised Hugging Face models (GPT-2, Llama, a Mixtral mixture of experts;
built offline from configs), one training step dumped at level mix: no failures, module paths,
dw, and unchanged numerics."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import precdbg
from precdbg_pt import PrecisionDebugger

from conftest import assert_rel
from torch_support import norm64

transformers = pytest.importorskip("transformers")


def _gpt2():
    config = transformers.GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=128,
                                     n_positions=32, resid_pdrop=0.0, embd_pdrop=0.0,
                                     attn_pdrop=0.0)
    return transformers.GPT2LMHeadModel(config)


def _llama():
    config = transformers.LlamaConfig(hidden_size=64, intermediate_size=128,
                                      num_hidden_layers=2, num_attention_heads=4,
                                      num_key_value_heads=2, vocab_size=128,
                                      max_position_embeddings=64)
    return transformers.LlamaForCausalLM(config)


def _mixtral():
    """A mixture of experts: a router's top-k, experts fed by index selection and weighted
    scatter-adds, expert weights as fused 3-D parameters."""
    config = transformers.MixtralConfig(hidden_size=64, intermediate_size=128,
                                        num_hidden_layers=2, num_attention_heads=4,
                                        num_key_value_heads=2, num_local_experts=4,
                                        num_experts_per_tok=2, vocab_size=128,
                                        max_position_embeddings=64)
    return transformers.MixtralForCausalLM(config)


MODELS = {
    "gpt2": (_gpt2, ["transformer.h.0.attn", "transformer.h.1.mlp", "transformer.ln_f"],
             "transformer.h.0.attn.c_attn"),
    "llama": (_llama, ["model.layers.0.self_attn", "model.layers.1.mlp", "model.norm"],
              "model.layers.0.self_attn.q_proj"),
    "mixtral": (_mixtral, ["model.layers.0.self_attn", "model.layers.1.mlp",
                           "model.layers.1.mlp.experts", "model.norm"],
                "model.layers.0.self_attn.q_proj"),
}


def _build(name):
    torch.manual_seed(0)
    model = MODELS[name][0]()
    model.train()
    return model


def _train(model, dbg=None, steps=2, keep_grads=False):
    """`steps` AdamW steps on fixed random tokens; returns losses (and the first step's grads)."""
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(0, 128, (2, 16), generator=gen)
    losses, grads = [], None
    for step in range(steps):
        if dbg is not None:
            dbg.start(model)
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        if dbg is not None:
            dbg.stop()
        if step == 0 and keep_grads:
            grads = {n: p.grad.detach().clone() for n, p in model.named_parameters()
                     if p.grad is not None}
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.detach())
        if dbg is not None:
            dbg.step()
    return losses, grads


@pytest.fixture(scope="module", params=sorted(MODELS))
def hf_run(request, tmp_path_factory):
    name = request.param
    path = str(tmp_path_factory.mktemp(name))
    reference = _build(name)
    ref_losses, _ = _train(reference)
    model = _build(name)
    dbg = PrecisionDebugger(dump_path=path, level="mix", step=[0])
    losses, grads = _train(model, dbg, keep_grads=True)
    assert dbg.close()
    return dict(name=name, dump=precdbg.open_dump(path), dbg=dbg, model=model,
                reference=reference, losses=losses, ref_losses=ref_losses, grads=grads)


def test_no_failures(hf_run):
    assert hf_run["dbg"].failures == 0
    assert hf_run["dump"].steps == [0]


def test_module_paths(hf_run):
    t = hf_run["dump"].records(step=0)
    paths, linear_owner = MODELS[hf_run["name"]][1:]
    modules = set(np.unique(t["module"]))
    for path in paths:
        assert path in modules, path
        cls = type(hf_run["model"].get_submodule(path)).__name__
        entry = f"Module.{path}.{cls}.forward.0"
        assert np.any(t["entry"] == entry), entry
        assert np.any(t["entry"] == f"Module.{path}.{cls}.backward.0"), entry
    api = t.select((t["kind"] == "api") & (t["module"] == linear_owner))
    assert len(api) > 0
    assert set(np.unique(api["direction"])) == {"forward", "backward"}


def test_dw_for_every_trainable_parameter(hf_run):
    t = hf_run["dump"].records(step=0)
    dw = t.select(t["kind"] == "param_grad")
    names = list(dw["api"])
    for name, grad in hf_run["grads"].items():
        assert names.count(name) == 1, name
        i = names.index(name)
        assert_rel(float(dw["norm"][i]), norm64(grad), 1e-6, name)
    trainable = {n for n, p in hf_run["model"].named_parameters() if p.requires_grad}
    assert trainable <= set(names)


def test_inventory_matches_the_model(hf_run):
    t = hf_run["dump"].records(step=0)
    inv = t.select((t["kind"] == "param") & (t["role"] == "param"))
    assert set(hf_run["model"].state_dict().keys()) >= set(inv["api"])
    assert {n for n, _ in hf_run["model"].named_parameters()} <= set(inv["api"])


def test_numerics_unchanged(hf_run):
    assert [float(l) for l in hf_run["losses"]] == [float(l) for l in hf_run["ref_losses"]]
    for (name, a), (_, b) in zip(hf_run["model"].named_parameters(),
                                 hf_run["reference"].named_parameters()):
        assert torch.equal(a, b), name


def test_model_prefixed_layer_classes_read_as_their_layer(tmp_path):
    """A model's own class for a standard layer (Qwen2RMSNorm, MistralRMSNorm, SiLUActivation)
    is that layer: its op is `rms_norm` / `silu`, and its settings are read, so `check` names
    an RMSNorm epsilon changed in one layer of a Qwen2 (nothing was read of it before). A
    suffix alone names nothing else (LlamaRotaryEmbedding is no embedding lookup)."""
    from precdbg.check import check_dumps
    from precdbg.records.naming import canonical_op

    assert {canonical_op(c) for c in ("Qwen2RMSNorm", "MistralRMSNorm", "MixedFusedRMSNorm",
                                      "LlamaRMSNorm", "MT5LayerNorm")} == {"rms_norm"}
    assert canonical_op("SiLUActivation") == "silu"
    assert canonical_op("LlamaRotaryEmbedding") == "llama_rotary_embedding"
    assert canonical_op("LinearActivation") == "linear_activation"
    config = transformers.Qwen2Config(hidden_size=64, intermediate_size=128,
                                      num_hidden_layers=2, num_attention_heads=4,
                                      num_key_value_heads=2, vocab_size=128,
                                      max_position_embeddings=64)
    for name, eps in (("a", None), ("b", 1e-2)):
        torch.manual_seed(0)
        model = transformers.Qwen2ForCausalLM(config)
        if eps is not None:
            model.model.layers[1].input_layernorm.variance_epsilon = eps
        dbg = PrecisionDebugger(dump_path=str(tmp_path / name), level="mix", step=[0])
        _train(model, dbg, steps=1)
        assert dbg.close() and not dbg.failures
    dump = precdbg.open_dump(str(tmp_path / "a"))
    settings = dump.module_settings(0)
    cls, norm = settings["model.layers.1.input_layernorm"]
    assert cls == "Qwen2RMSNorm" and norm == {"eps": pytest.approx(1e-6)}, (cls, norm)
    findings = [f for f in check_dumps(str(tmp_path / "a"), str(tmp_path / "b"))["findings"]
                if f["kind"] == "layer_settings"]
    assert len(findings) == 1, findings
    assert "model.layers.1.input_layernorm: eps 1e-06 vs 0.01" in findings[0]["message"]
