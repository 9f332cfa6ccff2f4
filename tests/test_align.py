"""Pairing records of two runs when one makes an extra call: with gradient accumulation, an extra
cast inside each micro-batch's forward must not pair the baseline's second micro-batch with the
candidate's first (real dumps of a real training loop, compared through the CLI's code)."""
from __future__ import annotations

import torch

import compare_support as cs
from compare_support import assert_first
from precdbg.compare import compare_dumps
from precdbg_pt import PrecisionDebugger


class _Net(torch.nn.Module):
    def __init__(self, extra_cast: bool) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(8, 8)
        self.head = torch.nn.Linear(8, 4)
        self.extra_cast = extra_cast

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.fc(x)).float()
        if self.extra_cast:                  # a port's extra cast: changes no number
            h = h.float()
        return self.head(h)


def _dump(path: str, extra_cast: bool) -> None:
    torch.manual_seed(0)
    net = _Net(extra_cast)
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    gen = torch.Generator().manual_seed(1)
    micro = [(torch.randn(4, 8, generator=gen), torch.randint(0, 4, (4,), generator=gen))
             for _ in range(2)]
    debugger = PrecisionDebugger(dump_path=path, level="mix")
    debugger.start(net)
    for x, y in micro:                       # two micro-batches, one optimizer step
        loss = torch.nn.functional.cross_entropy(net(x), y) / len(micro)
        loss.backward()
    opt.step()
    opt.zero_grad()
    debugger.stop()
    debugger.step()
    assert debugger.close() and not debugger.failures


def test_extra_call_per_micro_batch_pairs_within_each_module_call(tmp_path):
    _dump(str(tmp_path / "a"), extra_cast=False)
    _dump(str(tmp_path / "b"), extra_cast=True)
    result = compare_dumps(str(tmp_path / "a"), str(tmp_path / "b"))
    # `.float()` of a float32 tensor hands the tensor itself back: nothing reads a result of
    # its own, so it is no structural difference either (precdbg.compare.judge.structure)
    assert result["verdict"] == "match", result["first_divergence"]
    # nothing differs: the second micro-batch's casts pair with each other, never with
    # the first micro-batch's extra cast
    beyond = [r for r in result["rows"] if r["status"] != "match"]
    assert not beyond, beyond[:3]
    unmatched = result["unmatched"]
    assert unmatched and all(u["side"] == "b" and ".float." in u["name"] for u in unmatched), \
        unmatched
    assert {u["name"] for u in unmatched} == {"Tensor.float.1.forward", "Tensor.float.3.forward"}


def _albert(path: str, scale_call: int = 0) -> None:
    """transformers' ALBERT (random init, offline): one layer's weights shared by all six
    layers, so one module path is called six times per forward. `scale_call` > 0: a forward
    hook scales that call's output by 1.001 (a call-specific defect)."""
    from transformers import AlbertConfig, AlbertForMaskedLM
    torch.manual_seed(0)
    config = AlbertConfig(vocab_size=128, embedding_size=32, hidden_size=64, num_hidden_layers=6,
                          num_attention_heads=4, intermediate_size=128,
                          max_position_embeddings=64, hidden_dropout_prob=0.0,
                          attention_probs_dropout_prob=0.0)
    model = AlbertForMaskedLM(config)
    shared = model.albert.encoder.albert_layer_groups[0].albert_layers[0]
    calls = [0]

    def scale(module, args, output):
        calls[0] += 1
        if calls[0] == scale_call:
            return (output[0] * 1.001,) + tuple(output[1:]) if isinstance(output, tuple) \
                else output * 1.001
        return None
    shared.register_forward_hook(scale)
    ids = torch.randint(0, 128, (2, 16), generator=torch.Generator().manual_seed(1))
    debugger = PrecisionDebugger(dump_path=path, level="mix")
    debugger.start(model)
    model(input_ids=ids, labels=ids).loss.backward()
    debugger.stop()
    debugger.step()
    assert debugger.close() and not debugger.failures


SHARED = "albert.encoder.albert_layer_groups.0.albert_layers.0"


