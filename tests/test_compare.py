"""Defect suite of `precdbg compare`: pairs of real dumps of the bundled GPT that differ by one
defect each, and the first divergence compare must name for it (step, direction, kind, module,
op, and a reason that names the cause); clean pairs that must match (rerun, another CPU thread
count, PyTorch vs MindSpore); the command's contract (exit codes 0/1/2, JSON, CSV, HTML), mapping
files, and the statistics-only limitation.

Every dump is made once per module (see `dumps`): a tiny GPT (2 layers, d_model 64, seq 16,
vocab 128), batch 4, AdamW lr 1e-2, level mix. The baseline trains two steps; a defect's candidate
trains one (two for the optimizer), so they share step 0.

`pytest -s` also prints two measurements: the tensor-compare throughput on the default 4-layer
GPT (batch 8, task tensor) and the start-up time of `python -m precdbg --help`.
"""
from __future__ import annotations

import csv
import io
import json
import statistics
import subprocess
import time
from typing import Any, Callable, Dict

import numpy as np
import pytest
import torch

import compare_support as cs
from precdbg.compare import compare_dumps
from precdbg.compare.report.formats import summary_text

# name -> keyword arguments of compare_support.dump_gpt
SPECS: Dict[str, Dict[str, Any]] = {
    "base": dict(steps=2),
    "rerun": dict(steps=2),
    "gelu_tanh": dict(defect="gelu_tanh"),
    "layer_norm_eps": dict(defect="layer_norm_eps"),
    "every_layer_norm_eps": dict(defect="every_layer_norm_eps"),
    "layer_norm_eps_2": dict(defect="layer_norm_eps", steps=2),
    "weight": dict(defect="weight"),
    "data": dict(defect="data"),
    "dx_only": dict(defect="dx_only"),
    "dw_only": dict(defect="dw_only"),
    "dw_zero": dict(defect="dw_zero"),
    "fused_proj": dict(defect="fused_proj"),
    "fused_proj_dx": dict(defect="fused_proj_dx"),
    "optimizer": dict(defect="optimizer", steps=2),
    "nan": dict(defect="nan"),
    "stats_permuted": dict(defect="proj_permuted"),
    "layers": dict(model="layers"),
    "wrapped": dict(model="wrapped"),
    "attn_scale": dict(defect="attn_scale"),
    "detach_ln": dict(defect="detach_ln"),
    "module_base": dict(level="module"),
    "module_attn_scale": dict(defect="attn_scale", level="module"),
    "tensor_base": dict(task="tensor"),
    "tensor_1e-4": dict(task="tensor", defect="proj_1e-4"),
    "tensor_permuted": dict(task="tensor", defect="proj_permuted"),
}


@pytest.fixture(scope="module")
def dumps(tmp_path_factory) -> Callable[[str], str]:
    """dumps(name) -> path of the dump SPECS[name], made on first use, once per module."""
    root = tmp_path_factory.mktemp("compare")
    made: Dict[str, str] = {}

    def get(name: str) -> str:
        if name not in made:
            made[name] = cs.dump_gpt(str(root / name), **SPECS[name])
        return made[name]
    return get


def compare(dumps: Callable[[str], str], baseline: str, candidate: str, **kw: Any
            ) -> Dict[str, Any]:
    return compare_dumps(dumps(baseline), dumps(candidate), **kw)


# =========================================================================== defects
def test_forward_op_change_gelu_tanh(dumps):
    result = compare(dumps, "base", "gelu_tanh")
    first = cs.assert_first(result, step=0, direction="forward", kind="api",
                            module="blocks.1.mlp.act", op="gelu", code="argument", annotations=["layer_setting"])
    assert [(a["key"], a["b"]) for a in first["evidence"]["arguments_bad"]] == \
        [("approximate", "tanh")], cs.describe(result)
    # inside the model: the line of the model's code that called it, no `when`
    assert first["call_site"]["baseline"].split(" in ")[-1] == "forward", first
    assert "gpt_torch.py:" in first["call_site"]["baseline"] and "when" not in first, first
    # what follows the culprit is listed as its consequences, never before it
    assert result["consequences"], "the changed GELU output changes everything after it"
    assert all(c["module"] not in ("blocks.0.ln_1", "blocks.0.attn.qkv")
               for c in result["consequences"] if c["direction"] == "forward")


