"""Synthetic dumps: the record tables of a tiny model's training steps, computed with numpy and
written through the core's own writer (`precdbg.storage.writer.DumpWriter`), so that the files
are exactly what a capture writes, with no framework installed.

The model is what `precdbg_pt` records of

    class MLP(nn.Module):             # the root module ''
        fc1 = nn.Linear(4, 8)         # Module.fc1.Linear.forward.0  > Functional.linear.0.forward
        act = nn.GELU()               # Module.act.GELU.forward.0    > Functional.gelu.0.forward
        fc2 = nn.Linear(8, 2)         # Module.fc2.Linear.forward.0  > Functional.linear.1.forward
    loss = model(x).pow(2).mean(); loss.backward(); sgd.step()

at level mix (or module): the parameter inventory (kind param, direction none, phase setup),
each call's input and output records with their statistics, `producer` links (a record that
reads a tensor names the `seq` of the record that produced it: the first that wrote it),
the backward records in the order autograd runs them (grad_output, grad_input), the parameter
gradients (kind param_grad), the module tree with each module's layer settings, call stacks,
and run.json with its manifest (an SGD optimizer, the first batch). A `Variant` says how one run
differs from the reference run, in one known place; `write_dump(path, **changes)` writes one.

Every `Record` is made by `make_record`, and nowhere else in the core suite."""
from __future__ import annotations

import dataclasses
import json
import math
import os
import platform
import time
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple

import numpy as np

from precdbg.records.schema import NO_PRODUCER, Record
from precdbg.storage.step_file import Payload
from precdbg.storage.writer import DumpWriter

__all__ = ["make_record", "Variant", "Tensor", "StepBuilder", "model_step", "write_step",
           "write_run_json", "run_info", "manifest_of", "module_tree", "initial_params",
           "write_dump", "MODULES", "PARAMS", "STACKS", "stats_of"]

FRAMEWORK = "pytorch"        # the names below are precdbg_pt's
PARAMS = ("fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias")
STACKS = ("train.py:20 in train_step",
          "model.py:9 in forward\ntrain.py:20 in train_step")
_OUTSIDE, _INSIDE = 0, 1      # stack ids: the root module and what runs outside it; inside it


def _np_dtype(name: str) -> np.dtype:
    if name == "bfloat16":
        import ml_dtypes
        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(name)


# --------------------------------------------------------------------------- the one factory
def make_record(**fields: Any) -> Record:
    """The one place the core suite makes a `Record`: keyword arguments named as Record's fields
    (entry, kind, prefix, api, op, module, direction, role, phase, arg_index, arg_key,
    call_index, order, seq, dtype, shape, numel, min, max, mean, norm, nan_count, inf_count,
    checksum, text, alias, trainable, stack_id, data_offset, data_nbytes, tensor_id, producer,
    storage, precision; absent ones take a capture's defaults). The record is made as the
    capture makes it, from its call (`precdbg.records.call.Call`), and the fields that are the
    tensor's own are filled in after, as the capture fills them in."""
    from precdbg.records.call import Call
    from precdbg.records.schema import Direction, Phase, RecordKind, Role
    f = dict(fields)
    direction = Direction(f.pop("direction"))
    entry = f.pop("entry")
    phase = f.pop("phase", None)
    default_phase = {Direction.NONE: Phase.SETUP, Direction.BACKWARD: Phase.BACKWARD}.get(
        direction, Phase.FORWARD)
    call = Call(RecordKind(f.pop("kind")), f.pop("prefix"), f.pop("api"), f.pop("op"),
                f.pop("module"), f.pop("call_index"), f.pop("order"),
                Phase(phase) if phase is not None else default_phase, f.pop("stack_id", -1),
                False, entry, entry, f.pop("alias", ""))
    rec = Record(call, direction, Role(f.pop("role")), f.pop("arg_index"), f.pop("arg_key"),
                 f.pop("seq", 0), f.pop("dtype", ""), tuple(f.pop("shape", ())),
                 f.pop("numel", 0), f.pop("tensor_id", -1))
    if phase is not None:
        rec.phase = Phase(phase)
    for name, value in f.items():             # statistics, dataflow, storage, text
        if name not in Record.__dataclass_fields__:
            raise TypeError(f"make_record: Record has no field {name!r}")
        setattr(rec, name, value)
    return rec


