"""The optimizer's actions: what each does to a kernel's plan and its code, and that an illegal one is refused with
the reason. Running optimized kernels against unoptimized ones is tiny-tensor's test_opt_fuzz (it needs devices)."""

from __future__ import annotations

import ctypes
import subprocess
from dataclasses import replace
from types import SimpleNamespace

import numpy as np
import pytest
from kernel_helpers import const, expand, interpret_ast, move, reduce, tensor, vector_uops
from test_cstyle import build, compilers

from tiny.codegen import Kernel, KernelOptError, Opt, OptOps, program
from tiny.codegen.lower import lower_kernel
from tiny.codegen.opt.actions import Kind, merge_windows
from tiny.codegen.opt.beam import actions
from tiny.codegen.opt.heuristic import TILE_NODES, hand_opts
from tiny.codegen.renderer.cstyle import CRenderer
from tiny.ir.device import Compiled, Device, RendererCaps
from tiny.ir.dtypes import dtypes
from tiny.ir.schedule import create_schedule
from tiny.ir.uop import Ops, UOp

CPU = RendererCaps(language="C", vector_width=8, threads=4)
GPU = RendererCaps(
    language="PYTHON", has_local=True, has_shared=True, local_total_max=1024, shared_max=65536, vector_width=4
)
f32 = dtypes.float32


def ast_of(target: UOp) -> UOp:
    return create_schedule([target]).items[-1].ast


def matmul(m: int, k: int, n: int) -> UOp:
    a, b = tensor(m, k), tensor(k, n)
    prod = expand(move(Ops.RESHAPE, a, (m, k, 1)), (m, k, n)) * expand(move(Ops.RESHAPE, b, (1, k, n)), (m, k, n))
    return ast_of(move(Ops.RESHAPE, reduce(prod, (1,)), (m, n)))


def test_the_plan_of_a_matmul() -> None:
    k = Kernel(matmul(16, 32, 24), CPU)
    assert k.full_shape == (16, 32, 24) and k.reduce_dims == {1}
    assert [(p.dim, p.size, p.kind) for p in k.axes] == [
        (0, 16, Kind.GLOBAL),
        (2, 24, Kind.GLOBAL),
        (1, 32, Kind.REDUCE),
    ]
    k.apply(Opt(OptOps.UPCAST, 1, 8))
    k.apply(Opt(OptOps.UNROLL, 2, 4))
    k.apply(Opt(OptOps.THREAD, 0, 2))
    kinds = sorted((p.dim, p.size, p.stride, p.kind.value) for p in k.parts)
    assert kinds == [
        (0, 2, 8, "thread"),  # the outer piece of the rows: a contiguous block of rows per thread
        (0, 8, 1, "global"),
        (1, 4, 1, "unroll"),
        (1, 8, 4, "reduce"),
        (2, 3, 8, "global"),
        (2, 8, 1, "upcast"),
    ]


@pytest.mark.parametrize(
    "opt, why",
    [
        (Opt(OptOps.UPCAST, 0, 5), "does not split"),
        (Opt(OptOps.UPCAST, 2, 4), "needs a global axis"),
        (Opt(OptOps.UNROLL, 0, 4), "needs a reduce axis"),
        (Opt(OptOps.UPCAST, 7, 2), "does not exist"),
        (Opt(OptOps.LOCAL, 0, 4), "no workgroups"),
        (Opt(OptOps.GROUP, 2, 4), "no local memory"),
        (Opt(OptOps.PADTO, 0, 16), "changes nothing"),
        (Opt(OptOps.SWAP, 0, 0), "two different global axes"),
        (Opt(OptOps.THREAD, 0, 3), "does not split"),
        (Opt(OptOps.TC, 0, 0), "no tensor cores"),
    ],
)
def test_illegal_actions_are_refused_with_the_reason(opt: Opt, why: str) -> None:
    k = Kernel(matmul(16, 32, 24), CPU)
    before = list(k.parts)
    with pytest.raises(KernelOptError, match=why):
        k.apply(opt)
    assert k.parts == before and k.applied == []