def test_default_argument_layer_norm_eps(dumps):
    result = compare(dumps, "base", "layer_norm_eps")
    first = cs.assert_first(result, step=0, direction="forward", kind="api",
                            module="blocks.0.ln_2", op="layer_norm", code="argument", annotations=["layer_setting"])
    assert float(first["evidence"]["arguments_bad"][0]["b"]) == 1e-3, cs.describe(result)


def test_argument_only_consequences_say_the_argument(dumps):
    """Every LayerNorm's eps slightly off: the first is the culprit, the others differ only in
    that argument; each consequence line says which (it printed `(, err None)`)."""
    result = compare(dumps, "base", "every_layer_norm_eps")
    cs.assert_first(result, step=0, direction="forward", kind="api", module="blocks.0.ln_1",
                    op="layer_norm", code="argument", annotations=["layer_setting"])
    args = [c for c in result["consequences"] if c.get("argument")]
    assert args and all(c["argument"]["key"] == "eps" for c in args), result["consequences"]
    text = summary_text(result)
    assert "(argument 'eps': '1e-05' vs '1.1e-05')" in text and "(, err None)" not in text, text


def test_a_step_entered_with_other_weights_still_lists_the_differing_arguments(dumps):
    """--step 1 of a run whose LayerNorm eps differs from step 0 on: the weights entered the
    step apart, and the headline is the eps the step shows (issue 45: the cause, with the
    parameter difference as its evidence); every number after it differs, and the argument
    that differs is listed in a note."""
    result = compare_dumps(dumps("base"), dumps("layer_norm_eps_2"), step=1)
    first = result["first_divergence"]
    assert (first["cause"]["code"], first["module"]) == ("layer_setting", "blocks.0.ln_2"), \
        cs.describe(result)
    assert first["parameters"]["name_a"].startswith("Param.")
    assert "weights_entered_apart" in first["annotations"]
    also = cs.notes_of(result, "other_causes")
    assert also and "Functional.layer_norm.1.forward argument 'eps' '1e-05' vs '0.001'" in \
        also[0] and "layer settings differ (eps 1e-05 vs 0.001) in module 'blocks.0.ln_2'" in \
        also[0], also


def test_records_of_one_run_only_say_so_among_the_consequences(dumps):
    """The candidate's GPT held by a wrapper (`model.`), compared without a mapping: what
    only one run records is listed by its own name, saying which run (a candidate-only record
    printed as an empty name with `err None`)."""
    text = summary_text(compare(dumps, "base", "wrapped"))
    lines = text[text.index("consequences"):].splitlines()[1:6]
    assert any(line.endswith(", only in the candidate)") and "Param.model." in line
               for line in lines), text
    assert "err None" not in text and "    (" not in text, text


def test_perturbed_weight(dumps):
    result = compare(dumps, "base", "weight")
    first = cs.assert_first(result, step=0, direction="forward", kind="param",
                            module="blocks.1.mlp.fc", op="weight",
                            code="parameters_differ", annotations=["weights_entered_apart", "not_dumped"])
    assert first["name_a"] == "Param.blocks.1.mlp.fc.weight", cs.describe(result)
    # step 0 has no earlier step to blame; only one parameter was changed
    assert first["annotations"] == ["weights_entered_apart", "not_dumped"], first


def test_different_input_data(dumps):
    result = compare(dumps, "base", "data")
    first = cs.assert_first(result, step=0, direction="forward", kind=("module", "api"),
                            module=None, code="input_data")
    # the model's own input (root module), or the embedding that reads the tokens first
    assert (first["kind"], first["module"], first["op"]) in {
        ("module", "", "gpt"), ("api", "wte", "embedding")}, cs.describe(result)
    assert first["role"] == "input", cs.describe(result)


def test_backward_only_defect_in_dx(dumps):
    result = compare(dumps, "base", "dx_only")
    first = cs.assert_first(result, step=0, direction="backward", kind="module",
                            module="blocks.1.mlp.act", op="gelu", code="backward_only")
    assert first["role"] == "grad_input", cs.describe(result)