# --------------------------------------------------------------------------- statistics
def stats_of(values: np.ndarray) -> Dict[str, Any]:
    """A capture's statistics of a tensor: min and max over the values that are not NaN (so
    -inf shows), mean and norm over the finite ones, NaN and Inf counted."""
    v = np.asarray(values).astype(np.float64).ravel()
    isnan, isinf = np.isnan(v), np.isinf(v)
    kept, finite = v[~isnan], v[~isnan & ~isinf]
    nan = float("nan")
    return {"min": float(kept.min()) if kept.size else nan,
            "max": float(kept.max()) if kept.size else nan,
            "mean": float(finite.mean()) if finite.size else nan,
            "norm": float(np.sqrt(np.sum(finite * finite))) if v.size else nan,
            "nan_count": int(isnan.sum()), "inf_count": int(isinf.sum())}


@dataclasses.dataclass
class Tensor:
    """One distinct tensor of a step: its identity (tensor_id, also its storage) and values."""
    tensor_id: int
    values: np.ndarray


class StepBuilder:
    """The records of one step and rank, emitted in execution order: `seq` counts them, and a
    record reading a tensor names the first record that wrote it as its `producer`."""

    READS = ("input", "grad_output")

    def __init__(self, dtype: str = "float32", store: bool = False, checksum: bool = False
                 ) -> None:
        self.dtype = dtype
        self.store, self.checksum = store, checksum
        self.records: List[Record] = []
        self.payloads: List[Payload] = []
        self._seq = 0
        self._next_id = 0
        self._writer_of: Dict[int, int] = {}        # tensor_id -> seq of its first writer
        self._paid: set = set()

    def tensor(self, values: Any, dtype: Optional[str] = None) -> Tensor:
        """A new distinct tensor holding `values` rounded to `dtype` (the builder's)."""
        arr = np.asarray(values, dtype=np.float64).astype(_np_dtype(dtype or self.dtype))
        t = Tensor(self._next_id, arr)
        self._next_id += 1
        return t

    def emit(self, *, entry: str, kind: str, prefix: str, api: str, op: str, module: str,
             direction: str, role: str, arg_index: int, arg_key: str, call_index: int,
             order: int, value: Any, stack_id: int = -1, trainable: bool = False,
             alias: str = "", phase: Optional[str] = None) -> Record:
        """One record of `value`: a `Tensor`, or a Python number or string (a non-tensor
        argument, dtype py.<type>)."""
        self._seq += 1
        if phase is None:
            phase = {"none": "setup", "backward": "backward"}.get(direction, "forward")
        common = dict(entry=entry, kind=kind, prefix=prefix, api=api, op=op, module=module,
                      direction=direction, role=role, phase=phase, arg_index=arg_index,
                      arg_key=arg_key, call_index=call_index, order=order, seq=self._seq,
                      alias=alias, trainable=trainable, stack_id=stack_id)
        if not isinstance(value, Tensor):
            number = isinstance(value, (bool, int, float))
            stats = {"min": float(value), "max": float(value), "mean": float(value),
                     "norm": abs(float(value)),
                     "nan_count": int(number and value != value),
                     "inf_count": int(number and math.isinf(float(value)))} if number else {}
            rec = make_record(**common, dtype=f"py.{type(value).__name__}", shape=(), numel=1,
                              text=repr(value) if number else str(value), **stats)
            self.records.append(rec)
            return rec
        tid = value.tensor_id
        producer = NO_PRODUCER
        if role in self.READS or role == "param_grad":
            producer = self._writer_of.get(tid, NO_PRODUCER)
        if role not in self.READS:
            self._writer_of.setdefault(tid, self._seq)
        rec = make_record(**common, dtype=str(value.values.dtype), shape=tuple(value.values.shape),
                          numel=int(value.values.size), tensor_id=tid, producer=producer,
                          storage=tid, precision=str(value.values.dtype),
                          **stats_of(value.values))
        self.records.append(rec)
        if (self.store or self.checksum) and tid not in self._paid:
            self._paid.add(tid)
            self.payloads.append(Payload(tid, value.values, self.store, self.checksum))
        return rec


