"""The scheduler on tensor-level graphs built by hand: which nodes fuse, which become buffers, in what order.

Buffers live on a made-up device "FAKE": new_buffer only records them, and nothing here allocates.
"""

from __future__ import annotations

import math
from types import SimpleNamespace
from typing import Any

import pytest

from tiny.ir.device import Buffer, Compiled, Device, RendererCaps, buffer_of, new_buffer
from tiny.ir.dtypes import DType, dtypes
from tiny.ir.schedule import Schedule, create_schedule, is_realized, lift_reshapes
from tiny.ir.spec import validate_ast
from tiny.ir.uop import Ops, UOp
from tiny.ir.views import View

f32 = dtypes.float32
DEV = "FAKE"

# ---------------------------------------------------------------- building tensor-level graphs


def tensor(*shape: int, dtype: DType = f32) -> UOp:
    """A realized input: a reshape of a fresh BUFFER."""
    buf = new_buffer(DEV, math.prod(shape), dtype)
    return UOp(Ops.RESHAPE, dtype, (buf,), tuple(shape))


def move(op: Ops, x: UOp, arg: Any) -> UOp:
    return UOp(op, x.dtype, (x,), arg)


def const(value: Any, shape: tuple[int, ...], dtype: DType = f32) -> UOp:
    c = UOp(Ops.CONST, dtype, (UOp(Ops.DEVICE, arg=DEV),), value)
    return move(Ops.EXPAND, move(Ops.RESHAPE, c, (1,) * len(shape)), shape)


def reduce(x: UOp, axes: tuple[int, ...], op: Ops = Ops.ADD) -> UOp:
    return UOp(Ops.REDUCE_AXIS, x.dtype, (x,), (op, axes))


def contiguous(x: UOp) -> UOp:
    return UOp(Ops.CONTIGUOUS, x.dtype, (x,))


def ops_in(ast: UOp) -> list[Ops]:
    return [u.op for u in ast.toposort]


def store_of(ast: UOp) -> UOp:
    assert ast.op is Ops.SINK and len(ast.src) == 1 and ast.src[0].op is Ops.WRITE
    return ast.src[0]


def input_buffers(*nodes: UOp) -> set[int]:
    return {id(buffer_of(u)) for n in nodes for u in n.toposort if u.op is Ops.BUFFER}


def check_well_formed(s: Schedule, targets: list[UOp]) -> None:
    """Kernels in dependency order, outputs first, one DEFINE_GLOBAL per buffer, and every target covered."""
    ready = input_buffers(*targets)
    for item in s.items:
        assert item.ast.op is Ops.SINK
        out, *ins = item.buffers
        assert all(isinstance(b, Buffer) for b in item.buffers)
        assert id(out) not in ready, "a kernel overwrites a buffer that was already written"
        for b in ins:
            assert id(b) in ready, "a kernel reads a buffer no earlier kernel wrote"
        ready.add(id(out))
        globals_ = sorted({u.arg for u in item.ast.toposort if u.op is Ops.DEFINE_GLOBAL})
        assert globals_ == list(range(len(item.buffers)))
        store = store_of(item.ast)
        assert store.buffer.arg == 0  # the output is argument 0
        assert store.buffer.dtype.size == out.size and store.buffer.dtype.base == out.dtype
        for u in item.ast.toposort:
            assert u.op not in (Ops.RESHAPE, Ops.PERMUTE, Ops.EXPAND, Ops.PAD, Ops.SHRINK, Ops.FLIP, Ops.BUFFER)
            if u.op in (Ops.READ, Ops.CONST):
                assert u.view is not None
    for t in targets:
        if is_realized(t):
            continue
        new = s.becomes[t]
        assert new.op is Ops.RESHAPE and new.src[0].op is Ops.BUFFER and new.shape == t.shape and new.dtype == t.dtype
        assert any(buffer_of(new.src[0]) is item.buffers[0] for item in s.items)


# ---------------------------------------------------------------- fusion


def test_an_elementwise_chain_is_one_kernel() -> None:
    a, b = tensor(4, 4), tensor(4, 4)
    out = ((a + b) * a).alu(Ops.EXP2).cast(dtypes.float16)
    s = create_schedule([out])
    check_well_formed(s, [out])
    assert len(s.items) == 1
    ast = s.items[0].ast
    assert ops_in(ast).count(Ops.READ) == 2 and ops_in(ast).count(Ops.WRITE) == 1
    assert {Ops.ADD, Ops.MUL, Ops.EXP2, Ops.CAST} <= set(ops_in(ast))
    assert [b.size for b in s.items[0].buffers] == [16, 16, 16]
    assert s.items[0].buffers[0].dtype == dtypes.float16
    assert s.items[0].buffers[1:] == (buffer_of(a.src[0]), buffer_of(b.src[0]))


