"""Dataflow provenance at dump time: which record of the step produced the tensor a record reads.

A tensor is known by its storage and the storage's write count (version): every view of a tensor
shares both, and an in-place write makes a new version. The first record that writes a
(storage, version) is its producer; later records of the same bytes (the module that returns
its last op's output, a view, a no-op cast) only pass it through. A parameter's dw record
produces the gradient, and what holds it after backward (`.grad`, `main_grad`) is linked to it
by the adapter through `grad_of`; a later read of those elements at another version (changed by
something not captured, e.g. a collective inside DDP) still names the dw record, and the compare
sees that the bytes changed in between.

A version counter belongs to a tensor object, not to its memory: PyTorch's `p.data` is another
object over `p`'s storage with a counter of its own, so `p.data.mul_(2)` leaves `p._version`
where it was. A captured in-place call therefore also counts a write epoch of the storage it
wrote (`wrote`): the state of a storage is (epoch, version) once it has one, so no tensor over
that memory is taken for its state before the write, and a read whose own counter did not move
names the epoch's writer as its producer.

Only framework-neutral bookkeeping lives here; the adapter answers `storage(tensor)` (keys) and
`storage_ref(tensor)` (is that storage still alive: a freed storage's key may come back).
Each record also gets the number of its storage in the step (`storage`): when several tensors
share one (a gradient buffer holding every parameter's `main_grad`), the compare can still
find what else wrote into that memory.
"""
from __future__ import annotations

from typing import Any, Callable, Dict, Hashable, List, Optional, Tuple

from .contract import TensorOps
from ..records.schema import NO_PRODUCER, READ_ROLES, WRITE_ROLES, Record, Role

__all__ = ["Provenance"]

_PARAM_GRAD = Role.PARAM_GRAD
_Entry = Tuple[int, Callable[[], bool]]          # (producing record's seq, storage alive?)
_MAX_HOLDERS = 8       # live objects kept per (storage, version) whose memory they all hold


class _AnyAlive:
    """Alive while any of several holders of the same memory is."""
    __slots__ = ("refs",)

    def __init__(self, refs: List[Callable[[], bool]]) -> None:
        self.refs = refs

    def __call__(self) -> bool:
        for ref in self.refs:
            if ref():
                return True
        return False