def test_backward_defect_in_a_call_nothing_captures(dumps):
    """`blocks.1.mlp` computes its output projection through a custom autograd Function in both
    runs (as Megatron's linears and fused kernels do); the candidate's backward scales dx by
    1.001. No hook sees that backward, so the gradient arriving at the GELU before it differs
    with no captured producer; the MLP's own dy agrees, so the MLP is named, not "the loss or
    an uncaptured op"."""
    result = compare(dumps, "fused_proj", "fused_proj_dx")
    first = cs.assert_first(result, step=0, direction="backward", kind="module",
                            module="blocks.1.mlp", code="uncaptured_call")
    assert first["role"] == "grad_input", cs.describe(result)


def test_a_gradient_stopped_in_one_run_is_named_with_what_stops_it(dumps):
    """A detach in the candidate: the backward that differs first is the block holding it,
    and the verdict names the detach among the calls only the candidate makes there."""
    result = compare(dumps, "base", "detach_ln")
    first = cs.assert_first(result, step=0, direction="backward", kind="module",
                            module="blocks.1", code="backward_only",
                            annotations=["calls_in_one_run_only"])
    assert "Tensor.detach.0.forward" in first["evidence"]["calls_in_one_run_only"]["candidate"]


def test_an_all_zero_gradient_is_said_and_a_100_percent_difference(dumps):
    """A weight gradient zeroed in the candidate: the verdict says it is all zero there, and
    its relative error is 100 %, not a difference over a 1e-30 floor (4e+28)."""
    result = compare(dumps, "base", "dw_zero")
    first = cs.assert_first(result, step=0, direction="backward", kind="param_grad",
                            module="blocks.0.attn.qkv",
                            code="dw_only", annotations=["all_zero"])
    assert first["evidence"]["all_zero_in"] == "candidate"
    zero = [r for r in result["rows"] if r["step"] == 0 and r["norm_b"] == 0.0
            and r["norm_a"] not in (0.0, None)]
    assert zero and all(r["d_norm"] == pytest.approx(1.0) for r in zero), zero[:2]


def test_at_level_module_a_call_inside_a_module_is_not_called_uncaptured(dumps):
    """Level module records no API call: a difference computed by the module's own calls is
    said to be there and how to name it (level mix), not blamed on code precdbg cannot see."""
    result = compare(dumps, "module_base", "module_attn_scale")
    first = cs.assert_first(result, step=0, direction="forward", kind="module",
                            module="blocks.1.attn",
                            code="uncaptured_call", annotations=["module_level"])
    assert "module_level" in first["annotations"], first
    result = compare(dumps, "base", "attn_scale")        # level mix names the calls
    cs.assert_first(result, step=0, direction="forward", kind=("api", "module"),
                    module="blocks.1.attn", code="structure", annotations=["numbers_differ"])


def test_dw_only_defect(dumps):
    result = compare(dumps, "base", "dw_only")
    first = cs.assert_first(result, step=0, direction="backward", kind="param_grad",
                            module="blocks.0.attn.qkv", op="weight", code="dw_only")
    assert first["name_a"] == "Param.blocks.0.attn.qkv.weight.grad", cs.describe(result)


def test_optimizer_difference_at_second_step(dumps):
    result = compare(dumps, "base", "optimizer")
    # the first step matches entirely: nothing of step 0 is beyond tolerance
    bad0 = [r["name_a"] for r in result["rows"] if r["step"] == 0 and r["status"] != "match"]
    assert not bad0, f"step 0 should match, diverged: {bad0[:5]}"
    # every parameter is updated differently; the first in inventory order is wte.weight
    cs.assert_first(result, step=1, direction="forward", kind="param", module="wte",
                    op="weight", code="update_differs", annotations=["more_parameters"])


def test_nan_from_a_bad_op(dumps):
    result = compare(dumps, "base", "nan")
    cs.assert_first(result, step=0, direction="forward", kind=("module", "api"),
                    module="blocks.1.mlp.act", op="gelu", code="structure", annotations=["numbers_differ"])


# =========================================================================== clean pairs
def test_clean_rerun_same_seed(dumps):
    result = compare(dumps, "base", "rerun")
    cs.assert_match(result)
    assert {r["step"] for r in result["rows"]} == {0, 1}
    assert not result["unmatched"], result["unmatched"][:5]


