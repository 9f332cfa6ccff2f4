"""precdbg_ms in torch-shim mode: PyTorch code (Hugging Face GPT-2, tiny, random init) running on
MindSpore through mindnlp's `mindtorch`, dumped with the guides' pattern (`dump_step = 1`,
gradients through `value_and_grad`), and compared with a real-torch dump of the same weights and
batches (tests/shim_guide.py; the torch side is the main venv's python).

Runs where mindnlp imports (scripts/test_shim.sh builds that environment: MindSpore 2.7.0,
mindnlp 0.5.1); skipped elsewhere. The twin needs the torch side: PRECDBG_TORCH_PYTHON (a
python with torch and precdbg) and PRECDBG_TORCH_PATH (what it puts first on sys.path: the same
transformers version as the shim side's, whose model code both run).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Dict, List

import pytest

from conftest import beyond_dumping_to

pytest.importorskip("mindspore")
try:
    import importlib.util
    _HAS_MINDNLP = importlib.util.find_spec("mindnlp") is not None
except (ImportError, ValueError):
    _HAS_MINDNLP = False
pytestmark = pytest.mark.skipif(not _HAS_MINDNLP, reason="mindnlp (the torch shim) is not "
                                "installed here; scripts/test_shim.sh builds its environment")

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GUIDE = os.path.join(REPO, "tests", "shim_guide.py")
TORCH_PYTHON = os.environ.get("PRECDBG_TORCH_PYTHON", "")
TORCH_PATH = os.environ.get("PRECDBG_TORCH_PATH", "")
# how the shim side gets its gradients and steps: mindnlp 0.5.1 (PyPI) through value_and_grad and
# the guide's PlainSGD (its `loss.backward()` needs MindSpore's `run_backward`, 2.7.1 on, and its
# SGD has no CPU kernel); `backward` (scripts/test_shim_source.sh: mindnlp's current source on
# MindSpore 2.7.1 and 2.10) through `loss.backward()` and the shim's `torch.optim.SGD`, and the
# torch side then steps with torch.optim.SGD too
SHIM_BACKWARD = os.environ.get("PRECDBG_SHIM_GRADS", "value_and_grad") == "backward"
SHIM_GRADS = (["--grads", "backward", "--optimizer", "sgd"] if SHIM_BACKWARD
              else ["--grads", "value_and_grad"])
TORCH_OPTIMIZER = ["--optimizer", "sgd"] if SHIM_BACKWARD else []


def _run(python: str, args: List[str], extra_path: str = "") -> subprocess.CompletedProcess:
    path = os.pathsep.join(p for p in (extra_path, REPO) if p)
    env = {**os.environ, "GLOG_v": "3", "PYTHONPATH": path}
    return subprocess.run([python, GUIDE, *args], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=900)


def _records(dump: str) -> List[Dict]:
    import precdbg
    return list(precdbg.open_dump(dump).records(0, 0).rows())


@pytest.fixture(scope="module")
def shim_dump(tmp_path_factory) -> Dict[str, str]:
    root = tmp_path_factory.mktemp("shim")
    weights, dump = str(root / "w.npz"), str(root / "shim")
    shim = _run(sys.executable, ["shim", dump, weights, "--level", "module", *SHIM_GRADS])
    assert shim.returncode == 0, shim.stdout + shim.stderr
    return {"root": str(root), "weights": weights, "shim": dump, "stderr": shim.stderr}


def test_the_guides_pattern_dumps_the_shims_modules_under_pytorchs_paths(shim_dump):
    with open(os.path.join(shim_dump["shim"], "run.json"), encoding="utf-8") as handle:
        run = json.load(handle)
    assert run["framework"] == "mindtorch"
    versions = run["manifest"]["versions"]
    assert "mindspore" in versions and "mindtorch" in versions and "torch_api" in versions
    rows = _records(shim_dump["shim"])
    entries = {str(r["entry"]) for r in rows}
    assert "Module.transformer.h.1.mlp.c_proj.Conv1D.forward.0" in entries
    assert "Module.transformer.h.1.mlp.c_proj.Conv1D.backward.0" in entries
    # dw of every parameter, through value_and_grad or loss.backward()
    grads = {str(r["entry"]) for r in rows if r["role"] == "param_grad"}
    params = {str(r["entry"]) for r in rows if r["role"] == "param"}
    assert len(grads) == len(params) > 20
    said = beyond_dumping_to(shim_dump["stderr"])
    assert "precdbg:" not in said.replace("precdbg: wrote", "")


@pytest.mark.skipif(SHIM_BACKWARD, reason="mindnlp 0.5.1 under value_and_grad only")
def test_mindnlp_0_5_1s_zero_position_gradient_is_in_the_dump(shim_dump):
    """mindnlp 0.5.1 leaves GPT-2's `wpe` gradient all zero under value_and_grad (its
    `Tensor.to` cuts the graph): the dump shows it, as the shim computed it."""
    wpe = [r for r in _records(shim_dump["shim"])
           if str(r["entry"]) == "Param.transformer.wpe.weight.grad"]
    assert len(wpe) == 1 and wpe[0]["norm"] == 0.0


def test_a_process_mixing_the_shim_and_native_cells(tmp_path):
    """Native Cells and shim modules dumped together, each as its framework names it; the
    hook the user put on a shim module stays and runs, nothing of precdbg's is left."""
    proc = subprocess.run([sys.executable, os.path.join(REPO, "tests", "shim_mixed_guide.py"),
                           str(tmp_path / "d")], cwd=REPO, capture_output=True, text=True,
                          timeout=600, env={**os.environ, "PYTHONPATH": REPO})
    if proc.returncode != 0 and not _a_native_cell_runs_under_the_shim():
        pytest.skip("this shim runs no native Cell made after `import mindnlp`, without "
                    "precdbg too (mindnlp's current source: a new Parameter's `init` is the "
                    "shim's device name, so it reads as uninitialised and Cell._init_check "
                    "fails)")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    entries = {str(r["entry"]).rsplit(".", 2)[0] for r in _records(str(tmp_path / "d"))}
    assert {"Cell.0.0.Dense", "Functional.dense", "Module.1.0.Linear", "Functional.linear",
            "Torch.tanh"} <= entries