def test_limits_on_lanes_and_threads() -> None:
    k = Kernel(matmul(64, 64, 64), CPU)
    k.apply(Opt(OptOps.UPCAST, 0, 32))
    k.apply(Opt(OptOps.UPCAST, 1, 32))  # 1024 values, the most
    with pytest.raises(KernelOptError, match="values per thread"):
        k.apply(Opt(OptOps.UNROLL, next(i for i, p in enumerate(k.axes) if p.kind is Kind.REDUCE), 4))  # 4096 > 1024
    k.apply(Opt(OptOps.THREAD, 0, 2))
    with pytest.raises(KernelOptError, match="across threads already"):
        k.apply(Opt(OptOps.THREAD, 0, 2))
    assert not any(o.op is OptOps.THREAD for o in actions(Kernel(matmul(8, 8, 8), GPU)))


def test_padto_masks_the_extra() -> None:
    k = Kernel(matmul(13, 17, 9), CPU)
    k.apply(Opt(OptOps.PADTO, 0, 8))
    assert k.padded == {0: 16} and k.axes[0].size == 16
    uops = vector_uops(matmul(13, 17, 9), CPU, [Opt(OptOps.PADTO, 0, 8), Opt(OptOps.PADTO, 2, 8)])
    stores = [u for u in uops if u.op is Ops.STORE]
    assert all(s.address.gate is not None for s in stores), "padded rows are not written"
    assert any(u.op is Ops.WHERE for u in uops), "padded reduce iterations add the identity"


def test_upcast_on_the_contiguous_dim_makes_vectors() -> None:
    uops = vector_uops(matmul(16, 32, 24), CPU, [Opt(OptOps.UPCAST, 1, 8), Opt(OptOps.UPCAST, 0, 4)])
    vec = f32.vec(8)
    assert any(u.op is Ops.STORE and u.value.dtype == vec for u in uops)
    assert any(u.op is Ops.LOAD and u.dtype == vec for u in uops), "rows of b load as vectors"
    assert sum(1 for u in uops if u.op is Ops.DEFINE_ACC and u.dtype == vec) == 4, "4 rows x 1 vector of accumulators"
    assert sum(1 for u in uops if u.op is Ops.RANGE) == 3, "one reduce loop shared by every lane"


def test_unrolled_reduction_accumulates_in_a_vector() -> None:
    x = tensor(4, 64)
    uops = vector_uops(ast_of(reduce(x, (1,))), CPU, [Opt(OptOps.UNROLL, 1, 8)])
    accs = [u for u in uops if u.op is Ops.DEFINE_ACC]
    assert [a.dtype for a in accs] == [f32.vec(8)]
    assert sum(1 for u in uops if u.op is Ops.GEP) == 8, "the lanes are added up after the loop"


def test_a_groups_partials_are_read_back_a_vector_at_a_time_after_their_barrier() -> None:
    """GROUP's partials lie side by side in local memory: every thread reads them back four at a time, and each
    vector read still waits for the barrier after the partials' stores (a vector load made of loads that waited for
    it once dropped the barrier, and with it the stores)."""
    uops = vector_uops(ast_of(reduce(tensor(4, 64), (1,))), GPU, [Opt(OptOps.GROUP, 1, 16)])
    (read,) = [u for u in uops if u.op is Ops.LOAD and u.address.pointer.op is Ops.DEFINE_LOCAL]
    assert read.dtype.count == 4
    (barrier,) = [s for s in read.waits_for if s.op is Ops.BARRIER]
    (store,) = barrier.src
    assert store.op is Ops.STORE and store.address.pointer.op is Ops.DEFINE_LOCAL
    assert next(u for u in uops if u.op is Ops.RANGE and u in read.toposort).end.arg == 16 // 4


def test_grouptop_gives_each_thread_a_contiguous_run_of_the_reduction() -> None:
    """GROUP makes the workgroup's threads the inner piece of the reduction (thread t reads t, t+16, ...); GROUPTOP
    the outer piece (thread t reads its own 4 in a row)."""
    x = tensor(4, 64)
    plans = {}
    for op in (OptOps.GROUP, OptOps.GROUPTOP):
        k = Kernel(ast_of(reduce(x, (1,))), GPU)
        k.apply(Opt(op, 1, 16))
        plans[op] = sorted((p.dim, p.size, p.stride, p.kind.value) for p in k.parts)
    assert plans[OptOps.GROUP] == [(0, 4, 1, "global"), (1, 4, 16, "reduce"), (1, 16, 1, "group")]
    assert plans[OptOps.GROUPTOP] == [(0, 4, 1, "global"), (1, 4, 1, "reduce"), (1, 16, 4, "group")]


