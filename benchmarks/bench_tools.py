"""The dumping tools the overhead benchmarks drive (precdbg; msprobe for comparison) and the
accelerator probes (host syncs, peak device memory) of benchmarks/overhead_torch.py.

A tool is a small object with the same five calls for every dumper, so one timing loop
(overhead_torch.measure_mode) measures precdbg and msprobe the same way:
begin() = start dumping, end() = stop + end of step, drain() = wait until the step is on disk,
close() = shut down, files() = (size of each step's dump in bytes, records in the last step).
"""
from __future__ import annotations

import contextlib
import datetime
import glob
import importlib.util
import json
import os
import platform
import re
import shutil
import threading
import warnings
from typing import Any, Dict, Iterator, List, Optional, Tuple



def machine_info(nproc: Optional[int] = None) -> Dict[str, Any]:
    """What every results file says of the machine: date, CPU model, cores (`nproc`: the
    caller's count, else the CPUs this process may run on), memory, platform, and the versions
    of python, numpy, h5py and precdbg; each benchmark adds its framework's."""
    import h5py
    import numpy as np

    import precdbg
    cpu = platform.processor() or "unknown"
    mem_gb: Optional[float] = None
    for path, prefix in (("/proc/cpuinfo", "model name"), ("/proc/meminfo", "memtotal:")):
        try:
            with open(path, "r", encoding="utf-8") as handle:
                line = next((line for line in handle if line.lower().startswith(prefix)), None)
        except OSError:
            continue
        if line is not None and prefix == "model name":
            cpu = line.split(":", 1)[1].strip()
        elif line is not None:
            mem_gb = round(int(line.split()[1]) / (1 << 20), 1)
    if nproc is None:
        nproc = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") \
            else os.cpu_count()
    return {
        "date": datetime.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z"),
        "nproc": nproc, "cpu": cpu, "memory_gb": mem_gb, "platform": platform.platform(),
        "python": platform.python_version(), "numpy": np.__version__,
        "h5py": h5py.__version__, "precdbg": precdbg.__version__,
    }

def step_folders(dump_path: str) -> List[str]:
    """The step<N> folders of a dump (precdbg's and msprobe's layout), in step order."""
    found = []
    for path in glob.glob(os.path.join(dump_path, "step*")):
        match = re.fullmatch(r"step(\d+)", os.path.basename(path))
        if match and os.path.isdir(path):
            found.append((int(match.group(1)), path))
    return [path for _, path in sorted(found)]


def folder_bytes(path: str) -> int:
    return sum(os.path.getsize(os.path.join(root, name))
               for root, _, names in os.walk(path) for name in names)


def prune_older_steps(dump_path: str) -> List[int]:
    """Delete every finished step folder but the newest (call after a drain: nothing writes
    them any more); returns their sizes in bytes. A tensor-task step of a big model on an
    accelerator is tens of GB: the benchmark keeps one on disk at a time."""
    sizes = []
    for path in step_folders(dump_path)[:-1]:
        sizes.append(folder_bytes(path))
        shutil.rmtree(path)
    return sizes


class PrecdbgTool:
    """precdbg's PrecisionDebugger (PyTorch or MindSpore adapter) with step=[]: every started
    step is dumped, one HDF5 file per step."""

    def __init__(self, debugger_cls: Any, task: str, level: str, dump_path: str,
                 model: Any) -> None:
        self.debugger = debugger_cls(task=task, level=level, step=[], dump_path=dump_path)
        self.dump_path, self.model = dump_path, model

    def begin(self) -> None:
        self.debugger.start(self.model)

    def end(self) -> None:
        self.debugger.stop()
        self.debugger.step()

    def drain(self) -> bool:
        return bool(self.debugger.flush())

    def close(self) -> Tuple[bool, str]:
        closed = self.debugger.close()
        return bool(closed and not self.debugger.failures), \
            f"close() {closed}, {self.debugger.failures} failures"

    def files(self) -> Tuple[List[int], int]:
        import precdbg
        steps = step_folders(self.dump_path)
        if not steps:
            return [], 0
        with precdbg.open_dump(os.path.join(steps[-1], "rank0.h5")) as dump:
            records = len(dump.records())
        return [folder_bytes(step) for step in steps], records


# precdbg's level names -> msprobe's: module = L0 (nn.Module), api = L1 (torch API), mix = both
MSPROBE_LEVELS: Dict[str, str] = {"mix": "mix", "module": "L0", "api": "L1"}


def msprobe_available() -> bool:
    """Whether msprobe (pip package mindstudio-probe) can be imported; it is never installed
    by the benchmark."""
    return importlib.util.find_spec("msprobe") is not None


