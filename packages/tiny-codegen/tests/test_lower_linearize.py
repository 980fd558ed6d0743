"""Lowering and linearizing kernel ASTs: the result is a valid device-op list whose loops nest, whose work sits
in the outermost loop it can, whose reductions use accumulators, and which computes what NumPy does."""

from __future__ import annotations

import importlib
from dataclasses import replace

import numpy as np
import pytest
from kernel_helpers import (
    LOOPS,
    Case,
    const,
    expand,
    interpret_ast,
    kernel_uops,
    make_cases,
    move,
    reduce,
    run_case,
    tensor,
)

from tiny.codegen.linearize import linearize
from tiny.codegen.lower import identity, kernel_name, lower
from tiny.codegen.opt import Opt, OptOps
from tiny.codegen.program import estimate, format_uops
from tiny.ir.device import RendererCaps
from tiny.ir.dtypes import dtypes
from tiny.ir.pattern import graph_rewrite
from tiny.ir.schedule import create_schedule
from tiny.ir.spec import validate
from tiny.ir.symbolic import symbolic
from tiny.ir.uop import Ops, UOp
from tiny.ir.views import View

f32 = dtypes.float32
LOCAL = RendererCaps(language="test", has_local=True)
CASES = make_cases()


def asts(*targets: UOp) -> list[UOp]:
    return [item.ast for item in create_schedule(list(targets)).items]


def only_ast(*targets: UOp) -> UOp:
    (ast,) = asts(*targets)
    return ast


# ---------------------------------------------------------------- what the kernels compute


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_kernels_compute_what_numpy_does(case: Case) -> None:
    got = run_case(case, interpret_ast)
    for g, want in zip(got, case.expected):
        np.testing.assert_allclose(g, want, rtol=case.rtol, atol=1e-6)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_kernels_with_hardware_indices_compute_the_same(case: Case) -> None:
    got = run_case(case, lambda ast, bufs: interpret_ast(ast, bufs, LOCAL))
    for g, want in zip(got, case.expected):
        np.testing.assert_allclose(g, want, rtol=case.rtol, atol=1e-6)


# ---------------------------------------------------------------- structure


def loop_structure(uops: list[UOp]) -> dict[UOp, tuple[UOp, ...]]:
    """For each op, the loops open where it stands (outermost first)."""
    open_loops: list[UOp] = []
    where: dict[UOp, tuple[UOp, ...]] = {}
    for u in uops:
        if u.op is Ops.ENDRANGE:
            assert open_loops and open_loops[-1] is u.src[0], "loops close innermost first"
            open_loops.pop()
        where[u] = tuple(open_loops)
        if u.op is Ops.RANGE:
            open_loops.append(u)
    assert not open_loops, "every loop is closed"
    return where


def depends_on(uops: list[UOp]) -> dict[UOp, set[UOp]]:
    """The loops each op's value depends on, through its sources."""
    deps: dict[UOp, set[UOp]] = {}
    for u in uops:
        deps[u] = set().union(*(deps[s] for s in u.src)) if u.src else set()
        if u.op is Ops.RANGE:
            deps[u] = {u}
    return deps


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_loops_nest_and_each_op_sits_in_the_innermost_loop_it_needs(case: Case) -> None:
    for ast in asts(*case.targets):
        _, uops = kernel_uops(ast)
        where, deps = loop_structure(uops), depends_on(uops)
        assert sum(u.op is Ops.RANGE for u in uops) == sum(u.op is Ops.ENDRANGE for u in uops)
        for u in uops:
            if u.op in (Ops.CONST, Ops.RANGE, Ops.ENDRANGE, Ops.DEFINE_GLOBAL, Ops.DEFINE_ACC):
                continue
            if where[u]:
                innermost = where[u][-1]
                assert innermost in deps[u], f"{u.op} does not change inside the loop around it\n{format_uops(uops)}"