def _a_native_cell_runs_under_the_shim() -> bool:
    """Whether a MindSpore nn.Dense made after `import mindnlp` runs at all (no precdbg)."""
    probe = ("import mindspore as ms, numpy as np; ms.set_context(mode=ms.PYNATIVE_MODE); "
             "ms.set_device('CPU'); import mindnlp; from mindspore import nn; "
             "nn.Dense(4, 2)(ms.Tensor(np.ones((1, 4), np.float32)))")
    return subprocess.run([sys.executable, "-c", probe], cwd=REPO, capture_output=True,
                          timeout=600, env={**os.environ, "GLOG_v": "3"}).returncode == 0


def _bad_input(tmp_path, case: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, os.path.join(REPO, "tests", "shim_bad_input_guide.py"),
                           str(tmp_path / "d"), case], cwd=REPO, capture_output=True, text=True,
                          timeout=600, env={**os.environ, "PYTHONPATH": REPO})


def test_graph_mode_is_refused_in_one_line_before_anything_is_written(tmp_path):
    proc = _bad_input(tmp_path, "graph")
    assert proc.returncode != 0
    assert proc.stderr.strip().splitlines()[-1].startswith("precdbg.errors.FrameworkError: ")
    assert "GRAPH_MODE" in proc.stderr and not (tmp_path / "d").exists()


def test_a_shim_lacking_a_module_hook_is_named_in_one_line_and_training_goes_on(tmp_path):
    proc = _bad_input(tmp_path, "no_hook")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    said = [line for line in proc.stderr.splitlines() if "register_forward_pre_hook" in line]
    assert len(said) == 1 and said[0].startswith("precdbg: ")
    assert "trained on:" in proc.stdout
    assert any(str(r["entry"]).startswith("Torch.tanh") for r in _records(str(tmp_path / "d")))