def test_a_buffer_read_twice_is_one_argument() -> None:
    a = tensor(4, 4)
    out = a * move(Ops.PERMUTE, a, (1, 0))
    s = create_schedule([out])
    check_well_formed(s, [out])
    assert len(s.items) == 1 and len(s.items[0].buffers) == 2
    views = {u.view for u in s.items[0].ast.toposort if u.op is Ops.READ}
    assert views == {View.create((4, 4)), View.create((4, 4)).permute((1, 0))}


def test_movement_ops_become_views_of_loads_and_constants() -> None:
    a = tensor(2, 3)
    out = move(Ops.FLIP, move(Ops.PAD, move(Ops.PERMUTE, a, (1, 0)), ((1, 0), (0, 2))), (0,)) + const(1.0, (4, 4))
    s = create_schedule([out])
    check_well_formed(s, [out])
    assert len(s.items) == 1
    (load,) = [u for u in s.items[0].ast.toposort if u.op is Ops.READ]
    assert load.view == View.create((2, 3)).permute((1, 0)).pad(((1, 0), (0, 2))).flip((0,))
    (c,) = [u for u in s.items[0].ast.toposort if u.op is Ops.CONST]
    assert c.arg == 1.0 and c.src[0].arg.shape == (4, 4) and c.src[0].arg.strides == (0, 0)


def test_padding_an_elementwise_result_masks_it() -> None:
    a = tensor(3)
    out = move(Ops.PAD, (a + 1.0).alu(Ops.RECIP), ((2, 1),))  # 1/(0+1) must not leak into the padding
    s = create_schedule([out])
    check_well_formed(s, [out])
    assert len(s.items) == 1
    where = store_of(s.items[0].ast).value
    assert where.op is Ops.WHERE
    cond = where.src[0]
    assert cond.op is Ops.CONST and cond.dtype == dtypes.bool and cond.src[0].arg.mask == ((2, 5),)
    assert where.src[2].op is Ops.CONST and where.src[2].arg == 0.0


def test_a_reduce_with_its_inputs_and_epilogue_is_one_kernel() -> None:
    a, b = tensor(4, 8), tensor(4, 8)
    r = reduce((a * b).alu(Ops.EXP2), (1,))
    out = r * const(2.0, (4, 1)) + const(1.0, (4, 1))
    s = create_schedule([out])
    check_well_formed(s, [out])
    assert len(s.items) == 1
    ast = s.items[0].ast
    assert ops_in(ast).count(Ops.REDUCE_AXIS) == 1
    store = store_of(ast)
    assert store.view.shape == (4, 1) and store.value.op is Ops.ADD


def test_a_reduce_with_a_reshaped_epilogue_stays_one_kernel() -> None:
    a = tensor(4, 8)
    out = move(Ops.RESHAPE, reduce(a, (1,)), (4,)) * const(2.0, (4,))
    s = create_schedule([out])
    check_well_formed(s, [out])
    assert len(s.items) == 1 and ops_in(s.items[0].ast).count(Ops.REDUCE_AXIS) == 1


def test_a_reshaped_reduce_beside_a_reduce_of_it_schedules() -> None:
    """m = sum (3, 1, 2) -> (3, 1, 1) seen as (3, 1) (a matmul with one column), then m + m.sum(-1, keepdim=True):
    the other source holds a reduction in (3, 1), so lifting m's reshape would put one on it, which the rule would
    lift back, for ever. The rule leaves the sum; the scheduler realizes m (it feeds a reduction)."""
    a = tensor(3, 1, 2)
    m = move(Ops.RESHAPE, reduce(a, (2,)), (3, 1))
    out = m + reduce(m, (1,))
    assert lift_reshapes.rewrite(out, {}) is None
    s = create_schedule([out])
    check_well_formed(s, [out])
    assert [ops_in(item.ast).count(Ops.REDUCE_AXIS) for item in s.items] == [1, 1]


def test_a_lifted_reshape_lands_on_no_reduction() -> None:
    """ALU(RESHAPE(r), y): y gets the reshape r's lifts off, and y holds no reduction."""
    a, b = tensor(4, 8), tensor(4)
    out = move(Ops.RESHAPE, reduce(a, (1,)), (4,)) * b
    lifted = lift_reshapes.rewrite(out, {})
    assert lifted is not None and lifted.op is Ops.RESHAPE and lifted.shape == (4,)
    alu = lifted.src[0]
    assert alu.op is Ops.MUL and alu.shape == (4, 1) and alu.src[0].op is Ops.REDUCE_AXIS
    assert alu.src[1].op is Ops.RESHAPE and alu.src[1].src[0] is b
    assert lift_reshapes.rewrite(alu, {}) is None