def test_a_value_that_does_not_depend_on_the_inner_loop_is_hoisted() -> None:
    x, bias = tensor(4, 8), tensor(4, 1)
    out = x * expand(bias.alu(Ops.EXP2), (4, 8))
    _, uops = kernel_uops(only_ast(out))
    where = loop_structure(uops)
    ranges = [u for u in uops if u.op is Ops.RANGE]
    assert len(ranges) == 2
    (exp,) = [u for u in uops if u.op is Ops.EXP2]
    assert where[exp] == (ranges[0],)  # computed once per row, not once per element
    (bias_load,) = [u for u in uops if u.op is Ops.LOAD and u.address.pointer.arg == 2]
    assert where[bias_load] == (ranges[0],)


def test_a_reduce_becomes_an_accumulator_before_its_loop_and_an_assign_inside() -> None:
    x = tensor(4, 8)
    _, uops = kernel_uops(only_ast(reduce(x, (1,), Ops.MAX)))
    pos = {u: i for i, u in enumerate(uops)}
    where = loop_structure(uops)
    assert Ops.REDUCE not in [u.op for u in uops]
    (acc,) = [u for u in uops if u.op is Ops.DEFINE_ACC]
    (assign,) = [u for u in uops if u.op is Ops.ASSIGN]
    outer, inner = [u for u in uops if u.op is Ops.RANGE]
    assert acc.src[0].arg == -float("inf")  # MAX starts from the lowest value
    assert pos[acc] < pos[inner] and where[acc] == (outer,)
    assert where[assign] == (outer, inner) and assign.src[0] is acc
    assert assign.src[1].op is Ops.MAX and acc in assign.src[1].src
    (store,) = [u for u in uops if u.op is Ops.STORE]
    assert store.value is assign and where[store] == (outer,)  # the result is read after the loop


def _accumulator_updates(uops: list[UOp]) -> list[UOp]:
    """The ops of the loop that read the accumulator or an update of it, up to its ASSIGN."""
    (acc,) = [u for u in uops if u.op is Ops.DEFINE_ACC]
    chain, last = [], acc
    for u in uops:
        if u.op is not Ops.ASSIGN and last in u.src:
            chain.append(u)
            last = u
    return chain


def test_unrolled_lanes_reach_the_accumulator_in_one_op_unless_they_are_products() -> None:
    """A max (or a sum of anything but products) of 4 unrolled lanes combines them first: the accumulator takes
    one op per iteration, so the chain from one iteration to the next is one op long. A sum of products is added
    one product at a time (acc + a0*b0) + a1*b1 ...: multiply-adds the compiler fuses."""
    x = tensor(4, 64)
    _, uops = kernel_uops(only_ast(reduce(x, (1,), Ops.MAX)), opts=[Opt(OptOps.UNROLL, 1, 4)])
    (update,) = _accumulator_updates(uops)
    assert update.op is Ops.MAX
    _, uops = kernel_uops(only_ast(reduce(x.alu(Ops.EXP2), (1,))), opts=[Opt(OptOps.UNROLL, 1, 4)])
    assert [u.op for u in _accumulator_updates(uops)] == [Ops.ADD]
    y = tensor(4, 64)
    _, uops = kernel_uops(only_ast(reduce(x * y, (1,))), opts=[Opt(OptOps.UNROLL, 1, 4)])
    updates = _accumulator_updates(uops)
    assert [u.op for u in updates] == [Ops.ADD] * 4
    assert all(u.src[1].op is Ops.MUL for u in updates)


def test_reduce_identities() -> None:
    assert identity(Ops.ADD, f32) == 0 and identity(Ops.MUL, f32) == 1
    assert identity(Ops.MAX, f32) == -float("inf") and identity(Ops.MAX, dtypes.int8) == -128
    assert identity(Ops.MAX, dtypes.uint32) == 0 and identity(Ops.MAX, dtypes.bool) is False