# --------------------------------------------------------------------------- the variants
@dataclasses.dataclass
class Variant:
    """How one synthetic run differs from the reference run (the defaults)."""
    dtype: str = "float32"            # float32, float16, bfloat16: every tensor's dtype
    level: str = "mix"                # mix, or module (no API records)
    task: str = "statistics"          # statistics, or tensor (every distinct tensor stored)
    checksum: bool = False            # summary_mode checksum: xxh3 of every tensor's bytes
    seed: int = 0
    batch: int = 3                    # rows of the batch x (batch x 4)
    steps: Sequence[int] = (0,)
    ranks: Sequence[int] = (0,)
    input_scale: float = 1.0          # the batch x *= this (input data differs)
    gelu_scale: float = 1.0           # gelu's forward output *= this (its inputs agree)
    gelu_ulps: int = 0                # this many of gelu's output elements one ulp away (as
                                      # another kernel rounds), in the variant's dtype
    gelu_max_ulps: int = 0            # gelu's largest output element this many ulps up
    gelu_swap: bool = False           # gelu's first two output elements swapped (statistics
                                      # unchanged, the values not)
    gelu_grad_scale: float = 1.0      # gelu's backward dx *= this (the forward agrees)
    dw_scale: float = 1.0             # fc1.weight's gradient *= this (forward and dx agree)
    weight_scale: float = 1.0         # fc2.weight *= this before the first step (inventory)
    approximate: str = "none"         # gelu's form: none (erf) or tanh, as computed and passed
    settings_approximate: Optional[str] = None   # what the module tree records (approximate)
    extra_call: bool = False          # act multiplies gelu's output by 1.0 (one more call)
    nan_in_gelu: bool = False         # gelu's output holds a NaN (from finite inputs)
    nan_in_input: bool = False        # the batch holds a NaN
    nan_in_weight: bool = False       # fc2.weight holds a NaN before the first step
    lr: float = 0.1                   # SGD's learning rate (run.json's manifest)
    interrupted: bool = False         # the step files say the process ended inside the step
    stop_in: str = ""                 # the step stops inside this module's forward (an
                                      # exception the script caught): nothing after its input
    trained_before: int = 0           # SGD steps run, not written, before the first written
                                      # step (the guides' dump_step = 1)


MODULES = (("", "MLP", ""), ("fc1", "Linear", ""), ("act", "GELU", ""), ("fc2", "Linear", ""))


def _gelu(h: np.ndarray, approximate: str) -> np.ndarray:
    if approximate == "tanh":
        return 0.5 * h * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (h + 0.044715 * h ** 3)))
    erf = np.vectorize(math.erf, otypes=[np.float64])
    return 0.5 * h * (1.0 + erf(h / math.sqrt(2.0)))


def _gelu_grad(h: np.ndarray, approximate: str) -> np.ndarray:
    if approximate == "tanh":
        c = math.sqrt(2.0 / math.pi)
        t = np.tanh(c * (h + 0.044715 * h ** 3))
        return 0.5 * (1.0 + t) + 0.5 * h * (1.0 - t * t) * c * (1.0 + 3 * 0.044715 * h * h)
    erf = np.vectorize(math.erf, otypes=[np.float64])
    return 0.5 * (1.0 + erf(h / math.sqrt(2.0))) + h * np.exp(-0.5 * h * h) / math.sqrt(2 * math.pi)


def initial_params(v: Variant) -> Dict[str, np.ndarray]:
    rng = np.random.default_rng(1000 + v.seed)
    params = {"fc1.weight": rng.standard_normal((8, 4)) * 0.5,
              "fc1.bias": rng.standard_normal(8) * 0.1,
              "fc2.weight": rng.standard_normal((2, 8)) * 0.5,
              "fc2.bias": rng.standard_normal(2) * 0.1}
    params["fc2.weight"] = params["fc2.weight"] * v.weight_scale
    if v.nan_in_weight:
        params["fc2.weight"][0, 0] = float("nan")
    dt = _np_dtype(v.dtype)
    return {k: p.astype(dt).astype(np.float64) for k, p in params.items()}


