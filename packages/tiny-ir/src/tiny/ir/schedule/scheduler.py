"""The scheduler: cut a tensor-level graph into kernels.

Elementwise ops fuse into their consumers and into reductions; a reduction, its elementwise inputs and
its elementwise epilogue are one kernel. A node becomes a buffer (a kernel output) only where it must:
it was asked for, it is CONTIGUOUS or crosses devices, it is a reduction seen through a movement op or
inside another reduction, it is math over a reduction that a product reads broadcast (computed again for every
column otherwise), or a chain of movement ops over it is not one View.

A row's reductions stay in the kernel of the row's elements that read them (softmax, the norms: one kernel): a
reduction whose result an EXPAND broadcasts back along the axes it reduced, through elementwise ops only, where the
device can (_fuses_rows). The kernel then has one more dim per reduced axis, after the value's own: the reductions read
their row along the new dims (stride 0 along the value's), the rest has size 1 there.

Each kernel is a small AST: SINK(WRITE(DEFINE_GLOBAL, VIEW, value)) where value is built from
READ(DEFINE_GLOBAL, VIEW), CONST(VIEW), ALU ops and REDUCE_AXIS (tiny.ir.spec.validate_ast checks the form).
Movement ops are gone: they are the VIEWs.
"""

from __future__ import annotations

import functools
import math
import operator
from dataclasses import dataclass

from tiny.ir import profile, sint, viz
from tiny.ir.config import PROFILE, SCHEDULE_CACHE, VIZ
from tiny.ir.device import buffer_of, device_computes, new_buffer, new_buffer_view, opened_caps
from tiny.ir.device.collective import IN_PLACE
from tiny.ir.dtypes import dtypes, truncate
from tiny.ir.pattern import PatternMatcher, UPat, graph_rewrite
from tiny.ir.schedule.cache import SCHEDULES, Schedule, ScheduleItem, Template, check_same, structure_of
from tiny.ir.uop import GroupOp, Ops, UOp, binds_made, evaluate, record_below
from tiny.ir.views import View, strides_for_shape


def is_realized(u: UOp) -> bool:
    """A node that already is memory: a BUFFER, or a reshape of a whole BUFFER (a MULTI: each device's part is)."""
    op = u.op  # (asked of every live tensor at every realize: the members as globals, see _BUFFER; the reshape's
    # source as src[0], without the call of the `source` property)
    if op is _BUFFER or (op is _RESHAPE and u.src[0].op is _BUFFER):
        return True
    return op is _MULTI and all(map(is_realized, u.src))


def is_memory(u: UOp) -> bool:
    """A node that views memory: movement ops (none, or several) over a BUFFER."""
    while u.op in GroupOp.Movement:
        u = u.source
    return u.op is _BUFFER


# Python 3.11 finds an Enum's member through EnumType's __getattr__ hook, ten times a global's cost: the members the
# hottest tests compare with, once
_BUFFER, _RESHAPE, _MULTI = Ops.BUFFER, Ops.RESHAPE, Ops.MULTI


# ---------------------------------------------------------------- which nodes become buffers


@dataclass(frozen=True)
class _Path:
    """How a node is reached from the root of its kernel."""

    under_reduce: bool = False  # through a reduction that is fused into this kernel
    moved: bool = False  # through a movement op
    at_root: bool = True  # only through reshapes of the root (which the output's view absorbs)
    reshapes_only: bool = False  # ... under a CONTIGUOUS root: its permutes are the layout asked for, not absorbed
    spread: int = 1  # how many places broadcasts under a fused reduction put each value in
    # in a row's broadcast: under an EXPAND (to this shape) of math over reductions, through elementwise ops only
    row: tuple[sint.sint, ...] | None = None
    rows_only: bool = True  # every reduction it went through was reached through a row's broadcast


_PEELED = (Ops.RESHAPE, Ops.PERMUTE)  # movement ops a kernel's output view takes over at the root
_ASKED = (Ops.CONTIGUOUS, Ops.COPY, Ops.ASSIGN)  # nodes whose memory holds them in their own order


SPREAD_WORK = 1 << 20  # math a reduction reads broadcast, computed again this many times or more in all (its values x
# the places each goes to), is computed once, where it holds a reduction of its own: a layer norm before a product,
# each normalized value computed again for every column block of the product, one scalar at a time (3 projections of
# 8192 x 320: 24.4 -> 12.3 ms). Less, the kernel more costs more (a decode step's probabilities over a few keys)
SPREAD_OPS = 4  # ... and at least this many ops of it: a bias added to a product costs less computed again


def _child_path(parent: UOp, path: _Path, rows: set[UOp]) -> _Path:
    if path.at_root and (parent.op is Ops.RESHAPE or (parent.op is Ops.PERMUTE and not path.reshapes_only)):
        return path
    if path.at_root and parent.op is Ops.CONTIGUOUS:
        return _Path(path.under_reduce, path.moved, True, not _peels_permutes(parent))
    if parent in rows and not path.moved and path.rows_only:
        # a row's max or sum read by every element of the row (softmax, the norms): the reductions of this shape
        # under it, through elementwise ops, stay in the kernel (see _KernelBuilder), each computed once a row
        return _Path(path.under_reduce, False, False, spread=path.spread, row=parent.arg)
    if path.row is not None and (parent.op in GroupOp.Elementwise or parent.op is Ops.DETACH):
        return path
    spread = path.spread * (_spread(parent) if path.under_reduce and parent.op is Ops.EXPAND else 1)
    return _Path(
        path.under_reduce or parent.op is Ops.REDUCE_AXIS,
        path.moved or parent.op in GroupOp.Movement,
        False,
        spread=spread,
        rows_only=path.rows_only and (parent.op is not Ops.REDUCE_AXIS or _in_row(parent, path)),
    )


def _row_expands(sink: UOp) -> set[UOp]:
    """The EXPANDs that broadcast reductions back along the axes they reduced (through elementwise ops: a row's max,
    the reciprocal of its sum) on devices that keep such rows in one kernel (_fuses_rows)."""
    below: dict[UOp, frozenset] = {}  # node -> the source shapes of the reductions under it through elementwise ops
    out = set()
    for u in sink.toposort:
        if u.op is Ops.REDUCE_AXIS:
            below[u] = frozenset({u.source.shape}) if _fuses_rows(u) else frozenset()
        elif u.op in GroupOp.Elementwise or u.op is Ops.DETACH:
            below[u] = frozenset().union(*(below.get(s, frozenset()) for s in u.src))
        elif u.op is Ops.EXPAND and u.arg in below.get(u.source, ()):
            out.add(u)
    return out