def test_a_reduce_over_two_axes_nests_two_loops_in_one_accumulator() -> None:
    x = tensor(3, 4, 5)
    _, uops = kernel_uops(only_ast(reduce(x, (0, 2))))
    where = loop_structure(uops)
    (acc,) = [u for u in uops if u.op is Ops.DEFINE_ACC]
    (assign,) = [u for u in uops if u.op is Ops.ASSIGN]
    assert len(where[assign]) == 3 and len(where[acc]) == 1
    assert [u.end.arg for u in where[assign]] == [4, 3, 5]  # the output loop, then the reduce loops


def test_output_loops_come_in_axis_order() -> None:
    a = move(Ops.PERMUTE, tensor(5, 3, 2), (2, 1, 0))  # (2, 3, 5), no two dims one run of memory
    _, uops = kernel_uops(only_ast(a.alu(Ops.SQRT)))
    assert [u.end.arg for u in uops if u.op is Ops.RANGE] == [2, 3, 5]
    b = move(Ops.PERMUTE, tensor(5, 1, 2), (2, 1, 0))
    _, uops = kernel_uops(only_ast(b.alu(Ops.SQRT)))
    assert [u.end.arg for u in uops if u.op is Ops.RANGE] == [2, 5]  # no loop for a size-1 dim
    _, uops = kernel_uops(only_ast(tensor(2, 3, 5).alu(Ops.SQRT)))
    assert [u.end.arg for u in uops if u.op is Ops.RANGE] == [30]  # contiguous dims merge into one loop


def test_hardware_indices_replace_the_innermost_output_loops() -> None:
    a = tensor(2, 3, 4, 5)
    ast = only_ast(a.alu(Ops.EXP2))
    kernel, uops = kernel_uops(ast, LOCAL)
    specials = {u.arg for u in uops if u.op is Ops.SPECIAL}
    # gidx0 is the innermost dim; the last grid dim takes the outer dims too (3 x 2): no loop
    assert specials == {("gidx0", 5), ("gidx1", 4), ("gidx2", 6)}
    assert kernel.global_size == (5, 4, 6) and kernel.local_size == (1, 1, 1)
    assert not any(u.op is Ops.RANGE for u in uops)
    # ... while the renderer's limit for it allows: past that the outer dims stay loops
    kernel, uops = kernel_uops(ast, replace(LOCAL, global_max=(65535, 65535, 5)))
    assert kernel.global_size == (5, 4, 3) and [u.end.arg for u in uops if u.op is Ops.RANGE] == [2]
    small = only_ast(tensor(6, 1).alu(Ops.EXP2))
    kernel, uops = kernel_uops(small, LOCAL)
    assert kernel.global_size == (6, 1, 1) and not any(u.op is Ops.RANGE for u in uops)
    red = only_ast(reduce(tensor(4, 8), (1,)))
    kernel, uops = kernel_uops(red, LOCAL)
    assert kernel.global_size == (4, 1, 1) and [u.end.arg for u in uops if u.op is Ops.RANGE] == [8]
    assert lower(red, LOOPS).global_size == (1, 1, 1)


def test_kernel_names() -> None:
    assert kernel_name(only_ast(tensor(4, 4).alu(Ops.EXP2))) == "E_4_4"
    assert kernel_name(only_ast(tensor(4, 1, 3).alu(Ops.EXP2))) == "E_4_3"
    assert kernel_name(only_ast(move(Ops.RESHAPE, tensor(1), ()).alu(Ops.EXP2))) == "E_1"
    assert kernel_name(only_ast(reduce(tensor(4, 8), (1,)))) == "r_4_8"
    assert kernel_name(only_ast(reduce(tensor(4, 8), (0,)))) == "r_8_4"
    assert kernel_name(only_ast(reduce(tensor(4, 8), (0, 1)))) == "r_4_8"
    assert lower(only_ast(tensor(4, 4).alu(Ops.EXP2)), LOOPS).name == "E_4_4"
    for ast in asts(*CASES[0].targets):
        assert kernel_uops(ast)[0].name.startswith(("E_", "r_"))


