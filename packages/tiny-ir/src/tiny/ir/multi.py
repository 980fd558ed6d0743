"""Tensors on several devices. A MULTI node stands for one tensor held by several devices: a node per device, each a
shard of the tensor along the node's axis (`arg`), or each the whole tensor where the axis is None (replicated).

An op recorded on MULTI nodes is rewritten at once into the same op on each device's node (`expand_multi`), so that
every graph below a MULTI is an ordinary graph of one device, which the scheduler, autograd and TinyJit take as they
are. The rules, one per kind of op: elementwise ops run per shard, a source laid out otherwise first resharded to
the layout of the first sharded source (a replicated one is sliced where it lies: a view, no copy); a reduction
along the split axis ends in an all-reduce and is replicated; movement ops keep the axis where they can (a reshape
that cuts through shards, a shrink that empties one, a flip of the axis gather the tensor first, or refuse)."""

from __future__ import annotations

import math
from collections.abc import Callable

from tiny.ir.device.collective import bounds, concat, copy_to, split_sizes
from tiny.ir.device.registry import collective_for
from tiny.ir.uop import GroupOp, Ops, UOp

Bounds = tuple[tuple[int, int], ...]


def multi(parts: list[UOp], axis: int | None) -> UOp:
    """The MULTI node of a node per device (shards along `axis`, or whole copies where it is None)."""
    return UOp(Ops.MULTI, parts[0].dtype, tuple(parts), axis)


def devices_of(u: UOp) -> tuple[str, ...]:
    return tuple(s.device for s in u.src)


def shard_bounds(u: UOp) -> Bounds | None:
    """A sharded MULTI's [start, end) of each shard along its axis; None for a replicated one."""
    if u.arg is None:
        return None
    return bounds(tuple(s.shape[u.arg] for s in u.src))


# ---------------------------------------------------------------- making and relaying out


def shard(u: UOp, devices: tuple[str, ...], axis: int | None, cuts: Bounds | None = None) -> UOp:
    """A node (of one device, or a MULTI) laid out on `devices`: split along `axis` (at `cuts`, else in the sizes
    torch.tensor_split gives), or whole on each where axis is None."""
    if u.op is Ops.MULTI:
        if devices_of(u) != devices:
            raise ValueError(f"a tensor on {devices_of(u)} cannot be resharded onto {devices}; gather it first")
        return multi(relayout(u, axis, cuts), axis)
    if axis is None:
        return multi([copy_to(u, d) for d in devices], None)
    size = u.shape[axis]
    if type(size) is not int:
        raise ValueError(f"cannot shard the symbolic axis {axis} of shape {u.shape}")
    if size < len(devices) and cuts is None:
        raise ValueError(
            f"axis {axis} of shape {u.shape} has {size} element(s): too few to split over the {len(devices)} devices "
            f"{devices}; shard another axis, or replicate with .to(devices)"
        )
    cuts = cuts or bounds(split_sizes(size, len(devices)))
    return multi([copy_to(_slice(u, axis, lo, hi), d) for d, (lo, hi) in zip(devices, cuts)], axis)


def relayout(u: UOp, axis: int | None, cuts: Bounds | None) -> list[UOp]:
    """A MULTI's node per device, laid out along `axis` at `cuts` (whole on each where axis is None): its own where it
    is laid out so; slices of each copy where it is replicated (views, no copy); else gathered and sliced."""
    if u.arg == axis and (axis is None or shard_bounds(u) == cuts):
        return list(u.src)
    whole = list(u.src) if u.arg is None else gather(u)
    if axis is None:
        return whole
    cuts = cuts or bounds(split_sizes(u.shape[axis], len(whole)))
    return [_slice(w, axis, lo, hi) for w, (lo, hi) in zip(whole, cuts)]


def gather(u: UOp) -> list[UOp]:
    """The whole tensor on each of a MULTI's devices (its own copies where it is replicated)."""
    if u.arg is None:
        return list(u.src)
    return collective_for(devices_of(u)).all_gather(list(u.src), u.arg)


