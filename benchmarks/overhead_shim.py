"""What a precdbg dump costs PyTorch code running on MindSpore through a torch shim (mindnlp's
`mindtorch`: `import mindnlp` makes `import torch` the shim), PyNative on the CPU.

    python benchmarks/overhead_shim.py [--model gpt2-tiny|llama-tiny] [--layers N] [--batch B]
        [--seq S] [--modes task/level ...] [--repeats 9] [--warmup 2] [--msprobe]
        [--results benchmarks/results_shim.md|-] [--json FILE]

Needs MindSpore and mindnlp (no real torch): scripts/test_shim.sh builds such a venv from PyPI;
precdbg runs from the checkout (PYTHONPATH=<checkout>). The model is a Hugging Face model built
from a config with random init (offline): `gpt2-tiny` (default) is overhead_torch.py's gpt2-tiny
(GPT-2 small's modules at d_model 64, 4 heads, 512 tokens, 64 positions) with 2 of its 12
layers by default; `llama-tiny` a Llama of the same width (2 layers, 4 heads, 2 KV heads). One
training step is what the shim's guide (tests/shim_guide.py) runs: `p.grad = None` for every
parameter (mindnlp 0.5.1's `zero_grad` fails), forward with labels, gradients through
`mindtorch.autograd.value_and_grad(loss_fn, params)` (its `loss.backward()` is a no-op), and a
`torch.optim.Optimizer` subclass doing `p.sub_(lr * grad)` (its own SGD has no CPU kernel);
then a wait for the kernels (the loss and the last parameter read back). In ONE process, per
mode, plain and dumped steps alternate (overhead_torch.measure_mode: start(model) / step /
stop() / step(), step=[] so every started step is dumped; warm-up rounds first); the table is
overhead_torch.py's (ratio = median dumped ÷ median plain of the same run).

--msprobe also measures msprobe (mindstudio-probe) in its mindtorch mode, configured as its
MSAdapter guide says (`torch` imported before `from msprobe.mindspore import PrecisionDebugger`;
the same config.json as overhead_torch.py's msprobe: task, level mix / L0 / L1), one child
process per mode. Where it cannot run, the mode is reported as not measured, with the stage,
the error and where it was raised. Nothing here asserts on wall-clock time.
"""
from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import traceback
import types
from typing import Any, Dict, List, Optional, Tuple

os.environ.setdefault("GLOG_v", "3")          # MindSpore's C++ log: errors only
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from bench_tools import MsprobeTool, PrecdbgTool  # noqa: E402
from bench_tools import machine_info as shared_machine_info  # noqa: E402
from overhead_torch import add_timing_args, measure_mode, measure_modes, table  # noqa: E402

MODES: Tuple[Tuple[str, str], ...] = (("statistics", "mix"), ("statistics", "module"),
                                      ("statistics", "api"), ("tensor", "mix"))
MODELS = ("gpt2-tiny", "llama-tiny")
LR = 1e-3


class BenchError(Exception):
    """A one-line error: exit status 2."""


# ------------------------------------------------------------------------------ the shim
def import_shim() -> Any:
    """MindSpore in PyNative mode on the CPU, then mindnlp, whose import makes `torch` the
    shim; returns that `torch`. Real torch (or none) is a BenchError."""
    try:
        import mindspore as ms
    except ImportError:
        raise BenchError("MindSpore is not installed (scripts/test_shim.sh builds a venv with "
                         "MindSpore 2.7.0 and mindnlp 0.5.1)") from None
    ms.set_context(mode=ms.PYNATIVE_MODE)
    ms.set_device("CPU")
    if importlib.util.find_spec("mindnlp") is None:
        raise BenchError("mindnlp (the torch shim) is not installed (scripts/test_shim.sh "
                         "builds a venv with MindSpore 2.7.0 and mindnlp 0.5.1)")
    import mindnlp  # noqa: F401  - makes `torch` the shim (mindtorch)
    import torch
    from precdbg_ms.torch_shim import find_shim
    if find_shim() is None:
        raise BenchError(f"`import torch` is not a torch shim here ({torch.__file__})")
    return torch