def test_index_math_is_int32_for_small_views_and_int64_for_huge_ones() -> None:
    _, uops = kernel_uops(only_ast(tensor(8).alu(Ops.EXP2)))
    assert {u.dtype for u in uops if u.op is Ops.RANGE} == {dtypes.int32}
    huge = tensor(2**31 + 8, dtype=dtypes.int8)
    _, uops = kernel_uops(only_ast(huge * const(3, (2**31 + 8,), dtypes.int8)))
    assert {u.dtype for u in uops if u.op is Ops.RANGE} == {dtypes.int64}
    assert all(u.offset.dtype == dtypes.int64 for u in uops if u.op is Ops.INDEX)
    # a small buffer seen through a huge expand: the view's size decides too
    row = tensor(1, 4)
    _, uops = kernel_uops(only_ast(expand(row, (2**30, 4)) * const(2.0, (2**30, 4))))
    assert {u.dtype for u in uops if u.op is Ops.RANGE} == {dtypes.int64}


def test_a_kernel_over_nothing_is_empty() -> None:
    ast = only_ast(tensor(0, 4).alu(Ops.EXP2))
    kernel, uops = kernel_uops(ast)
    # nothing but its buffers, which stay arguments: launches pass them by position
    assert [u.op for u in uops] == [Ops.DEFINE_GLOBAL] * 2 and kernel.name == "E_0_4"


def test_a_gated_load_reads_zero_in_the_padding() -> None:
    a = tensor(4)
    _, uops = kernel_uops(only_ast(move(Ops.PAD, a, ((2, 2),))))
    (load,) = [u for u in uops if u.op is Ops.LOAD]
    assert load.address.gate is not None and load.alternative is not None and load.alternative.arg == 0.0


def test_padding_known_at_a_lane_is_no_load_and_no_add() -> None:
    """A window is a sum of padded views (one per offset); where a lane's index is a constant (an upcast or unrolled
    dim) each gate is known: the lane reads the one real view, ungated, with no `+ 0.0` for the others."""
    a = tensor(4, 6)
    left = move(Ops.PAD, move(Ops.SHRINK, a, ((0, 4), (0, 3))), ((0, 0), (0, 3)))  # columns 0-2 of a, then zeros
    right = move(Ops.PAD, move(Ops.SHRINK, a, ((0, 4), (3, 6))), ((0, 0), (3, 0)))  # zeros, then columns 3-5
    ast = only_ast(left + right)
    kernel = lower(ast, LOOPS, [Opt(OptOps.UPCAST, 1, 0)])  # the 6 columns written out: every gate a constant
    uops = linearize(graph_rewrite(kernel.sink, symbolic))
    validate(uops)
    loads = [u for u in uops if u.op is Ops.LOAD]
    assert len(loads) == 6 and all(u.address.gate is None for u in loads)
    assert not [u for u in uops if u.op is Ops.ADD and u.dtype == f32]
    res, src = np.zeros((4, 6), np.float32), np.arange(24, dtype=np.float32) - 12
    interpret_ast(ast, [res.reshape(-1), src])
    np.testing.assert_array_equal(res, src.reshape(4, 6))


def test_hand_built_ast() -> None:
    """SINK(WRITE(DEFINE_GLOBAL, VIEW, value)) with READ(DEFINE_GLOBAL, VIEW), CONST(VIEW) and REDUCE_AXIS."""
    out = UOp(Ops.DEFINE_GLOBAL, f32.ptr(3), (), 0)
    inp = UOp(Ops.DEFINE_GLOBAL, f32.ptr(6), (), 1)
    load = UOp(Ops.READ, f32, (inp, UOp(Ops.VIEW, arg=View.create((2, 3)).permute((1, 0)))))
    two = UOp(Ops.CONST, f32, (UOp(Ops.VIEW, arg=View.create((3, 2), (0, 0))),), 2.0)
    red = UOp(Ops.REDUCE_AXIS, f32, (load * two,), (Ops.ADD, (1,)))
    ast = UOp(Ops.SINK, src=(UOp(Ops.WRITE, src=(out, UOp(Ops.VIEW, arg=View.create((3, 1))), red)),))
    kernel, uops = kernel_uops(ast)
    assert kernel.name == "r_3_2"
    res, src = np.zeros(3, np.float32), np.arange(6, dtype=np.float32)
    interpret_ast(ast, [res, src])
    np.testing.assert_array_equal(res, src.reshape(2, 3).sum(0) * 2)


