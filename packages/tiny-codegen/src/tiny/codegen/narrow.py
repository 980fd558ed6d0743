"""Narrowing a sum's loops to the iterations that can add something other than 0.

A padded window reads padding at the border: a convolution's input gradient is a full convolution of the output
gradient, and a fifth of its kernel rows (for a 5x5 kernel over 20 rows) read the rows of zeros around it; each
product adds 0. Where every lane a sum adds is 0 unless its loop counter r lies in [lo, hi), with lo and hi
depending only on loops outside r's (the gate of a load the lane multiplies by: 3 < ih + kh, ih + kh < 24), r's
loop counts max(lo, 0) .. min(hi, end) instead of 0 .. end, and the gate clauses that said so are dropped (always
true there now). Skipping a product of 0 with a weight differs only where the weight is inf or NaN, as in
PyTorch, whose convolutions never multiply their padding.
"""

from __future__ import annotations

import functools

from tiny.ir.device import RendererCaps
from tiny.ir.symbolic import linear_form, simplify
from tiny.ir.uop import Ops, UOp, substitute

Bound = UOp | None  # a bound on the counter (lo inclusive, hi exclusive); None: no bound on that side
Interval = tuple[Bound, Bound] | None  # where a value may be nonzero; None: nowhere (the value is always 0)
UNBOUNDED: Interval = (None, None)


def narrow_loops(sink: UOp, caps: RendererCaps) -> UOp:
    """Each sum's loop over a counter whose lanes are 0 outside an interval runs over that interval only: on loop
    devices (a GPU's threads share a loop's count with their workgroup, its barriers and its warp's tensor cores)."""
    if caps.has_local or not any(u.op is Ops.INDEX and u.gate is not None for u in sink.toposort):
        return sink
    reduced = {x for u in sink.toposort if u.op is Ops.REDUCE for x in u.ranges}
    for r in [u for u in sink.toposort if u.op is Ops.RANGE]:
        narrowed = _narrow(sink, r) if r in reduced else _narrow_output(sink, r)
        if narrowed is not None:
            sink = narrowed
    return sink


def _narrow_output(sink: UOp, r: UOp) -> UOp | None:
    """Output loop r counting only the iterations where some store reading r may store: where every such store is
    gated by a bound on r that reads no loop (a dim padded to a multiple of the threads, each thread's share of it
    ending where the dim does: gidx0*R + r < S), the loop stops there and the gates say nothing more. Its body is
    then a plain loop that the C compiler vectorizes, with a tail, where a gate in every iteration kept it scalar."""
    stores = [u for u in sink.src if u.op is Ops.STORE and r in u.toposort]
    if not stores or any(st.address.gate is None for st in stores):
        return None
    finder = _Finder(r, frozenset())
    interval: Interval = None
    for st in stores:
        interval = _union(interval, finder.nonzero(st.address.gate))
    return None if interval is None else _bounded(sink, r, interval, finder)


def _narrow(sink: UOp, r: UOp) -> UOp | None:
    """The kernel with loop r narrowed, or None where it cannot be (or nothing is gained)."""
    sums = [u for u in sink.toposort if u.op is Ops.REDUCE and r in u.ranges]
    if not sums or any(s.arg is not Ops.ADD for s in sums) or _used_outside(sink, r, sums):
        return None
    inner = {x for s in sums for x in s.ranges[s.ranges.index(r) + 1 :]}
    reduced = {x for u in sink.toposort if u.op is Ops.REDUCE for x in u.ranges}
    # loops outside r's: the output loops, and the loops of these sums that open before r's
    outer = ({u for u in sink.toposort if u.op is Ops.RANGE} - reduced) | ({x for s in sums for x in s.ranges} - inner)
    finder = _Finder(r, frozenset(outer - {r}))
    interval: Interval = None
    for s in sums:
        interval = _union(interval, finder.nonzero(s.value))
    if interval is None:
        return None  # nothing but zeros: left to the simplifier
    return _bounded(sink, r, interval, finder)


def _bounded(sink: UOp, r: UOp, interval: tuple[Bound, Bound], finder: _Finder) -> UOp | None:
    """The kernel with loop r counting over `interval` only (clipped to 0 .. its end), the gate clauses that gave
    the interval's bounds dropped; None where that clips nothing."""
    lo, hi = first = interval
    end = r.end
    if lo is not None and lo.vmax <= 0:
        lo = None
    if hi is not None and end.op is Ops.CONST and hi.vmin >= end.arg:
        hi = None
    if lo is None and hi is None:
        return None
    start = UOp.const(r.dtype, 0) if lo is None else simplify(lo.maximum(0))
    stop = end if hi is None else _minimum(hi, end)
    loop = UOp(Ops.RANGE, r.dtype, (simplify(stop - start),), r.arg)
    # a clause that gave the bound now holds in every iteration (lo <= start <= counter, counter < stop <= hi)
    implied = {c: UOp.const(c.dtype, True) for c, b in finder.clauses.items() if _gives(b, first)}
    return simplify(_replace(substitute(sink, implied), r, loop, loop + start))