def _softmax(x: UOp) -> UOp:
    rows, n = x.shape
    m = reduce(x, (1,), Ops.MAX)
    e = (x - move(Ops.EXPAND, m, (rows, n))).alu(Ops.EXP2)
    total = reduce(e, (1,))
    return e * move(Ops.EXPAND, total, (rows, n)).alu(Ops.RECIP)


def test_softmax_realizes_each_reduce_seen_through_an_expand() -> None:
    """On a GPU (and a device not opened: FAKE) each reduction a row's elements read is a kernel of its own."""
    out = _softmax(tensor(4, 8))
    s = create_schedule([out])
    check_well_formed(s, [out])
    assert len(s.items) == 3
    first, second, third = (item.ast for item in s.items)
    assert [u.arg[0] for u in first.toposort if u.op is Ops.REDUCE_AXIS] == [Ops.MAX]
    assert [u.arg[0] for u in second.toposort if u.op is Ops.REDUCE_AXIS] == [Ops.ADD]
    assert Ops.REDUCE_AXIS not in ops_in(third)
    assert s.items[1].buffers[2] is s.items[0].buffers[0]  # the sum reads the max
    assert s.items[2].buffers[0].size == 32 and {b.size for b in s.items[2].buffers[1:]} == {32, 4}


def _normalized_product(rows: int, k: int, cols: int, math: str = "norm") -> UOp:
    """a @ w for a from x (rows, k), w (k, cols): the product reads a broadcast along its columns. math: "norm",
    (x - mean(x)) * 2 + 1 (a layer norm's ops over its reductions); "bias", x plus its sum (one op over one);
    "memory", x * 2 - 1 (math over memory alone, as a weight dequantized where it is read)."""
    x, w = tensor(rows, k), tensor(k, cols)
    shape = (rows, k)
    if math == "memory":
        a = x * const(2.0, shape) - const(1.0, shape)
    else:
        reduced = move(Ops.EXPAND, reduce(x, (1,)) * const(1 / k, (rows, 1)), shape)
        a = x + reduced if math == "bias" else (x - reduced) * const(2.0, shape) + const(1.0, shape)
    a = move(Ops.EXPAND, move(Ops.RESHAPE, a, (rows, 1, k)), (rows, cols, k))
    b = move(Ops.EXPAND, move(Ops.RESHAPE, move(Ops.PERMUTE, w, (1, 0)), (1, cols, k)), (rows, cols, k))
    return reduce(a * b, (2,))


def test_math_over_a_reduction_read_broadcast_by_a_product_is_computed_once() -> None:
    """A normalization a product reads along its columns is a buffer of its own: fused, each normalized value was
    computed again for every column (a layer norm before attention's projections, at half the speed)."""
    out = _normalized_product(256, 64, 128)
    s = create_schedule([out])
    check_well_formed(s, [out])
    assert len(s.items) == 3
    mean, normalized, product = (item.ast for item in s.items)
    assert ops_in(mean).count(Ops.REDUCE_AXIS) == 1 and Ops.REDUCE_AXIS not in ops_in(normalized)
    assert ops_in(product).count(Ops.REDUCE_AXIS) == 1 and Ops.ADD not in ops_in(product)  # (the normalization's)
    assert s.items[1].buffers[0].size == 256 * 64 and s.items[2].buffers[0].size == 256 * 128


def test_math_read_broadcast_stays_fused_when_little_cheap_or_over_memory_alone() -> None:
    """Where the values computed again are few (a decode step's probabilities over a few keys), the math is one op
    (a bias added: a buffer more costs more), or it reads memory alone (a weight cast or dequantized where the
    product reads it: as a buffer it would take its full size in memory), the product computes it in place."""
    for out, kernels in (
        (_normalized_product(4, 8, 16), 2),
        (_normalized_product(256, 64, 128, "bias"), 2),
        (_normalized_product(256, 64, 128, "memory"), 1),
    ):
        s = create_schedule([out])
        check_well_formed(s, [out])
        assert len(s.items) == kernels


def test_a_reduce_inside_a_reduce_is_realized() -> None:
    a = tensor(4, 8)
    out = reduce(reduce(a, (1,)) * const(2.0, (4, 1)), (0,))
    s = create_schedule([out])
    check_well_formed(s, [out])
    assert len(s.items) == 2 and all(ops_in(i.ast).count(Ops.REDUCE_AXIS) == 1 for i in s.items)


def test_a_padded_reduce_is_realized() -> None:
    a = tensor(4, 8)
    out = move(Ops.PAD, reduce(a, (1,)), ((1, 1), (0, 0)))
    s = create_schedule([out])
    check_well_formed(s, [out])
    assert len(s.items) == 2