def test_the_shims_collectives_and_fused_ops_get_precdbg_pts_names():
    """torch.distributed's calls that move tensors are `Distributed.<name>` on the shim as on
    PyTorch (the core's `api_members`), its group set-up is no API; where the shim maps
    `torch_npu` (mindnlp's current source: `mindtorch.npu`), its fused ops are `NPU.<name>`.
    Their calls are not run here: the shim has no CPU kernel for them (mindnlp 0.5.1 and
    7dd3e355: `No implementation for function: dist_comm_all_reduce on cpu`,
    `... rotary_position_embedding on cpu`)."""
    probe = ("import json, mindspore as ms; ms.set_device('CPU'); import mindnlp\n"
             "from precdbg_ms.torch_shim import ShimRegistry, find_shim\n"
             "try:\n    import torch_npu  # noqa\nexcept ImportError:\n    pass\n"
             "entries = ShimRegistry(find_shim()).entries()\n"
             "print(json.dumps(sorted({(p, a) for _, n, p, a in entries "
             "if p in ('Distributed', 'NPU')})))\n")
    proc = subprocess.run([sys.executable, "-c", probe], cwd=REPO, capture_output=True,
                          text=True, timeout=600,
                          env={**os.environ, "GLOG_v": "3", "PYTHONPATH": REPO})
    assert proc.returncode == 0, proc.stderr[-3000:]
    named = {tuple(x) for x in json.loads(proc.stdout.strip().splitlines()[-1])}
    distributed = {a for p, a in named if p == "Distributed"}
    assert {"all_reduce", "all_gather_into_tensor", "reduce_scatter_tensor", "broadcast",
            "_all_gather_base", "isend", "irecv"} <= distributed
    assert not {"init_process_group", "get_rank", "barrier", "new_group"} & distributed
    npu = {a for p, a in named if p == "NPU"}
    if npu:       # the shim maps torch_npu
        assert {"npu_fusion_attention", "npu_rotary_mul"} <= npu


@pytest.mark.skipif(not SHIM_BACKWARD, reason="loss.backward() on the shim (PRECDBG_SHIM_GRADS)")
def test_loss_backward_brings_every_gradient_to_precdbgs_hooks(shim_dump):
    """mindnlp's current source: `loss.backward()` (MindSpore's run_backward) reaches the
    parameter hooks (wpe's gradient too, not cut as in 0.5.1) and the modules' backward; the
    shim's torch.optim.SGD is the dumped step's optimizer."""
    rows = _records(shim_dump["shim"])
    wpe = [r for r in rows if str(r["entry"]) == "Param.transformer.wpe.weight.grad"]
    assert len(wpe) == 1 and wpe[0]["norm"] > 0.0
    backward = {str(r["entry"]) for r in rows if r["role"] in ("grad_input", "grad_output")}
    assert "Module.transformer.h.1.mlp.c_proj.Conv1D.backward.0" in backward
    assert len(backward) > 20
    with open(os.path.join(shim_dump["shim"], "run.json"), encoding="utf-8") as handle:
        optimizers = json.load(handle)["manifest"]["optimizers"]
    assert [o["class"] for o in optimizers] == ["SGD"]       # the shim's torch.optim.SGD


# --------------------------------------------------------------------------- twins with torch
# (name, model, level, dump step, shim-side defect): each a real-torch dump and a shim dump of
# the same weights and batches. `function*`: layer 1's down projection through a custom
# torch.autograd.Function on both sides (the vendor guide's GLM4 shape), run where the shim
# runs one (mindnlp's current source; 0.5.1's Function outputs carry no device)
_TWINS = [("gpt2_module", "gpt2", "module", 1, ""), ("gpt2_mix", "gpt2", "mix", 1, ""),
          ("llama_module", "llama", "module", 1, ""), ("llama_mix", "llama", "mix", 1, ""),
          ("act_mix", "llama", "mix", 0, "act"), ("dx_mix", "llama", "mix", 0, "dx"),
          ("dx_module", "llama", "module", 0, "dx"), ("dw_mix", "llama", "mix", 0, "dw")]
_FUNCTION_TWINS = [("function_mix", "llama", "mix", 1, "function"),
                   ("function_dw_mix", "llama", "mix", 1, "function_dw"),
                   ("function_dw_module", "llama", "module", 1, "function_dw")]