def test_clean_other_thread_count(dumps, tmp_path):
    threads = 2 if torch.get_num_threads() == 1 else 1
    assert torch.get_num_threads() != threads
    candidate = cs.dump_gpt_subprocess(str(tmp_path / "threads"), threads=threads, steps=2)
    result = compare_dumps(dumps("base"), candidate)
    cs.assert_match(result)
    assert not result["unmatched"], result["unmatched"][:5]


@pytest.fixture(scope="module")
def cross_framework(tmp_path_factory) -> Dict[str, str]:
    """PyTorch GPT and its MindSpore twin, same weights and data, one SGD step each; and the twin
    with blocks[1].mlp.act = mindspore.nn.GELU() (default approximate=True)."""
    ms = pytest.importorskip("mindspore")
    ms.set_device("CPU")
    ms.set_context(mode=ms.PYNATIVE_MODE)
    ms.runtime.launch_blocking()
    root = tmp_path_factory.mktemp("cross")
    x, y = cs.numpy_batch()
    state = cs.dump_torch_numpy(str(root / "pt"), x, y)
    return {"pt": str(root / "pt"),
            "ms": cs.dump_mindspore(str(root / "ms"), state, x, y),
            "ms_gelu": cs.dump_mindspore(str(root / "ms_gelu"), state, x, y,
                                         default_gelu=True)}


def test_clean_pytorch_vs_mindspore(cross_framework):
    result = compare_dumps(cross_framework["pt"], cross_framework["ms"])
    cs.assert_match(result)
    assert "frameworks_differ" in cs.note_codes(result), result["notes"]
    kinds = {(r["kind"], r["direction"]) for r in result["rows"]}
    assert {("api", "forward"), ("module", "forward"), ("api", "backward"),
            ("module", "backward"), ("param_grad", "backward")} <= kinds, kinds
    # every parameter of the inventory found its counterpart (names differ: gamma vs weight)
    params = [r for r in result["rows"] if r["kind"] == "param"]
    assert len(params) == sum(1 for _ in cs.GPT(cs.tiny_config()).parameters()), len(params)


def test_mindspore_default_gelu_is_approximate(cross_framework):
    result = compare_dumps(cross_framework["pt"], cross_framework["ms_gelu"])
    cs.assert_first(result, step=0, direction="forward", kind="api",
                    module="blocks.1.mlp.act", op="gelu")


# =========================================================================== command contract
def test_cli_exit_0_on_match(dumps):
    proc = cs.run_cli("compare", dumps("base"), dumps("rerun"))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "MATCH" in proc.stdout


def test_cli_exit_1_and_reports(dumps, tmp_path):
    out = {ext: str(tmp_path / f"report.{ext}") for ext in ("json", "csv", "html")}
    proc = cs.run_cli("compare", dumps("base"), dumps("gelu_tanh"), "--json", out["json"],
                      "--csv", out["csv"], "--html", out["html"])
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "DIVERGED" in proc.stdout and "blocks.1.mlp.act" in proc.stdout

    with open(out["json"], encoding="utf-8") as handle:
        result = json.load(handle)
    assert cs.RESULT_KEYS <= set(result), cs.RESULT_KEYS - set(result)
    cs.assert_first(result, step=0, direction="forward", kind="api", module="blocks.1.mlp.act",
                    op="gelu", code="argument", annotations=["layer_setting"])
    assert isinstance(result["rows"], list) and result["rows"]
    assert all(isinstance(result[k], list) for k in ("consequences", "unmatched", "notes"))
    same = compare_dumps(dumps("base"), dumps("gelu_tanh"))
    assert json.loads(json.dumps(same["first_divergence"], default=str)) == \
        result["first_divergence"], "the JSON file holds what compare_dumps returns"

    with open(out["csv"], encoding="utf-8", newline="") as handle:
        text = handle.read()
    lines = text.splitlines()
    assert len(lines) == 1 + len(result["rows"]), (len(lines), len(result["rows"]))
    header = next(csv.reader(io.StringIO(lines[0])))
    assert {"step", "direction", "kind", "name_a", "name_b", "module", "op", "role",
            "status", "floor"} <= set(header), header
    parsed = list(csv.DictReader(io.StringIO(text)))
    assert len(parsed) == len(result["rows"])
    assert sum(r["status"] == "diverged" for r in parsed) == \
        sum(r["status"] == "diverged" for r in result["rows"]) > 0
    # dumps without checksums compared none: blank, not False on every row
    assert {r["checksum_equal"] for r in parsed} == {""}
    assert {r["checksum_equal"] for r in result["rows"]} == {None}

    with open(out["html"], encoding="utf-8") as handle:
        page = handle.read()
    assert 'id="precdbg-data"' in page and "</html>" in page
    # self-contained: nothing to fetch (tests/test_html_report.py checks the page itself)
    assert "http://" not in page and "https://" not in page, \
        [page[max(0, i - 40):i + 60] for i in (page.find("http://"), page.find("https://"))]
    assert "blocks.1.mlp.act" in page