def _version(dist: str) -> Optional[str]:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def machine_info(torch: Any) -> Dict[str, Any]:
    import mindspore as ms
    from precdbg_ms.torch_shim import shim_versions
    info = shared_machine_info()
    shim = shim_versions(torch)
    info.update(mindspore=ms.__version__, mindspore_threads=ms.get_context("runtime_num_threads"),
                mindnlp=_version("mindnlp"), transformers=_version("transformers"),
                shim=shim["shim"], torch_api=shim["torch_api"])
    return info


# ------------------------------------------------------------------------------ the workload
class ShimWorkload:
    """A transformers model on the shim with a fixed random batch; step() is one training
    step as the shim's guide runs it, ending with a wait for its kernels."""

    def __init__(self, torch: Any, name: str, layers: Optional[int], batch: int, seq: int,
                 seed: int = 0) -> None:
        import transformers
        from mindtorch.autograd import value_and_grad
        if name == "gpt2-tiny":
            cfg = transformers.GPT2Config(n_embd=64, n_head=4, vocab_size=512, n_positions=64,
                                          bos_token_id=0, eos_token_id=0)
            self.full_layers, positions = cfg.n_layer, cfg.n_positions
            cfg.n_layer = layers or 2
            cls = transformers.GPT2LMHeadModel
        else:
            cfg = transformers.LlamaConfig(hidden_size=64, intermediate_size=172,
                                           num_hidden_layers=layers or 2, num_attention_heads=4,
                                           num_key_value_heads=2, vocab_size=512,
                                           max_position_embeddings=64)
            self.full_layers, positions = cfg.num_hidden_layers, cfg.max_position_embeddings
            cls = transformers.LlamaForCausalLM
        if seq > positions:
            raise BenchError(f"--seq {seq}: {name} has {positions} positions")
        cfg.use_cache = False
        cfg._attn_implementation = "eager"
        torch.manual_seed(seed)
        self.name, self.batch, self.seq = name, batch, seq
        self.layers = layers or 2
        self.model = cls(cfg)
        self.model.train()
        self.config = cfg.to_dict()
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        self.n_params = sum(int(p.numel()) for p in self.params)
        self.ids = torch.randint(0, cfg.vocab_size, (batch, seq))
        self.optimizer = make_sgd(torch)(self.params, lr=LR)
        model = self.model

        def loss_fn(ids: Any) -> Any:
            return model(input_ids=ids, labels=ids, use_cache=False).loss
        self.loss_and_grads = value_and_grad(loss_fn, self.params)

    def step(self) -> float:
        for p in self.params:        # optimizer.zero_grad(): mindnlp 0.5.1's fails
            p.grad = None
        loss = self.loss_and_grads(self.ids)
        self.optimizer.step()
        value = float(loss)          # waits for the forward and backward
        self.params[-1].asnumpy()    # and for the update
        return value

    def describe(self) -> str:
        layers = (f"{self.layers} of its {self.full_layers} layers" if self.name == "gpt2-tiny"
                  else f"{self.layers} layers")
        return (f"{self.name} ({self.n_params / 1e6:.2f} M parameters, {layers}, d_model 64, "
                f"eager attention), batch {self.batch} × seq {self.seq}, fp32, gradients by "
                f"mindtorch.autograd.value_and_grad, SGD lr {LR} as a torch.optim.Optimizer "
                "subclass (p.sub_(lr * grad)), on the CPU")


def make_sgd(torch: Any) -> type:
    class PlainSGD(torch.optim.Optimizer):
        """SGD as a user's `torch.optim.Optimizer` subclass (tests/shim_guide.py's): its step
        runs through the shim's optimizer step hooks, so precdbg sees the optimizer phase."""

        def __init__(self, params: Any, lr: float) -> None:
            super().__init__(params, {"lr": lr})

        @torch.no_grad()
        def step(self, closure: Any = None) -> None:
            for group in self.param_groups:
                for p in group["params"]:
                    if p.grad is not None:
                        p.sub_(p.grad * group["lr"])
    return PlainSGD


