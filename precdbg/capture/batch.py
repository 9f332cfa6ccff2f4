"""The records of a capture window on their way to the writer: distinct tensors, their statistics
handles, host copies, and when a batch must cross to the host.

A distinct tensor (same storage bytes in the same order at the same version) is summarised once
and copied once per window, whatever number of records read it; views of exactly the same
elements in another order (a transpose) share its statistics. Statistics handles come from the
adapter's `TensorOps`: host statistics are computed at capture (`_fastats`) and come back as the
finished row itself (a tuple), which nothing resolves, but their batch streams to the writer
every `BATCH_TENSORS`; a deferrable handle (statistics enqueued into
a device result buffer) costs nothing and waits for the window's end, so a step's device
statistics cross to the host once. Handles that keep tensors alive, and host copies of the tensor
task, count their bytes: a batch crosses once it holds `BATCH_BYTES`.
"""
from __future__ import annotations

import weakref
from typing import Any, Dict, Hashable, List, Optional, Sequence, Tuple

from ..records.precision import UNKNOWN
from .contract import TensorOps
from ..records.schema import Record
from ..storage.step_file import Payload

__all__ = ["Seen", "TensorBatch", "BATCH_TENSORS", "BATCH_BYTES"]

BATCH_TENSORS = 256            # host statistics (and host copies) go to the writer per this many
BATCH_BYTES = 64 << 20         # ... or once this many bytes of tensors are held for them
# a host (non-deferrable) handle costs at least this share of the budget, so host statistics
# stream in batches of BATCH_TENSORS
HOST_HANDLE_SHARE = BATCH_BYTES // BATCH_TENSORS


_NO_VALUES = -1       # _Stats.slot: memory nobody had written, no statistics taken
_FINISHED = -2        # ... the row came back finished from `summarize` (host statistics)


class _Stats:
    """Statistics of a set of elements (shared by every view that holds exactly those)."""
    __slots__ = ("ref", "slot", "values", "first")

    def __init__(self, ref: Any, slot: int) -> None:
        self.ref, self.slot = ref, slot     # slot: its handle's index in the batch, or above
        self.values: Optional[Sequence[float]] = None   # min, max, mean, norm, nan, inf
        self.first: Optional["Seen"] = None     # the distinct tensor they were taken for


class Seen:
    """A distinct tensor (same bytes, same order) of this window: its id, statistics, payload."""
    __slots__ = ("ref", "tensor_id", "stats", "copied", "precision", "storage")

    def __init__(self, ref: Any, tensor_id: int, stats: _Stats) -> None:
        self.ref, self.tensor_id, self.stats = ref, tensor_id, stats
        self.copied = False
        self.precision = UNKNOWN   # the lowest float precision its values went through (rank)
        self.storage: Any = None     # its storage key, filled in by precdbg.capture.provenance

    @property
    def has_values(self) -> bool:
        """False for memory nobody had written (see TensorBatch.seen_tensor's `values`)."""
        return self.stats.slot != _NO_VALUES

    def storage_holds(self, store: Hashable) -> bool:
        """Whether `store` is the storage these bytes were first seen in and it is still alive
        (`storage` is precdbg.capture.provenance's (storage, view, state, (number, alive))): then its
        memory cannot have been freed and handed out again, whatever became of the object that
        was seen first."""
        where = self.storage
        return where is not None and where[0] == store and where[3][1]()


def _dead_ref() -> None:
    return None