def _fuses_rows(r: UOp) -> bool:
    """Whether a kernel on the reduction's device computes it where the elements of its row read it (softmax, the
    norms: one kernel, the row read again from cache): over the last axes (a row along memory: a column's elements
    lie a row apart, and a kernel walking columns reads each again from memory, not from cache: a softmax over the
    columns of 1024 x 1024 1.6 -> 2.4 ms on the CPU), where each thread runs loops (the CPU); on a GPU where a
    workgroup's threads can share it through local memory (tiny.codegen.opt's ROWS: one reduced axis of a known
    size). Not on a device not opened (its caps unknown)."""
    caps = opened_caps(r.device) if type(r.device) is str else None
    shape = r.source.shape
    axes = sorted(a for a in r.arg[1] if shape[a] != 1)
    if caps is None or not axes or any(shape[d] != 1 for d in range(axes[0], len(shape)) if d not in axes):
        return False
    if not caps.has_local:
        return True
    return caps.has_shared and len(axes) == 1 and all(type(n) is int for n in shape)


def _in_row(reduce: UOp, path: _Path) -> bool:
    """Whether the path reaches the reduction through a row's broadcast: an EXPAND back to the shape it reduced."""
    return path.row is not None and path.row == reduce.source.shape


def _spread(expand: UOp) -> int:
    """How many places an EXPAND puts each value of its source in (1 where a dim is symbolic)."""
    grown = [n // o for n, o in zip(expand.arg, expand.source.shape) if type(n) is int and type(o) is int and o]
    return math.prod(grown)


def _peels_permutes(contiguous: UOp) -> bool:
    """Whether a CONTIGUOUS root's permutes move into its store view too: over a reduction, which is then written
    in the asked-for layout where it is computed (not realized and copied). Over anything else the kernel is a copy
    whose loops follow the asked-for layout."""
    u = contiguous.source
    while u.op in _PEELED:
        u = u.source
    return u.op is Ops.REDUCE_AXIS


def _realize_set(sink: UOp, forced: set[UOp]) -> set[UOp]:
    """The nodes that must become buffers."""
    realize = {t for t in sink.src if not is_realized(t)} | forced
    for u in sink.toposort:
        if u.op in (Ops.CONTIGUOUS, Ops.COPY, Ops.ASSIGN) and not _in_place(u):
            realize.add(u)
        if u.op is Ops.COPY and not is_realized(u.source):
            realize.add(u.source)
    paths: dict[UOp, set[_Path]] = {}
    rows = _row_expands(sink)
    for u in reversed(sink.toposort):
        if u.op is Ops.SINK or is_realized(u) or u.op is Ops.DEVICE:
            continue
        seen_as = paths.get(u, ())
        if u.op is Ops.REDUCE_AXIS and any(
            (p.under_reduce or p.moved or p.row is not None) and not _in_row(u, p) for p in seen_as
        ):
            realize.add(u)
        elif (
            u.op in GroupOp.Elementwise
            and _spread_work(u, paths.get(u, ())) >= SPREAD_WORK
            and _math_over_reduction(u) >= SPREAD_OPS
        ):
            realize.add(u)
        mine = {_Path()} if u in realize else paths.get(u, set())
        if u.op is Ops.COPY:
            continue  # a copy's source is its own kernel's root
        for s in u.src[1:] if u.op is Ops.ASSIGN else u.src:  # an assign's target is memory, not a value
            paths.setdefault(s, set()).update(_child_path(u, p, rows) for p in mine)
    return realize


def _spread_work(u: UOp, paths: set[_Path]) -> int:
    """How many times a kernel computes u's values again, where broadcasts put them in many places (0 where u's
    shape is symbolic)."""
    size = math.prod(u.shape)
    return (max((p.spread for p in paths), default=1) - 1) * size if type(size) is int else 0


def _math_over_reduction(u: UOp) -> int:
    """How many elementwise ops u computes from a reduction's result (through movement ops), where it reads one: a
    normalization, an activation of a product; 0 where it reads none (math over memory alone, as weights
    dequantized or cast where a product reads them, which as a buffer would take their full size in memory)."""
    todo, seen, ops, reduced = [u], set(), 0, False
    while todo:
        x = todo.pop()
        if x.op is Ops.REDUCE_AXIS:
            reduced = True
        elif (x.op in GroupOp.Elementwise or x.op in GroupOp.Movement) and x not in seen and not is_realized(x):
            seen.add(x)
            ops += x.op in GroupOp.Elementwise
            todo += x.src
    return ops if reduced else 0


# ---------------------------------------------------------------- kernel ASTs


class _Unexpressible(Exception):
    """A kernel cannot be built as it is (a chain of movement ops over `node` is not one View, the root's reshape
    is not one of its output's view, an assign would read its target through another view than it writes, or the
    kernel takes more buffers than its device binds): realize `node` (or store it in its own layout, where the
    scheduler chose another) and schedule again.

    An exception, not a pass that finds these nodes first: each is found by building the kernel itself (the view
    composed down the path from the kernel's root, the loads' views, the arguments counted), and the nodes realized
    decide where every kernel starts and so what the others compose; a pass deciding first would walk each kernel the
    way the builder does, a second walker that must agree with it exactly. Rare: 74 restarts in 2197 schedules planned
    by tiny-ir's tests, test_ops and test_nn_layers."""

    def __init__(self, node: UOp) -> None:
        self.node = node


def _apply(view: View, m: UOp) -> View:
    if m.op is Ops.RESHAPE:
        if (out := view.reshape(m.arg)) is None:
            raise _Unexpressible(m.source)
        return out
    if m.op is Ops.PERMUTE:
        return view.permute(m.arg)
    if m.op is Ops.EXPAND:
        return view.expand(m.arg)
    if m.op is Ops.PAD:
        return view.pad(m.arg)
    if m.op is Ops.SHRINK:
        return view.shrink(m.arg)
    assert m.op is Ops.FLIP, m.op
    return view.flip(m.arg)


def _view_through(start: View, path: tuple[UOp, ...]) -> View:
    """`start` seen through the movement ops on the path (listed from the kernel root down)."""
    for m in reversed(path):
        start = _apply(start, m)
    return start


def _memory_view(shape: tuple[int, ...], layout: tuple[int, ...] | None) -> View:
    """A view of `shape` over memory that holds it with its dims in the order `layout` (None: as they are)."""
    if layout is None:
        return View.create(shape)
    return View.create(tuple(shape[d] for d in layout)).permute(tuple(layout.index(d) for d in range(len(shape))))


def _layout_of(ast: UOp, args: list[UOp]) -> tuple[int, ...] | None:
    """The order of dims in which a kernel's largest input lies in memory (outermost first), where that is not the
    order of its output's dims: a value the scheduler keeps for itself is stored in that order, so the kernel writes
    in the order it reads and later kernels read it alongside that input (a convolution's output kept channels
    innermost stays so through the activations and pools after it). Dims the input broadcasts along stay after the
    dim before them."""
    views = [(args[u.buffer.arg].arg[1], u.view) for u in ast.toposort if u.op is Ops.READ]
    views = [(size, v) for size, v in views if not v.empty_mask]
    if not views or any(type(s) is not int for _, v in views for s in v.shape + v.strides):
        return None  # (none, or symbolic: stored as it is)
    # the largest buffer, where its view moves the most
    view = max(views, key=lambda sv: (sv[0], sum(st != 0 for st in sv[1].strides)))[1]
    read = [d for d, (size, st) in enumerate(zip(view.shape, view.strides)) if size > 1 and st != 0]
    order = sorted(read, key=lambda d: -abs(view.strides[d]))
    if order == read:
        return None
    for d in range(len(view.shape)):  # the rest follow the dim before them
        if d not in read:
            order.insert(order.index(d - 1) + 1 if d > 0 else 0, d)
    return tuple(order)


def _stores_across(ast: UOp, store: View) -> bool:
    """Whether a reduction's kernel would store its values along a dim no input is read along, where inputs are
    read along another of its output dims: its vectors, which follow memory, would then gather one operand or
    scatter the stores (attention's keys transposed as their projection computes them: 3.5 -> 34 ms). A permute
    asked of such a reduction is then a copy of it, through vectors both ways."""
    inner = [d for d, (n, st) in enumerate(zip(store.shape, store.strides)) if st == 1 and n != 1]
    if not inner or not any(u.op is Ops.REDUCE_AXIS for u in ast.toposort):
        return False
    reads = [u.view for u in ast.toposort if u.op is Ops.READ]
    along = {d for v in reads for d, (n, st) in enumerate(zip(v.shape, v.strides)) if st == 1 and n != 1}
    outputs = {d for d, n in enumerate(store.shape) if n != 1}
    return inner[0] not in along and bool(along & outputs)


def _write(out: UOp, view: View, value: UOp) -> UOp:
    """A kernel's AST: the value written to buffer `out` through `view`."""
    return UOp(Ops.SINK, src=(UOp(Ops.WRITE, src=(out, UOp(Ops.VIEW, arg=view), value)),))


class _KernelBuilder:
    def __init__(
        self, root: UOp, realize: set[UOp], buffers: dict[UOp, UOp], free: set[UOp], layouts: dict[UOp, tuple[int, ...]]
    ) -> None:
        self.root, self.realize, self.buffers, self.free, self.layouts = root, realize, buffers, free, layouts
        self.args: list[UOp] = []  # tensor-level buffer nodes, in argument order
        # a row kernel (softmax, a norm): its value's shape and the axes its rows' reductions reduce, which become
        # new dims after the value's (see _rows)
        self.shape: tuple[sint.sint, ...] = ()
        self.row_axes: tuple[int, ...] = ()

    def global_arg(self, buf: UOp) -> UOp:
        if buf not in self.args:
            self.args.append(buf)
        return UOp(Ops.DEFINE_GLOBAL, buf.dtype.ptr(buf.arg[1]), (), self.args.index(buf))

    def build(self) -> UOp:
        if self.root.op is Ops.ASSIGN:
            return self.build_assign()
        # reshapes and permutes at the root move into the output's view: the kernel computes what is below them (under
        # a CONTIGUOUS root reshapes only, unless a reduction is below them: see _peels_permutes)
        value, store_view, peeled = self.root, View.create(self.root.shape), _PEELED
        asked = value.op is Ops.CONTIGUOUS
        if asked:
            value, peeled = value.source, _PEELED if _peels_permutes(value) else (Ops.RESHAPE,)
        permuted = False
        while value.op in peeled and value.source not in self.realize and not is_realized(value.source):
            if value.op is Ops.PERMUTE:
                store_view = store_view.permute(tuple(value.arg.index(i) for i in range(len(value.arg))))
                permuted = True
            elif (reshaped := store_view.reshape(value.source.shape)) is not None:
                store_view = reshaped
            else:
                raise _Unexpressible(value.source)
            value = value.source
        out = self.global_arg(self.buffers[self.root])
        self.shape, self.row_axes = value.shape, self._rows(value)
        ast = self.node(value, ())
        if asked and permuted and _stores_across(ast, store_view):
            raise _Unexpressible(value)  # computed in its own order, then copied into the one asked for
        if self.row_axes:
            return _write(out, self.placed(store_view, False), ast)
        if self.root in self.free and value is self.root and (layout := _layout_of(ast, self.args)) is not None:
            self.layouts[self.root] = layout  # the scheduler's own value: stored as its kernel reads
            store_view = _memory_view(self.root.shape, layout)
        return _write(out, store_view, ast)

    def build_assign(self) -> UOp:
        """Write the value into the target's memory, through the target's view of its buffer."""
        target, value = self.root.target, self.root.value
        base, path = memory_of(target)
        store_view = _view_through(View.create(base.shape), path)
        out = self.global_arg(base)
        ast = self.node(value, ())  # (an assign's value has no rows: _rows is not asked, row_axes stays empty)
        for u in ast.toposort:  # reading this memory anywhere but where this thread writes would race
            if u.op is Ops.READ and u.buffer is out and u.view != store_view:
                raise _Unexpressible(value)
        return _write(out, store_view, ast)

    def _rows(self, value: UOp) -> tuple[int, ...]:
        """The axes the row reductions in value's kernel reduce (none where it has none): reductions that
        _realize_set left in the kernel although an EXPAND broadcasts their result back along the reduced axes."""
        todo, seen = [value], set()
        while todo:
            u = todo.pop()
            if u in seen or self._is_leaf(u):
                continue
            seen.add(u)
            if u.op is Ops.REDUCE_AXIS and u.source.shape == value.shape:
                return tuple(a for a in u.arg[1] if u.source.shape[a] != 1)
            todo += u.src
        return ()

    def placed(self, view: View, row: bool) -> View:
        """A view of the value's shape in a row kernel's dims: the value's, then one new dim per reduced axis. The
        output and what is computed from it have size 1 in the new dims; a row reduction's source reads its row along
        them, and is the same for every element of the row (stride 0 along the reduced axes, the value's last:
        _fuses_rows, so the loops along the row are inside the others' and its reductions are computed once a row)."""
        rows, new = self.row_axes, len(self.row_axes)
        if not rows:
            return view
        mask = view.mask
        if not row:
            return View.create(
                view.shape + (1,) * new, view.strides + (0,) * new, view.offset, mask and mask + ((0, 1),) * new
            )
        shape = view.shape + tuple(view.shape[a] for a in rows)
        strides = tuple(0 if d in rows else st for d, st in enumerate(view.strides))
        if mask is not None:
            mask = tuple((0, n) if d in rows else m for d, (n, m) in enumerate(zip(view.shape, mask)))
            mask += tuple(view.mask[a] for a in rows)
        strides += tuple(view.strides[a] for a in rows)
        return View.create(shape, strides, view.offset, mask)

    def node(self, u: UOp, path: tuple[UOp, ...]) -> UOp:
        """The kernel AST of tensor-level node u, seen through the movement ops on path (root first)."""
        return evaluate((u, path, False), self._children, self._combine)

    def _is_leaf(self, u: UOp) -> bool:
        return u is not self.root and (u in self.realize or is_realized(u) or _in_place(u))

    def _children(self, key: tuple[UOp, tuple[UOp, ...], bool]) -> list[tuple[UOp, tuple[UOp, ...], bool]]:
        """Keys: (node, the movement ops above it, root first; whether it is in a row reduction's source)."""
        u, path, row = key
        if self._is_leaf(u) or u.op is Ops.CONST or u.op is Ops.ARANGE:
            return []
        if u.op in GroupOp.Movement:
            return [(u.source, path + (u,), row)]
        if u.op is Ops.REDUCE_AXIS:
            if path:  # (_realize_set leaves one seen through a movement op only under a row's broadcast)
                axes = tuple(a for a in u.arg[1] if u.source.shape[a] != 1)
                if path[-1].arg != u.source.shape or u.source.shape != self.shape or axes != self.row_axes:
                    raise _Unexpressible(u)  # another kernel's shape or rows: computed in its own kernel
            elif self.row_axes:
                raise _Unexpressible(u)  # a row kernel's reductions are its rows'
            return [(u.source, (), bool(path))]
        if u.op in GroupOp.Elementwise or u.op in (Ops.CONTIGUOUS, Ops.DETACH):
            return [(s, path, row) for s in u.src]
        raise NotImplementedError(f"the scheduler cannot put {u.op} in a kernel")

    def _combine(self, key: tuple[UOp, tuple[UOp, ...], bool], srcs: list[UOp]) -> UOp:
        u, path, row = key
        if self._is_leaf(u):
            memory = u.source if _in_place(u) and u not in self.realize else u  # (the source's buffer, where it lies)
            buf = (
                self.buffers[memory] if memory in self.realize else memory if memory.op is Ops.BUFFER else memory.source
            )
            view = self.placed(_view_through(_memory_view(u.shape, self.layouts.get(memory)), path), row)
            return UOp(Ops.READ, u.dtype, (self.global_arg(buf), UOp(Ops.VIEW, arg=view)))
        if u.op is Ops.CONST:
            view = _view_through(View.create(()), path)
            return UOp(Ops.CONST, u.dtype, (UOp(Ops.VIEW, arg=self.placed(view, row) if view.shape else view),), u.arg)
        if u.op is Ops.ARANGE:  # (index math where it is read: no memory)
            view = self.placed(_view_through(View.create((u.arg,)), path), row)
            return UOp(Ops.ARANGE, u.dtype, (UOp(Ops.VIEW, arg=view),), u.arg)
        if u.op in GroupOp.Movement:
            inner = srcs[0]
            if u.op is not Ops.PAD or inner.op in (Ops.READ, Ops.CONST, Ops.ARANGE):
                return inner  # reads and constants read padding as 0 by their view's mask
            valid = self.placed(_view_through(View.create(u.source.shape), path + (u,)), row)
            zero = View.create(valid.shape, (0,) * len(valid.shape))
            cond = UOp(Ops.CONST, dtypes.bool, (UOp(Ops.VIEW, arg=valid),), True)
            return cond.where(inner, UOp(Ops.CONST, u.dtype, (UOp(Ops.VIEW, arg=zero),), truncate(u.dtype, 0)))
        if u.op in (Ops.CONTIGUOUS, Ops.DETACH):
            return srcs[0]
        if u.op is Ops.REDUCE_AXIS and path:  # a row's reduction: over the new dims
            n = len(self.shape)
            return UOp(u.op, u.dtype, tuple(srcs), (u.arg[0], tuple(range(n, n + len(self.row_axes)))))
        return UOp(u.op, u.dtype, tuple(srcs), u.arg)


# ---------------------------------------------------------------- lifting reshapes off reductions


def _lift_reshape(alu: UOp, ctx: dict[UOp, bool]) -> UOp | None:
    """ALU(RESHAPE(r), y) -> RESHAPE(ALU(r, RESHAPE(y))) where r holds a reduction, so the reduction and
    this op stay in one kernel; the reshape rises to the kernel's output, whose view absorbs it.
    Only y that hold no reduction get the new reshape: a reshape over a reduction only ever rises, so the
    rewrite ends. (A y holding a reduction in the op's own shape, as x.sum(-1, keepdim=True) beside a reshaped
    reduction of one column, would be reshaped here and lifted back there, for ever.)"""
    lifted = {_reduced_shape(s, ctx) for s in alu.src} - {None}
    if len(lifted) != 1:
        return None  # reductions seen in different shapes: lifting one would reshape another; leave them
    for s in alu.src:
        if s.op is Ops.RESHAPE and _reduces(s.source, ctx) and s.source.shape != s.shape:
            inner = s.source.shape
            srcs = tuple(
                x.source if x.op is Ops.RESHAPE and x.source.shape == inner else _reshape(x, inner) for x in alu.src
            )
            return _reshape(alu.replace(src=srcs), alu.shape)
    return None


def _reduced_shape(s: UOp, ctx: dict[UOp, bool]) -> tuple[int, ...] | None:
    """The shape in which a source of an elementwise op holds a reduction (under one reshape, or as it is);
    None where it holds none."""
    if s.op is Ops.RESHAPE and _reduces(s.source, ctx):
        return s.source.shape
    return s.shape if _reduces(s, ctx) else None


def _merge_reshapes(outer: UOp, inner: UOp) -> UOp | None:
    """Two reshapes are one, except over a buffer: a tensor's view of its memory keeps its identity for autograd."""
    return None if inner.source.op is Ops.BUFFER else _reshape(inner.source, outer.arg)


def _reduces(u: UOp, memo: dict[UOp, bool]) -> bool:
    """Whether u is a reduction, or elementwise ops over one (a node its kernel's reduction feeds)."""
    if u not in memo:
        for x in u.toposort:
            if x not in memo:
                feeds = x.op in GroupOp.Elementwise and any(memo[s] for s in x.src)
                memo[x] = x.op is Ops.REDUCE_AXIS or feeds
    return memo[u]


def _reshape(u: UOp, shape: tuple[int, ...]) -> UOp:
    return u if u.shape == shape else UOp(Ops.RESHAPE, u.dtype, (u,), shape)


lift_reshapes = PatternMatcher(
    [
        (UPat(Ops.RESHAPE, src=(UPat(Ops.RESHAPE, name="inner"),), name="outer"), _merge_reshapes),  # one reshape
        (UPat(GroupOp.Elementwise, name="alu"), _lift_reshape),  # reshapes of reductions rise to the kernel's output
    ],
    name="lift_reshapes",
)


# ---------------------------------------------------------------- reading a value from its copy


def read_copies(sink: UOp, memo: dict[UOp, UOp]) -> UOp:
    """Where CONTIGUOUS writes a computed node x (seen through reshapes and permutes), x's other consumers read that
    memory (through the inverse view) rather than computing x again from its inputs: a gradient made contiguous
    for a convolution and summed for a bias is computed once. `memo` gets each rebuilt node."""
    copies: dict[UOp, tuple[UOp, tuple[UOp, ...]]] = {}  # x -> (its CONTIGUOUS, the movement ops between, outer first)
    for c in sink.toposort:
        found = copied_value(c)
        if found is None or found[0] in copies or found[0] in sink.src:  # (a target has memory of its own)
            continue
        x, chain = found
        copies[x] = (c, chain)
    if not copies:
        return sink
    readers = {(chain[-1] if chain else c) for c, chain in copies.values()}  # what computes each copy reads x itself

    def rebuilt(u: UOp) -> UOp:
        return memo.get(u, u)

    def as_copy(x: UOp) -> UOp:
        c, chain = copies[x]
        node = rebuilt(x)
        for m in reversed(chain):
            node = memo.setdefault(m, m.replace(src=(node,)))
        return read_through(memo.setdefault(c, c.replace(src=(node,))), chain)

    for u in sink.toposort:
        if u in memo or not u.src:
            continue
        use_copy = u.op is not Ops.SINK and u not in readers
        src = tuple(as_copy(s) if use_copy and s in copies else rebuilt(s) for s in u.src)
        if src != u.src:
            memo[u] = u.replace(src=src)
    return rebuilt(sink)


def copied_value(c: UOp) -> tuple[UOp, tuple[UOp, ...]] | None:
    """For a CONTIGUOUS of reshapes and permutes of a computed node x (a reduction, or math that reads memory): x and
    the movement ops between (outermost first); None for anything else."""
    if c.op is not Ops.CONTIGUOUS:
        return None
    x, chain = c.source, []
    while x.op in _PEELED:
        chain.append(x)
        x = x.source
    computed = x.op is Ops.REDUCE_AXIS or (x.op in GroupOp.Elementwise and any(map(_reads_memory, x.toposort)))
    return (x, tuple(chain)) if computed else None


def read_through(copy: UOp, chain: tuple[UOp, ...]) -> UOp:
    """x's values read from `copy` (what a CONTIGUOUS of chain(x) holds, as copied_value found it): the chain's
    movement ops undone, outermost first."""
    view = copy
    for m in chain:
        if m.op is Ops.PERMUTE:
            view = UOp(Ops.PERMUTE, m.dtype, (view,), tuple(m.arg.index(i) for i in range(len(m.arg))))
        else:
            view = _reshape(view, m.source.shape)
    return view


def _in_place(u: UOp) -> bool:
    """A COPY that the kernels reading it read in its source's memory, on the source's device (collective.IN_PLACE)."""
    return u.op is Ops.COPY and u.arg == IN_PLACE


def _reads_memory(u: UOp) -> bool:
    return u.op is Ops.BUFFER or u.op is Ops.COPY


# ---------------------------------------------------------------- splitting big reductions

SPLIT_MIN = 1 << 15  # a reduction of at least this many elements into ...
SPLIT_MAX_OUT = 16  # ... at most this many outputs runs as two kernels, the first with many outputs (cores, vectors)
SPLIT_DS = (256, 128, 64, 32, 16, 8)  # the number of partial results, the largest that leaves each 1024 or more
# on a GPU, a long reduction into fewer outputs than its threads (a convolution weight's gradient: 32 x 32 x 5 x 5
# outputs over a batch's 128 x 20 x 20 positions) is split along one of its reduced axes ...
GPU_FEW = 1 << 16  # ... where it has fewer outputs than this (tiny.codegen's rules share each across a workgroup) ...
GPU_SPLIT_MIN = 1 << 12  # ... and reduces at least this many elements into each
GPU_REUSE = 4  # ... where each element of its inputs is read for this many outputs at least (a product)
GPU_PARTIALS = 1 << 20  # ... into the fewest partials that make this many outputs (threads x their register tiles)
GPU_PARTIAL_MIN = 32  # ... each over this many elements at least (the most partials where none makes that many)


def _gpu_split(r: UOp) -> UOp | None:
    """REDUCE(x over axes) -> REDUCE(REDUCE(x, one reduced axis split as (d, n/d), over n/d and the other axes) over
    d), on a GPU, for a product with few outputs and a long reduction: the rules would give each output a workgroup
    whose threads take images of the batch a warp apart (an H200 ran the MNIST step's second convolution's weight
    gradient, 32 x 32 x 5 x 5 over 128 x 20 x 20, at 1.1 TFLOPS: 2.3 ms of a 5.7 ms step); split, it is a product
    of d times as many outputs that threads tile in registers, a warp's threads reading neighbours (the forward
    convolution's plan), and a short sum of the d partials. The axis and d: the fewest partials that make
    GPU_PARTIALS outputs, the outermost axis where several do."""
    x, (op, axes) = r.source, r.arg
    axes = tuple(sorted(a for a in axes if x.shape[a] != 1))
    caps = opened_caps(r.device) if type(r.device) is str else None
    if caps is None or not caps.has_shared or not axes or not all(type(s) is int for s in x.shape):
        return None
    outputs, n = _prod(r.shape), _prod([x.shape[a] for a in axes])
    if outputs >= GPU_FEW or n < GPU_SPLIT_MIN or outputs <= SPLIT_MAX_OUT:
        return None
    # a product whose every input is read for several outputs (what registers tile); a plain sum (a norm's over a
    # batch: each element read once) keeps the rules' workgroups, which read along memory
    read = max((_prod(u.shape) for u in x.toposort if u.op in (Ops.BUFFER, Ops.REDUCE_AXIS)), default=0)
    if read * GPU_REUSE > _prod(x.shape):
        return None
    # (d, the axis's place): each divisor of each reduced axis that leaves a partial GPU_PARTIAL_MIN elements
    splits = [(d, i) for i, a in enumerate(axes) for d in range(2, x.shape[a] + 1) if x.shape[a] % d == 0]
    splits = [(d, i) for d, i in splits if n // d >= GPU_PARTIAL_MIN]
    if not splits:
        return None
    enough = [(d, i) for d, i in splits if outputs * d >= GPU_PARTIALS]
    d, i = min(enough) if enough else max(splits, key=lambda s: (s[0], -s[1]))
    a = axes[i]
    split = _reshape(x, x.shape[:a] + (d, x.shape[a] // d) + x.shape[a + 1 :])
    partial = UOp(Ops.REDUCE_AXIS, r.dtype, (split,), (op, tuple(b + (b >= a) for b in axes)))
    return _reshape(UOp(Ops.REDUCE_AXIS, r.dtype, (partial,), (op, (a,))), r.shape)


def _split_reduce(r: UOp) -> UOp | None:
    """REDUCE(x over n) with few outputs -> REDUCE(REDUCE(x as (d, n/d) over n/d) over d): d partial results, each
    over a contiguous stretch, then one small reduction of the partials (a reduction under a reduction realizes).
    Also for any number of outputs where n is more loop iterations than the device runs in one thread."""
    x, (op, axes) = r.source, r.arg
    axes = tuple(sorted(axes))
    n = _prod([x.shape[a] for a in axes])
    if not axes or axes != tuple(range(axes[0], axes[-1] + 1)) or type(n) is not int:
        return None  # (nor a symbolic length: split in two by what?)
    loops = caps.max_loop_iterations if (caps := opened_caps(r.device)) is not None else 0
    if loops and n > loops:  # two stages of about sqrt(n) iterations each
        d = next((d for d in range(math.isqrt(n), 1, -1) if n % d == 0 and n // d <= loops), None)
    elif n >= SPLIT_MIN and _prod(r.shape) <= SPLIT_MAX_OUT:
        # a GPU's workgroups each take one partial (its threads sharing it): as many as fill the GPU, each long enough
        # for a workgroup; a CPU's threads and vectors are fed by fewer, longer partials
        ds, least = ((1024, 512, 256, 128, 64, 32, 16, 8), 4096) if caps and caps.has_shared else (SPLIT_DS, 1024)
        d = next((d for d in ds if n % d == 0 and n // d >= least), None)
    else:
        return None
    if d is None:
        return None
    a0, a1 = axes[0], axes[-1]
    split = _reshape(x, x.shape[:a0] + (d, n // d) + x.shape[a1 + 1 :])
    partial = UOp(Ops.REDUCE_AXIS, r.dtype, (split,), (op, (a0 + 1,)))
    return _reshape(UOp(Ops.REDUCE_AXIS, r.dtype, (partial,), (op, (a0,))), r.shape)


def _factor_reduce(r: UOp) -> UOp | None:
    """sum(x * c * ...) -> sum(x * ...) * c where c is the same along every reduced axis (an EXPAND over them, as
    batch norm's weight in its own gradient): sums that differ only by such factors become one sum (batch norm's
    backward asks for four where two differ), and the factor is multiplied once per output, not per element."""
    x, (op, axes) = r.source, r.arg
    # (float32 and float64 only: a half's sum can overflow where the sum of its scaled values would not)
    if op is not Ops.ADD or x.op is not Ops.MUL or r.dtype not in (dtypes.float32, dtypes.float64):
        return None
    fixed, rest, todo = [], [], [x]
    while todo:  # the factors of a product of products, each constant along the reduced axes or not
        t = todo.pop()
        if t.op is Ops.MUL:
            todo += t.src[::-1]
        else:
            constant = t.op is Ops.EXPAND and all(t.source.shape[a] == 1 for a in axes)
            (fixed if constant else rest).append(t)
    if not fixed or not rest:
        return None
    out = UOp(Ops.REDUCE_AXIS, r.dtype, (functools.reduce(operator.mul, rest),), r.arg)
    for f in fixed:
        small = f.source
        out = out * (small if small.shape == r.shape else UOp(Ops.EXPAND, small.dtype, (small,), r.shape))
    return out


split_reductions = PatternMatcher(
    [
        (UPat(Ops.REDUCE_AXIS, name="r"), _factor_reduce),
        (UPat(Ops.REDUCE_AXIS, name="r"), _split_reduce),
        (UPat(Ops.REDUCE_AXIS, name="r"), _gpu_split),
    ],
    name="split_reductions",
)


# ---------------------------------------------------------------- devices that only hold data (DISK)


def data_view(u: UOp) -> UOp:
    """`u`, a chain of movement ops and bitcasts over a buffer of a device that runs no kernels, as a view of
    that buffer's memory (a BUFFER sharing it, reshaped): no kernel and no copy. ValueError when `u` is not one
    contiguous range of the buffer."""
    node, path = u, []
    while node.op in GroupOp.Movement or node.op is Ops.BITCAST:
        if node.op is not Ops.BITCAST:
            path.append(node)
        node = node.source
    why = f"{u.device} only holds data: a tensor there can be reshaped, sliced to one contiguous range and bitcast"
    if node.op is not Ops.BUFFER:
        raise ValueError(f"{why}, then copied with .to(); computing {node.op.name} on it needs .to() first")
    try:
        view: View | None = _view_through(View.create(node.shape), tuple(path))
    except _Unexpressible:
        view = None
    if view is None or view.mask is not None or view.strides != strides_for_shape(view.shape):
        raise ValueError(f"{why}; this view (strided, padded, flipped or expanded) is not one range: use .to() first")
    offset = view.offset * node.dtype.itemsize
    return _buffer_view(new_buffer_view(node, _prod(u.shape), u.dtype, offset), u.shape)


def _copy_from_data(c: UOp) -> UOp | None:
    if is_realized(c.source) or device_computes(c.source.device):
        return None
    return c.replace(src=(data_view(c.source), *c.src[1:]))


data_views = PatternMatcher([(UPat(Ops.COPY, name="c"), _copy_from_data)], name="data_views")


def _as_data_view(u: UOp) -> UOp:
    return u if is_realized(u) or u.op is Ops.COPY or device_computes(u.device) else data_view(u)


prepare = data_views + split_reductions


def create_schedule(targets: list[UOp]) -> Schedule:
    """Schedule the kernels and copies that realize `targets` (tensor-level nodes), in execution order. A graph of
    the structure of one scheduled before (other input buffers) takes that schedule from the cache, rebound.
    Symbolic sizes are scheduled unbound (the schedule of `x[:pos]` is one for every value of pos): the values go
    with the schedule (var_vals), and what the targets become is bound again."""
    if PROFILE.value or VIZ.value:  # (two reads of a flag: what watching costs when it is off)
        return _create_schedule_seen(targets)
    return _create_schedule(targets) if binds_made() else _schedule(targets)


def _create_schedule_seen(targets: list[UOp]) -> Schedule:
    """create_schedule, a span of PROFILE and a group of VIZ (the graph before and after each pass)."""
    if not (profile.enabled() or viz.enabled()):  # (PROFILE=0, VIZ=0)
        return _create_schedule(targets)
    with profile.timed("schedule", "schedule", "schedule") as args, viz.group("schedule", "schedule") as seen:
        sched = _create_schedule(targets)
        args["kernels"] = kernels = sum(1 for i in sched.items if i.ast.op is Ops.SINK)
        args["copies"] = len(sched.items) - kernels
    if seen is not None:
        seen.name = f"schedule: {kernels} kernels, {len(sched.items) - kernels} copies"
        if not seen.steps:
            seen.info["note"] = "the cached schedule of a graph of the same structure, rebound (SCHEDULE_CACHE)"
    return sched


def _create_schedule(targets: list[UOp]) -> Schedule:
    if binds_made() and (unbound := _unbind(targets)) is not None:
        plain, names, var_vals = unbound
        return _rebind(_schedule(plain), names, var_vals)
    return _schedule(targets)


def _unbind(targets: list[UOp]) -> tuple[list[UOp], dict[UOp, UOp], dict[UOp, int]] | None:
    """The graph with each bound Variable in a size replaced by the Variable, each new node's bound original, and
    each Variable's value; None where the graph holds none."""
    if not any(record_below(t, _SIZES, _sizes_below) for t in targets):
        return None  # (no size over a Variable below: the walk below would find no bound one)
    found: dict[UOp, int] = {}
    done: dict[UOp, UOp] = {}
    for u in UOp(Ops.SINK, src=tuple(targets)).toposort:
        src = tuple(done[s] for s in u.src)
        arg = u.arg
        # (a movement op's arg holding only ints is its own key: no size in it; a CONST's size is its arg)
        if (u.op in GroupOp.Movement and u.argkey is not arg and sint.has_binds(arg)) or (
            u.op is Ops.CONST and isinstance(arg, UOp)
        ):
            arg = sint.map_sizes(arg, lambda x: sint.unbind_size(x, found))
        done[u] = u if src == u.src and arg is u.arg else UOp(u.op, u.dtype, src, arg)
    if not found:
        return None
    return [done[t] for t in targets], {v: k for k, v in done.items() if v is not k}, found


_SIZES = "schedule.sizes"  # the per-node record of _sizes_below


def _sizes_below(u: UOp) -> bool:
    """Whether u or a node below it has a size that is a node (a movement op's over a Variable, a CONST's): kept on
    each node, so that a graph of fixed sizes asked again (a quantized model's lazy weights, in every schedule once
    a Variable was ever bound) is not walked again. (Each source's record is there: record_below's order.)"""
    arg = u.arg
    if (u.op in GroupOp.Movement and u.argkey is not arg and sint.has_binds(arg)) or (
        u.op is Ops.CONST and isinstance(arg, UOp)
    ):
        return True
    return any(s.__dict__[_SIZES] for s in u.src)


def rebind_graph(root: UOp, values: dict[UOp, int]) -> UOp:
    """A graph with each Variable in its sizes (bound or not) bound to the value `values` gives it."""
    done: dict[UOp, UOp] = {}
    for u in root.toposort:
        src = tuple(done[s] for s in u.src)
        arg = u.arg
        if (u.op in GroupOp.Movement and u.argkey is not arg and sint.has_binds(arg)) or (
            u.op is Ops.CONST and isinstance(arg, UOp)
        ):
            arg = sint.map_sizes(arg, lambda x: sint.bind_size(sint.unbind_size(x, {}), values))
        done[u] = u if src == u.src and arg is u.arg else UOp(u.op, u.dtype, src, arg)
    return done[root]


def _rebind(sched: Schedule, names: dict[UOp, UOp], values: dict[UOp, int]) -> Schedule:
    """An unbound graph's schedule for the bound graph: what the bound targets become, bound again."""
    becomes = {names.get(k, k): rebind_graph(v, values) for k, v in sched.becomes.items()}
    renamed = {names.get(k, k): rebind_graph(v, values) for k, v in sched.renamed.items()}
    var_vals = {var.arg[0]: value for var, value in values.items()}
    return Schedule(sched.items, becomes, renamed, sched.fresh, sched.reads, var_vals)


def _schedule(targets: list[UOp]) -> Schedule:
    mode = SCHEDULE_CACHE.value
    graph = structure_of(targets) if mode else None
    cached = SCHEDULES.get(graph.key) if graph is not None else None
    if cached is not None and mode == 1:
        return cached.instantiate(graph)  # type: ignore[union-attr]
    schedule = _plan(targets)
    if graph is not None:
        if cached is not None:  # SCHEDULE_CACHE=2: the cache must have given this very schedule
            check_same(cached, schedule, graph)
        elif (template := Template.record(schedule, graph)) is not None:
            SCHEDULES.put(graph.key, template)
    return schedule


def _plan(targets: list[UOp]) -> Schedule:
    """The scheduler itself: rewrite the graph, choose the nodes that become buffers, build a kernel for each."""
    given = UOp(Ops.SINK, src=tuple(_as_data_view(t) for t in targets))
    memos: list[dict[UOp, UOp]] = [{}, {}, {}]
    # values on data-only devices become buffer views; big reductions into few outputs split in two
    prepared = graph_rewrite(given, prepare, memo=memos[0], name="prepare")
    # reshapes of reductions rise to the root
    lifted = graph_rewrite(prepared, lift_reshapes, ctx={}, memo=memos[1], name="lift reshapes")
    sink = read_copies(lifted, memos[2])
    if viz.recording():
        viz.step("read copies", lifted, sink)
    forced: set[UOp] = set()
    plain: set[UOp] = set()  # values a later kernel cannot view in another layout than their own
    while True:
        realize = _realize_set(sink, forced)
        buffers = {u: memory_of(u.target)[0] if u.op is Ops.ASSIGN else _fresh(u) for u in realize}
        order = [u for u in sink.toposort if u in realize]
        # values no tensor asked for as they are (not targets, not CONTIGUOUS, not what a copy moves as bytes): their
        # kernels choose the layout
        asked = {u.source for u in realize if u.op is Ops.COPY} | set(sink.src) | plain
        free = {u for u in realize - asked if u.op not in _ASKED}
        layouts: dict[UOp, tuple[int, ...]] = {}
        try:  # (a kernel that cannot be built as it is names the node to realize: then again, with it realized)
            steps = tuple(_step(u, realize, buffers, free, layouts) for u in order)
            break
        except _Unexpressible as e:
            if e.node in layouts:
                plain.add(e.node)
            else:
                forced.add(e.node)
    # each realized node under the names it had before the rewrites: tensors hold those, and gradients expand a
    # buffer back into the graph it came from
    # (a node whose rewrite is a reshape of a realized node -- a reduction whose reshape rose -- is a view of it too)
    originals: dict[UOp, list[UOp]] = {}
    reshaped: dict[UOp, list[UOp]] = {}
    for node in given.toposort:
        final = memos[0][node]
        for memo in memos[1:]:  # (a node a rewrite cut out of the graph is not in the later passes' memos)
            final = memo.get(final, final)
        if final in realize:
            originals.setdefault(final, []).append(node)
        elif final.op is Ops.RESHAPE and final.src[0] in realize and final.src[0].op is not Ops.ASSIGN:
            reshaped.setdefault(final.src[0], []).append(node)
    becomes: dict[UOp, UOp] = {}
    for u in order:
        view = u.target if u.op is Ops.ASSIGN else _buffer_view(buffers[u], u.shape, layouts.get(u))
        for name in originals.get(u, [u]):
            becomes[name] = view
        for name in reshaped.get(u, ()):
            becomes[name] = _buffer_view(buffers[u], name.shape) if u not in layouts else _reshape(view, name.shape)
    renamed: dict[UOp, UOp] = {}
    for original, rewritten in zip(targets, sink.src):
        if original in becomes:
            continue
        if rewritten in becomes:  # the caller's node, not the rewritten one, is what its tensors hold
            becomes[original] = becomes.pop(rewritten)
        elif rewritten is not original and is_realized(rewritten):  # the rewrite alone made it a view of memory
            renamed[original] = rewritten
    fresh = tuple(buffers[u] for u in order if u.op is not Ops.ASSIGN)
    items = [ScheduleItem(ast, tuple(map(buffer_of, bufs))) for ast, bufs in steps]
    reads = tuple(u for u in given.toposort if u.op is Ops.BUFFER)
    if viz.recording():
        viz.step("kernels", sink, [item.ast for item in items])
    return Schedule(items, becomes, renamed, fresh, reads)


def _step(
    u: UOp, realize: set[UOp], buffers: dict[UOp, UOp], free: set[UOp], layouts: dict[UOp, tuple[int, ...]]
) -> tuple[UOp, tuple[UOp, ...]]:
    """The kernel (or copy) that computes realized node u, and its BUFFER nodes (the output first)."""
    if u.op is Ops.COPY:
        src = u.source
        src_buf = buffers[src] if src in realize else (src if src.op is Ops.BUFFER else src.source)
        return u, (buffers[u], src_buf)
    if not device_computes(u.device):
        raise ValueError(
            f"no kernels run on {u.device}, which only holds data; copy the tensor to a compute device with .to() "
            f"before computing {u.op.name} on it"
        )
    builder = _KernelBuilder(u, realize, buffers, free, layouts)
    ast = builder.build()
    limit = caps.max_buffers if (caps := opened_caps(u.device)) is not None else 0
    if limit and len(builder.args) + (n_vars := sum(x.op is Ops.DEFINE_VAR for x in ast.toposort)) > limit:
        raise _Unexpressible(_split_point(u, realize, limit - n_vars - 1, len(builder.args)))
    return ast, tuple(builder.args)


def _split_point(root: UOp, realize: set[UOp], room: int, n_args: int) -> UOp:
    """The node under a kernel's root that reads the most of its buffers while its own kernel fits in `room`
    input buffers: realizing it takes those reads out of the root's kernel."""
    leaves: dict[UOp, frozenset[UOp]] = {}
    stack: list[tuple[UOp, bool]] = [(root, False)]
    while stack:
        u, expanded = stack.pop()
        if u in leaves:
            continue
        if u is not root and (u in realize or is_realized(u)):
            leaves[u] = frozenset((u,))
            continue
        srcs = u.src[1:] if u.op is Ops.ASSIGN else u.src
        if expanded:
            leaves[u] = frozenset().union(*(leaves[x] for x in srcs))
        else:
            stack.append((u, True))
            stack.extend((x, False) for x in srcs if x not in leaves)
    fits = [u for u, ls in leaves.items() if u is not root and 2 <= len(ls) <= room and u not in realize]
    if not fits:
        raise ValueError(
            f"a kernel computing {root.op.name} of shape {root.shape} reads {n_args - 1} buffers and its device "
            f"{root.device} binds at most {room + 1} in one kernel; no part of it can be split off"
        )
    return max(fits, key=lambda u: len(leaves[u]))


def memory_of(u: UOp) -> tuple[UOp, tuple[UOp, ...]]:
    """The BUFFER a chain of movement ops views, and the chain (outermost first); ValueError if u is not one."""
    path: list[UOp] = []
    while u.op in GroupOp.Movement:
        path.append(u)
        u = u.source
    if u.op is not Ops.BUFFER:
        raise ValueError(f"an assign needs a target that is memory (movement ops over a buffer), got {u.op.name}")
    return u, tuple(path)


def _fresh(u: UOp) -> UOp:
    """A buffer for u: of its largest size where that is symbolic (a RESHAPE of it to the symbolic shape views its
    first elements)."""
    n = _prod(u.shape)
    return new_buffer(u.device, n if type(n) is int else sint.highest(n), u.dtype)


def _buffer_view(buf: UOp, shape: tuple[int, ...], layout: tuple[int, ...] | None = None) -> UOp:
    if layout is None:
        return UOp(Ops.RESHAPE, buf.dtype, (buf,), shape)
    memory = UOp(Ops.RESHAPE, buf.dtype, (buf,), tuple(shape[d] for d in layout))
    return UOp(Ops.PERMUTE, buf.dtype, (memory,), tuple(layout.index(d) for d in range(len(shape))))


def _prod(shape: tuple[sint.sint, ...] | list[sint.sint]) -> sint.sint:
    out: sint.sint = 1
    for s in shape:
        out = out * s if type(s) is int and type(out) is int else sint.smul(out, s)
    return out