def test_cli_exit_2_on_missing_dump(dumps, tmp_path):
    proc = cs.run_cli("compare", str(tmp_path / "no_such_dump"), dumps("base"))
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("precdbg:"), proc.stderr
    assert "Traceback" not in proc.stdout + proc.stderr


def test_cli_exit_2_on_absent_step(dumps):
    proc = cs.run_cli("compare", dumps("base"), dumps("rerun"), "--step", "7")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("precdbg:"), proc.stderr


def _compare_on_terminal(args, after: str) -> Dict[str, str]:
    """`python -m precdbg compare ARGS` with stderr on a pseudo-terminal; stdout, stderr."""
    import os
    import pty
    master, slave = pty.openpty()
    env = dict(os.environ, PRECDBG_PROGRESS_AFTER=after)
    try:
        proc = subprocess.run([cs.PYTHON, "-m", "precdbg", "compare", *args], cwd=cs.REPO,
                              stdout=subprocess.PIPE, stderr=slave, env=env, timeout=120)
    finally:
        os.close(slave)
    chunks = []
    while True:
        try:
            data = os.read(master, 1 << 16)
        except OSError:         # EIO: the terminal is closed and drained
            break
        if not data:
            break
        chunks.append(data)
    os.close(master)
    return {"stdout": proc.stdout.decode(), "stderr": b"".join(chunks).decode(),
            "code": proc.returncode}


def test_cli_progress_on_a_terminal(dumps):
    args = (dumps("base"), dumps("gelu_tanh"))
    shown = _compare_on_terminal(args, after="0")
    assert shown["code"] == 1, shown
    assert "step 0 rank 0: " in shown["stderr"] and \
        "records aligned and compared" in shown["stderr"], shown["stderr"]
    assert shown["stderr"].endswith("\r"), "the progress line is erased at the end"
    assert "\n" not in shown["stderr"].replace("\r\n", ""), shown["stderr"]
    piped = cs.run_cli("compare", *args)
    assert shown["stdout"] == piped.stdout, "progress never goes to stdout"


def test_cli_no_progress_when_quick_or_not_a_terminal(dumps):
    import os
    args = (dumps("base"), dumps("gelu_tanh"))
    quick = _compare_on_terminal(args, after="30")
    assert quick["code"] == 1 and quick["stderr"] == "", quick["stderr"]
    piped = subprocess.run([cs.PYTHON, "-m", "precdbg", "compare", *args], cwd=cs.REPO,
                           capture_output=True, text=True, timeout=120,
                           env=dict(os.environ, PRECDBG_PROGRESS_AFTER="0"))
    assert piped.returncode == 1 and piped.stderr == "", piped.stderr


# =========================================================================== mapping files
def test_mapping_renamed_attribute(dumps, tmp_path):
    # blocks -> layers: without a mapping the parameter inventories disagree
    unmapped = compare(dumps, "base", "layers")
    assert unmapped["verdict"] == "diverged", cs.describe(unmapped)
    mapping = tmp_path / "map.yaml"
    mapping.write_text("modules:\n  layers: blocks\n", encoding="utf-8")
    # base holds step 1 too, which layers lacks: the compare of what both hold, a match
    proc = cs.run_cli("compare", dumps("base"), dumps("layers"), "--map", str(mapping),
                      "--json", str(tmp_path / "r.json"), "--allow-missing")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    result = json.loads((tmp_path / "r.json").read_text(encoding="utf-8"))
    cs.assert_match(result)
    mapped = {r["name_b"] for r in result["rows"]}
    assert "Param.layers.1.mlp.fc.weight" in mapped and \
        "Module.layers.1.mlp.fc.Linear.forward.0" in mapped