class TensorBatch:
    """One capture window's distinct tensors and the batch not yet handed to the writer."""

    def __init__(self, tensors: TensorOps, checksum: bool) -> None:
        self.tensors = tensors
        self.checksum = checksum
        self._seen: Dict[Hashable, Seen] = {}
        self._stats_seen: Dict[Hashable, _Stats] = {}
        self._next_tensor_id = 0
        self._handles: List[Any] = []
        self._batch_stats: List[_Stats] = []
        self._held_bytes = 0
        self._firsts: List[_Stats] = []    # every _Stats whose `first` is set (see release)
        self._pending: List[Tuple[Record, Optional[Seen]]] = []
        self._copies: List[Tuple[Seen, Any, bool]] = []
        # tensor objects captured in this window: id -> (weak reference, state, facts, Seen)
        self._objects: Dict[int, Tuple[Any, Hashable, Any, Seen]] = {}
        self.object_state = getattr(tensors, "object_state", None)

    def distinct(self, tensor: Any, written: bool, values: bool,
                 epochs: Dict[Hashable, int]) -> Tuple[Any, Seen]:
        """((dtype, shape, numel, storage), Seen) of a tensor being recorded: what an earlier
        record of the same unchanged object learnt, or its facts read now and its distinct
        tensor found (`seen_tensor`). `epochs`: writes captured per storage (precdbg.capture.provenance)
        that made its bytes a state of their own."""
        known = self.known_object(tensor) if self.object_state is not None and not written \
            else None
        if known is not None:
            return known
        dtype, shape, numel, keys, where = self.tensors.facts(tensor)
        if numel == 0:
            keys = None          # no elements, no unique address: every empty tensor is its own
        elif epochs and keys is not None and where is not None:
            epoch = epochs.get(where[0])
            if epoch:            # written in place through another object: a state of its own
                keys = ((keys[0], epoch), (keys[1], epoch))
        seen = self.seen_tensor(tensor, written, keys, values,
                                where[0] if where is not None else None)
        facts = (dtype, shape, numel, where)
        if written:
            self.forget_objects()        # these bytes changed under every object over them
        elif keys is not None and self.object_state is not None:
            self.remember_object(tensor, facts, seen)
        return facts, seen

    def known_object(self, tensor: Any) -> Optional[Tuple[Any, Seen]]:
        """(facts, Seen) of a tensor object captured earlier in this window whose state (the
        framework's `object_state`: PyTorch's version and data pointer) has not changed since:
        the same bytes, so what was learnt then holds (60 % of a GPT step's records reread an
        object already captured, as the output of one call and the input of the next)."""
        entry = self._objects.get(id(tensor))
        if entry is None or entry[0]() is not tensor or entry[1] != self.object_state(tensor):
            return None
        return entry[2], entry[3]

    def remember_object(self, tensor: Any, facts: Any, seen: Seen) -> None:
        state = self.object_state(tensor)
        if state is not None:
            try:
                self._objects[id(tensor)] = (weakref.ref(tensor), state, facts, seen)
            except TypeError:
                pass

    def forget_objects(self) -> None:
        """Something wrote tensors without a new version (a collective, a write through
        another object over the same memory): no object's earlier facts are trusted."""
        if self._objects:
            self._objects = {}

    def seen_tensor(self, tensor: Any, written: bool = False, keys: Any = False,
                    values: bool = True, store: Optional[Hashable] = None) -> Seen:
        """The distinct tensor this one is (same storage bytes, order and version), reusing the
        statistics of any live view of exactly the same elements in the same row-major order
        (the statistics key: `pos_mean` depends on the order; not when `written`). `keys`:
        the tensor's identity when the caller has it already (None: it has none). `values`:
        False for memory nobody has written yet (`torch.empty`): no statistics are taken.
        `store`: the tensor's storage key, when the caller has it: bytes first seen through an
        object that is gone since (the gradient a backward hook saw, read again as `.grad`)
        are still these bytes while their storage lives."""
        if keys is False:
            keys = self.tensors.identity(tensor)
        stats_key, data_key = keys if keys is not None else (None, None)
        try:
            ref: Any = weakref.ref(tensor)
        except TypeError:
            ref = _dead_ref
        if data_key is not None and not written:
            seen = self._seen.get(data_key)
            if seen is not None and self._holds(seen, seen, data_key, store, ref):
                return seen
        stats = self._stats_seen.get(stats_key) if stats_key is not None else None
        if stats is not None and not self._holds(stats, stats.first, stats_key, store, ref):
            stats = None                 # gone, or its memory was freed and handed out again
        if not values and stats is None:
            stats = _Stats(ref, _NO_VALUES)  # values stay unknown (NaN) in every record
            if stats_key is not None:
                self._stats_seen[stats_key] = stats
        elif stats is None or written:
            handle = self.tensors.summarize(tensor)
            if type(handle) is tuple:            # the finished row: nothing left to resolve
                stats = _Stats(ref, _FINISHED)
                stats.values = handle
                self._held_bytes += HOST_HANDLE_SHARE
            else:
                stats = _Stats(ref, len(self._handles))
                self._handles.append(handle)
                held = self.tensors.retained_bytes(handle)
                self._held_bytes += held if self.tensors.deferrable(handle) \
                    else max(held, HOST_HANDLE_SHARE)
                self._batch_stats.append(stats)
            if stats_key is not None:
                self._stats_seen[stats_key] = stats
        seen = Seen(ref, self._next_tensor_id, stats)
        self._next_tensor_id += 1
        if stats.first is None:
            stats.first = seen
            self._firsts.append(stats)
        if data_key is not None:
            self._seen[data_key] = seen
        return seen

    def release(self) -> None:
        """The window is over: everything the batch holds is let go (a hook reached after
        stop() finds an empty batch). Its distinct tensors and their statistics reference each
        other (`_Stats.first`), cycles only Python's cyclic collector would free (gpt2-tiny:
        ~1,200 per dumped step, with their storage references): a loop that turns the collector
        off (Megatron's --manual-gc) would keep them all until it collects. Cut here, they go
        by reference counting."""
        for stats in self._firsts:
            stats.first = None
        self._firsts = []
        self._objects = {}
        self._seen, self._stats_seen = {}, {}
        self._pending, self._copies, self._handles, self._batch_stats = [], [], [], []
        self._held_bytes = 0

    def _holds(self, entry: Any, first: Optional[Seen], key: Hashable,
               store: Optional[Hashable], ref: Any) -> bool:
        """Whether an entry of this window (a `Seen` or its `_Stats`) still describes the
        memory `key` names: the object it holds is alive and still holds that memory, or it is
        gone and the storage `first` was seen in is alive (the entry then holds `ref`, the
        object seen now)."""
        held = entry.ref()
        if held is not None:
            return self.tensors.holds(held, key)
        if store is None or first is None or not first.storage_holds(store):
            return False
        entry.ref = ref
        return True

    def add(self, rec: Record, seen: Optional[Seen]) -> None:
        self._pending.append((rec, seen))

    def copy(self, seen: Seen, tensor: Any, store: bool) -> None:
        """Start the host copy of a distinct tensor (once per window)."""
        if seen.copied:
            return
        seen.copied = True
        handle = self.tensors.to_host(tensor)
        self._copies.append((seen, handle, store))
        self._held_bytes += self.tensors.retained_bytes(handle)

    def full(self) -> bool:
        return self._held_bytes >= BATCH_BYTES or len(self._copies) >= BATCH_TENSORS

    def empty(self) -> bool:
        return not self._pending and not self._handles

    def take(self) -> Tuple[List[Record], List[Payload]]:
        """The batch's records with their statistics and its payloads: one host crossing for
        the statistics and one wait for the copies. The batch is taken first, so a failure
        drops this batch, never the next ones."""
        handles, batch_stats, pending, copies = (self._handles, self._batch_stats,
                                                 self._pending, self._copies)
        self._handles, self._batch_stats, self._pending, self._copies = [], [], [], []
        self._held_bytes = 0
        if handles:
            try:
                values = self.tensors.resolve(handles)
            except Exception:
                self._forget_stats(batch_stats)
                raise
            rows = values.tolist()           # Python floats once, not numpy scalars per field
            for stats in batch_stats:
                stats.values = rows[stats.slot]
        payloads: List[Payload] = []
        if copies:
            arrays, ready = self.tensors.hand_over([handle for _, handle, _ in copies])
            for (seen, _, store), array in zip(copies, arrays):
                payloads.append(Payload(seen.tensor_id, array, store, self.checksum, ready))
        records: List[Record] = []
        for rec, seen in pending:
            if seen is not None:
                v = seen.stats.values
                if v is not None:
                    rec.min, rec.max, rec.mean, rec.norm, nan, inf, rec.pos_mean = v
                    rec.nan_count, rec.inf_count = int(nan), int(inf)
            records.append(rec)
        return records, payloads

    def _forget_stats(self, lost: Sequence[_Stats]) -> None:
        """Statistics that could not be computed: later records of the same tensors retry."""
        dead = {id(stats) for stats in lost}
        self._objects = {}
        self._stats_seen = {k: v for k, v in self._stats_seen.items() if id(v) not in dead}
        self._seen = {k: v for k, v in self._seen.items() if id(v.stats) not in dead}