@pytest.mark.parametrize(
    "caps, before, opt, why",
    [
        (GPU, [Opt(OptOps.GROUP, 1, 4)], Opt(OptOps.GROUPTOP, 1, 2), "split across the workgroup already"),
        (replace(GPU, shared_max=32), [], Opt(OptOps.GROUP, 1, 16), "64 bytes of local memory is too much"),
        (CPU, [], Opt(OptOps.PADTO, 0, 40), "padding 16 to 40 doubles it"),
        (CPU, [], Opt(OptOps.PADTO, 0, 1), "a multiple of at least 2"),
        (CPU, [Opt(OptOps.UPCAST, 0, 4)], Opt(OptOps.PADTO, 0, 8), "only a whole dim"),
        (CPU, [Opt(OptOps.THREAD, 0, 2)], Opt(OptOps.THREAD, 0, 2), "split across threads already"),
    ],
)
def test_actions_after_others_are_refused_with_the_reason(
    caps: RendererCaps, before: list[Opt], opt: Opt, why: str
) -> None:
    k = Kernel(ast_of(reduce(tensor(16, 64), (1,))), caps).apply_opts(before)
    parts = list(k.parts)
    with pytest.raises(KernelOptError, match=why):
        k.apply(opt)
    assert k.parts == parts and k.applied == before


def test_grouping_needs_exactly_one_reduction() -> None:
    two = ast_of(reduce(tensor(4, 64), (1,)) + reduce(tensor(4, 64), (1,)))
    with pytest.raises(KernelOptError, match="exactly one reduction, this kernel has 2"):
        Kernel(two, GPU).apply(Opt(OptOps.GROUP, 1, 16))


def test_group_reduces_through_local_memory() -> None:
    x = tensor(4, 64)
    uops = vector_uops(ast_of(reduce(x, (1,))), GPU, [Opt(OptOps.GROUP, 1, 16)])
    ops = [u.op for u in uops]
    assert Ops.DEFINE_LOCAL in ops and Ops.BARRIER in ops
    assert ops.index(Ops.BARRIER) < max(
        i for i, u in enumerate(uops) if u.op is Ops.LOAD and u.address.pointer.op is Ops.DEFINE_LOCAL
    )
    (store,) = [u for u in uops if u.op is Ops.STORE and u.address.pointer.op is Ops.DEFINE_GLOBAL]
    assert store.address.gate is not None, "the first thread of each group writes the result"
    lidx = [u.arg for u in uops if u.op is Ops.SPECIAL and u.arg[0].startswith("lidx")]
    assert lidx == [("lidx0", 16)]


def test_heuristics_tile_a_matmul_and_vectorize_elementwise() -> None:
    opts = hand_opts(Kernel(matmul(128, 128, 128), CPU))
    assert Opt(OptOps.UPCAST, 1, 16) in opts and any(o.op is OptOps.UNROLL for o in opts)
    assert any(o.op is OptOps.THREAD for o in opts)
    a = tensor(64, 64)
    ew = hand_opts(Kernel(ast_of(a * a), CPU))
    assert ew[0] == Opt(OptOps.UPCAST, 0, 8)  # (64 x 64 contiguous: one dim of 4096)
    assert hand_opts(Kernel(ast_of(tensor(3) * tensor(3)), RendererCaps(language="C"))) == []


def test_heuristics_tile_a_transpose_as_a_square_of_vectors() -> None:
    """A copy into another layout (the input read along the dim the output is not): a square of lanes x lanes values,
    so each input row is a vector load as each output row is a vector store; a plain copy stays one vector."""
    t = move(Ops.PERMUTE, tensor(64, 128), (1, 0))  # the output (128, 64) along its 64, the input along its 128
    opts = hand_opts(Kernel(ast_of(t + const(0.0, (128, 64))), CPU))
    assert opts[:2] == [Opt(OptOps.UPCAST, 1, 8), Opt(OptOps.UPCAST, 0, 8)]
    plain = hand_opts(Kernel(ast_of(tensor(128, 64) + const(0.0, (128, 64))), CPU))
    assert sum(o.op is OptOps.UPCAST for o in plain) == 1