def batch_of(v: Variant, step: int, rank: int) -> np.ndarray:
    rng = np.random.default_rng([v.seed, step, rank])
    x = rng.standard_normal((v.batch, 4)) * v.input_scale
    if v.nan_in_input:
        x[0, 0] = float("nan")
    return x


def model_step(v: Variant, params: Dict[str, np.ndarray], step: int, rank: int
               ) -> Tuple[StepBuilder, Dict[str, np.ndarray]]:
    """One training step of the MLP as a capture records it; returns the records (in a
    StepBuilder) and the gradients (the SGD update of the caller's `params` is the caller's)."""
    b = StepBuilder(v.dtype, store=v.task == "tensor", checksum=v.checksum)
    api_level = v.level != "module"
    rnd = lambda x: b.tensor(x)  # noqa: E731 - a computed tensor, rounded to the dtype
    f64 = lambda t: t.values.astype(np.float64)  # noqa: E731

    def api(name: str, prefix: str, index: int, order: int, module: str, direction: str,
            role: str, arg: int, value: Any, key: Optional[str] = None, op: Optional[str] = None
            ) -> None:
        if api_level:
            b.emit(entry=f"{prefix}.{name}.{index}.{direction}", kind="api", prefix=prefix,
                   api=name, op=op or name, module=module, direction=direction, role=role,
                   arg_index=arg, arg_key=str(arg) if key is None else key, call_index=index,
                   order=order, value=value, stack_id=_INSIDE if module else _OUTSIDE)

    def mod(path: str, cls: str, op: str, order: int, direction: str, role: str, value: Tensor
            ) -> None:
        entry = f"Module.{path}.{cls}.{direction}.0" if path else f"Module.{cls}.{direction}.0"
        b.emit(entry=entry, kind="module", prefix="Module", api=cls, op=op, module=path,
               direction=direction, role=role, arg_index=0, arg_key="0", call_index=0,
               order=order, value=value, stack_id=_INSIDE if path else _OUTSIDE)

    def grad(path: str, value: Tensor) -> None:
        owner, _, leaf = path.rpartition(".")
        b.emit(entry=f"Param.{path}.grad", kind="param_grad", prefix="Param", api=path, op=leaf,
               module=owner, direction="backward", role="param_grad", arg_index=0, arg_key="",
               call_index=0, order=0, value=value, alias=path)

    # the parameter inventory at start()
    p = {}
    for path in PARAMS:
        owner, _, leaf = path.rpartition(".")
        p[path] = b.tensor(params[path])
        b.emit(entry=f"Param.{path}", kind="param", prefix="Param", api=path, op=leaf,
               module=owner, direction="none", role="param", arg_index=0, arg_key=leaf,
               call_index=0, order=0, value=p[path], trainable=True, alias=path)

    # forward; `order` counts the forward calls
    extra = 1 if v.extra_call else 0
    x = b.tensor(batch_of(v, step, rank))
    mod("", "MLP", "mlp", 1, "forward", "input", x)
    mod("fc1", "Linear", "linear", 2, "forward", "input", x)
    for k, t in enumerate((x, p["fc1.weight"], p["fc1.bias"])):
        api("linear", "Functional", 0, 3, "fc1", "forward", "input", k, t)
    h = rnd(f64(x) @ params["fc1.weight"].T + params["fc1.bias"])
    api("linear", "Functional", 0, 3, "fc1", "forward", "output", 0, h)
    mod("fc1", "Linear", "linear", 2, "forward", "output", h)
    mod("act", "GELU", "gelu", 4, "forward", "input", h)
    api("gelu", "Functional", 0, 5, "act", "forward", "input", 0, h)
    api("gelu", "Functional", 0, 5, "act", "forward", "input", 1, v.approximate,
        key="approximate")
    g_values = _gelu(f64(h), v.approximate) * v.gelu_scale
    if v.nan_in_gelu:
        g_values[0, 0] = float("nan")
    if v.gelu_swap:
        flat = g_values.reshape(-1)
        flat[0], flat[1] = flat[1], flat[0]
    g = rnd(g_values)
    bits = g.values.reshape(-1).view(np.dtype(f"uint{8 * g.values.itemsize}"))
    if v.gelu_ulps:                      # the first elements one ulp up in magnitude
        bits[:v.gelu_ulps] += 1
    if v.gelu_max_ulps:                  # the largest element (positive) some ulps up
        bits[int(np.nanargmax(g.values.astype(np.float64)))] += v.gelu_max_ulps
    api("gelu", "Functional", 0, 5, "act", "forward", "output", 0, g)
    act_out = g
    if v.extra_call:
        api("mul", "Tensor", 0, 6, "act", "forward", "input", 0, g)
        api("mul", "Tensor", 0, 6, "act", "forward", "input", 1, 1.0)
        act_out = rnd(f64(g) * 1.0)
        api("mul", "Tensor", 0, 6, "act", "forward", "output", 0, act_out)
    mod("act", "GELU", "gelu", 4, "forward", "output", act_out)
    mod("fc2", "Linear", "linear", 6 + extra, "forward", "input", act_out)
    for k, t in enumerate((act_out, p["fc2.weight"], p["fc2.bias"])):
        api("linear", "Functional", 1, 7 + extra, "fc2", "forward", "input", k, t)
    y = rnd(f64(act_out) @ params["fc2.weight"].T + params["fc2.bias"])
    api("linear", "Functional", 1, 7 + extra, "fc2", "forward", "output", 0, y)
    mod("fc2", "Linear", "linear", 6 + extra, "forward", "output", y)
    mod("", "MLP", "mlp", 1, "forward", "output", y)
    # the loss, outside the model
    api("pow", "Tensor", 0, 8 + extra, "", "forward", "input", 0, y)
    api("pow", "Tensor", 0, 8 + extra, "", "forward", "input", 1, 2)
    sq = rnd(f64(y) ** 2)
    api("pow", "Tensor", 0, 8 + extra, "", "forward", "output", 0, sq)
    api("mean", "Tensor", 0, 9 + extra, "", "forward", "input", 0, sq)
    loss = rnd(np.mean(f64(sq)))
    api("mean", "Tensor", 0, 9 + extra, "", "forward", "output", 0, loss)

    # backward, in the order autograd runs it
    dloss = rnd(1.0)
    api("mean", "Tensor", 0, 9 + extra, "", "backward", "grad_output", 0, dloss)
    dsq = rnd(np.full(f64(sq).shape, 1.0 / f64(sq).size))
    api("mean", "Tensor", 0, 9 + extra, "", "backward", "grad_input", 0, dsq)
    api("pow", "Tensor", 0, 8 + extra, "", "backward", "grad_output", 0, dsq)
    dy = rnd(f64(dsq) * 2.0 * f64(y))
    api("pow", "Tensor", 0, 8 + extra, "", "backward", "grad_input", 0, dy)
    mod("", "MLP", "mlp", 1, "backward", "grad_output", dy)
    order2 = 7 + extra
    api("linear", "Functional", 1, order2, "fc2", "backward", "grad_output", 0, dy)
    db2 = rnd(f64(dy).sum(axis=0))
    api("linear", "Functional", 1, order2, "fc2", "backward", "grad_input", 2, db2)
    dg = rnd(f64(dy) @ params["fc2.weight"])
    api("linear", "Functional", 1, order2, "fc2", "backward", "grad_input", 0, dg)
    mod("fc2", "Linear", "linear", 6 + extra, "backward", "grad_output", dy)
    mod("fc2", "Linear", "linear", 6 + extra, "backward", "grad_input", dg)
    grad("fc2.bias", db2)
    dw2 = rnd(f64(dy).T @ f64(act_out))
    api("linear", "Functional", 1, order2, "fc2", "backward", "grad_input", 1, dw2)
    grad("fc2.weight", dw2)
    dg_in = dg
    if v.extra_call:
        api("mul", "Tensor", 0, 6, "act", "backward", "grad_output", 0, dg)
        dg_in = rnd(f64(dg) * 1.0)
        api("mul", "Tensor", 0, 6, "act", "backward", "grad_input", 0, dg_in)
    api("gelu", "Functional", 0, 5, "act", "backward", "grad_output", 0, dg_in)
    dh = rnd(f64(dg_in) * _gelu_grad(f64(h), v.approximate) * v.gelu_scale * v.gelu_grad_scale)
    api("gelu", "Functional", 0, 5, "act", "backward", "grad_input", 0, dh)
    mod("act", "GELU", "gelu", 4, "backward", "grad_output", dg)
    mod("act", "GELU", "gelu", 4, "backward", "grad_input", dh)
    mod("fc1", "Linear", "linear", 2, "backward", "grad_output", dh)
    api("linear", "Functional", 0, 3, "fc1", "backward", "grad_output", 0, dh)
    db1 = rnd(f64(dh).sum(axis=0))
    api("linear", "Functional", 0, 3, "fc1", "backward", "grad_input", 2, db1)
    grad("fc1.bias", db1)
    dw1 = rnd(f64(dh).T @ f64(x) * v.dw_scale)
    api("linear", "Functional", 0, 3, "fc1", "backward", "grad_input", 1, dw1)
    grad("fc1.weight", dw1)
    grads = {"fc1.weight": f64(dw1), "fc1.bias": f64(db1), "fc2.weight": f64(dw2),
             "fc2.bias": f64(db2)}
    return b, grads