def _an_autograd_function_runs_under_the_shim() -> bool:
    """Whether the shim runs a custom torch.autograd.Function's forward and backward, the way
    the shim side gets its gradients (no precdbg)."""
    grads = ("loss.backward()" if SHIM_BACKWARD else
             "from mindtorch.autograd import value_and_grad; "
             "value_and_grad(lambda x: F.apply(x, w).sum(), [w])(x)")
    probe = ("import mindspore as ms; ms.set_context(mode=ms.PYNATIVE_MODE); "
             "ms.set_device('CPU'); import mindnlp, torch\n"
             "class F(torch.autograd.Function):\n"
             "    @staticmethod\n    def forward(ctx, x, w):\n"
             "        ctx.save_for_backward(x, w); return torch.matmul(x, w.t())\n"
             "    @staticmethod\n    def backward(ctx, g):\n"
             "        x, w = ctx.saved_tensors; return torch.matmul(g, w), torch.matmul(g.t(), x)\n"
             "w = torch.nn.Parameter(torch.ones(3, 2)); x = torch.ones(4, 2)\n"
             f"loss = F.apply(x, w).sum(); {grads}\n")
    return subprocess.run([sys.executable, "-c", probe], cwd=REPO, capture_output=True,
                          timeout=600, env={**os.environ, "GLOG_v": "3"}).returncode == 0


def _twin_commands(root: str, twins: List) -> List[List]:
    """Batches of (python, args, extra path): the first torch side of each model (it writes
    that model's weights and batches), the other torch sides, then the shim sides."""
    writers, torch_side, shim_side = [], [], []
    for name, model, level, step, defect in twins:
        weights = os.path.join(root, f"{model}.npz")
        common = [weights, "--model", model, "--level", level, "--dump-step", str(step)]
        if defect.startswith("function"):       # the same Function on both sides
            common.append("--function")
            defect = "" if defect == "function" else defect
        command = (TORCH_PYTHON, ["torch", os.path.join(root, name, "torch")] + common
                   + TORCH_OPTIMIZER, TORCH_PATH)
        (torch_side if any(c[1][2] == weights for c in writers) else writers).append(command)
        shim_side.append((sys.executable, ["shim", os.path.join(root, name, "shim")] + common
                          + SHIM_GRADS
                          + (["--defect", defect] if defect else []), ""))
    weights = os.path.join(root, "llama.npz")       # a step that raises inside the model
    shim_side.append((sys.executable, ["shim", os.path.join(root, "raised", "shim"), weights,
                                       "--model", "llama", "--level", "module",
                                       "--grads", "value_and_grad", "--raise-in-forward"], ""))
    return [writers, torch_side, shim_side]


def _run_batch(commands: List, at_once: int = 2) -> None:
    """Run the commands, `at_once` at a time (two cores), failing with the first's output."""
    for k in range(0, len(commands), at_once):
        procs = []
        for python, args, extra in commands[k:k + at_once]:
            path = os.pathsep.join(p for p in (extra, REPO) if p)
            env = {**os.environ, "GLOG_v": "3", "PYTHONPATH": path}
            procs.append(subprocess.Popen([python, GUIDE, *args], cwd=REPO, env=env,
                                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                          text=True))
        for proc in procs:
            out, _ = proc.communicate(timeout=900)
            assert proc.returncode == 0, out[-3000:]


@pytest.fixture(scope="module")
def twins(tmp_path_factory) -> Dict[str, Dict]:
    if not TORCH_PYTHON:
        pytest.skip("no torch side (PRECDBG_TORCH_PYTHON)")
    root = str(tmp_path_factory.mktemp("twins"))
    twins = _TWINS + (_FUNCTION_TWINS if _an_autograd_function_runs_under_the_shim() else [])
    for batch in _twin_commands(root, twins):    # the weights exist before anything reads them
        _run_batch(batch)
    results = {}
    for name, *_ in twins + [("raised",)]:
        out = os.path.join(root, name, "cmp.json")
        torch_dump = os.path.join(root, "llama_module" if name == "raised" else name, "torch")
        proc = subprocess.run([sys.executable, "-m", "precdbg", "compare", torch_dump,
                               os.path.join(root, name, "shim"), "--json", out],
                              cwd=REPO, capture_output=True, text=True, timeout=600)
        assert proc.returncode in (0, 1), proc.stdout + proc.stderr
        with open(out, encoding="utf-8") as handle:
            results[name] = json.load(handle)
    return results


def _first(result: Dict) -> Dict:
    return result.get("first_divergence") or {}


@pytest.mark.parametrize("name", ["llama_module", "llama_mix"]
                         + (["gpt2_module", "gpt2_mix"] if SHIM_BACKWARD else []))