def test_heuristics_take_no_square_for_values_broadcast_along_the_output() -> None:
    """A softmax's last kernel reads each row's maximum and sum (contiguous along the rows, broadcast along the
    output's dim): no transpose, one vector of the output dim (a square of 8 x 8 rows made it 171 ops, 20% slower on
    4096 x 4096)."""
    x, m, s = tensor(256, 512), tensor(256, 1), tensor(256, 1)
    out = (x - expand(m, (256, 512))) * expand(s, (256, 512))
    opts = hand_opts(Kernel(ast_of(out), CPU))
    assert [o for o in opts if o.op is OptOps.UPCAST] == [Opt(OptOps.UPCAST, 1, 8)]


def test_heuristics_take_half_vectors_where_whole_ones_do_not_divide_the_outputs() -> None:
    """A product with 40 outputs along memory (an attention head of 40: probabilities @ values) on 16-lane vectors:
    vectors of 8, where it fell to 4."""
    wide = RendererCaps(language="C", vector_width=16, threads=2)
    a, b = tensor(64, 256), tensor(256, 40)
    full = (64, 40, 256)
    prod = expand(move(Ops.RESHAPE, a, (64, 1, 256)), full) * expand(
        move(Ops.RESHAPE, move(Ops.PERMUTE, b, (1, 0)), (1, 40, 256)), full
    )
    opts = hand_opts(Kernel(ast_of(move(Ops.RESHAPE, reduce(prod, (2,)), (64, 40))), wide))
    assert opts[0] == Opt(OptOps.UPCAST, 1, 8)


def test_heuristics_pad_an_odd_number_of_columns_to_whole_vectors() -> None:
    """A sum down the columns of 256 x 4099: no vector count divides 4099, so the outputs are padded to whole tiles of
    32, to a multiple of the threads' shares of them (4099 -> 4224 = 132 tiles, 33 a thread); an even width is only
    cut. On a GPU nothing is padded."""
    odd = hand_opts(Kernel(ast_of(reduce(tensor(256, 4099), (0,))), CPU))
    assert odd[:2] == [Opt(OptOps.PADTO, 0, 128), Opt(OptOps.UPCAST, 0, 32)] and Opt(OptOps.THREAD, 0, 4) in odd
    even = hand_opts(Kernel(ast_of(reduce(tensor(256, 4096), (0,))), CPU))
    assert even[0] == Opt(OptOps.UPCAST, 0, 32) and not any(o.op is OptOps.PADTO for o in even)
    assert not any(o.op is OptOps.PADTO for o in hand_opts(Kernel(ast_of(reduce(tensor(256, 4099), (0,))), GPU)))


def test_heuristics_pad_a_prime_dim_to_split_it_across_threads() -> None:
    """No thread count divides 2**20 + 7 (prime): the dim is padded to a multiple of the threads and split, each
    thread's loop stopping where the dim ends (tiny.codegen.narrow); a dim some count divides is split by it."""
    n = 2**20 + 7
    assert hand_opts(Kernel(ast_of(tensor(n) * tensor(n)), CPU)) == [Opt(OptOps.PADTO, 0, 4), Opt(OptOps.THREAD, 0, 4)]
    assert Opt(OptOps.PADTO, 0, 4) in actions(Kernel(ast_of(tensor(n) * tensor(n)), CPU))
    even = hand_opts(Kernel(ast_of(tensor(3 * 2**19) * tensor(3 * 2**19)), CPU))
    assert Opt(OptOps.THREAD, 0, 4) in even and not any(o.op is OptOps.PADTO for o in even)