def _slice(u: UOp, axis: int, lo: int, hi: int) -> UOp:
    if (lo, hi) == (0, u.shape[axis]):
        return u
    if u.op is Ops.EXPAND and u.source.shape[axis] == 1:  # a broadcast: expanded to the slice (its gradient sums the
        # slice, not the whole padded with zeros)
        return UOp(Ops.EXPAND, u.dtype, (u.source,), (*u.arg[:axis], hi - lo, *u.arg[axis + 1 :]))
    arg = tuple((lo, hi) if i == axis else (0, s) for i, s in enumerate(u.shape))
    return UOp(Ops.SHRINK, u.dtype, (u,), arg)


# ---------------------------------------------------------------- the rules, one per kind of op


def _per_device(u: UOp, parts: list[list[UOp]], axis: int | None) -> UOp:
    """The op u on each device's sources (parts: a list of nodes per device for each source)."""
    return multi([u.replace(src=tuple(p[i] for p in parts)) for i in range(len(parts[0]))], axis)


def _elementwise(u: UOp, srcs: tuple[UOp, ...]) -> UOp:
    sharded = next((s for s in srcs if s.arg is not None), None)
    axis, cuts = (None, None) if sharded is None else (sharded.arg, shard_bounds(sharded))
    return _per_device(u, [relayout(s, axis, cuts) for s in srcs], axis)


def _const(u: UOp, srcs: tuple[UOp, ...]) -> UOp:
    """A constant or an arange on several devices: the whole of it on each (it takes no memory)."""
    return multi([u.replace(src=(UOp(Ops.DEVICE, arg=d),)) for d in u.src[0].arg], None)


def _reduce(u: UOp, srcs: tuple[UOp, ...]) -> UOp:
    (x,) = srcs
    op, axes = u.arg
    if x.arg is None or x.arg not in axes:
        return _per_device(u, [list(x.src)], x.arg)
    partial = [u.replace(src=(s,)) for s in x.src]  # each device's part, then the parts combined on every device
    return multi(collective_for(devices_of(x)).all_reduce(op, partial), None)