# ------------------------------------------------------------------------------ msprobe
class MsprobeFailure(Exception):
    def __init__(self, stage: str, exc: BaseException) -> None:
        super().__init__(stage)
        self.info = {"stage": stage, "error": f"{type(exc).__name__}: "
                     + (str(exc).strip().splitlines() or [""])[0], "where": where(exc)}


def where(exc: BaseException) -> str:
    """Where it was raised (file:line in function (source line)), and the innermost msprobe
    frame that called it when that is another frame."""
    frames = traceback.extract_tb(exc.__traceback__)
    if not frames:
        return "unknown"

    def text(frame: Any) -> str:
        path = frame.filename.replace(os.sep, "/")
        for package in ("msprobe", "mindspore", "mindtorch", "transformers"):
            if f"/{package}/" in path:
                path = package + path.rsplit(f"/{package}", 1)[1]
                break
        return f"{path}:{frame.lineno} in {frame.name} ({(frame.line or '').strip()})"
    mine = [f for f in frames if "/msprobe/" in f.filename.replace(os.sep, "/")]
    said = text(frames[-1])
    if mine and mine[-1] is not frames[-1]:
        said += f", called from {text(mine[-1])}"
    return said


def norm_on_cpu() -> str:
    """What mindspore.mint.norm (msprobe's norm of a tensor's statistics) does alone on this
    CPU: 'works' or its error."""
    import mindspore as ms
    from mindspore import mint
    try:
        mint.norm(ms.Tensor([3.0, 4.0], ms.float32)).asnumpy()
        return "works"
    except Exception as exc:  # noqa: BLE001 - the answer
        return f"{type(exc).__name__}: " + (str(exc).strip().splitlines() or [""])[0]


def import_msprobe(notes: List[str]) -> Any:
    """msprobe.mindspore's PrecisionDebugger, imported after the shim's `torch` as its guide
    says. Its mindtorch mode imports `torch_npu` (which MSAdapter ships and mindnlp does not):
    where that is missing, the import is said in `notes` and tried again with an empty
    stand-in `torch_npu` module (no NPU APIs to wrap), so what comes next can be seen."""
    try:
        from msprobe.mindspore import PrecisionDebugger
        return PrecisionDebugger
    except ModuleNotFoundError as exc:
        if exc.name != "torch_npu":
            raise MsprobeFailure("import", exc) from exc
        notes.append(f"import as documented: {MsprobeFailure('import', exc).info['error']} at "
                     f"{where(exc)}; retried with an empty stand-in `torch_npu` module")
        for name in [m for m in sys.modules if m.startswith("msprobe")]:
            del sys.modules[name]        # the half-imported modules, to import them again
        sys.modules["torch_npu"] = types.ModuleType("torch_npu")
    try:
        from msprobe.mindspore import PrecisionDebugger
        return PrecisionDebugger
    except Exception as exc:  # noqa: BLE001 - reported as the mode's failure
        raise MsprobeFailure("import (with the stand-in torch_npu)", exc) from exc


def msprobe_child_rows(args: argparse.Namespace, work: ShimWorkload) -> Dict[str, Any]:
    """The `--tool msprobe` child: one mode, measured or the failure described."""
    notes: List[str] = []
    out: Dict[str, Any] = {"rows": [], "failures": [], "notes": notes}
    try:
        debugger_cls = import_msprobe(notes)
    except MsprobeFailure as failure:
        out["failures"] = [dict(failure.info, mode=m) for m in args.modes]
        return out
    for mode in args.modes:
        try:
            out["rows"] += measure_modes([mode], lambda task, level: measure_mode(
                task, level, None, work.model, work.step, args.repeats, args.warmup,
                "precdbg_bench_shim_msprobe", tool_factory=lambda t, lv, path: MsprobeTool(
                    t, lv, path, work.model, debugger_cls)), args.retries, args.max_other)
        except Exception as exc:  # noqa: BLE001 - the mode is not measured; say why
            out["failures"].append(dict(MsprobeFailure("dumped step", exc).info, mode=mode))
    if out["failures"]:
        note = f"mindspore.mint.norm of a float32 CPU tensor alone: {norm_on_cpu()}"
        if note not in notes:
            notes.append(note)
    return out