def test_heuristics_leave_a_big_body_untiled() -> None:
    """A register tile reuses a matrix product's loads; a reduction whose body is hundreds of ops (a fused backward
    pass) gains little from that, and its code would grow by the whole body with each value of the tile: it is
    planned as a plain reduction, no output dim upcast."""
    m, k, n = 16, 32, 24
    a, b = tensor(m, k), tensor(k, n)
    prod = expand(move(Ops.RESHAPE, a, (m, k, 1)), (m, k, n)) * expand(move(Ops.RESHAPE, b, (1, k, n)), (m, k, n))
    body = prod
    for i in range(1, 70):  # 4 AST nodes a step: scale, shift, max and their constants' views
        body = (body * const(1 + i / 1000, (m, k, n)) + const(i / 100, (m, k, n))).alu(Ops.MAX, prod)
    big = ast_of(move(Ops.RESHAPE, reduce(body, (1,)), (m, n)))
    assert len(Kernel(big, CPU).ast.toposort) > TILE_NODES >= len(Kernel(matmul(m, k, n), CPU).ast.toposort)
    small_opts = hand_opts(Kernel(matmul(m, k, n), CPU))
    assert Opt(OptOps.UPCAST, 0, 8) in small_opts and any(o.op is OptOps.UNROLL for o in small_opts)
    assert hand_opts(Kernel(big, CPU)) == [Opt(OptOps.UNROLL, 2, 16)]  # 16 steps of k, along A's rows, in vectors


@pytest.mark.skipif(not compilers(), reason="no C compiler on PATH")
def test_rules_choose_again_with_fewer_lanes_where_the_code_grows_too_big(monkeypatch: pytest.MonkeyPatch) -> None:
    """Where the rules' actions make more ops than CODE_OPS, they choose again with fewer values per thread: the
    code fits the budget, and computes what the bigger one does."""
    r = CRenderer("x86_64;vector_width=8;threads=1;")
    ast = matmul(16, 32, 24)
    a = np.random.default_rng(0).standard_normal((16, 32)).astype(np.float32)
    b = np.random.default_rng(1).standard_normal((32, 24)).astype(np.float32)
    sizes = []
    for budget in (program.CODE_OPS, 150):
        monkeypatch.setattr(program, "CODE_OPS", budget)
        rendered = program.render_for(ast, r, None)
        sizes.append(len(rendered.uops))
        out = np.zeros((16, 24), dtype=np.float32)
        fn = getattr(build(rendered.src), rendered.kernel.name)
        fn(*(ctypes.c_void_p(x.ctypes.data) for x in (out, a, b)))
        np.testing.assert_allclose(out, a @ b, rtol=1e-5, atol=1e-5)
    assert sizes[0] > 150 >= sizes[1]  # (280 ops with an 8 x 8 tile and 4 steps unrolled; 103 with one vector)


def test_the_rules_actions_are_a_list_whose_plan_is_lowered_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """The rules' actions are a list like any other, held to CODE_OPS; the spine starts from the plan they lowered to
    count its ops (not lowering it again), and renders what the same list given by a caller renders."""
    r = CRenderer("x86_64;vector_width=8;threads=1;")
    ast = matmul(16, 32, 24)
    monkeypatch.setattr(program, "CODE_OPS", 150)
    actions = program.rules_actions(ast, r)
    assert actions.chosen_by == "the rules" and actions.lowered is not None
    assert list(actions.opts) == actions.lowered.plan.applied and len(actions.lowered.sink.toposort) <= 150
    lowerings = []
    monkeypatch.setattr(program, "lower_kernel", lambda plan: lowerings.append(plan) or lower_kernel(plan))
    rules = program.render(ast, r, actions)
    assert lowerings == []
    given = program.render_for(ast, r, list(actions.opts))
    assert len(lowerings) == 1 and given.src == rules.src and given.opts == rules.opts == actions.opts


@pytest.mark.skipif(not compilers(), reason="no C compiler on PATH")
def test_vector_c_compiles() -> None:
    opts = [Opt(OptOps.UPCAST, 1, 8), Opt(OptOps.UPCAST, 0, 4), Opt(OptOps.UNROLL, 2, 4), Opt(OptOps.THREAD, 0, 2)]
    r = CRenderer("x86_64;vector_width=8;threads=2;")
    src = r.render("mm", vector_uops(matmul(16, 32, 24), r.caps, opts))
    assert "float32x8" in src and "tiny_vload_float32x8" in src and "int gidx0" in src
    cc = compilers()[0]
    out = subprocess.run([cc, "-c", "-x", "c", "-", "-o", "/dev/null"], input=src.encode(), capture_output=True)
    assert out.returncode == 0, out.stderr.decode()


