"""Static memory planning: assign storage ids to the entries of a kernel sequence.

The planner works on the graph-executor view of a compiled model — entries (one per node
output, with a byte size) and the ordered kernel calls that read and write them — so it is
independent of how the graph was fused.

Algorithm (liveness-based, greedy best fit, TVM's ``GraphPlanMemory`` in spirit):

* Graph inputs and params ("fixed" entries) get dedicated storage: users bind them and the
  executor may share them across executors, so no kernel may scribble over them.
* Walking the kernels in order, each output entry takes the free storage whose size fits
  best (smallest one that is large enough; otherwise the largest free one, grown); a new
  storage is opened only when nothing is free. Outputs are allocated *before* the inputs of
  the same call are released, so a kernel never writes into memory it is still reading.
* An entry's storage is released after its last consumer. Graph outputs may land in reused
  storage but are never released (the user reads them after the run).
* A ``__nop`` output (aliasing reshape) shares its input's storage id; its uses extend the
  lifetime of that storage.
* A ``__concat`` (a concatenation written in place, ``is_view``) places its inputs back to back
  inside its output: they share its storage id at byte offsets (``MemoryPlan.storage_offsets``),
  so their producers write straight into the concatenated tensor and nothing copies them.
  :func:`place_concats` decides the placement; every entry of one placement is live from the
  first write of any of them to the last read of any of them.
* Heterogeneous graphs: with ``devices`` (the DLPack device type of every entry), storage is
  planned per device — an entry only ever reuses storage of its own device, and every
  storage id belongs to exactly one device (``MemoryPlan.storage_devices``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Hashable, Sequence, TypeVar

__all__ = ["PlanOp", "MemoryPlan", "plan_memory", "place_concats"]

K = TypeVar("K", bound=Hashable)


@dataclass(frozen=True)
class PlanOp:
    """One call in execution order.

    Attributes
    ----------
    inputs : tuple of int
        Entry ids read.
    outputs : tuple of int
        Entry ids written.
    is_nop : bool
        A ``__nop`` alias: ``outputs[0]`` shares ``inputs[0]``'s storage.
    is_view : bool
        A ``__concat`` written in place: ``outputs[0]`` is the byte concatenation of
        ``inputs``, which live inside it (no work at run time).
    """

    inputs: tuple[int, ...]
    outputs: tuple[int, ...]
    is_nop: bool = False
    is_view: bool = False


@dataclass
class MemoryPlan:
    """The result of :func:`plan_memory`.

    Attributes
    ----------
    storage_ids : list of int
        Storage id of every entry (the graph JSON ``storage_id`` attribute).
    storage_sizes : list of int
        Bytes of every storage id (its largest entry).
    fixed_storages : set of int
        Storage ids of graph inputs and params (dedicated, never reused).
    planned_bytes : int
        Bytes of all activation storages (everything except inputs and params) — the
        planned peak activation memory.
    no_reuse_bytes : int
        Bytes the activations would need with one buffer per entry (aliases excluded).
    fixed_bytes : int
        Bytes of the input and param storages.
    storage_devices : list of int
        DLPack device type of every storage id (all 1 = CPU unless planned per device).
    storage_offsets : list of int
        Byte offset of every entry inside its storage (non-zero only for the inputs of an
        in-place ``__concat`` and their aliases).
    """

    storage_ids: list[int]
    storage_sizes: list[int]
    fixed_storages: set[int] = field(default_factory=set)
    planned_bytes: int = 0
    no_reuse_bytes: int = 0
    fixed_bytes: int = 0
    storage_devices: list[int] = field(default_factory=list)
    storage_offsets: list[int] = field(default_factory=list)

    @property
    def num_storages(self) -> int:
        """Number of distinct storage ids."""
        return len(self.storage_sizes)

    @property
    def saved_fraction(self) -> float:
        """``1 - planned / no_reuse`` for activations (0 when there are none)."""
        return 0.0 if not self.no_reuse_bytes else 1.0 - self.planned_bytes / self.no_reuse_bytes

    def summary(self) -> str:
        """One line: storages, planned vs no-reuse activation bytes, fixed bytes."""
        return (f"memory plan: {self.num_storages} storages; activations {self.planned_bytes} B "
                f"planned vs {self.no_reuse_bytes} B without reuse "
                f"({100 * self.saved_fraction:.1f}% saved); inputs+params {self.fixed_bytes} B")

    def as_dict(self) -> dict[str, object]:
        """Plain-dict form (for ``factory.get_stats()`` and JSON dumps)."""
        out: dict[str, object] = {"num_storages": self.num_storages, "planned_bytes": self.planned_bytes,
                                  "no_reuse_bytes": self.no_reuse_bytes, "fixed_bytes": self.fixed_bytes,
                                  "storage_sizes": list(self.storage_sizes)}
        if self.storage_devices and any(d != 1 for d in self.storage_devices):
            per: dict[int, int] = {}
            for nb, d in zip(self.storage_sizes, self.storage_devices):
                per[d] = per.get(d, 0) + nb
            out["storage_devices"] = list(self.storage_devices)
            out["bytes_per_device"] = {str(d): b for d, b in sorted(per.items())}
        return out


def plan_memory(entry_bytes: Sequence[int], ops: Sequence[PlanOp], fixed: Sequence[int],
                outputs: Sequence[int], devices: Sequence[int] | None = None) -> MemoryPlan:
    """Plan storage for a sequence of kernel calls.

    Parameters
    ----------
    entry_bytes : sequence of int
        Size in bytes of every entry (index = entry id).
    ops : sequence of PlanOp
        Calls in execution order.
    fixed : sequence of int
        Entries with dedicated storage (graph inputs, params).
    outputs : sequence of int
        Graph output entries (never released).
    devices : sequence of int, optional
        DLPack device type of every entry; storage is then never shared across devices.

    Returns
    -------
    MemoryPlan
    """
    n = len(entry_bytes)
    edev = [1] * n if devices is None else [int(d) for d in devices]
    if len(edev) != n:
        raise ValueError(f"plan_memory: {len(edev)} entry devices for {n} entries")
    sid = [-1] * n
    sizes: list[int] = []
    sdev: list[int] = []  # device type of every storage id
    fixed_sids: set[int] = set()
    for e in fixed:
        if sid[e] < 0:
            sid[e] = len(sizes)
            sizes.append(int(entry_bytes[e]))
            sdev.append(edev[e])
            fixed_sids.add(sid[e])

    # Alias roots: a nop's output is its input's memory; the inputs of an in-place concat are
    # the concatenation's memory at an offset. ``root`` is the entry whose storage an entry
    # uses, ``offset`` where inside it.
    root = list(range(n))
    for op in ops:
        if op.is_nop:
            root[op.outputs[0]] = root[op.inputs[0]]
    fixed_set, out_set = set(fixed), {root[e] for e in outputs}
    views = [(op.outputs[0], tuple(op.inputs)) for op in ops if op.is_view]
    ok, loc = place_concats(views, lambda e: int(entry_bytes[e]),
                            lambda e: e not in fixed_set and e not in out_set and root[e] == e)
    if not all(ok):
        bad = views[ok.index(False)]
        raise ValueError(f"plan_memory: the concatenation of entries {list(bad[1])} into entry {bad[0]} "
                         "cannot be written in place")
    offset = [0] * n
    for e in range(n):
        r = root[e]
        if r in loc:
            root[e], offset[e] = loc[r][0], loc[r][1]
    # Remaining uses per root: reads by kernels (a nop's or view's read is not a use: their
    # readers are), plus the writes still to come into a shared placement, so it is not
    # released before its last member is written.
    refs = [0] * n
    for op in ops:
        if not (op.is_nop or op.is_view):
            for e in op.inputs:
                refs[root[e]] += 1
            for o in op.outputs:
                if root[o] != o:
                    refs[root[o]] += 1
    pinned = {root[e] for e in outputs}

    free_by_dev: dict[int, list[int]] = {}  # device type -> storage ids available for reuse

    def take(nbytes: int, dev: int) -> int:
        free = free_by_dev.setdefault(dev, [])
        if not free:
            sizes.append(nbytes)
            sdev.append(dev)
            return len(sizes) - 1
        fits = [s for s in free if sizes[s] >= nbytes]
        if fits:
            best = min(fits, key=lambda s: (sizes[s], s))
        else:
            # Growing the largest free buffer wastes the least: it is the closest to fitting.
            best = max(free, key=lambda s: (sizes[s], -s))
            sizes[best] = nbytes
        free.remove(best)
        return best

    def release(r: int) -> None:
        if r in pinned or sid[r] in fixed_sids or sid[r] < 0:
            return
        free_by_dev.setdefault(sdev[sid[r]], []).append(sid[r])

    no_reuse = 0
    for op in ops:
        if op.is_nop or op.is_view:
            for o in op.outputs:
                sid[o] = sid[root[o]]
            continue
        for o in op.outputs:
            if sid[o] >= 0:
                continue
            r = root[o]
            if sid[r] < 0:
                sid[r] = take(int(entry_bytes[r]), edev[r])
            sid[o] = sid[r]
            no_reuse += int(entry_bytes[o])
        for o in op.outputs:  # written but never read (nor its placement): free right away
            r = root[o]
            if r != o:
                refs[r] -= 1
            if refs[r] == 0:
                release(r)
        for e in op.inputs:
            r = root[e]
            refs[r] -= 1
            if refs[r] == 0:
                release(r)
    for e in range(n):  # entries no call writes (unused inputs...) still need an id
        if sid[e] < 0:
            sid[e] = sid[root[e]] if root[e] != e and sid[root[e]] >= 0 else len(sizes)
            if sid[e] == len(sizes):
                sizes.append(int(entry_bytes[e]))
                sdev.append(edev[e])
    planned = sum(s for i, s in enumerate(sizes) if i not in fixed_sids)
    fixed_b = sum(sizes[i] for i in fixed_sids)
    return MemoryPlan(sid, sizes, fixed_sids, planned, no_reuse, fixed_b, sdev, offset)


def place_concats(concats: Sequence[tuple[K, Sequence[K]]], nbytes: Callable[[K], int],
                  movable: Callable[[K], bool]) -> tuple[list[bool], dict[K, tuple[K, int]]]:
    """Decide which concatenations can be written in place, and where their pieces go.

    A concatenation whose pieces are contiguous byte ranges of its result (a concat along an
    axis with only 1s before it) needs no copy if every piece is written straight into the
    result. A piece can live in one place only, so chains that share pieces (DenseNet's
    ``c_k = concat(c_{k-1}, y_k)``) must agree: walking the concatenations from the last,
    each places its pieces at their offsets inside its own location, or, when its pieces were
    already placed back to back by a later one, takes their location as its own.

    Parameters
    ----------
    concats : sequence of (output, inputs)
        Candidate concatenations in execution order.
    nbytes : callable
        Byte size of an entry.
    movable : callable
        Whether an entry may be placed inside another one's memory (written by a kernel, not
        a graph input, param, output or alias).

    Returns
    -------
    accepted : list of bool
        Per concatenation, whether it is written in place.
    placement : dict
        ``entry -> (root, byte offset)`` for every entry of an accepted concatenation; a
        root maps to ``(root, 0)`` and owns the memory.
    """
    loc: dict[K, tuple[K, int]] = {}
    accepted = [False] * len(concats)
    for k in range(len(concats) - 1, -1, -1):
        out, ins = concats[k]
        if not ins or not movable(out) or out in ins or len(set(ins)) != len(ins):
            continue
        offs, total = [], 0
        for i in ins:
            offs.append(total)
            total += nbytes(i)
        if total != nbytes(out):
            continue
        if out not in loc and all(i in loc for i in ins):
            r, base = loc[ins[0]]
            if all(loc[i] == (r, base + d) for i, d in zip(ins, offs)):
                loc[out] = (r, base)
                accepted[k] = True
            continue
        r, base = loc.get(out, (out, 0))
        want = [(r, base + d) for d in offs]
        if all(loc[i] == w if i in loc else movable(i) for i, w in zip(ins, want)):
            loc.setdefault(out, (r, base))
            loc.update(zip(ins, want))
            accepted[k] = True
    return accepted, loc