def _gives(clause: tuple[Bound, Bound], bounds: tuple[Bound, Bound]) -> bool:
    lo, hi = clause
    return (lo is not None and lo is bounds[0]) or (hi is not None and hi is bounds[1])


def _used_outside(sink: UOp, r: UOp, sums: list[UOp]) -> bool:
    """Whether something other than the values these sums add up reads counter r."""
    seen: set[UOp] = set(sums)
    stack = [sink]
    while stack:
        u = stack.pop()
        if u in seen:
            continue
        seen.add(u)
        if u is r:
            return True
        stack.extend(u.src)
    return False


def _replace(root: UOp, r: UOp, loop: UOp, value: UOp) -> UOp:
    """root with counter r read as `value`, and the sums over r summing over `loop` instead (substitute would put
    `value` among their loops too)."""
    done: dict[UOp, UOp] = {r: value}
    for u in root.toposort:
        if u is r:
            continue
        src = tuple(done[s] for s in u.src)
        if u.op is Ops.REDUCE and r in u.ranges:
            src = (src[0],) + tuple(loop if x is r else x for x in u.ranges)
        done[u] = u if src == u.src else u.replace(src=src)
    return done[root]


class _Finder:
    """Where values may be nonzero (conditions true), as an interval of counter r whose bounds read only the `outer`
    loops."""

    def __init__(self, r: UOp, outer: frozenset[UOp]) -> None:
        self.r, self.outer = r, outer
        self.clauses: dict[UOp, tuple[Bound, Bound]] = {}  # gate clauses that bound r, and the bound each gives
        self.found: dict[UOp, Interval] = {}

    def nonzero(self, v: UOp) -> Interval:
        """Where v may be other than 0: a lane of a sum (float or int), or a condition (bool: where it may be true).
        Sources first, without recursing (a sum of unrolled lanes is a deep chain)."""
        for u in v.toposort:
            if u not in self.found:
                self.found[u] = self._at(u)
        return self.found[v]

    def _at(self, u: UOp) -> Interval:
        src = [self.found.get(s, UNBOUNDED) for s in u.src]
        if u.op is Ops.CONST:
            return UNBOUNDED if u.arg else None  # (0, 0.0 and False are nowhere nonzero)
        if u.op is Ops.LOAD:  # a gated load reads 0 where its gate is false
            alt, gate = u.alternative, u.address.gate
            zero = alt is not None and alt.op is Ops.CONST and alt.arg == 0
            return self.found[gate] if zero and gate is not None else UNBOUNDED
        if u.op in (Ops.MUL, Ops.AND):
            return _intersect(src[0], src[1])
        if u.op in (Ops.ADD, Ops.OR, Ops.VECTORIZE):
            return functools.reduce(_union, src, None)
        if u.op in (Ops.NEG, Ops.CAST, Ops.GEP):
            return src[0]
        if u.op is Ops.WHERE:
            return _union(_intersect(src[0], src[1]), src[2])
        if u.op is Ops.CMPLT and u.dtype.count == 1 and (bound := self.clause(u)) is not None:
            self.clauses[u] = bound
            return bound
        return UNBOUNDED

    def clause(self, c: UOp) -> tuple[Bound, Bound] | None:
        """a < b where b - a = k*r + rest (k = 1 or -1, rest reading outer loops only): r >= 1 - rest (k = 1) or
        r < rest (k = -1)."""
        a, b = c.src
        if not (a.dtype.is_int and b.dtype == a.dtype):
            return None
        diff = b - a
        lin = linear_form(diff)
        if lin is None or lin[0].get(self.r) not in (1, -1):
            return None
        k = lin[0][self.r]
        rest = simplify(diff - self.r * k)
        if any(u.op in (Ops.LOAD, Ops.REDUCE) or (u.op is Ops.RANGE and u not in self.outer) for u in rest.toposort):
            return None
        return (simplify(UOp.const(rest.dtype, 1) - rest), None) if k == 1 else (None, rest)


def _union(a: Interval, b: Interval) -> Interval:
    if a is None or b is None:
        return b if a is None else a
    return _join(a[0], b[0], low=True, widen=True), _join(a[1], b[1], low=False, widen=True)


def _intersect(a: Interval, b: Interval) -> Interval:
    if a is None or b is None:
        return None
    return _join(a[0], b[0], low=True, widen=False), _join(a[1], b[1], low=False, widen=False)


def _join(x: Bound, y: Bound, low: bool, widen: bool) -> Bound:
    """Two bounds of one side as one: the wider (union) or the narrower (intersection); None is no bound."""
    if x is None or y is None:
        return None if widen else (y if x is None else x)
    if x is y:
        return x
    smaller = low == widen  # the union's low bound is the smaller one, the intersection's the larger
    return _minimum(x, y) if smaller else simplify(x.maximum(y))


def _minimum(x: UOp, y: UOp) -> UOp:
    return simplify(-((-x).maximum(-y)))