@pytest.mark.skipif(not compilers(), reason="no C compiler on PATH")
def test_comparisons_used_as_numbers_are_vector_selects() -> None:
    """(a == b) + 2 (a < b) as floats, 8 lanes a vector (max pooling's gradient counts a window's maxima so): one
    vector comparison and select of 1 or 0, not eight scalar comparisons gathered into a vector; same numbers."""
    a, b = tensor(4, 16), tensor(4, 16)
    out = a.ne(b).ne(const(True, (4, 16), dtypes.bool)).cast(f32) + a.lt(b).cast(f32) * const(2.0, (4, 16))
    ast = ast_of(out)
    r = CRenderer("x86_64;vector_width=8;threads=1;")
    uops = vector_uops(ast, r.caps, [Opt(OptOps.UPCAST, 0, 8)])  # (4 x 16 contiguous: one dim of 64)
    vec = f32.vec(8)
    assert any(u.op is Ops.WHERE and u.dtype == vec for u in uops)
    assert not any(u.op is Ops.CAST for u in uops), "no comparison is cast lane by lane"
    rng = np.random.default_rng(3)
    av, bv = (rng.integers(0, 3, (4, 16)).astype(np.float32) for _ in range(2))
    got = np.zeros((4, 16), np.float32)
    fn = build(r.render("counts", uops)).counts
    fn(*(ctypes.c_void_p(x.ctypes.data) for x in (got, av, bv)))
    np.testing.assert_array_equal(got, (av == bv) + 2.0 * (av < bv))


# ---------------------------------------------------------------- windows read as one view (opt.merge_windows)


def window_sum(n: int, starts: tuple[int, ...], rows: int = 1) -> tuple[UOp, UOp]:
    """(x, kernel AST) of out[r, o] = sum over j of x[r, o + starts[j]] for a (rows, n) x: one view of x per
    offset, each padded into its slot of a window dim, added up (a pool's or convolution's window), then reduced."""
    out, k = n - max(starts), len(starts)
    x = tensor(rows, n)
    terms = []
    for j, s in enumerate(starts):
        view = move(Ops.RESHAPE, move(Ops.SHRINK, x, ((0, rows), (s, s + out))), (rows, out, 1))
        terms.append(move(Ops.PAD, view, ((0, 0), (0, 0), (j, k - 1 - j))))
    total = terms[0]
    for t in terms[1:]:
        total = total + t
    return x, ast_of(move(Ops.RESHAPE, reduce(total, (2,)), (rows, out)))


def loads_of(ast: UOp) -> list[UOp]:
    return [u for u in ast.toposort if u.op is Ops.READ]


def test_a_window_of_shifted_views_is_read_as_one_view() -> None:
    x, ast = window_sum(10, (0, 1, 2), rows=3)
    assert len(loads_of(ast)) == 3 and all(u.view.mask for u in loads_of(ast))
    merged = loads_of(merge_windows(ast))
    assert len(merged) == 1
    view = merged[0].view
    assert view.strides == (10, 1, 1) and view.mask is None and view.offset == 0  # the window walks x along a row
    assert Kernel(ast, CPU).ast is not ast and len(loads_of(Kernel(ast, CPU).ast)) == 1  # CPU kernels take it
    assert len(loads_of(Kernel(ast, GPU).ast)) == 1  # ... and GPU ones (a weight gradient's window is output dims)
    data = np.arange(30, dtype=np.float32).reshape(3, 10)
    out = np.zeros(3 * 8, np.float32)
    interpret_ast(ast, [out, data.reshape(-1)])  # (loop caps: merged too)
    np.testing.assert_array_equal(out.reshape(3, 8), data[:, :8] + data[:, 1:9] + data[:, 2:])


def test_a_window_with_dilation_walks_with_its_step() -> None:
    _, ast = window_sum(12, (0, 2, 4, 6))
    (load,) = loads_of(merge_windows(ast))
    assert load.view.strides[-1] == 2


