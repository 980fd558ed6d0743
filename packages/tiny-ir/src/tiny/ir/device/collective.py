"""Collectives: how the values of a tensor on several devices are combined (all-reduce) or put together (all-gather).

A collective is written as graph nodes: copies between devices (COPY) and the ops that combine what they bring, so
autograd derives it by its rules, the scheduler fuses the combining into the kernels around it, and TinyJit replays it
as the copies and kernels it ran. `RingCollective` is the default for any devices; a runtime with a faster transport
(an NCCL-like library) subclasses `Collective` and names it in its device class's `collective`, as the CPU names
`SharedMemoryCollective` (its devices' memory is one address space: a kernel reads every device's part where it
lies, so the all-reduce is one kernel a step and no copies)."""

from __future__ import annotations

import math
from collections.abc import Callable

from tiny.ir.uop import Ops, UOp

_COMBINE = {Ops.ADD: "sum", Ops.MAX: "max", Ops.MUL: "product"}
RING_LEAST = 1 << 14  # elements a device below which the ring copies whole values instead (see RingCollective)
# a COPY's arg: the destination's kernels read the source's memory where it lies, with no copy (devices that share
# memory: SharedMemoryCollective). The scheduler realizes the source on its own device, and the kernels that read the
# COPY take that buffer; a COPY asked for as a tensor of its own is copied as any other
IN_PLACE = "in place"


def split_sizes(size: int, parts: int) -> tuple[int, ...]:
    """`size` elements in `parts` pieces as torch.tensor_split cuts them: the first size % parts one longer."""
    base, extra = divmod(size, parts)
    return tuple(base + (i < extra) for i in range(parts))


def bounds(sizes: tuple[int, ...]) -> tuple[tuple[int, int], ...]:
    """The [start, end) of each piece laid end to end."""
    starts = [0]
    for s in sizes:
        starts.append(starts[-1] + s)
    return tuple(zip(starts[:-1], starts[1:]))


def copy_to(u: UOp, device: str) -> UOp:
    """u on `device` (u itself where it is there already)."""
    return u if u.device == device else UOp(Ops.COPY, u.dtype, (u, UOp(Ops.DEVICE, arg=device)))


def read_in_place(u: UOp, device: str) -> UOp:
    """u as a kernel on `device` reads it: in the memory of u's own device (u itself where it is there already)."""
    return u if u.device == device else UOp(Ops.COPY, u.dtype, (u, UOp(Ops.DEVICE, arg=device)), IN_PLACE)


def concat(parts: list[UOp], axis: int) -> UOp:
    """Nodes on one device side by side along `axis`: each padded with zeros to the whole and the padded ones added
    (or-ed for bools), which the scheduler fuses into one kernel."""
    if len(parts) == 1:
        return parts[0]
    total = sum(p.shape[axis] for p in parts)
    combine = Ops.OR if parts[0].dtype.scalar.name == "bool" else Ops.ADD
    out, start = None, 0
    for p in parts:
        size = p.shape[axis]
        pads = tuple((start, total - start - size) if i == axis else (0, 0) for i in range(len(p.shape)))
        padded = UOp(Ops.PAD, p.dtype, (p,), pads)
        out = padded if out is None else UOp(combine, p.dtype, (out, padded))
        start += size
    assert out is not None
    return out


class Collective:
    """How the values of one tensor on several devices (a node per device, in the order of the devices) are combined.
    Both methods return a node per device, in the same order."""

    def all_reduce(self, op: Ops, parts: list[UOp]) -> list[UOp]:
        """On every device, the elementwise `op` (ADD, MAX or MUL) of the parts (of one shape), equal bits on each."""
        raise NotImplementedError

    def all_gather(self, parts: list[UOp], axis: int) -> list[UOp]:
        """On every device, the parts side by side along `axis` (their sizes there may differ)."""
        raise NotImplementedError


class RingCollective(Collective):
    """Copies around the ring of devices. All-reduce: the values, flattened, are cut into one chunk per device; each
    chunk travels the ring once, combined with each device's own chunk as it passes (reduce-scatter), and its total
    then goes to every device (all-gather); each device sends and receives 2 (n - 1) / n of the bytes, whatever n.
    Two devices, or values of fewer than RING_LEAST elements a device, are copied whole to every device and combined
    there, in the order of the devices on each: for two devices the same bytes as the ring, in 1 copy and 1 kernel a
    device where the ring takes 2 and 3 (the kernel fuses into what reads it), and a few small tensors (a batch
    norm's statistics, a bias's gradient) are not cut into pieces smaller than a kernel's launch."""

    def all_reduce(self, op: Ops, parts: list[UOp]) -> list[UOp]:
        return _in_chunks(op, parts, copy_to, _ring_totals)

    def all_gather(self, parts: list[UOp], axis: int) -> list[UOp]:
        return [concat([copy_to(p, d) for p in parts], axis) for d in (p.device for p in parts)]