def test_a_shared_layer_is_named_at_the_call_that_differs(tmp_path):
    """The six calls of one module path are compared call by call: the fourth call, whose
    output alone is scaled, is named, not the first."""
    _albert(str(tmp_path / "a"))
    _albert(str(tmp_path / "b"), scale_call=4)
    result = compare_dumps(str(tmp_path / "a"), str(tmp_path / "b"))
    first = assert_first(result, step=0, direction="forward", kind="module", module=SHARED,
                         code="structure", annotations=["numbers_differ"])
    assert first["name_a"] == f"Module.{SHARED}.AlbertLayer.forward.3", first["name_a"]


class _Rotary(torch.nn.Module):
    """Rotary embedding's `cat` (rotate_half), and in the candidate a KV cache's `cat` made
    after it (an empty past: the same numbers), whose backward runs before the rotary `cat`'s:
    what HF's Llama does without gradient checkpointing and not with it."""

    def __init__(self, cache: bool) -> None:
        super().__init__()
        self.q = torch.nn.Linear(8, 8)
        self.v = torch.nn.Linear(8, 8)
        self.cache = cache

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q = self.q(x)
        rotated = torch.cat((-q[..., 4:], q[..., :4]), dim=-1)
        v = self.v(x)
        if self.cache:
            v = torch.cat((v.new_zeros(0, 8), v), dim=0)
        return rotated * v


def test_backward_of_a_call_pairs_with_the_backward_of_its_forward_counterpart(tmp_path):
    """The dy and dx of an API call pair with those of the call its forward paired with, not
    with the k-th backward record of the same op in the module: the cache's extra `cat` runs
    first in backward, and pairing by occurrence set the rotary `cat`'s gradients against the
    cache's (relative error ~1 on identical runs)."""
    for name, cache in (("a", False), ("b", True)):
        torch.manual_seed(0)
        net = _Rotary(cache)
        debugger = PrecisionDebugger(dump_path=str(tmp_path / name), level="mix")
        debugger.start(net)
        net(torch.randn(4, 8, generator=torch.Generator().manual_seed(1))).square().sum() \
            .backward()
        debugger.stop()
        debugger.step()
        assert debugger.close() and not debugger.failures
    result = compare_dumps(str(tmp_path / "a"), str(tmp_path / "b"))
    cats = [r for r in result["rows"] if r["op"] == "cat"]
    assert {r["role"] for r in cats} >= {"input", "output", "grad_output", "grad_input"}
    assert all(r["name_a"].startswith("Torch.cat.0.") and r["name_b"].startswith("Torch.cat.0.")
               for r in cats), [(r["name_a"], r["name_b"], r["role"]) for r in cats]
    beyond = [(r["name_a"], r["name_b"], r["role"]) for r in result["rows"]
              if r["status"] != "match"]
    assert not beyond, beyond
    assert {u["name"] for u in result["unmatched"]} >= {"Torch.cat.1.forward",
                                                         "Torch.cat.1.backward"}


class _Attention(torch.nn.Module):
    """A self-attention that, with `cache` on, does what transformers models do when
    `use_cache` is on and gradient checkpointing has not turned it off: joins its keys and
    values to an empty cache and counts cache positions. Both change no number."""

    def __init__(self, cache: bool) -> None:
        super().__init__()
        self.qkv = torch.nn.Linear(8, 24)
        self.cache = cache

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        if self.cache:
            empty = x.new_zeros((x.shape[0], 0, 8))
            k, v = torch.cat([empty, k], dim=1), torch.cat([empty, v], dim=1)
            positions = torch.arange(x.shape[1]) + torch.zeros((), dtype=torch.long)
            positions.ne(-1).cumsum(0)                 # a cache position nobody reads
        return torch.softmax(q @ k.transpose(1, 2), dim=-1) @ v


def _attention_dump(path: str, cache: bool) -> None:
    torch.manual_seed(0)
    net = _Attention(cache)
    x = torch.randn(2, 5, 8, generator=torch.Generator().manual_seed(1))
    debugger = PrecisionDebugger(dump_path=path, level="mix")
    debugger.start(net)
    net(x).pow(2).mean().backward()
    debugger.stop()
    debugger.step()
    assert debugger.close() and not debugger.failures