def test_an_unexpressible_reshape_of_a_permuted_buffer_realizes_the_permute() -> None:
    a, b = tensor(4, 6), tensor(24)
    t = move(Ops.PERMUTE, a, (1, 0))
    flat = move(Ops.RESHAPE, t, (24,))
    assert View.create((4, 6)).permute((1, 0)).reshape((24,)) is None
    out = flat + b
    s = create_schedule([out])
    check_well_formed(s, [out])
    assert len(s.items) == 2
    copy, add = s.items
    (load,) = [u for u in copy.ast.toposort if u.op is Ops.READ]
    assert load.view == View.create((4, 6)).permute((1, 0))  # the copy does the transpose
    assert add.buffers[1] is copy.buffers[0] and add.buffers[2] is buffer_of(b.src[0])
    assert all(u.view.contiguous for u in add.ast.toposort if u.op is Ops.READ)


def test_an_expressible_reshape_is_free() -> None:
    a, b = tensor(4, 6), tensor(6, 2, 2)
    out = move(Ops.RESHAPE, move(Ops.PERMUTE, a, (1, 0)), (6, 2, 2)) + b  # splitting a dim: one View says it
    s = create_schedule([out])
    check_well_formed(s, [out])
    assert len(s.items) == 1


def test_contiguous_forces_a_kernel() -> None:
    a = tensor(4, 4)
    mid = contiguous(a + const(1.0, (4, 4)))
    out = mid * mid
    s = create_schedule([out])
    check_well_formed(s, [out])
    assert len(s.items) == 2
    assert s.items[1].buffers[1] is s.items[0].buffers[0]
    assert ops_in(s.items[1].ast).count(Ops.READ) == 1  # both factors read the realized buffer
    copy = create_schedule([contiguous(move(Ops.PERMUTE, a, (1, 0)))])
    assert len(copy.items) == 1


def test_a_reduce_reshaped_and_made_contiguous_is_written_where_it_is_computed() -> None:
    """contiguous(reshape(reduce)) is the reduction's own kernel, its store view taking the reshape (no copy); under
    a CONTIGUOUS a permute stays the layout asked for: the kernel runs in the output's order."""
    a = tensor(4, 6, 8)
    out = contiguous(move(Ops.RESHAPE, reduce(a, (2,)), (24,)))
    s = create_schedule([out])
    check_well_formed(s, [out])
    assert len(s.items) == 1 and ops_in(s.items[0].ast).count(Ops.REDUCE_AXIS) == 1
    flipped = contiguous(move(Ops.PERMUTE, a + const(1.0, (4, 6, 8)), (2, 0, 1)))
    (item,) = create_schedule([flipped]).items
    assert store_of(item.ast).view == View.create((8, 4, 6))  # stored in order, the input read permuted


def test_a_reduce_permuted_and_made_contiguous_is_written_in_that_order_where_it_is_computed() -> None:
    """contiguous(permute(reduce)): one kernel (not the reduction realized and then copied), storing through the
    permute."""
    a = tensor(4, 6, 8)
    out = contiguous(move(Ops.PERMUTE, reduce(a, (2,)), (2, 1, 0)))
    (item,) = create_schedule([out]).items
    assert ops_in(item.ast).count(Ops.REDUCE_AXIS) == 1
    assert store_of(item.ast).view == View.create((1, 6, 4)).permute((2, 1, 0))


def test_a_product_asked_for_across_its_operands_is_computed_then_copied() -> None:
    """contiguous(permute(a @ w)) with the rows innermost, where w is read along the columns and nothing along the
    rows (attention's keys transposed): the product in its own order, then a copy into the order asked for (stored
    where computed, each vector of the product would scatter its lanes a row apart: 3.5 -> 34 ms)."""
    a, w = tensor(8, 4), tensor(4, 6)
    left = move(Ops.EXPAND, move(Ops.RESHAPE, a, (8, 1, 4)), (8, 6, 4))
    right = move(Ops.EXPAND, move(Ops.RESHAPE, move(Ops.PERMUTE, w, (1, 0)), (1, 6, 4)), (8, 6, 4))
    out = contiguous(move(Ops.PERMUTE, reduce(left * right, (2,)), (2, 1, 0)))
    s = create_schedule([out])
    check_well_formed(s, [out])
    product, copy = (item.ast for item in s.items)
    assert ops_in(product).count(Ops.REDUCE_AXIS) == 1 and Ops.REDUCE_AXIS not in ops_in(copy)
    assert store_of(product).view.strides[1] == 1 and store_of(copy).view.shape == (1, 6, 8)