class Provenance:
    """Producers of the tensors of one step, by storage and version (made fresh per step)."""

    def __init__(self, tensors: TensorOps) -> None:
        self.tensors = tensors
        # a reference of a live storage answers as any other reference of it would: another
        # holder of the same memory adds nothing (PyTorch); else each holder is kept (_hold)
        self._refs_follow_memory = bool(getattr(tensors, "STORAGE_REF_FOLLOWS_MEMORY", False))
        self._by_version: Dict[Tuple[Hashable, int], _Entry] = {}
        self._grads: Dict[Tuple[Hashable, Hashable], _Entry] = {}
        self._last_dw: Dict[str, int] = {}
        self._held: List[Any] = []
        self._storages: Dict[Hashable, _Entry] = {}    # storage -> (its number, alive?)
        self._next_storage = 0
        self.epochs: Dict[Hashable, int] = {}          # storage -> in-place writes captured
        self._epoch_writer: Dict[Hashable, Tuple[int, _Entry]] = {}

    def wrote(self, tensor: Any) -> None:
        """A captured call wrote `tensor` in place: every tensor over its storage (whatever
        its own version counter says) now holds a new state."""
        key = self.tensors.storage(tensor)
        if key is not None:
            self.epochs[key[0]] = self.epochs.get(key[0], 0) + 1

    def state(self, store: Hashable, version: int) -> Hashable:
        """The state of a storage as its producers are kept: the version, with the storage's
        write epoch once it has one."""
        epoch = self.epochs.get(store, 0) if self.epochs else 0
        return (epoch, version) if epoch else version

    def _lookup(self, store: Hashable, view: Hashable, state: Hashable) -> int:
        hit = self._by_version.get((store, state))
        if hit is not None and hit[1]():
            return hit[0]
        hit = self._grads.get((store, view))
        if hit is not None and hit[1]():
            return hit[0]
        if self._epoch_writer:           # written through another object at this epoch
            last = self._epoch_writer.get(store)
            if last is not None and isinstance(state, tuple) and last[0] == state[0] \
                    and last[1][1]():
                return last[1][0]
        return NO_PRODUCER

    def note(self, rec: Record, tensor: Any, written: bool = False, seen: Any = None,
             key: Any = False) -> None:
        """Set `rec.producer` for a record that reads its tensor; register a producing record
        (`written`: it wrote the bytes in place without a new version, so it produced them).
        `seen`: the window's distinct-tensor object (precdbg.capture.batch.Seen) of these very bytes;
        where it is, the storage key found for its first record serves every later one. `key`:
        the tensor's `storage` when the caller has it already (None: it has none)."""
        where = seen.storage if seen is not None else None
        if where is None:
            if key is False:
                key = self.tensors.storage(tensor)
            if key is None:
                return
            store = key[0]
            known = self._storages.get(store)
            if known is None or not known[1]():
                known = self._storages[store] = (self._next_storage,
                                                 self.tensors.storage_ref(tensor))
                self._next_storage += 1
            where = (store, key[1], self.state(store, key[2]), known)
            if seen is not None:
                seen.storage = where
        store, view, version, known = where
        rec.storage = known[0]
        role = rec.role
        dw = role == _PARAM_GRAD
        if (role in READ_ROLES or dw) and not written:   # a dw may be a dx passed through
            rec.producer = self._lookup(store, view, version)
        if role in WRITE_ROLES:
            have = self._by_version.get((store, version))
            if dw or written or have is None or not have[1]():
                # every version of a storage lives exactly as long as the storage: one reference
                entry = self._by_version[(store, version)] = (rec.seq, known[1])
                if isinstance(version, tuple):      # (epoch, version): this epoch's writer
                    self._epoch_writer[store] = (version[0], entry)
            elif not self._refs_follow_memory:   # passed through: alive while either is
                self._hold(store, version, have, tensor)
            if dw:
                self._last_dw[rec.api] = rec.seq

    def alias(self, original: Any, copy: Any) -> None:
        """`copy` is a copy of `original` made outside any captured call: same producer."""
        key = self.tensors.storage(original)
        seq = self._lookup(key[0], key[1], self.state(key[0], key[2])) if key is not None \
            else NO_PRODUCER
        dst = self.tensors.storage(copy) if seq != NO_PRODUCER else None
        if dst is None:
            return
        state = self.state(dst[0], dst[2])
        have = self._by_version.get((dst[0], state))
        if have is not None and have[1]():
            self._hold(dst[0], state, have, copy)
        else:
            self._by_version[(dst[0], state)] = (seq, self.tensors.storage_ref(copy))

    def _hold(self, store: Hashable, version: Hashable, have: _Entry, tensor: Any) -> None:
        """Another object holds the same memory (a framework that wraps tensors in new objects
        without copying): the producer stays known while any of them lives. The holders are a
        flat list, pruned of dead ones, of at most `_MAX_HOLDERS` (the same bytes passed through
        a thousand calls cost neither a thousand checks nor a recursion)."""
        known = have[1]
        refs = [ref for ref in (known.refs if isinstance(known, _AnyAlive) else (known,))
                if ref()]
        if len(refs) < _MAX_HOLDERS:
            refs.append(self.tensors.storage_ref(tensor))
        self._by_version[(store, version)] = (have[0], _AnyAlive(refs))

    def grad_of(self, path: str, tensor: Any, hold: bool = False) -> None:
        """`tensor` holds the gradient of parameter `path` (its `.grad`, `main_grad`): its
        producer is that parameter's latest dw record. `hold`: keep the tensor until the step
        ends (a framework that hands the same memory back in another object, so that no weak
        reference tells whether the memory is still the gradient's)."""
        seq: Optional[int] = self._last_dw.get(path)
        key = self.tensors.storage(tensor) if seq is not None else None
        if key is None:
            return
        store, view, version = key
        if hold:
            self._held.append(tensor)
        entry = (seq, (lambda: True) if hold else self.tensors.storage_ref(tensor))
        self._by_version[(store, self.state(store, version))] = entry
        self._grads[(store, view)] = entry
