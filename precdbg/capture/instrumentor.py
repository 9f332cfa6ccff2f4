"""The one shape of a framework adapter: idempotent `install`/`uninstall` around the framework's
own `_instrument`/`_uninstrument` (as OpenTelemetry's instrumentors do), every hook and patch
kept as a handle that removes itself, and the rules both frameworks share written once here: the
model walk, the parameter inventory, the gradient-hook loop, the optimizer phase and guarded hook
execution. A subclass only says how its framework lists modules and parameters and how it hooks
them; it never imports another adapter, and this module imports no framework.
"""
from __future__ import annotations

import logging

from typing import (Any, Callable, ClassVar, ContextManager, Dict, Iterable, List, Optional,
                    Protocol, Set, Tuple, TypeVar)

from ..errors import PrecdbgError
from ..records.layers import raw_settings
from ..records.naming import vocabulary
from .model_walk import named_through
from .contract import Recorder
from ..records.schema import Direction, Phase, RecordKind
from ..storage.json_files import jsonable

__all__ = ["BaseInstrumentor", "ClassPatch", "GuardedHook", "Handle", "NamedTensor", "OptimizerToken",
           "named_through"]

T = TypeVar("T")
_OPTIMIZER, _PARAM, _NONE = Phase.OPTIMIZER, RecordKind.PARAM, Direction.NONE
# an optimizer stepping this often in one captured step: stop() was most likely skipped
_STEPS_OF_A_LEFT_OPEN_CAPTURE = 3

log = logging.getLogger("precdbg")

# (full name, tensor, class name of the module that owns it under that name)
NamedTensor = Tuple[str, Any, str]
# what `optimizer_begins` saw before it changed anything: (phase, paused)
OptimizerToken = Tuple[str, bool]


class Handle(Protocol):
    """Anything installed: torch's RemovableHandle, MindSpore's hook handles, a ClassPatch."""

    def remove(self) -> None: ...


class ClassPatch:
    """One attribute of a class or module replaced by a wrapper of the original.

    `remove()` restores exactly what was there: an attribute the owner held itself is put back
    (the very same object); an inherited one is deleted again so the base class's shows through,
    as before. Creating the patch applies it; if the owner refuses the new attribute nothing is
    changed and the error propagates (AttributeError, TypeError).

    Several debuggers of one process may patch the same attribute, each wrapping what the one
    before installed, and stop in any order. A patch removed while a later one still wraps it
    stays in place, a pass-through of a stopped adapter, until every later one is gone; then
    the attribute is unwound to what it was before the first (`_LIVE`, the patches of each
    attribute in the order applied: the process's one record of what its classes hold).
    """
    __slots__ = ("owner", "attr", "original", "own", "stale")

    def __init__(self, owner: Any, attr: str, make: Callable[[Any], Any]) -> None:
        self.owner, self.attr = owner, attr
        self.own = attr in vars(owner)
        self.original = vars(owner)[attr] if self.own else getattr(owner, attr)
        setattr(owner, attr, make(self.original))
        self.stale = False           # removed while a later patch wraps it
        _LIVE.setdefault((id(owner), attr), []).append(self)

    def remove(self) -> None:
        key = (id(self.owner), self.attr)
        live = _LIVE.get(key)
        if not live or not any(patch is self for patch in live):
            return                   # removed already
        if live[-1] is not self:
            self.stale = True        # a later patch wraps this one: unwound when it goes
            return
        live.pop()._restore()
        while live and live[-1].stale:
            live.pop()._restore()
        if not live:
            del _LIVE[key]

    def _restore(self) -> None:
        if self.own:
            setattr(self.owner, self.attr, self.original)
        elif self.attr in vars(self.owner):
            delattr(self.owner, self.attr)

    def __repr__(self) -> str:
        return f"ClassPatch({getattr(self.owner, '__name__', self.owner)}.{self.attr})"


# (id(owner), attribute) -> the live patches of that attribute, in the order they were applied
_LIVE: Dict[Tuple[int, str], List[ClassPatch]] = {}