@pytest.mark.parametrize("starts", [(0, 1, 3), (0, 0, 1)], ids=["not evenly spaced", "an offset twice"])
def test_views_that_are_not_a_window_stay_apart(starts: tuple[int, ...]) -> None:
    _, ast = window_sum(10, starts)
    assert merge_windows(ast) is ast


def test_a_reduction_across_its_outputs_reads_whole_lines_per_thread_on_a_cpu() -> None:
    """Sums over (images, positions) of 32 channels-last channels (a batch norm's): the CPU's plan takes all 32 as 4
    vectors (each step reads two whole cache lines, no thread reads half of one); a GPU's stays at one vector."""
    x = tensor(128, 400, 32)
    ast = ast_of(move(Ops.RESHAPE, reduce(x, (0, 1)), (32,)))
    cpu = Kernel(ast, CPU).apply_opts(hand_opts(Kernel(ast, CPU)))
    assert [p.size for p in cpu.of_kind(Kind.UPCAST)] == [32] and not cpu.of_kind(Kind.THREAD)
    gpu = Kernel(ast, GPU).apply_opts(hand_opts(Kernel(ast, GPU)))
    assert [p.size for p in gpu.of_kind(Kind.UPCAST)] == [4]


# ---------------------------------------------------------------- rows: reductions every element of a row reads


class _Loops(Compiled):
    """An opened device whose threads run loops: the scheduler keeps a row's reductions in the kernel that reads them
    (on a device it has not opened it does not)."""

    def __init__(self) -> None:
        self.__dict__["renderer"] = SimpleNamespace(caps=RendererCaps(language="C"))


def softmax_ast(monkeypatch: pytest.MonkeyPatch, rows: int, n: int) -> UOp:
    monkeypatch.setitem(Device._open, "FAKE", _Loops())
    x = tensor(rows, n)
    e = (x - expand(reduce(x, (1,), Ops.MAX), (rows, n))).alu(Ops.EXP2)
    return ast_of(e * expand(reduce(e, (1,)), (rows, n)).alu(Ops.RECIP))


def test_rows_share_one_hardware_index_between_a_row_and_its_reductions(monkeypatch: pytest.MonkeyPatch) -> None:
    """ROWS on a softmax: 16 threads a row, which each take every 16th value of the row's max and sum (through
    local memory, each reduction its own, read after its own barrier) and then every 16th value of the output."""
    ast = softmax_ast(monkeypatch, 4, 64)
    k = Kernel(ast, GPU).apply_opts([Opt(OptOps.ROWS, 1, 16)])
    assert k.describe() == "global4@0 global4@1 reduce4@2 local16@1 group16@2"
    uops = vector_uops(ast, GPU, [Opt(OptOps.ROWS, 1, 16)])
    lidx = [u.arg for u in uops if u.op is Ops.SPECIAL and u.arg[0].startswith("lidx")]
    assert lidx == [("lidx0", 16)], "one workgroup dim, not one for the row and one for its reductions"
    temps = [u for u in uops if u.op is Ops.DEFINE_LOCAL]
    barriers = [i for i, u in enumerate(uops) if u.op is Ops.BARRIER]
    assert len(temps) == 2 and len(barriers) == 2
    # the sum's partials are stored after the max's are read (its loads follow the first barrier)
    local_loads = [i for i, u in enumerate(uops) if u.op is Ops.LOAD and u.address.pointer in temps]
    sum_stores = [i for i, u in enumerate(uops) if u.op is Ops.STORE and u.address.pointer is temps[1]]
    assert barriers[0] < min(local_loads) and max(local_loads[:1]) < min(sum_stores) < barriers[1]
    (store,) = [u for u in uops if u.op is Ops.STORE and u.address.pointer.op is Ops.DEFINE_GLOBAL]
    assert store.address.gate is None, "each thread writes its own values of the row"