def _reshape(u: UOp, srcs: tuple[UOp, ...]) -> UOp:
    (x,) = srcs
    if x.arg is None:
        return _per_device(u, [list(x.src)], None)
    new, old, axis = u.arg, x.shape, x.arg
    before, after = math.prod(old[:axis]), math.prod(old[axis + 1 :])
    sizes = [s.shape[axis] for s in x.src]
    for k in range(len(new)):  # the new axis the shards can stay split along: each shard a block of it
        rest = math.prod(new[k + 1 :])
        if math.prod(new[:k]) != before or rest == 0 or any(s * after % rest for s in sizes):
            continue
        pieces = [s * after // rest for s in sizes]
        if sum(pieces) == new[k]:
            shards = [UOp(Ops.RESHAPE, s.dtype, (s,), (*new[:k], p, *new[k + 1 :])) for s, p in zip(x.src, pieces)]
            return multi(shards, k)
    raise ValueError(
        f"reshape from {old} to {new} cuts through the shards of axis {axis} (sizes {sizes}) on {devices_of(x)}; "
        "reshard first with .shard(devices, axis=...) or gather with .to(devices)"
    )


def _permute(u: UOp, srcs: tuple[UOp, ...]) -> UOp:
    (x,) = srcs
    return _per_device(u, [list(x.src)], None if x.arg is None else u.arg.index(x.arg))


def _expand(u: UOp, srcs: tuple[UOp, ...]) -> UOp:
    (x,) = srcs
    if x.arg is None:
        return _per_device(u, [list(x.src)], None)
    axis = x.arg
    shards = [UOp(Ops.EXPAND, s.dtype, (s,), (*u.arg[:axis], s.shape[axis], *u.arg[axis + 1 :])) for s in x.src]
    return multi(shards, axis)


def _pad(u: UOp, srcs: tuple[UOp, ...]) -> UOp:
    (x,) = srcs
    if x.arg is None or u.arg[x.arg] == (0, 0):
        return _per_device(u, [list(x.src)], x.arg)
    axis, (front, back), last = x.arg, u.arg[x.arg], len(x.src) - 1
    shards = []
    for i, s in enumerate(x.src):  # the first shard takes the padding before, the last the padding after
        edge = (front if i == 0 else 0, back if i == last else 0)
        shards.append(UOp(Ops.PAD, s.dtype, (s,), (*u.arg[:axis], edge, *u.arg[axis + 1 :])))
    return multi(shards, axis)


def _shrink(u: UOp, srcs: tuple[UOp, ...]) -> UOp:
    (x,) = srcs
    if x.arg is None:
        return _per_device(u, [list(x.src)], None)
    axis, (lo, hi) = x.arg, u.arg[x.arg]
    cuts = shard_bounds(x) or ()
    kept = [(max(lo, start), min(hi, end)) for start, end in cuts]
    if any(a >= b for a, b in kept):  # a shard would be empty: the kept part is gathered and shrunk on every device
        return _per_device(u, [gather(x)], None)
    shards = [
        UOp(Ops.SHRINK, s.dtype, (s,), (*u.arg[:axis], (a - start, b - start), *u.arg[axis + 1 :]))
        for s, (a, b), (start, _) in zip(x.src, kept, cuts)
    ]
    return multi(shards, axis)


def _flip(u: UOp, srcs: tuple[UOp, ...]) -> UOp:
    (x,) = srcs
    if x.arg is None or x.arg not in u.arg:
        return _per_device(u, [list(x.src)], x.arg)
    return _per_device(u, [gather(x)], None)  # (reversed shards would sit on the devices in reverse order)


def _assign(u: UOp, srcs: tuple[UOp, ...]) -> UOp:
    target, value = srcs
    cuts = shard_bounds(target)
    return _per_device(u, [list(target.src), relayout(value, target.arg, cuts)], target.arg)


RULES: dict[Ops, Callable[[UOp, tuple[UOp, ...]], UOp]] = {
    **{op: _elementwise for op in GroupOp.Elementwise | {Ops.CONTIGUOUS, Ops.DETACH}},
    Ops.CONST: _const,
    Ops.ARANGE: _const,
    Ops.REDUCE_AXIS: _reduce,
    Ops.RESHAPE: _reshape,
    Ops.PERMUTE: _permute,
    Ops.EXPAND: _expand,
    Ops.PAD: _pad,
    Ops.SHRINK: _shrink,
    Ops.FLIP: _flip,
    Ops.ASSIGN: _assign,
}


# ---------------------------------------------------------------- the walk


def expand_multi(root: UOp) -> UOp:
    """root with every op over MULTI nodes rewritten into MULTI nodes of the op per device: the nodes on a tuple of
    devices above the MULTIs (what a Tensor op just recorded), deepest first. A node on one device over a MULTI (an
    op between a tensor on several devices and one on one device) is an error naming both."""
    done: dict[UOp, UOp] = {}
    stack = [root]
    while stack:
        u = stack[-1]
        if u in done:
            stack.pop()
            continue
        if u.op is Ops.MULTI or u.op is Ops.DEVICE or type(u.device) is not tuple:
            if u.op is not Ops.MULTI and u.op is not Ops.DEVICE and (m := _multi_source(u)) is not None:
                raise _mixed(u, m)
            done[u] = u
            stack.pop()
            continue
        todo = [s for s in u.src if s not in done]
        if todo:
            stack.extend(todo)
            continue
        stack.pop()
        done[u] = _expanded(u, tuple(done[s] for s in u.src))
    return done[root]


def _expanded(u: UOp, srcs: tuple[UOp, ...]) -> UOp:
    if u.op is Ops.CONST or u.op is Ops.ARANGE:
        return _const(u, srcs)
    if (rule := RULES.get(u.op)) is None:
        raise NotImplementedError(f"{u.op.name} has no rule for a tensor on several devices {u.device}")
    for s in srcs:
        if s.op is not Ops.MULTI:
            raise _mixed(s, next(m for m in srcs if m.op is Ops.MULTI))
    devices = {devices_of(s) for s in srcs}
    if len(devices) > 1:
        shapes = ", ".join(f"{s.shape} on {devices_of(s)}" for s in srcs)
        raise ValueError(f"{u.op.name} of tensors on different devices: {shapes}; move one with .to(devices)")
    return rule(u, srcs)


def _multi_source(u: UOp) -> UOp | None:
    return next((s for s in u.src if s.op is Ops.MULTI), None)


def _mixed(one: UOp, several: UOp) -> ValueError:
    return ValueError(
        f"an op between a tensor of shape {one.shape} on {one.device} and one of shape {several.shape} on "
        f"{devices_of(several)}; move one with .to() (a tuple of devices replicates, .shard() splits)"
    )


__all__ = ["concat", "devices_of", "expand_multi", "gather", "multi", "relayout", "shard", "shard_bounds"]