def test_other_readers_of_a_value_made_contiguous_read_its_memory() -> None:
    """x made contiguous (through a permute) and also summed: x is computed once; the sum reads the copy through
    the inverse view instead of recomputing x from a and b."""
    a, b = tensor(4, 6), tensor(4, 6)
    x = a * b + const(1.0, (4, 6))
    kept = contiguous(move(Ops.PERMUTE, x, (1, 0)))
    total = reduce(x, (0, 1))
    s = create_schedule([kept, total])
    check_well_formed(s, [kept, total])
    copy, summed = s.items
    assert summed.buffers[1:] == (copy.buffers[0],)
    (load,) = [u for u in summed.ast.toposort if u.op is Ops.READ]
    assert load.view == View.create((6, 4)).permute((1, 0))
    alone = reduce(a * const(2.0, (4, 6)), (0, 1))  # a target is not read from another node's copy
    s = create_schedule([alone, contiguous(move(Ops.PERMUTE, alone, (1, 0)))])
    assert s.items[1].buffers[1] is s.items[0].buffers[0]


def test_a_value_the_scheduler_keeps_is_stored_in_the_order_of_its_largest_input() -> None:
    """A reduction realized for its reader (seen through an expand) over an input whose memory is channels-last
    (an NCHW view of NHWC memory) is stored channels-last too, and read back through that layout; a target or a
    value asked for contiguous keeps its own order."""
    nhwc = tensor(2, 4, 6, 8)
    x = move(Ops.PERMUTE, nhwc, (0, 3, 1, 2))  # (2, 8, 4, 6)
    pooled = reduce(x, (3,), Ops.MAX)  # (2, 8, 4, 1)
    out = reduce(x - move(Ops.EXPAND, pooled, (2, 8, 4, 6)), (3,))
    s = create_schedule([out])
    check_well_formed(s, [out])
    first, second = s.items
    assert store_of(first.ast).view == View.create((2, 4, 1, 8)).permute((0, 3, 1, 2))
    arg = second.buffers.index(first.buffers[0])
    loads = {u.view for u in second.ast.toposort if u.op is Ops.READ and u.buffer.arg == arg}
    assert loads == {View.create((2, 4, 1, 8)).permute((0, 3, 1, 2)).expand((2, 8, 4, 6))}
    assert store_of(second.ast).view == View.create((2, 8, 4, 1))  # the target: in its own order
    (item,) = create_schedule([pooled]).items
    assert store_of(item.ast).view == View.create((2, 8, 4, 1))


def test_a_realized_target_needs_no_kernel() -> None:
    a = tensor(4, 4)
    s = create_schedule([a])
    assert s.items == [] and a not in s.becomes
    raw = a.src[0]
    assert create_schedule([raw]).items == []


def test_becomes_covers_every_target() -> None:
    a, b = tensor(4, 8), tensor(4, 8)
    t1 = a + b
    t2 = reduce(t1, (1,))
    t3 = move(Ops.PERMUTE, a, (1, 0))
    t4 = move(Ops.RESHAPE, reduce(a, (0, 1)), ())
    targets = [t1, t2, t3, t4]
    s = create_schedule(targets)
    check_well_formed(s, targets)
    assert all(t in s.becomes for t in targets)
    assert s.becomes[t3].shape == (8, 4) and s.becomes[t4].shape == ()
    assert len({id(buffer_of(s.becomes[t].src[0])) for t in targets}) == 4
    # a target used by another target is read from its buffer, not computed twice
    t2_item = next(i for i in s.items if i.buffers[0] is buffer_of(s.becomes[t2].src[0]))
    assert buffer_of(s.becomes[t1].src[0]) in t2_item.buffers[1:]


def test_kernels_come_in_dependency_order() -> None:
    x = tensor(8)
    h = x
    for i in range(5):  # each step needs the previous one realized
        h = contiguous(h * const(float(i + 2), (8,)))
    out = reduce(h, (0,))
    s = create_schedule([out])
    check_well_formed(s, [out])
    assert len(s.items) == 6
    for prev, item in zip(s.items, s.items[1:]):
        assert prev.buffers[0] in item.buffers[1:]


def test_identical_kernels_share_one_ast_object() -> None:
    a, b = tensor(4, 4), tensor(4, 4)
    s = create_schedule([a.alu(Ops.EXP2) + a, b.alu(Ops.EXP2) + b])
    assert len(s.items) == 2
    assert s.items[0].ast is s.items[1].ast
    assert s.items[0].buffers[1] is not s.items[1].buffers[1]
    other = create_schedule([a.alu(Ops.LOG2) + a])
    assert other.items[0].ast is not s.items[0].ast


def test_int_and_bool_dtypes_flow_through() -> None:
    a = tensor(6, dtype=dtypes.int32)
    out = a.lt(const(3, (6,), dtypes.int32)).where(a, const(-1, (6,), dtypes.int32))
    s = create_schedule([out])
    check_well_formed(s, [out])
    assert s.items[0].buffers[0].dtype == dtypes.int32
    cmp = next(u for u in s.items[0].ast.toposort if u.op is Ops.CMPLT)
    assert cmp.dtype == dtypes.bool


def test_scheduling_never_allocates() -> None:
    a = tensor(4)
    s = create_schedule([a + a])
    assert not any(b.is_allocated for b in s.items[0].buffers)