# --------------------------------------------------------------------------- writing
def module_tree(v: Variant) -> List[Tuple[str, str, str, str]]:
    """`close_step`'s modules: (path, class, parent, layer settings as JSON text)."""
    approximate = v.settings_approximate or v.approximate
    settings = {"act": json.dumps({"approximate": approximate}, sort_keys=True)}
    return [(path, cls, parent, settings.get(path, "")) for path, cls, parent in MODULES]


def write_step(writer: DumpWriter, step: int, rank: int, parts: Iterable[Tuple[List[Record],
               List[Payload]]], modules: Sequence[Tuple[str, ...]] = (),
               stacks: Sequence[str] = STACKS, attrs: Optional[Dict[str, Any]] = None,
               close: Optional[Dict[str, Any]] = None, world_size: int = 1,
               task: str = "statistics", level: str = "mix") -> None:
    """One capture window of a step, as the capture drives the writer: open_step, one submit
    per batch of records (with their payloads), close_step with the module tree and stacks."""
    from precdbg.version import __version__
    writer.open_step(step, rank, dict({"framework": FRAMEWORK, "task": task, "level": level,
                                       "world_size": world_size,
                                       "precdbg_version": __version__}, **(attrs or {})))
    for records, payloads in parts:
        writer.submit(list(records), list(payloads))
    writer.close_step(list(modules), list(stacks),
                      dict({"interrupted": False, "failures": 0}, **(close or {})))