def test_mapping_entry_naming_no_module_is_said(dumps, tmp_path):
    """An entry whose paths neither dump holds (a typo: `layer` for `layers`) renames nothing;
    the compare says so, naming it, and the entries that do apply still apply."""
    mapping = tmp_path / "map.yaml"
    mapping.write_text("modules:\n  layers: blocks\n  layer.9: blocks.9\n", encoding="utf-8")
    result = compare(dumps, "base", "layers", mapping_file=str(mapping), allow_missing=True)
    cs.assert_match(result)
    said = cs.notes_of(result, "mapping_unused")
    assert len(said) == 1 and "'layer.9' (candidate)" in said[0] \
        and "'blocks.9' (baseline)" in said[0] and "'layers'" not in said[0], said
    good = tmp_path / "good.yaml"
    good.write_text("modules:\n  layers: blocks\n", encoding="utf-8")
    result = compare(dumps, "base", "layers", mapping_file=str(good))
    assert "mapping_unused" not in cs.note_codes(result), result["notes"]


def test_mapping_file_unknown_key_suggests_the_closest(dumps, tmp_path):
    mapping = tmp_path / "map.yaml"
    mapping.write_text("modles:\n  layers: blocks\n", encoding="utf-8")
    proc = cs.run_cli("compare", dumps("base"), dumps("rerun"), "--map", str(mapping))
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stderr.splitlines() == [
        f"precdbg: {mapping}: modles: unknown key — did you mean modules? (a mapping file "
        "holds only 'modules' and 'ops' mappings)"], proc.stderr


def test_mapping_wrapped_model_prefix(dumps, tmp_path):
    # the candidate's GPT is held by a wrapper as `model`: its paths are model.<baseline path>,
    # and the candidate's `model` is the baseline's root module ("")
    mapping = tmp_path / "map.yaml"
    mapping.write_text('modules:\n  model: ""\n', encoding="utf-8")
    result = compare_dumps(dumps("base"), dumps("wrapped"), mapping_file=str(mapping),
                           allow_missing=True)      # base's step 1: wrapped has one step
    cs.assert_match(result)
    # only the wrapper itself has no counterpart
    assert {u["module"] for u in result["unmatched"]} <= {""}, result["unmatched"][:5]


def test_mapping_then_defect_is_still_named(dumps, tmp_path):
    # a mapping does not hide a real defect: a renamed model with a perturbed weight
    mapping = tmp_path / "map.yaml"
    mapping.write_text("modules:\n  blocks: blocks\n", encoding="utf-8")
    result = compare(dumps, "base", "weight", mapping_file=str(mapping))
    cs.assert_first(result, step=0, direction="forward", kind="param",
                    module="blocks.1.mlp.fc", op="weight",
                    code="parameters_differ", annotations=["weights_entered_apart", "not_dumped"])


# =========================================================================== statistics vs tensors
def test_statistics_only_note(dumps):
    """Dumps that carry pos_mean (schema 4) see a permutation: no statistics-only note; the
    rows carry pos_mean and its difference (old dumps: tests/test_order_stats.py)."""
    result = compare(dumps, "base", "rerun")
    assert "statistics_only" not in cs.note_codes(result), result["notes"]
    assert not any("rel_rmse" in r or "cosine" in r for r in result["rows"])
    tensors = [r for r in result["rows"] if not r["dtype_a"].startswith("py.")]
    assert tensors and all(r["pos_mean_a"] is not None and r["d_pos_mean"] is not None
                           for r in tensors if r["nan_a"] == 0 and r["inf_a"] == 0)


def test_tensor_task_rows_carry_tensor_metrics(dumps):
    result = compare(dumps, "tensor_base", "tensor_1e-4")
    assert "statistics_only" not in cs.note_codes(result), result["notes"]
    tensors = [r for r in result["rows"] if not r["dtype_a"].startswith("py.")]
    assert tensors
    lacking = [r["name_a"] for r in tensors if r.get("cosine") is None or
               r.get("rel_rmse") is None]
    assert not lacking, f"{len(lacking)} tensor rows without cosine/rel_rmse: {lacking[:5]}"