# ---------------------------------------------------------------- estimates


def test_estimate_counts_work_and_memory() -> None:
    a, b = tensor(4, 8), tensor(4, 8)
    _, uops = kernel_uops(only_ast(a * b + a))
    flops, mem = estimate(uops)
    assert flops == 2 * 32  # a MUL and an ADD per element; the index math does not count
    assert mem == 3 * 32 * 4  # two inputs and the output
    _, uops = kernel_uops(only_ast(reduce(tensor(4, 8), (1,))))
    flops, mem = estimate(uops)
    assert flops == 32 and mem == (32 + 4) * 4
    _, uops = kernel_uops(only_ast(reduce(tensor(16, dtype=dtypes.float16), (0,))))
    assert estimate(uops) == (16, (16 + 1) * 2)


def test_estimate_multiplies_by_hardware_indices() -> None:
    a = tensor(6, 5)
    _, uops = kernel_uops(only_ast(a.alu(Ops.SQRT)), LOCAL)
    assert estimate(uops)[0] == 30


def test_a_deep_elementwise_chain_lowers_and_linearizes() -> None:
    xs = [tensor(4) for _ in range(1000)]  # Python's sum() over 1000 tensors: one kernel, 999 ADDs deep
    total = xs[0]
    for x in xs[1:]:
        total = total + x
    try:
        kernel, uops = kernel_uops(only_ast(total))
    except RecursionError:
        pytest.fail("RecursionError", pytrace=False)  # a short report: pytest formats a deep traceback slowly
    assert sum(u.op is Ops.LOAD for u in uops) == 1000 and kernel.name == "E_4"
    inputs = [np.full(4, i, np.float32) for i in range(1000)]
    out = np.zeros(4, np.float32)
    interpret_ast(only_ast(total), [out, *inputs])
    np.testing.assert_array_equal(out, np.full(4, sum(range(1000)), np.float32))


def test_lanes_share_the_lowering_of_what_they_read_alike(monkeypatch: pytest.MonkeyPatch) -> None:
    """In a 16 x 24 x 32 product with 8 columns per thread (UPCAST of n) and 4 steps of k unrolled, a row of A is
    the same for the 8 columns: each A load is lowered once per step, each B load once per step and column. The
    program is the one lowering every lane on its own gives."""
    lowering = importlib.import_module("tiny.codegen.lower")  # (the module: tiny.codegen.lower is also a function)
    a, b = tensor(16, 32), tensor(32, 24)
    prod = expand(move(Ops.RESHAPE, a, (16, 32, 1)), (16, 32, 24)) * expand(
        move(Ops.RESHAPE, b, (1, 32, 24)), (16, 32, 24)
    )
    ast = only_ast(move(Ops.RESHAPE, reduce(prod, (1,)), (16, 24)))
    opts = [Opt(OptOps.UPCAST, 1, 8), Opt(OptOps.UNROLL, 2, 4)]
    loads: dict[int, int] = {}  # DEFINE_GLOBAL number -> loads lowered
    combine = lowering._Lowerer._combine

    def counting(self, key, srcs):  # noqa: ANN001, ANN202
        if key[0].op is Ops.READ:
            loads[key[0].buffer.arg] = loads.get(key[0].buffer.arg, 0) + 1
        return combine(self, key, srcs)

    monkeypatch.setattr(lowering._Lowerer, "_combine", counting)
    shared = lower(ast, RendererCaps(language="test"), opts).sink
    assert loads == {1: 4, 2: 4 * 8}
    monkeypatch.setattr(lowering._Lowerer, "key", lambda self, u, idxs: (u, idxs))  # every lane on its own
    assert lower(ast, RendererCaps(language="test"), opts).sink is shared
