"""Lowering: a kernel AST (views over the kernel's shape) -> loops, index math, loads, stores and REDUCEs.

Every output dimension becomes a loop (RANGE) or, where the renderer indexes with hardware ids, a
SPECIAL; every reduced dimension becomes a loop inside its REDUCE. A View becomes an offset expression
and, where it has padding, a gate that makes the load read 0 instead of memory.
"""

from __future__ import annotations

from dataclasses import dataclass

from tiny.ir.device import RendererCaps
from tiny.ir.dtypes import DType, dtypes
from tiny.ir.uop import GroupOp, Ops, UOp, evaluate
from tiny.ir.views import View

INT32_MAX = 2**31 - 1


@dataclass(frozen=True)
class LoweredKernel:
    sink: UOp  # SINK of STOREs, using RANGE/SPECIAL/REDUCE/INDEX/LOAD and ALU ops
    name: str
    global_size: tuple[int, int, int]
    local_size: tuple[int, int, int]


def _index_dtype(ast: UOp) -> DType:
    """int32 index math unless some buffer or view reaches past 2**31-1 elements."""
    for u in ast.toposort:
        if u.op is Ops.VIEW:
            lo, hi = u.arg.span()
            if hi > INT32_MAX or lo < -INT32_MAX or u.arg.size > INT32_MAX:
                return dtypes.int64
        if u.op is Ops.DEFINE_GLOBAL and u.dtype.size > INT32_MAX:
            return dtypes.int64
    return dtypes.int32


def kernel_name(ast: UOp) -> str:
    """E_<output dims> for elementwise kernels, r_<output dims>_<reduced dims> for reductions."""
    store = ast.src[0]
    out = [s for s in store.shape if s != 1]
    reduces = [u for u in ast.toposort if u.op is Ops.REDUCE_AXIS]
    if not reduces:
        return "E_" + "_".join(str(s) for s in out or [1])
    red = reduces[-1]
    red_dims = [red.src[0].shape[a] for a in red.arg[1] if red.src[0].shape[a] != 1]
    return "r_" + "_".join(str(s) for s in (out + red_dims) or [1])


class _Lowerer:
    def __init__(self, idx_dtype: DType) -> None:
        self.idx_dtype = idx_dtype
        self.reduce_ranges: dict[tuple[UOp, tuple[UOp, ...]], list[UOp]] = {}
        self.next_range = 0

    def new_range(self, size: int) -> UOp:
        r = UOp.range(UOp.const(self.idx_dtype, size), self.next_range, self.idx_dtype)
        self.next_range += 1
        return r

    def access(self, buf: UOp, view: View, idxs: tuple[UOp, ...]) -> UOp:
        offset, valid = view.to_index(idxs)
        return UOp(Ops.INDEX, buf.dtype, (buf, offset) + ((valid,) if valid is not None else ()))

    def lower(self, u: UOp, idxs: tuple[UOp, ...]) -> UOp:
        """Kernel AST node u at the index idxs, as device ops."""
        return evaluate((u, idxs), self._children, self._combine)

    def _children(self, key: tuple[UOp, tuple[UOp, ...]]) -> list[tuple[UOp, tuple[UOp, ...]]]:
        u, idxs = key
        if u.op in (Ops.LOAD, Ops.CONST):
            return []
        if u.op is Ops.STORE:
            return [(u.src[2], idxs)]
        if u.op is Ops.REDUCE_AXIS:
            op, axes = u.arg
            in_shape = u.src[0].shape
            if any(in_shape[a] == 0 for a in axes):  # nothing to reduce over: no loop, no value
                return []
            inner = list(idxs)
            for a in axes:  # each reduction gets loops of its own
                inner[a] = UOp.const(self.idx_dtype, 0) if in_shape[a] == 1 else self.new_range(in_shape[a])
            self.reduce_ranges[key] = [inner[a] for a in axes if in_shape[a] != 1]
            return [(u.src[0], tuple(inner))]
        if u.op in GroupOp.Elementwise or u.op is Ops.SINK:
            return [(s, idxs) for s in u.src]
        raise NotImplementedError(f"cannot lower {u.op} in a kernel")

    def _combine(self, key: tuple[UOp, tuple[UOp, ...]], srcs: list[UOp]) -> UOp:
        u, idxs = key
        if u.op is Ops.LOAD:
            addr = self.access(u.src[0], u.src[1].arg, idxs)
            alt = (UOp.const(u.dtype, 0),) if addr.gate is not None else ()
            return UOp(Ops.LOAD, u.dtype, (addr,) + alt)
        if u.op is Ops.CONST:
            value = UOp.const(u.dtype, u.arg)
            _, valid = u.src[0].arg.to_index(idxs) if u.src else (None, None)
            return value if valid is None else valid.where(value, UOp.const(u.dtype, 0))
        if u.op is Ops.STORE:
            return UOp(Ops.STORE, dtypes.void, (self.access(u.src[0], u.src[1].arg, idxs), srcs[0]))
        if u.op is Ops.REDUCE_AXIS:
            if not srcs:
                return UOp.const(u.dtype, identity(u.arg[0], u.dtype))
            ranges = self.reduce_ranges[key]
            return UOp(Ops.REDUCE, u.dtype, (srcs[0], *ranges), u.arg[0]) if ranges else srcs[0]
        return UOp(u.op, u.dtype, tuple(srcs), u.arg)


def identity(op: Ops, dtype: DType) -> int | float | bool:
    """The value a reduction starts from: 0 for sums, 1 for products, the lowest value for max."""
    if op is Ops.ADD:
        return 0
    if op is Ops.MUL:
        return 1
    assert op is Ops.MAX, op
    return dtype.min


def lower(ast: UOp, caps: RendererCaps) -> LoweredKernel:
    """Lower a scheduled kernel AST (SINK of one STORE) for a renderer with these capabilities."""
    idx_dtype = _index_dtype(ast)
    lw = _Lowerer(idx_dtype)
    out_shape = ast.src[0].shape
    zero = UOp.const(idx_dtype, 0)
    idxs: list[UOp] = [zero] * len(out_shape)
    global_size = [1, 1, 1]
    if caps.has_local:
        # the innermost (up to three) output dims map to workgroups, gidx0 being the innermost
        dims = [i for i, s in enumerate(out_shape) if s > 1]
        hw, loops = dims[-3:], dims[:-3]
        for d in loops:
            idxs[d] = lw.new_range(out_shape[d])
        for n, d in enumerate(reversed(hw)):
            idxs[d] = UOp(Ops.SPECIAL, idx_dtype, (), (f"gidx{n}", out_shape[d]))
            global_size[n] = out_shape[d]
    else:
        for d, s in enumerate(out_shape):
            if s > 1:
                idxs[d] = lw.new_range(s)
    if any(s == 0 for s in out_shape):  # nothing to compute
        return LoweredKernel(UOp(Ops.SINK), kernel_name(ast), (1, 1, 1), (1, 1, 1))
    sink = lw.lower(ast, tuple(idxs))
    # every buffer stays an argument, also one whose reads simplification removes: launches pass them by position
    buffers = sorted({u for u in ast.toposort if u.op is Ops.DEFINE_GLOBAL}, key=lambda u: u.arg)
    sink = UOp(Ops.SINK, dtypes.void, sink.src + tuple(buffers))
    return LoweredKernel(sink, kernel_name(ast), (global_size[0], global_size[1], global_size[2]), (1, 1, 1))