class SharedMemoryCollective(Collective):
    """For devices whose memory is one address space (the CPU devices of a process): a device's kernel reads another
    device's memory where it lies (read_in_place), so nothing is copied. All-reduce: each device's total is the parts
    combined in the order of the devices by one kernel on it, which fuses into what reads the total; or, for values
    of RING_LEAST elements a device or more on more than two devices, in two steps of one kernel each: device c
    combines chunk c of every part (each device reads 1/n of the bytes of every part, not all of them), then each
    device reads the n chunks' totals into its whole (fused into what reads it). All-gather copies, as the ring does."""

    def all_reduce(self, op: Ops, parts: list[UOp]) -> list[UOp]:
        return _in_chunks(op, parts, read_in_place, _shared_totals)

    def all_gather(self, parts: list[UOp], axis: int) -> list[UOp]:
        return RING.all_gather(parts, axis)  # (copies: a gathered value is often a parameter an update writes later)


Move = Callable[[UOp, str], UOp]  # a node as a kernel on a device reads it (copy_to, read_in_place)


def _in_chunks(
    op: Ops, parts: list[UOp], move: Move, totals_of: Callable[[Ops, list[UOp], list[str], int], list[UOp]]
) -> list[UOp]:
    """The all-reduce of both collectives: two devices, or values of fewer than RING_LEAST elements a device, moved
    whole to every device and combined there in the order of the devices; else the flattened values cut in one chunk
    a device, each chunk's total made on one device (totals_of: chunk c's on device c, in its order), and every
    device's whole the totals side by side."""
    _check(op, parts)
    n, shape = len(parts), parts[0].shape
    if n == 1:
        return list(parts)
    size = math.prod(shape)
    devices = [p.device for p in parts]
    if n == 2 or size < n * RING_LEAST:
        return [_combined(op, [move(p, d) for p in parts]) for d in devices]
    totals = totals_of(op, parts, devices, size)
    return [
        UOp(Ops.RESHAPE, p.dtype, (concat([move(t, d) for t in totals], 0),), shape) for p, d in zip(parts, devices)
    ]


def _ring_totals(op: Ops, parts: list[UOp], devices: list[str], size: int) -> list[UOp]:
    """Chunk c starts on device c and travels the ring, combined with each device's own chunk as it passes: it ends,
    summed, on device c - 1."""
    n = len(parts)
    flat = [UOp(Ops.RESHAPE, p.dtype, (p,), (size,)) for p in parts]
    totals: list[UOp] = []
    for c, (lo, hi) in enumerate(bounds(split_sizes(size, n))):
        acc = UOp(Ops.SHRINK, flat[c].dtype, (flat[c],), ((lo, hi),))
        for step in range(1, n):
            d = (c + step) % n
            own = UOp(Ops.SHRINK, flat[d].dtype, (flat[d],), ((lo, hi),))
            acc = UOp(op, acc.dtype, (copy_to(acc, devices[d]), own))
        totals.append(acc)
    return totals


def _shared_totals(op: Ops, parts: list[UOp], devices: list[str], size: int) -> list[UOp]:
    """Device c combines chunk c of every part, read where each lies."""
    totals = []
    for c, (lo, hi) in enumerate(bounds(split_sizes(size, len(parts)))):
        flat = [UOp(Ops.RESHAPE, p.dtype, (read_in_place(p, devices[c]),), (size,)) for p in parts]
        totals.append(_combined(op, [UOp(Ops.SHRINK, f.dtype, (f,), ((lo, hi),)) for f in flat]))
    return totals


def _check(op: Ops, parts: list[UOp]) -> None:
    if op not in _COMBINE:
        raise ValueError(f"all-reduce combines by {', '.join(o.name for o in _COMBINE)}, not {op.name}")
    if len({p.shape for p in parts}) != 1:
        raise ValueError(f"all-reduce needs parts of one shape, got {[p.shape for p in parts]}")


def _combined(op: Ops, values: list[UOp]) -> UOp:
    out = values[0]
    for v in values[1:]:
        out = UOp(op, out.dtype, (out, v))
    return out


RING = RingCollective()
SHARED_MEMORY = SharedMemoryCollective()