def test_a_clean_pair_matches_at_levels_module_and_mix(twins, name):
    """The same Llama on torch and on the shim, step 1 dumped: MATCH. The shim's own code
    underneath (its masks, positions, how it calls F.softmax) is a note at level mix. With
    `loss.backward()` (mindnlp's current source) GPT-2 matches too: wpe's gradient is not cut."""
    result = twins[name]
    assert result["verdict"] == "match", _first(result)
    if name.endswith("mix"):
        assert "calls_underneath" in [n["code"] for n in result["notes"]]


@pytest.mark.skipif(SHIM_BACKWARD, reason="mindnlp 0.5.1 under value_and_grad only")
@pytest.mark.parametrize("name", ["gpt2_module", "gpt2_mix"])
def test_mindnlps_zero_position_gradient_is_named(twins, name):
    """mindnlp 0.5.1 leaves GPT-2's `wpe` gradient all zero: a dw-only difference there, all
    zero in the candidate, at both levels (not the shim's other code underneath the model).
    Iteration 1 dumped: wpe enters it apart (iteration 0 did not update it on the shim), and
    the zero gradient of the step is the cause named, the weights its evidence."""
    first = _first(twins[name])
    assert first["code"] == "dw_only" and "all_zero" in first["annotations"]
    assert first["name_a"] == "Param.transformer.wpe.weight.grad"
    assert first["cause"]["code"] == "weight_gradient"
    assert first["parameters"]["name_a"] == "Param.transformer.wpe.weight"


def test_a_forward_defect_is_named_at_the_activation(twins):
    first = _first(twins["act_mix"])
    assert first["code"] == "op_differs" and first["direction"] == "forward"
    assert first["module"] == "model.layers.1.mlp.act_fn"


@pytest.mark.parametrize("name", ["dx_mix", "dx_module"])
def test_a_backward_only_defect_is_named_in_the_mlp(twins, name):
    """Layer 1's down projection's input gradient scaled on its way back (forward untouched):
    a backward difference inside layer 1's MLP, between the projection and what read it."""
    first = _first(twins[name])
    assert first["direction"] == "backward" and first["module"] == "model.layers.1.mlp"
    assert first["code"] in ("changed_after", "uncaptured_call")


def test_a_dw_only_defect_is_named_at_the_parameter(twins):
    first = _first(twins["dw_mix"])
    assert first["code"] == "dw_only"
    assert first["name_a"] == "Param.model.layers.1.mlp.down_proj.weight.grad"


def _function_twin(twins: Dict, name: str) -> Dict:
    if name not in twins:
        pytest.skip("this shim runs no custom torch.autograd.Function (mindnlp 0.5.1: its "
                    "outputs carry no device, `Tensor must have device`); mindnlp's current "
                    "source runs it (scripts/test_shim_source.sh)")
    return twins[name]


def test_the_same_autograd_function_on_both_sides_matches(twins):
    result = _function_twin(twins, "function_mix")
    assert result["verdict"] == "match", _first(result)


@pytest.mark.parametrize("name", ["function_dw_mix", "function_dw_module"])
def test_a_function_computing_dw_otherwise_is_named_at_that_dw(twins, name):
    """The vendor guide's GLM4 case: a custom autograd.Function's backward computes layer 1's
    down-projection dw otherwise on the shim. Iteration 1 dumped: that weight enters it apart,
    and the step's own dw, far beyond what the projection read, is named."""
    first = _first(_function_twin(twins, name))
    assert first["code"] == "dw_only" and first["cause"]["code"] == "weight_gradient"
    assert first["name_a"] == "Param.model.layers.1.mlp.down_proj.weight.grad"
    assert first["parameters"]["name_a"] == "Param.model.layers.1.mlp.down_proj.weight"


def test_a_step_that_raised_inside_the_model_is_named_where_it_stopped(twins):
    """The shim runs PyTorch's always_call: the modules a raising forward leaves are closed,
    and the step is named as stopped inside layer 1's MLP (it compared as MATCH before)."""
    first = _first(twins["raised"])
    assert twins["raised"]["verdict"] == "diverged"
    assert first["code"] == "unfinished" and first["module"] == "model.layers.1.mlp"