@pytest.mark.parametrize(
    ("opts", "why"),
    [
        ([Opt(OptOps.ROWS, 0, 2)], "a reduction varies along dim 0"),
        ([Opt(OptOps.ROWS, 1, 3)], "3 does not split a part of size 64"),
        ([Opt(OptOps.UNROLL, 2, 4), Opt(OptOps.ROWS, 1, 16)], "not grouped or unrolled yet"),
        ([Opt(OptOps.ROWS, 2, 16)], "needs a global axis"),
    ],
)
def test_rows_are_refused_with_the_reason(monkeypatch: pytest.MonkeyPatch, opts: list[Opt], why: str) -> None:
    k = Kernel(softmax_ast(monkeypatch, 4, 64), GPU)
    with pytest.raises(KernelOptError, match=why):
        k.apply_opts(opts)


def test_rows_need_local_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(KernelOptError, match="the C renderer has no local memory"):
        Kernel(softmax_ast(monkeypatch, 4, 64), CPU).apply(Opt(OptOps.ROWS, 1, 16))


@pytest.mark.parametrize(
    ("n", "plan"),
    [
        (1000, "local100@1 group100@2 upcast10@1 unroll10@2"),
        (4096, "local128@1 group128@2 upcast32@1 unroll32@2"),
        (16384, "local256@1 group256@2 upcast16@1"),
    ],
)
def test_heuristics_share_a_row_across_a_workgroup_on_a_gpu(monkeypatch: pytest.MonkeyPatch, n: int, plan: str) -> None:
    """A softmax on a GPU: a workgroup a row, the fewest threads (64 at least) that hold the row 32 values each
    (each value loaded once for the row's reductions and the output); a longer row takes 256 threads (the most that
    divide it, up to 256) of 16 values, the rest in more workgroups. BEAM may try ROWS too."""
    k = Kernel(softmax_ast(monkeypatch, 8, n), GPU)
    opts = hand_opts(k)
    assert opts[0].op is OptOps.ROWS
    assert plan in k.copy().apply_opts(opts).describe()
    assert any(o.op is OptOps.ROWS for o in actions(k))
    assert not any(o.op is OptOps.ROWS for o in actions(Kernel(softmax_ast(monkeypatch, 8, n), CPU)))


def test_rows_of_attention_merge_their_batch_dims_on_a_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """Attention's probabilities (batch, heads, queries, keys): their three outer dims run through memory as one, and
    are one dim on a GPU too (there dims are otherwise kept as scheduled), so the row takes a workgroup (ROWS needs
    at most three global dims)."""
    monkeypatch.setitem(Device._open, "FAKE", _Loops())
    shape = (2, 3, 4, 64)
    x = tensor(*shape)
    ast = ast_of(x - expand(reduce(x, (3,), Ops.MAX), shape))
    k = Kernel(ast, GPU)
    assert k.full_shape == (24, 64, 64)
    assert hand_opts(k)[0] == Opt(OptOps.ROWS, 1, 64)


def test_a_row_kernel_stores_vectors_of_its_row_on_a_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """The row's max and sum read along the row (the reduction's unrolled dim) are the same for every value of the
    output's vector, so the output is stored a vector at a time (not a value at a time, as a matrix-vector product's
    outputs, each a row of its own, are)."""
    ast = softmax_ast(monkeypatch, 4, 64)
    k = Kernel(ast, CPU)
    opts = hand_opts(k)
    assert any(o.op is OptOps.UNROLL for o in opts), opts
    uops = vector_uops(ast, CPU, opts)
    stores = [u for u in uops if u.op is Ops.STORE]
    assert stores and all(s.value.dtype.count > 1 for s in stores)
    accumulators = [u for u in uops if u.op is Ops.DEFINE_ACC]
    assert len(accumulators) == 2 and all(a.dtype.count > 1 for a in accumulators), "the max and sum in vectors too"


@pytest.mark.parametrize(("rows", "n", "threads"), [(64, 1000, False), (4096, 4096, True)])
def test_a_row_kernel_takes_threads_by_its_work(
    monkeypatch: pytest.MonkeyPatch, rows: int, n: int, threads: bool
) -> None:
    """A row kernel's full shape counts each row's values once per value of the row (n x n a row); its work is
    the row read by each reduction and by the output: 64 rows of 1000 are too little to share between threads."""
    opts = hand_opts(Kernel(softmax_ast(monkeypatch, rows, n), CPU))
    assert any(o.op is OptOps.THREAD for o in opts) == threads