def msprobe_modes(args: argparse.Namespace, argv_common: List[str]
                  ) -> Tuple[List[Dict[str, Any]], List[Dict[str, Any]], List[str]]:
    """Each mode in a child process (msprobe's debugger is a process-wide singleton that
    wraps the shim's APIs); returns (rows, failures, notes)."""
    rows: List[Dict[str, Any]] = []
    failures: List[Dict[str, Any]] = []
    notes: List[str] = []
    for mode in args.modes:
        with tempfile.TemporaryDirectory(prefix="precdbg_bench_shim_msprobe_") as tmp:
            out = os.path.join(tmp, "child.json")
            cmd = [args.msprobe_python, os.path.abspath(__file__), "--tool", "msprobe",
                   "--results", "-", "--json", out, "--modes", mode] + argv_common
            print(f"msprobe {mode}: child process", flush=True)
            done = subprocess.run(cmd, capture_output=True, text=True, check=False)
            if not os.path.exists(out):
                tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or [""]
                failures.append({"mode": mode, "stage": "child process",
                                 "error": f"exit {done.returncode}: {tail[0]}", "where": ""})
                continue
            with open(out, "r", encoding="utf-8") as handle:
                got = json.load(handle)
        rows += got["rows"]
        failures += got["failures"]
        notes += [n for n in got["notes"] if n not in notes]
        for failure in got["failures"]:
            print(f"msprobe {mode}: not measured: {failure['stage']}: {failure['error']} "
                  f"({failure['where']})", flush=True)
    return rows, failures, notes


# ------------------------------------------------------------------------------ reporting
def spread(rows: List[Dict[str, Any]]) -> str:
    """Quartiles of the plain and dumped steps' own times, per mode."""
    lines = ["| tool | task / level | plain ms (25 %–75 %) | dumped ms (25 %–75 %) | rounds |",
             "|---|---|---:|---:|---:|"]
    for r in rows:
        cells = []
        for key in ("plain_ms_all", "dumped_ms_all"):
            values = r[key]
            q1, q3 = (statistics.quantiles(values, n=4, method="inclusive")[::2]
                      if len(values) > 1 else (values[0], values[0]))
            cells.append(f"{q1:.0f}–{q3:.0f}")
        lines.append(f"| {r.get('tool', 'precdbg')} | {r['task']} / {r['level']} | {cells[0]} | "
                     f"{cells[1]} | {len(r['plain_ms_all'])} |")
    return "\n".join(lines) + "\n"


def failure_lines(failures: List[Dict[str, Any]]) -> str:
    return "".join(f"- msprobe {f['mode']}: **not measured** — {f['stage']}: `{f['error']}`"
                   + (f" at `{f['where']}`" if f.get("where") else "") + "\n" for f in failures)