class MsprobeTool:
    """msprobe's PyTorch PrecisionDebugger from a generated config.json (task statistics or
    tensor, level mapped by MSPROBE_LEVELS, every rank and step, synchronous dump so the step is
    on disk when step() returns: drain() has nothing to wait for). msprobe's debugger is a
    process-wide singleton that wraps torch's APIs, so overhead_torch.py runs each msprobe mode
    in a fresh child process, apart from the precdbg measurements."""

    def __init__(self, task: str, level: str, dump_path: str, model: Any,
                 debugger_cls: Any = None) -> None:
        # msprobe.pytorch's debugger by default; overhead_shim.py passes msprobe.mindspore's
        # (its mindtorch mode: the same config, start/stop/step)
        if debugger_cls is None:
            from msprobe.pytorch import PrecisionDebugger as debugger_cls
        if level not in MSPROBE_LEVELS:
            raise ValueError(f"msprobe has no level for {level!r}")
        self.level = MSPROBE_LEVELS[level]
        config = {"task": task, "dump_path": dump_path, "rank": [], "step": [],
                  "level": self.level, "async_dump": False,
                  task: {"scope": [], "list": [], "data_mode": ["all"],
                         "summary_mode": "statistics"}}
        path = os.path.join(os.path.dirname(dump_path), "msprobe_config.json")
        with open(path, "w", encoding="utf-8") as handle:
            json.dump(config, handle, indent=2)
        self.debugger = debugger_cls(config_path=path)
        self.dump_path, self.model = dump_path, model

    def begin(self) -> None:
        # the model is needed (and only used) for the module-level part: L0 and mix
        if self.level == "L1":
            self.debugger.start()
        else:
            self.debugger.start(model=self.model)

    def end(self) -> None:
        self.debugger.stop()
        self.debugger.step()

    def drain(self) -> bool:
        return True

    def close(self) -> Tuple[bool, str]:
        return True, ""

    def files(self) -> Tuple[List[int], int]:
        steps = step_folders(self.dump_path)
        sizes = [folder_bytes(step) for step in steps]
        records = 0
        if steps:
            # step<N>/rank<R>/dump.json, or step<N>/dump.json where msprobe knows no rank
            for root, _, names in os.walk(steps[-1]):
                if "dump.json" in names:
                    with open(os.path.join(root, "dump.json"), "r", encoding="utf-8") as handle:
                        records += len(json.load(handle).get("data", {}))
        return sizes, records


class SyncCount:
    """Host syncs seen during a probe, split by thread and phase: 'step' = on the training
    thread from start() to the end of step() (what the training loop waits for), 'writer' = on
    any other thread (precdbg's background writer) until the step is drained."""

    def __init__(self) -> None:
        self.step = 0
        self.writer = 0
        self.explicit = 0
        self.messages: Dict[str, int] = {}
        self.phase = "step"


@contextlib.contextmanager
def count_syncs(device: Any) -> Iterator[Optional[SyncCount]]:
    """Count host<->device synchronisations on CUDA: torch.cuda.set_sync_debug_mode("warn")
    makes every synchronising copy/item/nonzero/stream sync raise a UserWarning, which we
    catch (warnings.catch_warnings + a showwarning that notes the thread). cudaEventSynchronize
    and torch.cuda.synchronize are not reliably flagged by the debug mode, so torch.cuda.
    synchronize, torch.accelerator.synchronize and torch.cuda.Event.synchronize are wrapped and
    counted once each (warnings raised inside them are not counted again). Yields None on other
    devices. The debug mode is global and slows every op, so use it on one probe step only."""
    import torch
    if device.type != "cuda":
        yield None
        return
    count = SyncCount()
    main = threading.get_ident()
    inside = threading.local()

    def note(thread_is_main: bool, message: str) -> None:
        if thread_is_main and count.phase == "step":
            count.step += 1
        elif not thread_is_main:
            count.writer += 1
        count.messages[message] = count.messages.get(message, 0) + 1

    def show(message: Any, category: Any, filename: str, lineno: int, file: Any = None,
             line: Any = None) -> None:
        text = str(message)
        if "synchroniz" in text and not getattr(inside, "active", False):
            note(threading.get_ident() == main, text.split("(")[0].strip())

    def wrap(owner: Any, name: str) -> Tuple[Any, str, Any]:
        original = getattr(owner, name)

        def counted(*args: Any, **kwargs: Any) -> Any:
            count.explicit += 1
            note(threading.get_ident() == main, f"{getattr(owner, '__name__', owner)}.{name}")
            inside.active = True
            try:
                return original(*args, **kwargs)
            finally:
                inside.active = False
        setattr(owner, name, counted)
        return owner, name, original

    previous = torch.cuda.get_sync_debug_mode()
    patched = [wrap(torch.cuda, "synchronize"), wrap(torch.cuda.Event, "synchronize")]
    if hasattr(torch, "accelerator") and hasattr(torch.accelerator, "synchronize"):
        patched.append(wrap(torch.accelerator, "synchronize"))
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.showwarning = show
        torch.cuda.set_sync_debug_mode("warn")
        try:
            yield count
        finally:
            torch.cuda.set_sync_debug_mode(previous)
            for owner, name, original in patched:
                setattr(owner, name, original)


def _memory_api(device: Any) -> Optional[Any]:
    """torch.accelerator (torch >= 2.8) or the device's own module (torch.cuda, torch.npu)."""
    import torch
    if device.type == "cpu":
        return None
    accelerator = getattr(torch, "accelerator", None)
    if accelerator is not None and hasattr(accelerator, "max_memory_allocated"):
        return accelerator
    return getattr(torch, device.type, None)


def reset_peak(device: Any) -> None:
    api = _memory_api(device)
    if api is not None:
        api.reset_peak_memory_stats()


def peak_bytes(device: Any) -> Optional[int]:
    """Peak device memory allocated by tensors since the last reset_peak(); None on the CPU."""
    api = _memory_api(device)
    return None if api is None else int(api.max_memory_allocated())