def test_calls_that_change_no_number_are_no_structural_difference(tmp_path):
    """Joins with an empty cache, integer position arithmetic and results nothing reads are
    left out of a module's call sequence; the calls that compute stay compared."""
    _attention_dump(str(tmp_path / "plain"), cache=False)
    _attention_dump(str(tmp_path / "cache"), cache=True)
    result = compare_dumps(str(tmp_path / "plain"), str(tmp_path / "cache"))
    assert result["verdict"] == "match", result["first_divergence"]
    assert result["unmatched"]                        # the extra calls, listed, nothing more
    assert not [r for r in result["rows"] if r["status"] != "match"]


class _Scores(torch.nn.Module):
    """Scores computed in `upcast` and cast back, as transformers' attention does."""
    def __init__(self, upcast: torch.dtype) -> None:
        super().__init__()
        self.q = torch.nn.Linear(8, 8)
        self.v = torch.nn.Linear(8, 8)
        self.head = torch.nn.Linear(8, 4)
        self.upcast = upcast

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, v = self.q(x), self.v(x)
        return self.head(torch.softmax(q.to(self.upcast), dim=-1).type(v.dtype) * v)


def _scores_dump(path: str, upcast: torch.dtype) -> None:
    torch.manual_seed(0)
    net = _Scores(upcast)
    x, y = torch.randn(6, 8), torch.randint(0, 4, (6,))
    debugger = PrecisionDebugger(dump_path=path, level="mix")
    debugger.start(net)
    torch.nn.functional.cross_entropy(net(x), y).backward()
    debugger.stop()
    debugger.step()
    assert debugger.close() and not debugger.failures


