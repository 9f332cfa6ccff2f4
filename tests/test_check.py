"""`precdbg check A B`: set-up differences between two real runs, and `precdbg compare` reporting
them under "setup".

Every dump trains one step of the tiny GPT (GPTConfig(n_layer=2, d_model=64, n_head=4, seq_len=16,
vocab_size=128), batch 4, AdamW lr 1e-2 with a weight-decay group of the >=2-d weights) at level
"mix", saving its batch with `debugger.save("batch", {"x": x})`. The dumps are made in
subprocesses (seed_all and deterministic mode are process-wide; environments must differ), all
started at once by one session fixture. Run as a script this file makes one group of dumps:

    python tests/test_check.py {torch-variants|torch-unseeded|torch-env|mindspore} OUT
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any, Dict, List

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PYTHON = sys.executable
THIS = os.path.abspath(__file__)

TINY = dict(n_layer=2, d_model=64, n_head=4, seq_len=16, vocab_size=128)
BATCH = 4
SEED = 0
LR = 1e-2
TOKEN = "ghp_1234567890abcdefABCDEF123456"
AWS_SECRET = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"
# the variants of torch-variants: keyword arguments of _dump_torch
VARIANTS: Dict[str, Dict[str, Any]] = {
    "base": {}, "same": {}, "lr": {"lr": 2 * LR},
    "wd": {"move_to_decay": ["blocks.0.ln_1.weight"]},
    "frozen": {"frozen": ["blocks.1.mlp.fc.bias"]},
    "weight": {"perturb": True}, "data": {"data": True}, "eps": {"ln_eps": 1e-3},
    "bf16": {"autocast": True},
}


# --------------------------------------------------------------------------- dumping (subprocess)
def _decay_groups(named: List[Any], move_to_decay: List[str]) -> List[Dict[str, Any]]:
    decay = [p for n, p in named if p.ndim >= 2 or n in move_to_decay]
    rest = [p for n, p in named if not (p.ndim >= 2 or n in move_to_decay)]
    return [{"params": decay, "weight_decay": 0.1}, {"params": rest, "weight_decay": 0.0}]


def _torch_batch():
    from precdbg_examples.gpt_torch import GPTConfig, make_batches
    return next(make_batches(GPTConfig(**TINY), BATCH, 1, seed=SEED))


def _dump_torch(path: str, lr: float = LR, move_to_decay=(), frozen=(), perturb: bool = False,
                data: bool = False, ln_eps: Any = None, autocast: bool = False) -> None:
    import torch
    import precdbg_pt
    from precdbg_examples.gpt_torch import GPT, GPTConfig, train_step
    torch.manual_seed(SEED)
    model = GPT(GPTConfig(**TINY))
    if perturb:
        with torch.no_grad():
            model.blocks[1].mlp.fc.weight[3, 5] += 0.05
    for name in frozen:
        model.get_parameter(name).requires_grad_(False)
    if ln_eps is not None:
        model.blocks[0].ln_2.eps = ln_eps
    opt = torch.optim.AdamW(_decay_groups(list(model.named_parameters()), list(move_to_decay)),
                            lr=lr)
    x, y = _torch_batch()
    if data:
        x = x.clone()
        x[0, 3] = (x[0, 3] + 1) % TINY["vocab_size"]
    dbg = precdbg_pt.PrecisionDebugger(dump_path=path, level="mix")
    dbg.start(model)
    dbg.save("batch", {"x": x})
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        train_step(model, opt, x, y)
    dbg.stop()
    dbg.step()
    assert dbg.close()


def _dump_mindspore(path: str, defaults: bool = True) -> None:
    """MindSpore twin of `base` with MindSpore's own choices: nn.GELU() (approximate=True by
    default) and nn.LayerNorm (epsilon=1e-7 by default) everywhere, AdamWeightDecay at twice the
    learning rate, blocks.0.ln_1.gamma in the decay group. Without `defaults` the layers are
    the twin's own (GELU(approximate=False), LayerNorm(epsilon=1e-5))."""
    import numpy as np
    import torch
    import mindspore as ms
    ms.set_device("CPU")
    ms.set_context(mode=ms.PYNATIVE_MODE)
    ms.runtime.launch_blocking()
    from mindspore import nn
    import precdbg_ms
    from precdbg_examples import gpt_ms
    from precdbg_examples.gpt_torch import GPT, GPTConfig
    precdbg_ms.seed_all(SEED)
    torch.manual_seed(SEED)
    reference = GPT(GPTConfig(**TINY))
    own_layer_norm = gpt_ms._layer_norm
    if defaults:          # the twin's LayerNorms keep MindSpore's epsilon
        gpt_ms._layer_norm = lambda d: nn.LayerNorm((d,))
    try:
        model = gpt_ms.GPT(gpt_ms.GPTConfig(**TINY))
    finally:
        gpt_ms._layer_norm = own_layer_norm
    if defaults:
        for block in model.blocks:
            block.mlp.act = nn.GELU()
    gpt_ms.load_torch_state(model, {k: v.detach().numpy() for k, v in
                                    reference.state_dict().items()})
    params = model.trainable_params()
    moved = "blocks.0.ln_1.gamma"
    decay = [p for p in params if len(p.shape) >= 2 or p.name == moved]
    rest = [p for p in params if not (len(p.shape) >= 2 or p.name == moved)]
    opt = nn.AdamWeightDecay([{"params": decay, "weight_decay": 0.1},
                              {"params": rest, "weight_decay": 0.0}], learning_rate=2 * LR)
    step = gpt_ms.train_step_fn(model, opt)
    x, y = (t.numpy().astype(np.int32) for t in _torch_batch())
    dbg = precdbg_ms.PrecisionDebugger(dump_path=path, level="mix")
    dbg.start(model)
    dbg.save("batch", {"x": ms.Tensor(x)})
    step(x, y)
    dbg.stop()
    dbg.step()
    assert dbg.close()


