"""The index memory pass (tiny.codegen.memory): a kernel AST's reads, writes and masked constants as loads, stores and
gated values in a variable per dim, checked against NumPy by putting every point's index in the variables' place."""

from __future__ import annotations

import itertools

import numpy as np

from tiny.codegen.memory import Dims, index_memory
from tiny.ir.dtypes import dtypes
from tiny.ir.pattern import graph_rewrite
from tiny.ir.symbolic import symbolic
from tiny.ir.uop import Ops, UOp, substitute
from tiny.ir.views import View

f32, i32 = dtypes.float32, dtypes.int32


def at(expr: UOp, dims: Dims, point: tuple[int, ...]) -> int | float | bool:
    """An expression in the dims' variables at one point of the kernel's shape, simplified to its value."""
    value = graph_rewrite(substitute(expr, {v: UOp.const(i32, i) for v, i in zip(dims.index, point)}), symbolic)
    assert value.op is Ops.CONST, value
    return value.arg


def test_a_padded_read_loads_the_elements_numpy_pads_and_0_outside() -> None:
    # x (3, 4) transposed and padded by one on each side: a (6, 5) view whose border reads nothing
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    view = View.create((3, 4)).permute((1, 0)).pad(((1, 1), (1, 1)))
    buf = UOp(Ops.DEFINE_GLOBAL, f32.ptr(12), (), 1)
    read = UOp(Ops.READ, f32, (buf, UOp(Ops.VIEW, arg=view)))
    dims = Dims.of(view.shape, {}, i32)
    load = graph_rewrite(read, index_memory, ctx=dims)
    assert load.op is Ops.LOAD and load.alternative is UOp.const(f32, 0) and load.address.pointer is buf
    want = np.pad(x.T, 1)
    for point in itertools.product(*map(range, view.shape)):
        inside = at(load.address.gate, dims, point)
        got = x.reshape(-1)[at(load.address.offset, dims, point)] if inside else 0.0
        assert got == want[point], point


def test_a_padded_dim_of_the_plan_gates_the_read_at_its_real_size() -> None:
    # dim 1 of size 5 padded to 8 by the plan: reads past 5 are gated off, the ones before read memory
    view = View.create((2, 8))
    buf = UOp(Ops.DEFINE_GLOBAL, f32.ptr(16), (), 1)
    dims = Dims.of((2, 5), {1: 8}, i32)
    load = graph_rewrite(UOp(Ops.READ, f32, (buf, UOp(Ops.VIEW, arg=view))), index_memory, ctx=dims)
    assert load.address.gate is not None and load.alternative is UOp.const(f32, 0)
    for point in itertools.product(range(2), range(8)):
        assert at(load.address.gate, dims, point) == (point[1] < 5)
        assert at(load.address.offset, dims, point) == point[0] * 8 + point[1]


def test_a_write_stores_its_value_at_its_views_offset_and_a_masked_constant_is_0_outside_its_mask() -> None:
    view = View.create((4, 3)).permute((1, 0))  # a (3, 4) output written transposed
    out = UOp(Ops.DEFINE_GLOBAL, f32.ptr(12), (), 0)
    masked = View.create((2, 4)).pad(((1, 0), (0, 0)))  # a (3, 4) constant: 2.5 below row 0, 0 in it
    value = UOp(Ops.CONST, f32, (UOp(Ops.VIEW, arg=masked),), 2.5)
    write = UOp(Ops.WRITE, dtypes.void, (out, UOp(Ops.VIEW, arg=view), value))
    dims = Dims.of((3, 4), {}, i32)
    store = graph_rewrite(write, index_memory, ctx=dims)
    assert store.op is Ops.STORE and store.address.pointer is out and store.address.gate is None
    assert store.value.op is Ops.WHERE
    for point in itertools.product(range(3), range(4)):
        assert at(store.address.offset, dims, point) == point[1] * 3 + point[0]
        assert at(store.value, dims, point) == (2.5 if point[0] >= 1 else 0.0)