def results_markdown(info: Dict[str, Any], work: ShimWorkload, rows: List[Dict[str, Any]],
                     failures: List[Dict[str, Any]], notes: List[str], argv: List[str]) -> str:
    cmd = shlex.join(["python", "benchmarks/overhead_shim.py"] + argv)
    msprobe = f", msprobe {info['msprobe']}" if info.get("msprobe") else ""
    return (
        "# precdbg overhead, PyTorch code on MindSpore through a torch shim (mindtorch)\n\n"
        f"Measured {info['date']} with `{cmd}`.\n\n"
        f"- machine: {info['nproc']} cores, {info['cpu']}, {info['memory_gb']} GB RAM, "
        f"{info['platform']}\n"
        f"- python {info['python']}, mindspore {info['mindspore']} (PyNative, CPU, runtime "
        f"threads {info['mindspore_threads']}), mindnlp {info['mindnlp']} (shim "
        f"`{info['shim']}`, torch API {info['torch_api']}), transformers "
        f"{info['transformers']}, numpy {info['numpy']}, h5py {info['h5py']}, precdbg "
        f"{info['precdbg']}{msprobe}\n"
        f"- workload: {work.describe()}\n"
        f"- {rows[0]['repeats']} repeats after {rows[0]['warmup']} warm-up rounds per mode, "
        "one process, plain and dumped steps alternating (msprobe: one child process per "
        "mode)\n" + "".join(f"- {n}\n" for n in notes) + "\n" + table(rows) + "\n"
        + failure_lines(failures) + ("\n" if failures else "")
        + "Spread of the steps' own times:\n\n" + spread(rows) +
        "\nratio = median dumped step ÷ median plain step of the same run (start(model) .. "
        "step(), what the training loop sees); per-round = quartiles (25 %–75 %) of each "
        "round's own dumped ÷ plain. drain = median wait in debugger.flush() for the "
        "background writer after a dumped step; +drain = (dumped + drain) ÷ plain. MB/step = "
        "size of one step's dump; records = records in one step (msprobe: entries of its "
        "dump.json, one per call, not the same unit). other CPU = share of the machine's CPU "
        "time used by other processes meanwhile (more than a few % distorts the timings). "
        "See benchmarks/README.md.\n")