class BaseInstrumentor:
    """Owner of every hook, patch and mode precdbg puts into one framework.

    Subclasses set `framework`, `module_type`/`module_type_name` and `Guard`, and write
    `named_submodules`, `own_parameters` (and `own_buffers`), `inventory_role`, `hook_module`,
    `gradient_hooks` and `_instrument`. Everything is registered through `hold`, so `uninstall`
    removes it all whatever fails.
    """
    framework: ClassVar[str] = ""
    module_type: ClassVar[type] = object          # nn.Module / nn.Cell
    module_type_name: ClassVar[str] = ""          # as named in error messages
    # The framework's guard for our own code, made per use as `Guard(self)` (it counts `busy`
    # itself). None: the busy counter alone, inlined in run_guarded because MindSpore runs it
    # several times per record and a context-manager object would add three calls to each.
    Guard: ClassVar[Optional[Callable[[Any], ContextManager[Any]]]] = None

    def __init__(self) -> None:
        self.recorder: Optional[Recorder] = None    # the capture window, while installed
        self.busy = 0            # > 0 inside our own code: nothing it calls is captured
        self.paused = False      # inside an optimizer whose calls are not captured
        self.installed = False
        self._handles: List[Handle] = []
        # the one way anything installed is registered: the list's own append (a C method, no
        # Python layer: backward hooks are registered per captured call)
        self.hold: Callable[[Handle], None] = self._handles.append
        self._optimizers = _OptimizersSeen()     # per capture window
        self._module_paths: Dict[int, str] = {}   # id(module) -> path, while installed
        self._param_paths: Dict[int, str] = {}    # id(parameter) -> its full path, likewise

    # ------------------------------------------------------------------ install / uninstall
    def install(self, session: Recorder, model: Any) -> None:
        """Hook `model` (a module, a list/tuple of them, or None) and the framework; a second
        call while installed is a no-op. Invalid arguments raise before anything is hooked."""
        if self.installed:
            return
        self._prepare(session)
        modules = self.walk(model)
        self.recorder, self.busy, self.paused = session, 0, False
        self._optimizers = _OptimizersSeen()
        self.installed = True
        params = self.named_tensors(modules, self.own_parameters)
        self._param_paths = {id(value): full for full, value, _ in params}
        if modules:
            with self.guard():
                session.set_module_tree([(path, self.class_name(m), path.rpartition(".")[0],
                                          raw_settings(vocabulary(self.framework),
                                                       self.class_name(m), m))
                                         for path, m in modules])
                self._inventory(session, params, self.named_tensors(modules, self.own_buffers))
        self._module_paths = {id(module): path for path, module in modules}
        for path, module in modules:
            self.hook_module(path, module)
        for full, param, _ in params:
            if param.requires_grad:
                for handle in self.gradient_hooks(full, param):
                    self.hold(handle)
        self._instrument(session, params)

    def uninstall(self) -> None:
        """Remove every handle (the last installed first) and restore every patch, even when
        some `remove()` fails (each failure reported once); a no-op when not installed."""
        if not self.installed:
            return
        self.installed = False           # hooks still reached from here on do nothing
        handles = self._handles[:]
        self._handles.clear()            # in place: `hold` is bound to this list
        for handle in reversed(handles):
            try:
                handle.remove()
            except Exception as exc:  # noqa: BLE001 - the rest must still be removed
                if self.recorder is not None:
                    self.recorder.hook_failed(exc, f"removing {type(handle).__name__}")
        self._module_paths = {}
        self._param_paths = {}
        self.paused = False
        self._uninstrument()

    def param_path(self, param: Any) -> Optional[str]:
        """The full path of a parameter of the hooked model (what its inventory and gradient
        records name it; not a framework's own name for it, which a submodule replaced after
        construction keeps from where it was made), or None."""
        return self._param_paths.get(id(param))

    def module_path(self, candidates: Iterable[Any]) -> str:
        """The path of the first of `candidates` that is a module of the hooked model ("" for
        none): what a recompute replays, from what the framework's checkpoint holds."""
        paths = self._module_paths
        return next((paths[id(c)] for c in candidates if id(c) in paths), "")

    # ------------------------------------------------------------------ what subclasses write
    def _prepare(self, session: Recorder) -> None:
        """Refuse a framework state hooks cannot work in, and read what this window needs of
        the framework, before anything is installed."""

    def _instrument(self, session: Recorder, params: List[NamedTensor]) -> None:
        """Install what is not per module or per parameter (API capture, optimizer, patches)."""
        raise NotImplementedError

    def _uninstrument(self) -> None:
        """Forget per-install state after every handle is removed."""

    def named_submodules(self, module: Any) -> Iterable[Tuple[str, Any]]:
        """(path, module) of a module and everything below it, the module itself as ""."""
        raise NotImplementedError

    def class_name(self, module: Any) -> str:
        """The module's class as its entries name it: the model's own class, where a framework
        wrapper replaced it by a subclass of its own (FSDP2's `FSDP<class>`)."""
        return type(module).__name__

    def own_parameters(self, module: Any) -> Iterable[Tuple[str, Any]]:
        """(name, parameter) held by this module itself (not its children)."""
        raise NotImplementedError

    def own_buffers(self, module: Any) -> Iterable[Tuple[str, Any]]:
        """(name, buffer) held by this module itself; frameworks without buffers have none."""
        return ()

    def inventory_role(self, leaf: str, value: Any, is_param: bool) -> Tuple[str, bool]:
        """(role, trainable) of one inventory entry."""
        raise NotImplementedError

    def hook_module(self, path: str, module: Any) -> None:
        """Register the forward (and backward) hooks of one module through `hold`."""
        raise NotImplementedError

    def gradient_hooks(self, path: str, param: Any) -> Iterable[Handle]:
        """The hooks that record a trainable parameter's gradient (dw)."""
        raise NotImplementedError

    # ------------------------------------------------------------------ model walk
    def check_model(self, model: Any) -> None:
        """Refuse what `start(model)` cannot hook, before anything is written or installed:
        one module, a non-empty list/tuple of distinct modules, or None (no module hooks)."""
        if model is None or isinstance(model, self.module_type):
            return
        if not isinstance(model, (list, tuple)):
            raise PrecdbgError(f"start(model): expected a {self.module_type_name} or a list of "
                               f"them, got {type(model).__name__}")
        if not model:
            raise PrecdbgError(f"start(model): an empty {type(model).__name__}; give the model "
                               "(or a list of its parts), or call start() for no module hooks")
        seen: Dict[int, int] = {}
        for i, item in enumerate(model):
            if not isinstance(item, self.module_type):
                raise PrecdbgError(f"start(model): item {i} is {type(item).__name__}, "
                                   f"not a {self.module_type_name}")
            if id(item) in seen:
                raise PrecdbgError(f"start(model): item {i} is item {seen[id(item)]} again; "
                                   "give each model once")
            seen[id(item)] = i

    def walk(self, model: Any) -> List[Tuple[str, Any]]:
        """(path, module) of every module of `model`: one module, a list/tuple of them (paths
        prefixed `"{i}."`, the item itself `"{i}"`), or None (no module hooks)."""
        self.check_model(model)
        if model is None:
            return []
        if isinstance(model, self.module_type):
            return list(self.named_submodules(model))
        out: List[Tuple[str, Any]] = []
        for i, item in enumerate(model):
            out.extend((f"{i}.{p}" if p else str(i), sub) for p, sub in self.named_submodules(item))
        return out

    # ------------------------------------------------------------------ parameters
    def named_tensors(self, modules: List[Tuple[str, Any]],
                      own: Callable[[Any], Iterable[Tuple[str, Any]]]) -> List[NamedTensor]:
        """Every parameter (or buffer) of the walked modules, a shared (tied) one once under
        its first name, as `named_parameters()` does."""
        seen, out = set(), []
        for path, module in modules:
            for name, value in own(module):
                if value is None or id(value) in seen:
                    continue
                seen.add(id(value))
                out.append((f"{path}.{name}" if path else name, value,
                            self.class_name(module)))
        return out

    def _inventory(self, session: Recorder, params: List[NamedTensor],
                   buffers: List[NamedTensor]) -> None:
        """Name, shape, dtype, trainable flag and statistics of every parameter and buffer."""
        for is_param, items in ((True, params), (False, buffers)):
            for full, value, owner in items:
                leaf = full.rpartition(".")[2]
                role, trainable = self.inventory_role(leaf, value, is_param)
                call = session.param_call(full, _PARAM, owner, role=role)
                if call is None:
                    continue
                session.capture(call, _NONE, role, 0, leaf, value, trainable=trainable)
                session.end_call(launch=False)      # parameters share statistics launches
        session.end_call()

    # ------------------------------------------------------------------ optimizer phase
    def optimizer_begins(self, optimizer: Any, describe: Callable[[Any], Dict[str, Any]]
                         ) -> OptimizerToken:
        """An optimizer starts: noted once in the manifest, phase `optimizer`, capture paused
        unless `include_optimizer`. Returns what `optimizer_ends` restores."""
        session = self.recorder
        token = (session.phase, self.paused)
        seen = self._optimizers
        if id(optimizer) not in seen.noted:
            seen.noted.add(id(optimizer))
            self.run_guarded(self._note_optimizer, "recording the optimizer", optimizer,
                             describe)
        steps = seen.steps[id(optimizer)] = seen.steps.get(id(optimizer), 0) + 1
        if steps == _STEPS_OF_A_LEFT_OPEN_CAPTURE:
            session.say_once("left open", "precdbg: step %d has been captured through %d steps "
                             "of %s: stop() did not run (an exception skipped it?); everything "
                             "runs captured, and slower, until stop()", session.current_step,
                             steps, type(optimizer).__name__)
        session.phase = _OPTIMIZER
        self.paused = self.paused or not session.config.include_optimizer
        self.pause_changed()
        return token

    def optimizer_ends(self, token: OptimizerToken) -> None:
        """The optimizer is done: the phase (and pause) current before it are back, so an
        optimizer run inside another region leaves that region's phase as it was."""
        self.recorder.phase, self.paused = token
        self.pause_changed()

    def closure_in_step(self, closure: Callable[..., T], token: OptimizerToken
                        ) -> Callable[..., T]:
        """`closure` as the optimizer that began with `token` should call it: a closure
        handed to an optimizer (LBFGS evaluates the loss and gradients in it, several times per
        step) runs the model, so its calls are captured in the phase, and under the pause,
        current before the optimizer began; the optimizer's own phase is back after each call."""
        def closure_in_step(*args: Any, **kwargs: Any) -> T:
            if not self.installed:
                return closure(*args, **kwargs)
            inside = (self.recorder.phase, self.paused)
            self.optimizer_ends(token)
            try:
                return closure(*args, **kwargs)
            finally:
                if self.installed:
                    self.optimizer_ends(inside)
        return closure_in_step

    def optimizer_step_pre(self, optimizer: Any, args: Any, kwargs: Any) -> Any:
        """A global optimizer step pre-hook of PyTorch's shape (`torch.optim.optimizer.
        register_optimizer_step_pre_hook`, which torch shims copy): the optimizer phase begins;
        a closure among the step's arguments (LBFGS) is handed on through `closure_in_step`.
        Returns what such a hook returns: None, or the (args, kwargs) to step with."""
        if not self.installed:
            return None
        token = self.optimizer_begins(optimizer, self.describe_param_groups)
        self._optimizers.tokens.append(token)
        # torch hands the hook step's arguments with the optimizer itself first
        at = 1 if args and args[0] is optimizer else 0
        if len(args) > at and callable(args[at]):
            closure = self.closure_in_step(args[at], token)
            return tuple(args[:at]) + (closure,) + tuple(args[at + 1:]), kwargs
        if callable(kwargs.get("closure")):
            return args, dict(kwargs, closure=self.closure_in_step(kwargs["closure"], token))
        return None

    def optimizer_step_post(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        """The global post-hook that pairs with `optimizer_step_pre`."""
        if self.installed and self._optimizers.tokens:
            self.optimizer_ends(self._optimizers.tokens.pop())
        return None

    def describe_param_groups(self, optimizer: Any) -> Dict[str, Any]:
        """A PyTorch-style optimizer for the manifest: its class, and per param group its
        hyperparameters and the names of its parameters (as the model's records name them)."""
        groups = [{"hyper": {k: jsonable(v) for k, v in group.items() if k != "params"},
                   "params": [self.param_path(p) or f"<unnamed {tuple(p.shape)}>"
                              for p in group["params"]]}
                  for group in optimizer.param_groups]
        return {"id": id(optimizer), "class": type(optimizer).__name__, "param_groups": groups}

    def pause_changed(self) -> None:
        """`paused` has just changed: a framework whose interposer must follow it (taken off
        while paused) does so here."""

    def _note_optimizer(self, optimizer: Any, describe: Callable[[Any], Dict[str, Any]]) -> None:
        self.recorder.note_optimizer(describe(optimizer))

    # ------------------------------------------------------------------ guarded execution
    def guard(self) -> ContextManager[Any]:
        """Our own code runs inside this: nothing it calls is captured (errors propagate)."""
        return self.Guard(self) if self.Guard is not None else _Busy(self)

    def quietly(self, fn: Callable[..., T], *args: Any) -> T:
        """Run our own code with the framework: no capture (errors propagate to the caller)."""
        with self.guard():
            return fn(*args)

    def run_guarded(self, fn: Callable[..., T], where: str, *args: Any) -> Optional[T]:
        """Run our own code from a hook: nothing it calls is captured and nothing it raises
        reaches training (failures go to `session.hook_failed(exc, where)`)."""
        guard = self.Guard
        try:
            if guard is None:
                self.busy += 1
                try:
                    return fn(*args)
                finally:
                    self.busy -= 1
            with guard(self):
                return fn(*args)
        except Exception as exc:  # noqa: BLE001 - never raise into training
            self.recorder.hook_failed(exc, where)
            return None


class GuardedHook:
    """A hook as one object (no closure: hooks are made per captured call, and each closure cell
    is one more object for the garbage collector to walk). Calling it runs `record(session,
    *args)` inside the adapter's guard, then ends the call; nothing it raises reaches training
    (reported as `where()`), and once the adapter is uninstalled it does nothing. Subclasses
    write `record` and `where`, and list their own fields in `__slots__`."""
    __slots__ = ("adapter",)

    def __init__(self, adapter: BaseInstrumentor) -> None:
        self.adapter = adapter

    def __call__(self, *args: Any) -> None:
        adapter = self.adapter
        if not adapter.installed:
            return None
        session = adapter.recorder
        try:
            with adapter.guard():
                self.record(session, *args)
                session.end_call()
        except Exception as exc:  # noqa: BLE001 - never raise into training
            session.hook_failed(exc, self.where())
        return None

    def record(self, session: Recorder, *args: Any) -> None:
        raise NotImplementedError

    def where(self) -> str:
        raise NotImplementedError


class _Busy:
    """The busy counter as a context (for `guard()` where no framework guard is set)."""
    __slots__ = ("owner",)

    def __init__(self, owner: BaseInstrumentor) -> None:
        self.owner = owner

    def __enter__(self) -> "_Busy":
        self.owner.busy += 1
        return self

    def __exit__(self, *exc: Any) -> None:
        self.owner.busy -= 1


class _OptimizersSeen:
    """The optimizers one capture window saw: noted in the manifest once, how often each
    stepped (a capture left open through several steps is said), and the tokens of those
    stepping now (`optimizer_begins`, innermost last)."""
    __slots__ = ("noted", "steps", "tokens")

    def __init__(self) -> None:
        self.noted: Set[int] = set()
        self.steps: Dict[int, int] = {}
        self.tokens: List[OptimizerToken] = []