def test_tensor_task_names_1e4_relative_change(dumps):
    result = compare(dumps, "tensor_base", "tensor_1e-4")
    first = cs.assert_first(result, step=0, direction="forward", kind=("module", "api"),
                            module="blocks.0.attn.proj", op="linear")
    assert first["role"] == "output", cs.describe(result)
    assert first["metrics"].get("rel_rmse") == pytest.approx(1e-4, rel=0.05), first["metrics"]
    assert first["metrics"].get("cosine") == pytest.approx(1.0, abs=1e-6), first["metrics"]


def test_statistics_and_tensor_task_see_a_permutation(dumps):
    # the permuted output keeps min, max, mean and norm; pos_mean (schema 4) moves
    stats = compare(dumps, "base", "stats_permuted")
    first = cs.assert_first(stats, step=0, direction="forward", kind=("module", "api"),
                            module="blocks.0.attn.proj", op="linear")
    assert first["role"] == "output", cs.describe(stats)
    proj = [r for r in stats["rows"] if r["name_a"] == "Module.blocks.0.attn.proj.Linear.forward.0"
            and r["role"] == "output"]
    assert proj and all(r["status"] == "diverged" and r["d_pos_mean"] > r["tol"]
                        for r in proj), proj
    result = compare(dumps, "tensor_base", "tensor_permuted")
    first = cs.assert_first(result, step=0, direction="forward", kind=("module", "api"),
                            module="blocks.0.attn.proj", op="linear")
    assert first["metrics"].get("cosine", 1.0) < 0.999, first["metrics"]


# =========================================================================== measurements
def _tensor_bytes(row: Dict[str, Any], side: str) -> int:
    return int(np.prod(row[f"shape_{side}"], dtype=np.int64)) * \
        np.dtype(row[f"dtype_{side}"]).itemsize


def test_measure_tensor_compare_throughput(tmp_path):
    cfg = cs.GPTConfig()
    a = cs.dump_gpt(str(tmp_path / "a"), task="tensor", cfg=cfg, batch=8)
    b = cs.dump_gpt(str(tmp_path / "b"), task="tensor", cfg=cfg, batch=8)
    start = time.perf_counter()
    result = compare_dumps(a, b)
    seconds = time.perf_counter() - start
    cs.assert_match(result)
    compared = [r for r in result["rows"] if r.get("rel_rmse") is not None]
    assert compared
    nbytes = sum(_tensor_bytes(r, "a") + _tensor_bytes(r, "b") for r in compared)
    print(f"\n[measure] tensor compare, default GPT (4 layers, d_model 256, seq 64), batch 8: "
          f"{len(compared)} tensor pairs, {nbytes / 1e6:.1f} MB (both sides) in "
          f"{seconds:.2f} s = {nbytes / 1e6 / seconds:.1f} MB/s")


def test_measure_cli_startup():
    times = []
    for _ in range(5):
        start = time.perf_counter()
        proc = subprocess.run([cs.PYTHON, "-m", "precdbg", "--help"], capture_output=True,
                              text=True, cwd=cs.REPO, timeout=60)
        times.append(time.perf_counter() - start)
        assert proc.returncode == 0 and "compare" in proc.stdout, proc.stderr
    print(f"\n[measure] `python -m precdbg --help` start-up: median "
          f"{statistics.median(times) * 1e3:.0f} ms (min {min(times) * 1e3:.0f} ms, 5 runs)")


def test_stored_complex_tensors_are_compared_in_both_parts():
    """A complex tensor that differs only in its imaginary part differs (it was cast to float64,
    which drops the imaginary part with a ComplexWarning, and matched)."""
    import warnings
    from precdbg.compare.judge.metrics import tensor_metrics
    a = np.array([1 + 0j, 2 + 0j, -1 + 0j], dtype=np.complex64)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        same = tensor_metrics(a, a.copy())
        apart = tensor_metrics(a, a + 0.5j)
    assert same["rmse"] == 0.0 and same["cosine"] == pytest.approx(1.0)
    assert apart["rmse"] > 0.2 and apart["cosine"] < 0.99