# ------------------------------------------------------------------------------ main
def parse_args(argv: List[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="precdbg dump overhead on PyTorch code run on "
                                                 "MindSpore through mindnlp's torch shim")
    parser.add_argument("--model", default="gpt2-tiny", choices=MODELS)
    parser.add_argument("--layers", type=int, help="layers (default 2)")
    parser.add_argument("--batch", type=int, default=2, help="batch (default 2)")
    parser.add_argument("--seq", type=int, default=32, help="sequence length (default 32)")
    add_timing_args(parser, MODES)
    parser.add_argument("--msprobe", action="store_true",
                        help="also measure msprobe's mindtorch mode when it is installed")
    parser.add_argument("--msprobe-python", metavar="PYTHON", default=sys.executable,
                        help="the interpreter of msprobe's child processes (default this one): "
                             "a venv with the same packages and mindstudio-probe")
    parser.add_argument("--tool", default="precdbg", choices=("precdbg", "msprobe"),
                        help=argparse.SUPPRESS)      # the child process of --msprobe
    parser.add_argument("--json", metavar="FILE", help="also write the results as JSON")
    parser.add_argument("--results", metavar="FILE",
                        help="markdown results (default benchmarks/results_shim.md for "
                             "gpt2-tiny, else results_shim_<model>.md); '-' to skip")
    args = parser.parse_args(argv)
    if args.repeats < 1 or args.warmup < 0 or args.retries < 0:
        parser.error("--repeats must be >= 1, --warmup and --retries >= 0")
    for flag in ("layers", "batch", "seq"):
        if getattr(args, flag) is not None and getattr(args, flag) < 1:
            parser.error(f"--{flag} must be >= 1")
    for mode in args.modes:
        task, _, level = mode.partition("/")
        if task not in ("statistics", "tensor") or level not in ("mix", "api", "module"):
            parser.error(f"--modes {mode}: expected statistics|tensor / mix|api|module")
    if args.results is None:
        args.results = os.path.join(HERE, "results_shim.md" if args.model == "gpt2-tiny"
                                    else f"results_shim_{args.model}.md")
    return args


def main(argv: Optional[List[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    try:
        return run(args, argv)
    except BenchError as exc:
        print(f"overhead_shim.py: error: {exc}", file=sys.stderr)
        return 2


def run(args: argparse.Namespace, argv: List[str]) -> int:
    torch = import_shim()
    info = machine_info(torch)
    notes: List[str] = []
    if importlib.util.find_spec("precdbg.capture._fastats") is None:
        # without it host statistics take the framework's reductions (slower, and under
        # mindnlp 0.5.1 they fail: see benchmarks/README.md)
        notes.append("precdbg's C extension precdbg.capture._fastats is not built in this "
                     "checkout")
        print(f"warning: {notes[-1]}", file=sys.stderr, flush=True)
    work = ShimWorkload(torch, args.model, args.layers, args.batch, args.seq)
    for _ in range(3):          # the first steps compile and allocate: out of every mode
        work.step()
    if args.tool == "msprobe":
        got = msprobe_child_rows(args, work)
        for row in got["rows"]:
            row["tool"] = "msprobe"
        with open(args.json, "w", encoding="utf-8") as handle:
            json.dump(got, handle, indent=2, default=str)
        return 0

    print(f"{info['nproc']} cores, {info['cpu']}; mindspore {info['mindspore']}, mindnlp "
          f"{info['mindnlp']}, transformers {info['transformers']}", flush=True)
    print(f"workload: {work.describe()}", flush=True)
    from precdbg_ms import PrecisionDebugger
    frameworks: List[str] = []

    def precdbg_tool(task: str, level: str, path: str) -> PrecdbgTool:
        tool = PrecdbgTool(PrecisionDebugger, task, level, path, work.model)
        tool.files = _noting_framework(tool, frameworks)      # type: ignore[method-assign]
        return tool

    def bench(task: str, level: str) -> Dict[str, Any]:
        row = measure_mode(task, level, None, work.model, work.step, args.repeats,
                           args.warmup, "precdbg_bench_shim", tool_factory=precdbg_tool)
        row["tool"], row["framework"] = "precdbg", frameworks[-1] if frameworks else None
        return row
    rows = measure_modes(args.modes, bench, args.retries, args.max_other)
    failures: List[Dict[str, Any]] = []
    if args.msprobe:
        info["msprobe"] = msprobe_version(args.msprobe_python)
        if info["msprobe"]:
            if args.msprobe_python != sys.executable:
                notes.append(f"msprobe's child processes ran {args.msprobe_python}")
            common = ["--model", args.model, "--batch", str(args.batch), "--seq", str(args.seq),
                      "--repeats", str(args.repeats), "--warmup", str(args.warmup),
                      "--retries", str(args.retries), "--max-other", str(args.max_other)] + (
                ["--layers", str(args.layers)] if args.layers else [])
            more, failures, said = msprobe_modes(args, common)
            rows += more
            notes += [f"msprobe {info['msprobe']} (mindtorch mode): {n}" for n in said]
        else:
            notes.append("msprobe (mindstudio-probe) is not installed: measuring precdbg only")
            print(notes[-1], flush=True)

    print()
    print(table(rows), end="")
    print(failure_lines(failures), end="")
    if args.results != "-":
        with open(args.results, "w", encoding="utf-8") as handle:
            handle.write(results_markdown(info, work, rows, failures, notes, argv))
        print(f"\nwrote {args.results}")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as handle:
            json.dump({"machine": info, "argv": argv, "workload": work.describe(),
                       "model_name": args.model, "model": work.config, "rows": rows,
                       "msprobe_failures": failures, "notes": notes}, handle, indent=2,
                      default=str)
        print(f"wrote {args.json}")
    return 0


def msprobe_version(python: str) -> Optional[str]:
    """mindstudio-probe's version in that interpreter, None where it is not installed (asked
    in a child: importing msprobe here would wrap the shim's APIs for the rest of the run)."""
    done = subprocess.run([python, "-c", "import importlib.metadata as m; "
                           "print(m.version('mindstudio-probe'))"],
                          capture_output=True, text=True, check=False)
    return done.stdout.strip() or None if done.returncode == 0 else None


def _noting_framework(tool: PrecdbgTool, frameworks: List[str]) -> Any:
    """PrecdbgTool.files, also noting the framework the dump's run.json names (mindtorch)."""
    files = tool.files

    def noted() -> Tuple[List[int], int]:
        import precdbg
        with precdbg.open_dump(tool.dump_path) as dump:
            frameworks.append(str(dump.run.get("framework")))
        return files()
    return noted


if __name__ == "__main__":
    sys.exit(main())