def _script(group: str, out: str) -> None:
    if group == "mindspore":
        _dump_mindspore(os.path.join(out, "ms"))
        _dump_mindspore(os.path.join(out, "ms_twin"), defaults=False)
        return
    if group != "torch-unseeded":
        import precdbg_pt
        precdbg_pt.seed_all(SEED)
    if group == "torch-variants":
        for name, kwargs in VARIANTS.items():
            _dump_torch(os.path.join(out, name), **kwargs)
    else:
        _dump_torch(os.path.join(out, group.split("-", 1)[1]))


if __name__ == "__main__":
    _script(sys.argv[1], sys.argv[2])
    sys.exit(0)


# --------------------------------------------------------------------------- tests
import importlib.util  # noqa: E402

import pytest  # noqa: E402

from precdbg.check import check_dumps, semantics  # noqa: E402
from precdbg.check.values import _CONDITIONS  # noqa: E402
from precdbg.compare import compare_dumps  # noqa: E402

_OWN_ENV = ("CUBLAS_WORKSPACE_CONFIG", "HCCL_ALGO", "HCCL_DETERMINISTIC", "PYTHONHASHSEED",
            "AWS_SECRET_ACCESS_KEY")


class _Dumps:
    """Dump groups made by subprocesses started together; `path()` waits for its group."""

    def __init__(self, root: str) -> None:
        self.root = root
        self.procs: Dict[str, subprocess.Popen] = {}
        self.done: Dict[str, str] = {}
        base_env = {k: v for k, v in os.environ.items() if k not in _OWN_ENV}
        groups = {"torch-variants": {}, "torch-unseeded": {},
                  "torch-env": {"CUBLAS_WORKSPACE_CONFIG": ":16:8", "HCCL_ALGO": TOKEN,
                                "AWS_SECRET_ACCESS_KEY": AWS_SECRET}}
        if importlib.util.find_spec("mindspore") is not None:
            groups["mindspore"] = {"GLOG_v": "3"}
        for group, extra in groups.items():
            out = os.path.join(root, group)
            os.makedirs(out)
            log = open(os.path.join(out, "log.txt"), "w")
            self.procs[group] = subprocess.Popen([PYTHON, THIS, group, out], cwd=REPO,
                                                 env={**base_env, **extra}, stdout=log,
                                                 stderr=subprocess.STDOUT)

    def path(self, group: str, name: str) -> str:
        if group not in self.done:
            proc = self.procs[group]
            rc = proc.wait(timeout=300)
            out = os.path.join(self.root, group)
            with open(os.path.join(out, "log.txt")) as log:
                assert rc == 0, f"dump group {group} failed:\n{log.read()[-4000:]}"
            self.done[group] = out
        return os.path.join(self.done[group], name)

    def close(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()


@pytest.fixture(scope="session")
def dumps(tmp_path_factory):
    made = _Dumps(str(tmp_path_factory.mktemp("check")))
    yield made
    made.close()


def _base(dumps: _Dumps) -> str:
    return dumps.path("torch-variants", "base")


def _kinds(result: Dict[str, Any]) -> Dict[str, List[Dict[str, Any]]]:
    out: Dict[str, List[Dict[str, Any]]] = {}
    for f in result["findings"]:
        out.setdefault(f["kind"], []).append(f)
    return out


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([PYTHON, "-m", "precdbg", *args], capture_output=True, text=True,
                          cwd=REPO, timeout=120)


# ------------------------------------------------------------------ the data file
def test_semantics_file_is_well_formed():
    data = semantics()
    ids = [e["id"] for e in data["entries"]]
    assert len(ids) == len(set(ids))
    for entry in data["entries"]:
        assert entry["severity"] in ("high", "medium", "low"), entry["id"]
        text = entry["explanation"]
        assert text and "\n" not in text.strip() and len(text) < 240, entry["id"]
        assert set(entry["applies_when"]) <= _CONDITIONS, entry["id"]
    for needed in ("mindspore-gelu-approximate-default", "layernorm-epsilon-default",
                   "batchnorm-momentum-convention", "dropout-probability-convention",
                   "adamweightdecay-no-bias-correction", "adam-l2-versus-decoupled-weight-decay",
                   "sgd-dampening-versus-momentum", "cross-entropy-defaults",
                   "default-initializers-differ"):
        assert needed in ids
    family = data["optimizer_classes"]["adamw"]
    assert "AdamW" in family["pytorch"] and "AdamWeightDecay" in family["mindspore"]


# ------------------------------------------------------------------ PyTorch - PyTorch
def test_identical_runs_have_no_finding(dumps):
    result = check_dumps(_base(dumps), dumps.path("torch-variants", "same"))
    assert result["findings"] == [], result["findings"]
    proc = _cli("check", _base(dumps), dumps.path("torch-variants", "same"))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "no set-up difference found" in proc.stdout


@pytest.mark.parametrize("variant, kinds, words", [
    ("lr", {"optimizer"}, ["lr differs", "0.01", "0.02", "all 29 parameters"]),
    ("wd", {"optimizer_groups"}, ["weight decay applies to 1 parameter", "B only",
                                  "blocks.0.ln_1.weight"]),
    ("frozen", {"trainable"}, ["trainable in A, frozen in B", "blocks.1.mlp.fc.bias"]),
    ("weight", {"initial_values"}, ["blocks.1.mlp.fc.weight"]),
    ("data", {"batch", "saved"}, ["first batch", "save('batch') differs"]),
    ("bf16", {"compute_dtype"}, ["linear float32 vs bfloat16", "autocast",
                                 "first: linear in module 'blocks.0."]),
])
def test_each_pytorch_difference_is_found_alone(dumps, variant, kinds, words):
    result = check_dumps(_base(dumps), dumps.path("torch-variants", variant))
    found = _kinds(result)
    assert set(found) == kinds, result["findings"]
    assert all(f["severity"] == "high" for f in result["findings"])
    text = " ".join(f["message"] for f in result["findings"])
    for word in words:
        assert word in text, text


def test_missing_seed_all_is_found(dumps):
    result = check_dumps(_base(dumps), dumps.path("torch-unseeded", "unseeded"))
    seed = _kinds(result)["seed"]
    assert any("only in A" in f["message"] and f["severity"] == "medium" for f in seed), seed
    # deterministic mode and the variables seed_all sets are differences too
    assert "determinism" in _kinds(result)
    assert not {"optimizer", "inventory", "initial_values", "batch"} & set(_kinds(result))


def test_environment_difference_is_found_and_secrets_never_written(dumps):
    env_dump = dumps.path("torch-env", "env")
    result = check_dumps(_base(dumps), env_dump)
    env = {f["variable"]: f for f in _kinds(result)["environment"]}
    assert env["CUBLAS_WORKSPACE_CONFIG"]["severity"] == "medium"
    assert "':4096:8'" in env["CUBLAS_WORKSPACE_CONFIG"]["message"]
    assert "':16:8'" in env["CUBLAS_WORKSPACE_CONFIG"]["message"]
    assert "<redacted>" in env["HCCL_ALGO"]["message"]
    assert "AWS_SECRET_ACCESS_KEY" not in env
    with open(os.path.join(env_dump, "run.json"), encoding="utf-8") as handle:
        text = handle.read()
    assert TOKEN not in text and AWS_SECRET not in text and "AWS_SECRET" not in text
    assert json.loads(text)["manifest"]["environment"]["HCCL_ALGO"] == "<redacted>"
    for path in (_base(dumps), dumps.path("torch-variants", "lr")):
        with open(os.path.join(path, "run.json"), encoding="utf-8") as handle:
            assert TOKEN not in handle.read()
    proc = _cli("check", _base(dumps), env_dump)
    assert proc.returncode == 1 and TOKEN not in proc.stdout


def test_ranking_puts_high_first(dumps):
    result = check_dumps(dumps.path("torch-unseeded", "unseeded"),
                         dumps.path("torch-variants", "lr"))
    order = [f["severity"] for f in result["findings"]]
    assert order[0] == "high" and order == sorted(order, key=["high", "medium", "low"].index)


def test_check_cli_json_and_exit_codes(dumps, tmp_path):
    out = tmp_path / "check.json"
    proc = _cli("check", _base(dumps), dumps.path("torch-variants", "wd"), "--json", str(out))
    assert proc.returncode == 1, proc.stderr
    assert proc.stdout.splitlines()[2].startswith("1 set-up difference")
    assert "[high] optimizer_groups:" in proc.stdout
    data = json.loads(out.read_text())
    assert data["findings"][0]["kind"] == "optimizer_groups"
    assert set(data["findings"][0]) >= {"severity", "kind", "message", "a", "b"}
    proc = _cli("check", _base(dumps), str(tmp_path / "missing"))
    assert proc.returncode == 2 and "no such dump" in proc.stderr


# ------------------------------------------------------------------ compare runs the check first
def test_compare_prints_setup_above_verdict_and_saved_items_by_name(dumps, tmp_path):
    out = tmp_path / "compare.json"
    proc = _cli("compare", _base(dumps), dumps.path("torch-variants", "data"), "--json",
                str(out))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    setup = [i for i, line in enumerate(lines) if line.startswith("setup: [high]")]
    verdict = next(i for i, line in enumerate(lines) if line.startswith("verdict:"))
    assert setup and max(setup) < verdict, proc.stdout
    data = json.loads(out.read_text())
    assert {f["kind"] for f in data["setup"]} == {"batch", "saved"}
    assert all(set(f) >= {"severity", "kind", "message", "a", "b"} for f in data["setup"])
    first = data["first_divergence"]
    assert first["kind"] == "saved" and first["name_a"] == "Save.batch.0", first
    # equal saved items match, and no setup line is printed
    result = compare_dumps(_base(dumps), dumps.path("torch-variants", "same"))
    assert result["verdict"] == "match" and result["setup"] == []
    assert any(r["kind"] == "saved" and r["status"] == "match" for r in result["rows"])


# ------------------------------------------------------------------ MindSpore - PyTorch
def test_mindspore_versus_pytorch(dumps):
    pytest.importorskip("mindspore")
    result = check_dumps(_base(dumps), dumps.path("mindspore", "ms"))
    found = _kinds(result)
    # names are mapped (gamma -> weight, embedding_table -> weight): same inventory, same values,
    # the same batch (int64 vs int32 token ids are the same data) and the same saved item
    # (and both compute in float32: MindSpore's dtypes read as PyTorch's)
    assert not {"inventory", "initial_values", "trainable", "batch", "saved",
                "compute_dtype"} & set(found), result["findings"]
    ids = {f.get("id"): f for f in found["semantics"]}
    assert ids["adamweightdecay-no-bias-correction"]["severity"] == "high"
    assert "AdamWeightDecay" in ids["adamweightdecay-no-bias-correction"]["message"]
    # the recorded layer settings differ: each note names the first module instance
    assert "[blocks.0.mlp.act: approximate none vs tanh (+1 more module(s))]" in \
        ids["mindspore-gelu-approximate-default"]["message"]
    assert "[blocks.0.ln_1: eps 1e-05 vs 1e-07 (+4 more module(s))]" in \
        ids["layernorm-epsilon-default"]["message"]
    differing = {(d["path_a"], d["path_b"], d["setting"], d["a"], d["b"])
                 for d in result["layer_settings"]}
    assert ("blocks.0.ln_1", "blocks.0.ln_1", "eps", 1e-05, 1e-07) in differing
    assert ("blocks.1.mlp.act", "blocks.1.mlp.act", "approximate", "none", "tanh") in differing
    assert len(differing) == 7 and "layer_settings" not in found   # all explained by notes
    assert "dropout-probability-convention" not in ids      # p=0 in the PyTorch run
    hyper = {f.get("hyperparameter"): f for f in found["optimizer"]}
    assert set(hyper) == {"lr", "eps"}, found["optimizer"]
    assert "all 29 parameters" in hyper["lr"]["message"] and hyper["lr"]["severity"] == "high"
    assert "class differs" not in " ".join(f["message"] for f in found["optimizer"])
    groups = found["optimizer_groups"]
    assert len(groups) == 1 and groups[0]["names"] == ["blocks.0.ln_1.weight"], groups
    assert not {"seed", "determinism", "device", "environment"} & set(found), result["findings"]


def test_mindspore_twin_with_torch_settings_gets_no_layer_note(dumps):
    """The twin passes approximate=False and epsilon=1e-5: the recorded settings agree, so the
    notes on MindSpore's defaults stay silent (they fired on every twin before)."""
    pytest.importorskip("mindspore")
    result = check_dumps(_base(dumps), dumps.path("mindspore", "ms_twin"))
    ids = {f.get("id") for f in result["findings"]}
    assert not {"mindspore-gelu-approximate-default", "layernorm-epsilon-default",
                "dropout-probability-convention"} & ids, result["findings"]
    assert result["layer_settings"] == [] and "layer_settings" not in _kinds(result)


def test_layer_setting_difference_names_the_module(dumps):
    """Same framework, one LayerNorm built with another eps: no semantics note explains it, the
    check names the module and both values (the numbers alone differ by less than float32
    tolerance in places)."""
    result = check_dumps(_base(dumps), dumps.path("torch-variants", "eps"))
    found = _kinds(result)
    assert set(found) == {"layer_settings"}, result["findings"]
    (finding,) = found["layer_settings"]
    assert finding["message"] == "layer_norm eps differs in 1 module(s): blocks.0.ln_2: eps " \
        "1e-05 vs 0.001", finding
    assert [m["path_a"] for m in finding["modules"]] == ["blocks.0.ln_2"]
    assert result["layer_settings"] == finding["modules"]


# ------------------------------------------------------------------ an unseeded process's seed
_UNSEEDED = r"""
import sys, torch
from precdbg_pt import PrecisionDebugger
weights, out, dropout = sys.argv[1], sys.argv[2], float(sys.argv[3])
middle = torch.nn.Dropout(dropout) if dropout else torch.nn.Identity()
model = torch.nn.Sequential(torch.nn.Linear(4, 8), middle, torch.nn.Linear(8, 1))
model.load_state_dict(torch.load(weights))          # the same weights, no seed set
debugger = PrecisionDebugger(dump_path=out, level="mix")
debugger.start(model)
model(torch.ones(2, 4)).sum().backward()
debugger.stop(); debugger.step()
"""


@pytest.mark.parametrize("dropout", [0.0, 0.5])
def test_a_seed_no_random_op_used_is_a_note_not_a_finding(tmp_path, dropout):
    """Two unseeded runs of the same loaded weights differ in torch's initial seed. Where the
    parameters agree at the start and no random op ran in the step, the seed changes nothing
    there: a note (check exits 0), not a medium finding. With a dropout that draws, it is one."""
    import torch
    torch.manual_seed(0)
    weights = str(tmp_path / "w.pt")
    torch.save(torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Identity(),
                                   torch.nn.Linear(8, 1)).state_dict(), weights)
    for name in ("a", "b"):
        proc = subprocess.run([PYTHON, "-c", _UNSEEDED, weights, str(tmp_path / name),
                               str(dropout)], cwd=REPO, capture_output=True, text=True,
                              timeout=300)
        assert proc.returncode == 0, proc.stderr
    result = check_dumps(str(tmp_path / "a"), str(tmp_path / "b"))
    seed = [f for f in result["findings"] if f["kind"] == "seed"]
    noted = [n for n in result["notes"] if "torch seed differs" in n]
    if dropout:
        assert len(seed) == 1 and seed[0]["severity"] == "medium" and not noted, result
    else:
        assert not seed and len(noted) == 1 and "neither run called a random op" in noted[0]
        assert _cli("check", str(tmp_path / "a"), str(tmp_path / "b")).returncode == 0