def _clipped_steps(path: str, max_norm: float, micro: int = 1, scale_dw: bool = False) -> int:
    """Two SGD steps of a small MLP, clipped to `max_norm`, each dumped with the four lines
    (`micro` micro-batches accumulated per step); returns the line of the clipping call."""
    from precdbg_pt import PrecisionDebugger
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    debugger = PrecisionDebugger(task="statistics", level="mix", dump_path=path, step=[])
    x, y = torch.randn(32, 8), torch.randn(32, 4)
    parts = list(zip(x.chunk(micro), y.chunk(micro)))
    for _ in range(2):
        debugger.start(model)
        if scale_dw and _ == 0:        # after start(model): it runs after precdbg's hook
            model[0].weight.register_hook(lambda grad: grad * 1.5)
        for xs, ys in parts:
            (torch.nn.functional.mse_loss(model(xs), ys) / micro).backward()
        line = _line() + 1
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
        opt.step()
        opt.zero_grad()
        debugger.stop()
        debugger.step()
    debugger.close()
    return line


def _line() -> int:
    import inspect
    return inspect.currentframe().f_back.f_lineno


def test_a_clipping_difference_says_when_it_ran_and_which_line(tmp_path):
    """Clipping's calls run outside every module like the model's own first op: the verdict
    says it ran after the backward and names the script's line that made it."""
    line = _clipped_steps(str(tmp_path / "a"), 1.0)
    _clipped_steps(str(tmp_path / "b"), 0.05)
    result = compare_dumps(str(tmp_path / "a"), str(tmp_path / "b"))
    first = cs.assert_first(result, step=0, direction="forward", kind="api", module="",
                            code="argument")
    assert first["when"].startswith("after the backward"), first
    site = f"{__file__}:{line} in _clipped_steps"
    assert first["call_site"] == {"baseline": site, "candidate": site}, first
    text = summary_text(result)
    assert "after the backward, outside the model" in text and f"called at {site}" in text


def test_micro_batches_against_one_batch_are_named_as_such(tmp_path):
    """Two accumulated micro-batches against one batch of both: the model runs twice in one
    run, which is named as that (not as a list of calls), the clipping after the backward
    pairs with the other run's, and the weights after the step agree, which a note says."""
    _clipped_steps(str(tmp_path / "a"), 1.0)
    _clipped_steps(str(tmp_path / "b"), 1.0, micro=2)
    result = compare_dumps(str(tmp_path / "a"), str(tmp_path / "b"))
    first = cs.assert_first(result, step=0, direction="forward", kind="module", module="",
                            code="structure", annotations=["numbers_differ"])
    assert "structure" in first, first
    only_a = {u["name"] for u in result["unmatched"] if u["side"] == "a"}
    assert not only_a, only_a              # clipping's calls pair, although the model ran twice
    assert cs.notes_of(result, "weights_agree_after"), result["notes"]


def test_clipping_bound_neither_run_reaches_is_noted_as_absorbed(tmp_path):
    _clipped_steps(str(tmp_path / "a"), 50.0)
    _clipped_steps(str(tmp_path / "b"), 100.0)
    result = compare_dumps(str(tmp_path / "a"), str(tmp_path / "b"))
    cs.assert_first(result, step=0, direction="forward", kind="api", module="",
                    code="argument")
    assert cs.notes_of(result, "weights_agree_after"), result["notes"]
    # one that bites does reach the weights: no such note
    _clipped_steps(str(tmp_path / "c"), 0.05)
    result = compare_dumps(str(tmp_path / "a"), str(tmp_path / "c"))
    assert "weights_agree_after" not in cs.note_codes(result), result["notes"]


def test_gradient_changed_after_its_hook_recorded_it_is_named_at_the_gradient(tmp_path):
    """A user's gradient hook registered after start(model) scales a weight's gradient after
    precdbg's hook recorded it: the dw records agree, `.grad` as clipping reads it does not.
    The verdict names that weight's gradient and says what changes one after it is recorded,
    not the clipping call that first read it."""
    _clipped_steps(str(tmp_path / "a"), 100.0)
    _clipped_steps(str(tmp_path / "b"), 100.0, scale_dw=True)
    result = compare_dumps(str(tmp_path / "a"), str(tmp_path / "b"))
    first = cs.assert_first(result, step=0, direction="backward", kind="param_grad", module="0",
                            code="grad_changed_after_hook")
    assert first["name_a"] == "Param.0.weight.grad", first