def manifest_of(v: Variant, rank: int, world_size: int, first: Optional[Record],
                x: Optional[np.ndarray], step: int = 0) -> Dict[str, Any]:
    """What a torch run's run.json manifest holds (precdbg.capture.manifest, the adapter's
    determinism flags and optimizer)."""
    from precdbg.capture.manifest import base_manifest
    manifest = base_manifest(FRAMEWORK, rank, world_size)
    manifest["versions"]["torch"] = "2.13.0+cpu"
    manifest["versions"]["cuda"] = None
    manifest["determinism"] = {"deterministic_algorithms": False, "cudnn_deterministic": False,
                               "cudnn_benchmark": False, "allow_tf32_matmul": False,
                               "allow_tf32_cudnn": True, "float32_matmul_precision": "highest",
                               "initial_seed": v.seed, "num_threads": 1}
    manifest["device"] = {"kind": "cpu", "count": 1}
    manifest["optimizers"] = [{
        "class": "SGD", "id": 1,
        "param_groups": [{"hyper": {"lr": v.lr, "momentum": 0, "dampening": 0,
                                    "weight_decay": 0, "nesterov": False, "maximize": False,
                                    "foreach": None, "differentiable": False, "fused": None},
                          "params": list(PARAMS)}]}]
    if first is not None and x is not None:
        import xxhash
        manifest["first_batch"] = {"step": step, "tensors": [{
            "arg_key": first.arg_key, "dtype": first.dtype, "shape": list(first.shape),
            "min": first.min, "max": first.max, "mean": first.mean, "norm": first.norm,
            "checksum": xxhash.xxh3_64_hexdigest(np.ascontiguousarray(x).view(np.uint8))}]}
    return manifest