def test_a_deep_elementwise_chain_schedules() -> None:
    xs = [tensor(4) for _ in range(1000)]
    total = xs[0]
    for x in xs[1:]:
        total = total + x
    try:
        s = create_schedule([total])
    except RecursionError:
        pytest.fail("RecursionError", pytrace=False)  # a short report: pytest formats a deep traceback slowly
    assert len(s.items) == 1 and len(s.items[0].buffers) == 1001


# ---------------------------------------------------------------- kernels over a device's buffer limit


class _Limited(Compiled):
    """An opened device with limits in its caps (buffers per kernel, loop iterations per thread), as WebGPU has."""

    def __init__(self, **limits: int) -> None:  # nothing to allocate: the scheduler only reads the renderer's caps
        self.__dict__["renderer"] = SimpleNamespace(caps=RendererCaps(language="FEW", **limits))


def few_tensor(device: str, n: int, dtype: DType = f32) -> UOp:
    return UOp(Ops.RESHAPE, dtype, (new_buffer(device, n, dtype),), (n,))


def test_a_kernel_over_the_buffer_limit_is_split(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(Device._open, "FEW", _Limited(max_buffers=4))
    xs = [few_tensor("FEW", 8) for _ in range(11)]
    total = xs[0]
    for x in xs[1:]:
        total = UOp(Ops.ADD, f32, (total, x))
    s = create_schedule([total])
    check_well_formed(s, [total])
    assert len(s.items) >= 3 and all(len(item.buffers) <= 4 for item in s.items)
    read = {id(b) for item in s.items for b in item.buffers[1:]}
    assert all(id(buffer_of(x.source)) in read for x in xs)  # every input is still read by some kernel


def test_a_kernel_that_cannot_be_split_under_the_limit_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(Device._open, "FEW", _Limited(max_buffers=3))
    cond, a, b = few_tensor("FEW", 8, dtypes.bool), few_tensor("FEW", 8), few_tensor("FEW", 8)
    picked = UOp(Ops.WHERE, f32, (cond, a, b))  # 4 buffers with its output, and no part reads two of them
    with pytest.raises(ValueError, match="reads 3 buffers and its device FEW binds at most 3 in one kernel"):
        create_schedule([picked])


def test_a_reduction_longer_than_the_loop_limit_runs_in_two_stages(monkeypatch: pytest.MonkeyPatch) -> None:
    """llvmpipe stops a thread after 65535 loop iterations: 40 sums of 250000 elements each (too many outputs for
    the usual split) become 40 * 500 partial sums of 500, then 40 sums of 500."""
    monkeypatch.setitem(Device._open, "FEW", _Limited(max_loop_iterations=65535))
    x = few_tensor("FEW", 40 * 250000)
    total = reduce(UOp(Ops.RESHAPE, f32, (x,), (40, 250000)), (1,))
    s = create_schedule([total])
    check_well_formed(s, [total])
    assert [item.buffers[0].size for item in s.items] == [40 * 500, 40]
    monkeypatch.setitem(Device._open, "FEW", _Limited())  # no limit: one kernel
    assert len(create_schedule([reduce(UOp(Ops.RESHAPE, f32, (x,), (40, 250000)), (1,))]).items) == 1


def test_a_factor_constant_along_the_reduced_axes_leaves_the_sum() -> None:
    """Batch norm's backward: sum(dy * gamma) feeds the input gradient and sum(dy) is beta's gradient; gamma is the
    same along the reduced axes, so both are sum(dy) (gamma multiplies the 4 sums, not the 512 elements): one
    reduction of dy and the elementwise kernel, where each sum had its own pass over dy."""
    dy, gamma = tensor(8, 4, 16), tensor(1, 4, 1)
    scaled = reduce(UOp(Ops.MUL, f32, (dy, move(Ops.EXPAND, gamma, (8, 4, 16)))), (0, 2))
    dx = UOp(Ops.ADD, f32, (dy, UOp(Ops.NEG, f32, (move(Ops.EXPAND, scaled, (8, 4, 16)),))))
    dbeta = reduce(dy, (0, 2))
    s = create_schedule([dx, dbeta])
    check_well_formed(s, [dx, dbeta])
    assert len(s.items) == 2
    (summed,) = [item for item in s.items if Ops.REDUCE_AXIS in ops_in(item.ast)]
    assert len(summed.buffers) == 2 and summed.buffers[1] is buffer_of(dy.source), "the sum reads dy alone"


# ---------------------------------------------------------------- rows: a reduction read by each element of its row


def _loop_device(monkeypatch: pytest.MonkeyPatch, **caps: bool) -> str:
    """An opened device: by default one whose threads run loops (the CPU); has_local (and has_shared) a GPU."""
    monkeypatch.setitem(Device._open, "ROWS", _Limited())
    Device._open["ROWS"].renderer.caps = RendererCaps(language="ROWS", **caps)
    return "ROWS"


def _rows(device: str, *shape: int) -> UOp:
    return UOp(Ops.RESHAPE, f32, (new_buffer(device, math.prod(shape), f32),), shape)


def test_a_softmax_is_one_kernel_where_threads_run_loops(monkeypatch: pytest.MonkeyPatch) -> None:
    """On the CPU a row's max and sum stay in the kernel that reads them: the kernel gets a dim per reduced axis,
    after the output's, along which the reductions read the row (and the output has size 1), while the row's
    elements broadcast them (stride 0 along the reduced axis)."""
    x = _rows(_loop_device(monkeypatch), 4, 8)
    out = _softmax(x)
    s = create_schedule([out])
    check_well_formed(s, [out])
    (item,) = s.items
    validate_ast(item.ast)
    store = store_of(item.ast)
    assert store.view.shape == (4, 8, 1) and store.view.strides == (8, 1, 0)
    reductions = [u for u in item.ast.toposort if u.op is Ops.REDUCE_AXIS]
    assert [r.arg for r in reductions] == [(Ops.MAX, (2,)), (Ops.ADD, (2,))]
    reads = {u.view for u in item.ast.toposort if u.op is Ops.READ}
    assert reads == {View.create((4, 8, 1)), View.create((4, 8, 8), (8, 0, 1))}  # the element, the row


def test_rows_on_a_gpu_are_one_kernel_where_its_workgroups_can_share_them(monkeypatch: pytest.MonkeyPatch) -> None:
    """On a GPU a workgroup's threads share a row's reductions through local memory (tiny.codegen.opt's ROWS): one
    reduced axis of a known size. Without local memory, or over two axes, each reduction is a kernel of its own (each
    thread would compute its row's reductions again for itself)."""
    gpu = _loop_device(monkeypatch, has_local=True, has_shared=True)
    assert len(create_schedule([_softmax(_rows(gpu, 4, 8))]).items) == 1
    x = _rows(gpu, 2, 4, 8)
    over_two = x - move(Ops.EXPAND, reduce(x, (1, 2), Ops.MAX), (2, 4, 8))
    assert len(create_schedule([over_two]).items) == 2
    monkeypatch.setitem(Device._open, "ROWS", _Limited())  # (the loops of a CPU: one kernel)
    assert len(create_schedule([x - move(Ops.EXPAND, reduce(x, (1, 2), Ops.MAX), (2, 4, 8))]).items) == 1
    no_shared = _loop_device(monkeypatch, has_local=True)
    assert len(create_schedule([_softmax(_rows(no_shared, 4, 8))]).items) == 3


def test_a_norm_reads_its_mean_inside_its_variance(monkeypatch: pytest.MonkeyPatch) -> None:
    """A layer norm: the variance's row reads the mean's (a row reduction inside another's row), one kernel."""
    x = _rows(_loop_device(monkeypatch), 3, 16)
    mean = move(Ops.EXPAND, reduce(x, (1,)) * const(1 / 16, (3, 1)), (3, 16))
    centered = x - mean
    var = reduce(centered * centered, (1,)) * const(1 / 16, (3, 1))
    out = centered * move(Ops.EXPAND, (var + const(1e-5, (3, 1))).alu(Ops.SQRT).alu(Ops.RECIP), (3, 16))
    s = create_schedule([out])
    check_well_formed(s, [out])
    (item,) = s.items
    validate_ast(item.ast)
    assert [u.arg for u in item.ast.toposort if u.op is Ops.REDUCE_AXIS] == [(Ops.ADD, (2,))] * 2


def test_rows_along_two_axes_are_two_kernels(monkeypatch: pytest.MonkeyPatch) -> None:
    """One kernel's rows run along one set of axes: a column's max beside a row's is computed in a kernel of its
    own, and read like any buffer."""
    x = _rows(_loop_device(monkeypatch), 4, 8)
    out = x - move(Ops.EXPAND, reduce(x, (1,), Ops.MAX), (4, 8)) - move(Ops.EXPAND, reduce(x, (0,), Ops.MAX), (4, 8))
    s = create_schedule([out])
    check_well_formed(s, [out])
    assert len(s.items) == 2
    first, last = (item.ast for item in s.items)
    assert [u.arg for u in first.toposort if u.op is Ops.REDUCE_AXIS] in ([(Ops.MAX, (1,))], [(Ops.MAX, (0,))])
    assert len([u for u in last.toposort if u.op is Ops.REDUCE_AXIS]) == 1
    validate_ast(last)


def test_rows_under_a_reduction_are_realized(monkeypatch: pytest.MonkeyPatch) -> None:
    """A sum over softmax rows (a loss): the kernel's root reduces, so the rows' reductions are kernels."""
    x = _rows(_loop_device(monkeypatch), 4, 8)
    total = reduce(_softmax(x), (0, 1))
    s = create_schedule([total])
    check_well_formed(s, [total])
    assert len(s.items) == 3


def test_a_row_seen_through_a_movement_op_is_realized(monkeypatch: pytest.MonkeyPatch) -> None:
    """The rows must come back along the axes they reduced: a max broadcast into a transposed shape is a buffer."""
    x = _rows(_loop_device(monkeypatch), 4, 4)
    m = move(Ops.EXPAND, reduce(x, (1,), Ops.MAX), (4, 4))
    out = x - move(Ops.PERMUTE, m, (1, 0))
    s = create_schedule([out])
    check_well_formed(s, [out])
    assert len(s.items) == 2


def test_rows_along_memory_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """Only a row over the last axes is one kernel: a column's elements lie a row apart, and a kernel that walks
    a column three times (max, sum, output) reads it from memory each time, where three kernels stream the rows."""
    x = _rows(_loop_device(monkeypatch), 4, 8, 1)
    out = x - move(Ops.EXPAND, reduce(x, (0,), Ops.MAX), (4, 8, 1))
    assert len(create_schedule([out]).items) == 2
    (item,) = create_schedule([x - move(Ops.EXPAND, reduce(x, (1,), Ops.MAX), (4, 8, 1))]).items
    assert store_of(item.ast).view == View.create((4, 8, 1, 1), (8, 1, 0, 0))


def test_a_row_read_first_in_another_rows_sum_keeps_the_sums_shape(monkeypatch: pytest.MonkeyPatch) -> None:
    """sum(var * centered + var * centered) over a row, the variance first: an AST op's shape is its sources'
    broadcast (the variance has size 1 along the reduced dim), else the sum's loop was lost (std's gradient was off by
    half)."""
    x = _rows(_loop_device(monkeypatch), 3, 2)
    centered = x - move(Ops.EXPAND, reduce(x, (1,)), (3, 2))
    var = move(Ops.EXPAND, reduce(centered * centered, (1,)), (3, 2))
    term = var * centered
    out = x + move(Ops.EXPAND, reduce(term + term, (1,)), (3, 2))
    (item,) = create_schedule([out]).items
    shapes = {u.source.shape for u in item.ast.toposort if u.op is Ops.REDUCE_AXIS}
    assert shapes == {(3, 2, 2)}


# ---------------------------------------------------------------- a GPU's long products into few outputs


def _weight_gradient(device: str, images: int = 8, positions: int = 1024) -> UOp:
    """A weight gradient's shape of work: 8 x 8 outputs, each the products of its row of dy and its row of x summed
    over images x positions (the reduced axes 0 and 3, not side by side); each element of x and dy is read for 8
    outputs."""
    dy = _rows(device, images, 8, 1, positions)
    x = _rows(device, images, 1, 8, positions)
    shape = (images, 8, 8, positions)
    return reduce(UOp(Ops.MUL, f32, (move(Ops.EXPAND, dy, shape), move(Ops.EXPAND, x, shape))), (0, 3))


def test_a_long_product_into_few_outputs_is_split_on_a_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """On a GPU a product with fewer outputs than threads and a long reduction is two kernels: partial products
    along one reduced axis (here the positions: 256 partials, the most that leave each 32 elements, short of the
    outputs GPU_PARTIALS asks for), which its threads tile in registers, then their sum. A plain sum of as many
    elements (each read once), and the same product on a CPU, stay one kernel."""
    gpu = _loop_device(monkeypatch, has_local=True, has_shared=True)
    grad = _weight_gradient(gpu)
    s = create_schedule([grad])
    check_well_formed(s, [grad])
    assert [item.buffers[0].size for item in s.items] == [64 * 256, 64]
    partial, total = (item.ast for item in s.items)
    assert [u.arg for u in partial.toposort if u.op is Ops.REDUCE_AXIS] == [(Ops.ADD, (0, 4))]
    assert store_of(partial).view.shape == (1, 8, 8, 256, 1)
    assert [u.arg for u in total.toposort if u.op is Ops.REDUCE_AXIS] == [(Ops.ADD, (3,))]
    plain = reduce(_rows(gpu, 8, 64, 1024), (0, 2))
    assert len(create_schedule([plain]).items) == 1
    # (fewer partials where more would leave fewer than 32 elements each: 8 images x 512 positions, 128 of them)
    shorter = create_schedule([_weight_gradient(gpu, positions=512)])
    assert [item.buffers[0].size for item in shorter.items] == [64 * 128, 64]
    assert len(create_schedule([_weight_gradient(gpu, positions=256)]).items) == 1  # (2048 elements: not long)
    cpu = _loop_device(monkeypatch)
    assert len(create_schedule([_weight_gradient(cpu)]).items) == 1