def _gpt2_dump(path: str, autocast: bool = False, recompute: bool = False) -> None:
    """transformers' GPT-2 (random init, offline, eager attention) trained one step, under
    bf16 autocast or not: its attention's `.type(value.dtype)` and its loss's `.float()` of
    the logits convert under autocast and return their input in float32. `recompute`:
    gradient checkpointing (non-reentrant), which turns the KV cache off."""
    from transformers import GPT2Config, GPT2LMHeadModel
    torch.manual_seed(0)
    config = GPT2Config(vocab_size=128, n_positions=32, n_embd=64, n_layer=2, n_head=4,
                        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    config._attn_implementation = "eager"
    model = GPT2LMHeadModel(config)
    if recompute:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    ids = torch.randint(0, 128, (2, 16), generator=torch.Generator().manual_seed(1))
    debugger = PrecisionDebugger(dump_path=path, level="mix")
    debugger.start(model)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    opt.zero_grad()
    debugger.stop()
    debugger.step()
    assert debugger.close() and not debugger.failures


def test_casts_that_are_no_ops_in_one_run_are_no_structural_difference(tmp_path):
    """Under bf16 autocast GPT-2's `.type(value.dtype)` and `.float()` convert; in float32
    they return their input (left out as calls nothing new reads). Its modules' calls then
    differ in casts alone: no structural difference, and the setup check names the dtypes."""
    _gpt2_dump(str(tmp_path / "fp32"), autocast=False)
    _gpt2_dump(str(tmp_path / "bf16"), autocast=True)
    result = compare_dumps(str(tmp_path / "fp32"), str(tmp_path / "bf16"))
    assert any(f["kind"] == "compute_dtype" for f in result["setup"]), result["setup"]
    # no module is named for its calls (whether every bf16 gradient stays within the bf16
    # tolerance of its float32 counterpart is the numbers' matter: README, known limits)
    first = result["first_divergence"]
    assert first is None or not (first["kind"] == "module" and first["code"] == "structure"), \
        first


def test_a_cast_to_another_dtype_at_the_same_place_is_still_named(tmp_path):
    """Both runs cast at the same place, to float64 and to bfloat16: the casts pair, and the
    cast whose dtype argument differs is the culprit."""
    _scores_dump(str(tmp_path / "f64"), upcast=torch.float64)
    _scores_dump(str(tmp_path / "bf16"), upcast=torch.bfloat16)
    result = compare_dumps(str(tmp_path / "f64"), str(tmp_path / "bf16"))
    assert_first(result, step=0, direction="forward", kind="api", module="", op="cast",
                 code="argument")


def test_masks_and_positions_built_another_way_are_no_divergence(tmp_path):
    """Gradient checkpointing turns GPT-2's KV cache off (use_cache): its causal mask and
    positions are built by other integer calls, which pair by order with the plain run's and
    differ. Every floating-point record agrees, so those integer records are no divergence
    (status 'integer', said in a note): the runs match."""
    _gpt2_dump(str(tmp_path / "plain"))
    _gpt2_dump(str(tmp_path / "recompute"), recompute=True)
    result = compare_dumps(str(tmp_path / "plain"), str(tmp_path / "recompute"))
    assert result["verdict"] == "match", result["first_divergence"]
    integer = [r for r in result["rows"] if r["status"] == "integer"]
    assert integer and {r["dtype_a"] for r in integer} <= {"int64", "bool"}, integer[:3]
    assert "integer_plumbing" in cs.note_codes(result), result["notes"]


class _Softmax(torch.nn.Module):
    """Attention-like weights; `bf16`: the softmax computed in bfloat16 through two casts that
    only this run makes (a port's change), then `.to(x.dtype)` as HF eager attention does."""
    def __init__(self, bf16: bool) -> None:
        super().__init__()
        self.q = torch.nn.Linear(8, 4)
        self.bf16 = bf16

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = self.q(x)
        if self.bf16:
            p = torch.softmax(w.to(torch.bfloat16), dim=-1).to(torch.float32)
        else:
            p = torch.softmax(w, dim=-1)
        return p.to(x.dtype) @ x


def test_casts_only_one_run_makes_stay_a_structural_difference(tmp_path):
    """Casts one run makes where the other has none at all (not a no-op of the same line) are
    that run's own calls: the module is named for its calls, not a cast paired by position."""
    for name, bf16 in (("fp32", False), ("bf16", True)):
        torch.manual_seed(0)
        net = _Softmax(bf16)
        debugger = PrecisionDebugger(dump_path=str(tmp_path / name), level="mix")
        debugger.start(net)
        net(torch.randn(2, 4, 8, generator=torch.Generator().manual_seed(1))).sum().backward()
        debugger.stop()
        debugger.step()
        assert debugger.close() and not debugger.failures
    result = compare_dumps(str(tmp_path / "fp32"), str(tmp_path / "bf16"))
    assert_first(result, step=0, direction="forward", kind="module", module="",
                 code="structure")


class _RoundedScores(torch.nn.Module):
    """Attention-like probabilities handed on in bf16; `rounded`: the scores are put through
    bf16 first (a port's slip), two more casts of the same shape and dtypes before it."""

    def __init__(self, rounded: bool) -> None:
        super().__init__()
        self.q = torch.nn.Linear(8, 8)
        self.rounded = rounded

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = self.q(x)
        if self.rounded:
            w = w.to(torch.bfloat16).to(torch.float32)
        return torch.softmax(w, dim=-1).to(torch.bfloat16)


def test_a_cast_pairs_with_the_cast_of_its_inputs_counterpart(tmp_path):
    """Casts pair by what they convert (the paired producer of their input), not k-th in
    their module: the baseline's cast of the softmax output paired with the candidate's cast
    of the scores (same shape and dtypes), and that pair reported an error of the scores
    against the probabilities."""
    for name, rounded in (("plain", False), ("rounded", True)):
        torch.manual_seed(0)
        net = _RoundedScores(rounded)
        debugger = PrecisionDebugger(dump_path=str(tmp_path / name), level="mix")
        debugger.start(net)
        net(torch.randn(2, 4, 8, generator=torch.Generator().manual_seed(1))).float().sum() \
            .backward()
        debugger.stop()
        debugger.step()
        assert debugger.close() and not debugger.failures
    result = compare_dumps(str(tmp_path / "plain"), str(tmp_path / "rounded"))
    casts = {(r["name_a"], r["name_b"]) for r in result["rows"]
             if r["name_a"].startswith("Tensor.to.") and r["direction"] == "forward"}
    assert casts == {("Tensor.to.0.forward", "Tensor.to.2.forward")}, casts
    assert {u["name"] for u in result["unmatched"] if u["side"] == "b"} >= \
        {"Tensor.to.0.forward", "Tensor.to.1.forward"}, result["unmatched"]
    assert_first(result, step=0, direction="forward", kind="module", module="",
                 code="structure")