def run_info(root: str, v: Variant, manifests: Dict[int, Dict[str, Any]]) -> Dict[str, Any]:
    """run.json as `precdbg.capture.run_file.RunInfo.write` makes it."""
    from precdbg.config import load_config
    from precdbg.records.schema import SCHEMA_VERSION
    from precdbg.version import __version__
    config = load_config(dump_path=root, task=v.task, level=v.level,
                         summary_mode="checksum" if v.checksum else "statistics")
    world = len(v.ranks)
    info = {"schema_version": SCHEMA_VERSION, "precdbg_version": __version__,
            "framework": FRAMEWORK, "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "python": platform.python_version(), "numpy": np.__version__,
            "platform": platform.platform(), "world_size": world,
            "config": config.public_dict(), "pid": os.getpid(),
            "framework_version": "2.13.0+cpu", "device": "cpu", "machine": platform.machine(),
            "threads": 1, "torch_cuda": None}
    lowest = min(manifests)
    info["manifest"] = manifests[lowest]
    if world > 1:
        info["manifests"] = {str(r): m for r, m in manifests.items()}
    return info


def write_run_json(root: str, info: Dict[str, Any]) -> None:
    from precdbg.storage.json_files import write_json_atomic
    from precdbg.storage.layout import run_json_path
    write_json_atomic(run_json_path(root), info)


def _cut_inside(records: List[Record], module: str) -> List[Record]:
    """The records of a step that stopped inside `module`'s forward: everything up to its
    input record (the parameter inventory included), nothing after."""
    cut = next(i for i, r in enumerate(records) if r.kind == "module" and r.module == module
               and r.direction == "forward" and r.role == "input")
    return records[:cut + 1]


def _sgd(v: Variant, params: Dict[str, np.ndarray], grads: Dict[str, np.ndarray]) -> None:
    for path in PARAMS:
        params[path] = (params[path] - v.lr * grads[path]).astype(
            _np_dtype(v.dtype)).astype(np.float64)


def write_dump(root: Any, variant: Optional[Variant] = None, **changes: Any) -> str:
    """Write a synthetic dump of `variant` (or the reference run with `changes`) to `root`:
    every step and rank of the variant, each step's records in two batches (the forward and
    the inventory, then the backward), then run.json. Returns the root."""
    root = os.fspath(root)
    v = dataclasses.replace(variant or Variant(), **changes)
    world = len(v.ranks)
    manifests: Dict[int, Dict[str, Any]] = {}
    for rank in v.ranks:
        writer = DumpWriter(root)
        params = initial_params(v)
        first: Optional[Record] = None
        for step in range(min(v.steps) - v.trained_before, min(v.steps)):   # not written
            _sgd(v, params, model_step(v, params, step, rank)[1])
        for step in sorted(v.steps):
            b, grads = model_step(v, params, step, rank)
            if first is None:
                first = next(r for r in b.records if r.kind == "module" and r.module == ""
                             and r.role == "input")
            if v.stop_in:
                b.records = _cut_inside(b.records, v.stop_in)
            split = next((i for i, r in enumerate(b.records) if r.direction == "backward"),
                         len(b.records))
            ids = {r.tensor_id for r in b.records[:split]}
            early = [p for p in b.payloads if p.tensor_id in ids]
            late = [p for p in b.payloads if p.tensor_id not in ids]
            write_step(writer, step, rank, [(b.records[:split], early),
                                            (b.records[split:], late)],
                       module_tree(v), world_size=world, task=v.task, level=v.level,
                       close={"interrupted": v.interrupted})
            _sgd(v, params, grads)
        assert writer.flush(60) and writer.shutdown(), writer.last_error
        assert writer.errors == 0, writer.last_error
        manifests[rank] = manifest_of(v, rank, world, first,
                                      batch_of(v, min(v.steps), rank).astype(_np_dtype(v.dtype)),
                                      min(v.steps))
    write_run_json(root, run_info(root, v, manifests))
    return root

