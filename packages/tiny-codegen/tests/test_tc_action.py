"""The optimizer's TC action: a matrix product mapped onto a renderer's tensor cores, what it does to the plan and
the code (one WMMA per tile, accumulating through its C operand), and each refusal with its reason. Running the
kernels is tiny-tensor's test_tensor_cores (on the PYTHON emulator, which executes WMMA)."""

from __future__ import annotations

from dataclasses import replace

import pytest
from kernel_helpers import expand, move, reduce, tensor, vector_uops

from tiny.codegen import Kernel, KernelOptError, Opt, OptOps
from tiny.codegen.opt import Kind
from tiny.codegen.opt.beam import actions
from tiny.codegen.opt.heuristic import hand_opts
from tiny.codegen.program import estimate
from tiny.ir.device import RendererCaps
from tiny.ir.dtypes import DType, dtypes
from tiny.ir.schedule import create_schedule
from tiny.ir.tensorcore import tensor_cores_for
from tiny.ir.uop import Ops, UOp

f16, bf16, f32 = dtypes.float16, dtypes.bfloat16, dtypes.float32
GPU = RendererCaps(
    language="PYTHON", has_local=True, has_shared=True, local_total_max=1024, shared_max=65536, vector_width=4
)
TARGETS = ("sm_80", "gfx1100", "gfx1201", "gfx942")


def caps_of(target: str) -> RendererCaps:
    return replace(GPU, tensor_cores=tensor_cores_for(target))


def ast_of(target: UOp) -> UOp:
    return create_schedule([target]).items[-1].ast


def matmul(
    m: int, k: int, n: int, dt: DType = f16, cast_first: bool = False, out: DType = f32, result: DType | None = None
) -> UOp:
    """a (m x k) @ b (k x n) summed in `out`: the products cast (as tiny.tensor writes it) or the factors cast; the
    sum cast to `result` where given (a 16-bit product's output)."""
    a, b = tensor(m, k, dtype=dt), tensor(k, n, dtype=dt)
    x, y = expand(move(Ops.RESHAPE, a, (m, k, 1)), (m, k, n)), expand(move(Ops.RESHAPE, b, (1, k, n)), (m, k, n))
    prod = x.cast(out) * y.cast(out) if cast_first else (x * y).cast(out)
    total = reduce(prod, (1,))
    return ast_of(move(Ops.RESHAPE, total if result is None else total.cast(result), (m, n)))


@pytest.mark.parametrize("target", TARGETS)
def test_the_plan_of_a_matmul_on_tensor_cores(target: str) -> None:
    caps = caps_of(target)
    core = caps.tensor_cores[0]
    m, n, kk = core.dims
    k = Kernel(matmul(2 * m, 3 * kk, 4 * n), caps)
    k.apply(Opt(OptOps.TC, 2, 0))
    assert k.tc is not None and (k.tc.m, k.tc.n, k.tc.k) == (0, 2, 1) and k.tc.core is core
    assert sorted((p.dim, p.size, p.stride, p.kind.value) for p in k.parts) == [
        (0, 2, m, "global"),
        (0, m, 1, "tc"),
        (1, 3, kk, "reduce"),
        (1, kk, 1, "tc"),
        (2, 4, n, "global"),
        (2, n, 1, "tc"),
    ]
    assert [p.kind for p in k.axes] == [Kind.GLOBAL, Kind.GLOBAL, Kind.REDUCE]


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("dt", [f16, bf16])
def test_the_code_is_one_wmma_per_tile_accumulating_through_c(target: str, dt: DType) -> None:
    caps = caps_of(target)
    index = next(i for i, c in enumerate(caps.tensor_cores) if c.dtype_in == dt)
    core = caps.tensor_cores[index]
    m, n, kk = core.dims
    opts = [Opt(OptOps.TC, 2, index), Opt(OptOps.UPCAST, 0, 2), Opt(OptOps.LOCAL, 1, 2)]
    uops = vector_uops(matmul(4 * m, 2 * kk, 2 * n, dt), caps, opts)
    wmmas = [u for u in uops if u.op is Ops.WMMA]
    assert len(wmmas) == 2 and all(w.arg == core.name for w in wmmas), "two tiles per warp (the upcast)"
    accs = [u for u in uops if u.op is Ops.DEFINE_ACC]
    assert [a.dtype for a in accs] == [core.c_dtype] * 2
    assert {w.src[2] for w in wmmas} == set(accs), "the accumulator is each WMMA's C operand"
    assert wmmas[0].src[1] is wmmas[1].src[1], "both tiles share B's fragment"
    lidx = sorted(u.arg for u in uops if u.op is Ops.SPECIAL and u.arg[0].startswith("lidx"))
    assert lidx == [("lidx0", core.threads), ("lidx1", 2)], "the warp's lanes are lidx0, a second warp lidx1"
    stores = [u for u in uops if u.op is Ops.STORE]
    assert sum(s.value.dtype.count for s in stores) == 2 * core.c.elements
    pairs = core.c.elem_bits[0] == "n0"  # (NVIDIA's c0, c1: neighbours in a row of the output, stored together)
    assert all(s.value.dtype.count == (2 if pairs else 1) for s in stores)


@pytest.mark.parametrize("dt", [f16, bf16])
def test_16_bit_neighbours_of_c_are_stored_as_one_pair_where_the_renderer_says_so(dt: DType) -> None:
    """A 16-bit product's C fragment (the output in the input's dtype): where caps.half_pairs (CUDA C, PTX), a lane's
    c0 and c1 are one 2-wide store (32 bits: st.global.b32's worth), else one store each."""
    caps = caps_of("sm_80")
    index = next(i for i, c in enumerate(caps.tensor_cores) if c.dtype_in == dt)
    opts = [Opt(OptOps.TC, 2, index), Opt(OptOps.UPCAST, 0, 2)]
    for pairs in (False, True):
        uops = vector_uops(matmul(32, 32, 16, dt, result=dt), replace(caps, half_pairs=pairs), opts)
        stores = [u for u in uops if u.op is Ops.STORE]
        assert sum(s.value.dtype.count for s in stores) == 2 * caps.tensor_cores[index].c.elements
        assert {(s.value.dtype.scalar, s.value.dtype.count) for s in stores} == {(dt, 2 if pairs else 1)}


def test_unrolled_steps_of_k_chain_their_wmmas() -> None:
    caps = caps_of("gfx1201")
    uops = vector_uops(matmul(16, 64, 16), caps, [Opt(OptOps.TC, 2, 0), Opt(OptOps.UNROLL, 0, 2)])
    first, second = [u for u in uops if u.op is Ops.WMMA]
    (acc,) = [u for u in uops if u.op is Ops.DEFINE_ACC]
    assert first.src[2] is acc and second.src[2] is first, "the accumulator feeds the first, the first the second"
    assert any(u.op is Ops.ASSIGN and u.src == (acc, second) for u in uops)
    assert sum(1 for u in uops if u.op is Ops.RANGE) == 1 and first.src[0] is not second.src[0]


def test_a_single_tile_of_k_needs_no_loop() -> None:
    caps = caps_of("sm_80")
    uops = vector_uops(matmul(16, 16, 8), caps, [Opt(OptOps.TC, 2, 0)])
    (wmma,) = [u for u in uops if u.op is Ops.WMMA]
    assert wmma.src[2].op is Ops.CONST and not any(u.op is Ops.RANGE for u in uops)


def test_cast_factors_and_batches_and_a_second_reduce_dim() -> None:
    caps = caps_of("gfx1100")
    k = Kernel(matmul(16, 32, 16, cast_first=True), caps)
    k.apply(Opt(OptOps.TC, 2, 0))
    assert k.tc is not None
    a, b = tensor(3, 16, 32, dtype=f16), tensor(3, 32, 16, dtype=f16)
    x = expand(move(Ops.RESHAPE, a, (3, 16, 32, 1)), (3, 16, 32, 16))
    y = expand(move(Ops.RESHAPE, b, (3, 1, 32, 16)), (3, 16, 32, 16))
    batched = Kernel(ast_of(move(Ops.RESHAPE, reduce((x * y).cast(f32), (2,)), (3, 16, 16))), caps)
    batched.apply(Opt(OptOps.TC, 3, 0))
    assert batched.tc is not None and (batched.tc.m, batched.tc.n, batched.tc.k) == (1, 3, 2)
    # a sum over two dims (a convolution's channels and window): K is one of them, the other stays a loop
    a, b = tensor(16, 4, 16, dtype=f16), tensor(4, 16, 16, dtype=f16)
    x = expand(move(Ops.RESHAPE, a, (16, 4, 16, 1)), (16, 4, 16, 16))
    y = expand(move(Ops.RESHAPE, b, (1, 4, 16, 16)), (16, 4, 16, 16))
    two = ast_of(move(Ops.RESHAPE, reduce((x * y).cast(f32), (1, 2)), (16, 16)))
    uops = vector_uops(two, caps, [Opt(OptOps.TC, 3, 0)])
    assert sum(1 for u in uops if u.op is Ops.RANGE) == 1 and sum(1 for u in uops if u.op is Ops.WMMA) == 1


@pytest.mark.parametrize(
    "ast, caps, opt, why",
    [
        (lambda: matmul(32, 32, 32), GPU, Opt(OptOps.TC, 2, 0), "declares no tensor cores"),
        (lambda: matmul(32, 32, 32), replace(caps_of("sm_80"), has_local=False), Opt(OptOps.TC, 2, 0), "no workgroups"),
        (lambda: matmul(32, 32, 32), caps_of("sm_80"), Opt(OptOps.TC, 2, 5), "one of the renderer's 2"),
        (lambda: matmul(32, 32, 32), caps_of("sm_80"), Opt(OptOps.TC, 0, 0), "needs a reduce axis"),
        (lambda: matmul(32, 32, 32, f32), caps_of("sm_80"), Opt(OptOps.TC, 2, 0), "products of two float16"),
        (lambda: matmul(32, 32, 32, bf16), caps_of("sm_80"), Opt(OptOps.TC, 2, 0), "products of two float16"),
        (lambda: matmul(32, 32, 32, out=f16), caps_of("sm_80"), Opt(OptOps.TC, 2, 0), "the sum is float16"),
        (
            lambda: matmul(24, 32, 32),
            caps_of("sm_80"),
            Opt(OptOps.TC, 2, 0),
            r"M a multiple of 16 \(PADTO first\), dim 0 is 24",
        ),
        (
            lambda: matmul(32, 32, 12),
            caps_of("sm_80"),
            Opt(OptOps.TC, 2, 0),
            r"N a multiple of 8 \(PADTO first\), dim 2 is 12",
        ),
        (
            lambda: matmul(32, 40, 32),
            caps_of("gfx942"),
            Opt(OptOps.TC, 2, 0),
            r"K a multiple of 16 \(PADTO first\), dim 1 is 40",
        ),
        (lambda: ast_of(reduce(tensor(32, 32, dtype=f32), (1,))), caps_of("sm_80"), Opt(OptOps.TC, 1, 0), "sums a"),
        (
            lambda: ast_of(reduce((tensor(32, 32, dtype=f16) * tensor(32, 32, dtype=f16)).cast(f32), (1,))),
            caps_of("sm_80"),
            Opt(OptOps.TC, 1, 0),
            "not a matrix product",
        ),
        (
            lambda: ast_of(reduce(tensor(32, 32, dtype=f32), (1,), Ops.MAX)),
            caps_of("sm_80"),
            Opt(OptOps.TC, 1, 0),
            "one sum",
        ),
    ],
)
def test_refusals(ast, caps: RendererCaps, opt: Opt, why: str) -> None:  # noqa: ANN001
    k = Kernel(ast(), caps)
    before = list(k.parts)
    with pytest.raises(KernelOptError, match=why):
        k.apply(opt)
    assert k.parts == before and k.tc is None and k.applied == []


def test_padding_makes_the_tile_fit() -> None:
    caps = caps_of("sm_80")
    k = Kernel(matmul(20, 24, 10), caps)
    k.apply_opts([Opt(OptOps.PADTO, 0, 16), Opt(OptOps.PADTO, 1, 8), Opt(OptOps.PADTO, 2, 16), Opt(OptOps.TC, 2, 0)])
    assert k.tc is not None and k.padded == {0: 32, 1: 32, 2: 16}  # M 20, K 24 (dim 1), N 10 (dim 2)
    uops = vector_uops(matmul(20, 24, 10), caps, list(k.applied))
    stores = [u for u in uops if u.op is Ops.STORE]
    assert stores and all(s.address.gate is not None for s in stores), "padded rows and columns are not written"
    assert any(u.op is Ops.WHERE and u.dtype == f16 for u in uops), "fragment elements in the padding are zeros"
    assert hand_opts(Kernel(matmul(20, 24, 10), caps))[:4] == list(k.applied), "the heuristics pad, then TC"
    too_small = hand_opts(Kernel(matmul(6, 32, 32), caps))  # 6 -> 16 would more than double M
    assert all(o.op is not OptOps.TC for o in too_small)


def test_tc_comes_first_and_only_some_actions_follow() -> None:
    caps = caps_of("sm_80")
    k = Kernel(matmul(32, 32, 32), caps)
    k.apply(Opt(OptOps.UPCAST, 0, 2))
    with pytest.raises(KernelOptError, match=r"TC comes first \(after PADTO only\)"):
        k.apply(Opt(OptOps.TC, 2, 0))
    k = Kernel(matmul(64, 64, 64), caps)
    k.apply(Opt(OptOps.TC, 2, 0))
    for opt in (Opt(OptOps.GROUP, 2, 2), Opt(OptOps.PADTO, 0, 3)):
        with pytest.raises(KernelOptError, match="not on a kernel mapped onto tensor cores"):
            k.apply(opt)
    k.apply(Opt(OptOps.LOCAL, 0, 2))
    k.apply(Opt(OptOps.LOCAL, 1, 2))
    with pytest.raises(KernelOptError, match="too big"):  # the warp is the third workgroup dim already
        k.apply(Opt(OptOps.LOCAL, 0, 2))


def test_a_warp_must_fit_the_workgroup() -> None:
    caps = replace(caps_of("gfx942"), local_max=(32, 32, 32))
    with pytest.raises(KernelOptError, match="warp of 64 threads does not fit"):
        Kernel(matmul(32, 32, 32), caps).apply(Opt(OptOps.TC, 2, 0))


def test_heuristics_and_beam_offer_tensor_cores() -> None:
    caps = caps_of("sm_80")
    opts = hand_opts(Kernel(matmul(64, 64, 64), caps))
    assert opts[0] == Opt(OptOps.TC, 2, 0) and Opt(OptOps.UPCAST, 0, 4) in opts, "4 tiles along M per warp"
    assert Kernel(matmul(64, 64, 64), caps).apply_opts(opts).lanes() >= 32, "and 8 along N: a 64 x 64 warp tile"
    bf = hand_opts(Kernel(matmul(64, 64, 64, bf16), caps))
    assert bf[0] == Opt(OptOps.TC, 2, 1), "the bfloat16 tensor core"
    assert all(o.op is not OptOps.TC for o in hand_opts(Kernel(matmul(64, 64, 64, f32), caps)))
    assert all(o.op is not OptOps.TC for o in hand_opts(Kernel(matmul(6, 64, 64), caps))), "too small to pad"
    assert all(o.op is not OptOps.TC for o in hand_opts(Kernel(matmul(64, 64, 64), GPU)))
    offered = actions(Kernel(matmul(64, 64, 64), caps))
    assert Opt(OptOps.TC, 2, 0) in offered and Opt(OptOps.TC, 2, 1) in offered
    k = Kernel(matmul(64, 64, 64), caps)
    k.apply(Opt(OptOps.TC, 2, 0))
    assert not any(o.op is OptOps.TC for o in actions(k))
    stages = {o.arg for o in actions(k) if o.op is OptOps.STAGE}
    assert stages == {0}, "no asynchronous copies on a renderer without them"
    k = Kernel(matmul(64, 64, 64), replace(caps, async_copy=True))
    k.apply(Opt(OptOps.TC, 2, 0))
    assert {o.arg for o in actions(k) if o.op is OptOps.STAGE} == {0, 1, 2, 3}, "BEAM tries both copies, 1-3 ahead"


def test_the_rules_copy_tiles_asynchronously_where_the_renderer_can() -> None:
    """STAGE 1 where the renderer has asynchronous copies (measured faster on an H200), else STAGE 0; and STAGE 0
    where the K loop is not the one reduce loop (a convolution's channels and window)."""
    caps = caps_of("sm_80")
    assert hand_opts(Kernel(matmul(256, 128, 256), replace(caps, async_copy=True)))[-1] == Opt(OptOps.STAGE, 2, 1)
    assert hand_opts(Kernel(matmul(256, 128, 256), replace(caps, async_copy=False)))[-1] == Opt(OptOps.STAGE, 2, 0)


def test_the_flop_estimate_counts_the_tensor_cores_work() -> None:
    uops = vector_uops(matmul(64, 32, 48), caps_of("gfx942"), [Opt(OptOps.TC, 2, 0), Opt(OptOps.UPCAST, 0, 2)])
    flops, _ = estimate(uops)
    assert flops == 2 * 64 * 32 * 48


def test_stage_puts_the_operand_tiles_in_local_memory() -> None:
    caps = caps_of("sm_80")
    k = Kernel(matmul(256, 128, 256), caps)
    opts = [Opt(OptOps.TC, 2, 0), Opt(OptOps.UNROLL, 2, 2), Opt(OptOps.LOCAL, 0, 2), Opt(OptOps.STAGE, 2)]
    k.apply_opts(opts)
    assert k.staged
    uops = vector_uops(matmul(256, 128, 256), caps, opts)
    locals_ = [u for u in uops if u.op is Ops.DEFINE_LOCAL]
    assert [u.arg[0] for u in locals_] == ["stage0", "stage1"]
    # A: 32 rows of 32 k (64 bytes, padded to 40), B: 8 columns by 16 k (the first run of 64 bytes or more, padded
    # by 8), twice for 32 k; each twice (two buffers)
    assert [u.arg[1] for u in locals_] == [2 * 32 * 40, 2 * 2 * (16 * 8 + 8)]
    assert sum(u.op is Ops.BARRIER for u in uops) == 1, "one barrier an iteration: the buffers alternate"
    loop = next(i for i, u in enumerate(uops) if u.op is Ops.RANGE)
    assert loop < next(i for i, u in enumerate(uops) if u.op is Ops.BARRIER), "the barrier is inside the K loop"


@pytest.mark.parametrize(
    "shape, opts, reason",
    [
        ((32, 256, 8), [Opt(OptOps.STAGE, 1)], "after TC"),
        ((32, 256, 8), [Opt(OptOps.TC, 2, 0), Opt(OptOps.STAGE, 0)], "needs a reduce axis"),
        ((32, 256, 8), [Opt(OptOps.TC, 2, 0), Opt(OptOps.STAGE, 1), Opt(OptOps.STAGE, 1)], "last action"),
        ((32, 256, 8), [Opt(OptOps.TC, 2, 0), Opt(OptOps.STAGE, 1), Opt(OptOps.UNROLL, 1, 0)], "last action"),
        ((16, 256, 128), [Opt(OptOps.TC, 2, 0), Opt(OptOps.LOCAL, 0, 16), Opt(OptOps.STAGE, 0)], "over 512 threads"),
    ],
)
def test_stage_refusals_say_why(shape: tuple[int, int, int], opts: list[Opt], reason: str) -> None:
    k = Kernel(matmul(*shape), caps_of("sm_80"))
    with pytest.raises(KernelOptError, match=reason):
        k.apply_opts(opts)


def test_stage_needs_local_memory_for_both_tiles() -> None:
    caps = replace(caps_of("sm_80"), shared_max=4096)
    k = Kernel(matmul(256, 128, 256), caps)
    k.apply_opts([Opt(OptOps.TC, 2, 0), Opt(OptOps.UNROLL, 2, 2), Opt(OptOps.UPCAST, 0, 4)])
    with pytest.raises(KernelOptError, match="bytes of local memory"):
        k.apply(Opt(OptOps.STAGE, 2))


def test_asynchronous_stage_copies_the_next_tiles_while_this_ones_are_read() -> None:
    """STAGE 1: the first iteration's tiles copied before the K loop; in the loop one barrier that waits for the
    copies, then the next iteration's copies (runs of 16 bytes, none past the last), then the fragment loads."""
    caps, ast = replace(caps_of("sm_80"), async_copy=True), matmul(256, 128, 256)
    plan = hand_opts(Kernel(ast, caps_of("sm_80")))
    uops = vector_uops(ast, caps, [*plan[:-1], Opt(OptOps.STAGE, plan[-1].axis, 1)])
    loop = next(i for i, u in enumerate(uops) if u.op is Ops.RANGE)
    copies = [i for i, u in enumerate(uops) if u.op is Ops.COPY_ASYNC]
    (barrier,) = [i for i, u in enumerate(uops) if u.op is Ops.BARRIER]
    assert uops[barrier].arg == ("async", 0) and loop < barrier
    before, inside = [i for i in copies if i < loop], [i for i in copies if i > loop]
    # A's tile 128 x 32 values, B's 32 x 128, over four warps' 128 threads in runs of 8: 4 runs of each a thread,
    # before the loop and in it
    assert len(before) == len(inside) == 8 and all(barrier < i for i in inside)
    assert all(uops[i].dtype == f16.vec(8) for i in copies)
    assert all(uops[i].copied_from.gate is None for i in before)
    assert all(uops[i].copied_from.gate is not None for i in inside), "no copy past the last iteration"
    fragments = [u for u in uops[barrier:] if u.op is Ops.LOAD and u.address.pointer.op is Ops.DEFINE_LOCAL]
    assert fragments and min(uops.index(u) for u in fragments) > max(inside), "the copies go out before the reads"
    assert not any(u.op is Ops.STORE and u.address.pointer.op is Ops.DEFINE_LOCAL for u in uops)


def test_copies_n_steps_ahead_take_n_plus_one_buffers_and_a_barrier_between_the_first_ones() -> None:
    """STAGE 2: three buffers of each tile where STAGE 1 has two; the first two iterations' copies before the K loop
    with a barrier between them that waits for none (("async", 2)), the loop's barrier leaving one group in flight;
    past STAGE_AHEAD_MAX or past the local memory: refused."""
    caps, ast = replace(caps_of("sm_80"), async_copy=True), matmul(256, 128, 256)
    plan = hand_opts(Kernel(ast, caps_of("sm_80")))
    one, two = (vector_uops(ast, caps, [*plan[:-1], Opt(OptOps.STAGE, plan[-1].axis, n)]) for n in (1, 2))
    sizes = [[u.arg[1] for u in uops if u.op is Ops.DEFINE_LOCAL] for uops in (one, two)]
    assert [3 * s for s in sizes[0]] == [2 * s for s in sizes[1]]
    loop = next(i for i, u in enumerate(two) if u.op is Ops.RANGE)
    barriers = [(i, u.arg) for i, u in enumerate(two) if u.op is Ops.BARRIER]
    assert [arg for _, arg in barriers] == [("async", 2), ("async", 1)] and barriers[0][0] < loop < barriers[1][0]
    copies = [i for i, u in enumerate(two) if u.op is Ops.COPY_ASYNC]
    assert sum(i < barriers[0][0] for i in copies) == sum(barriers[0][0] < i < loop for i in copies) == 8
    k = Kernel(ast, caps).apply_opts(plan[:-1])
    with pytest.raises(KernelOptError, match="1 to 4 asynchronously"):
        k.copy().apply(Opt(OptOps.STAGE, plan[-1].axis, 5))
    small = Kernel(ast, replace(caps, shared_max=2 * sum(sizes[0]))).apply_opts(plan[:-1])  # (STAGE 1's bytes)
    small.copy().apply(Opt(OptOps.STAGE, plan[-1].axis, 1))
    with pytest.raises(KernelOptError, match="bytes of local memory"):
        small.apply(Opt(OptOps.STAGE, plan[-1].axis, 2))


def _strided(m: int, k: int, n: int) -> UOp:
    """a @ b where a is every other column of a wider matrix: no run of its tile lies along memory."""
    wide = tensor(m, 2 * k, dtype=f16)
    a = move(Ops.SHRINK, move(Ops.RESHAPE, wide, (m, k, 2)), ((0, m), (0, k), (0, 1)))
    a, b = move(Ops.RESHAPE, a, (m, k, 1)), move(Ops.RESHAPE, tensor(k, n, dtype=f16), (1, k, n))
    prod = (expand(a, (m, k, n)) * expand(b, (m, k, n))).cast(f32)
    return ast_of(move(Ops.RESHAPE, reduce(prod, (1,)), (m, n)))


def _computed(m: int, k: int, n: int) -> UOp:
    """a @ b where a is float32 cast to float16 in the kernel."""
    a = move(Ops.RESHAPE, tensor(m, k, dtype=f32).cast(f16), (m, k, 1))
    b = move(Ops.RESHAPE, tensor(k, n, dtype=f16), (1, k, n))
    return ast_of(move(Ops.RESHAPE, reduce((expand(a, (m, k, n)) * expand(b, (m, k, n))).cast(f32), (1,)), (m, n)))


@pytest.mark.parametrize(
    "make, async_copy, why",
    [
        (lambda: matmul(256, 128, 256), True, None),
        (lambda: matmul(128, 256, 128, cast_first=True), True, None),
        (lambda: matmul(256, 128, 256), False, "has no asynchronous copies"),
        (lambda: matmul(120, 40, 100), True, "A cannot be copied 16 bytes at a time: it is padded"),
        (lambda: _strided(256, 128, 256), True, "A cannot .* its tile's rows do not run along memory"),
        (lambda: _computed(256, 128, 256), True, "A cannot .* it is computed"),
    ],
)
def test_asynchronous_stage_refusals_say_why(make, async_copy: bool, why: str | None) -> None:  # noqa: ANN001
    """The rules' staged plan with its STAGE copying asynchronously instead: taken, or refused with the reason."""
    ast = make()
    plan = hand_opts(Kernel(ast, caps_of("sm_80")))
    assert plan[-1].op is OptOps.STAGE and plan[-1].arg == 0
    k = Kernel(ast, replace(caps_of("sm_80"), async_copy=async_copy)).apply_opts(plan[:-1])
    if why is None:
        k.apply(Opt(OptOps.STAGE, plan[-1].axis, 1))
        assert k.staged_ahead == 1
    else:
        with pytest.raises(KernelOptError, match=why):
            k.apply(Opt(OptOps.STAGE, plan[-1].axis, 1))


def test_stage_with_a_loop_around_k_alternates_buffers_through_both_loops() -> None:
    """A sum over two dims (a convolution's window around its channels): K's loop inside the other. The buffer an
    iteration fills is chosen by its number counted through both loops (an odd K loop would otherwise start the next
    window position on the buffer the last iteration is still being read from). Copied asynchronously: refused."""
    caps = replace(caps_of("sm_80"), async_copy=True)
    a, b = tensor(64, 3, 96, dtype=f16), tensor(3, 96, 64, dtype=f16)
    x = expand(move(Ops.RESHAPE, a, (64, 3, 96, 1)), (64, 3, 96, 64))
    y = expand(move(Ops.RESHAPE, b, (1, 3, 96, 64)), (64, 3, 96, 64))
    two = ast_of(move(Ops.RESHAPE, reduce((x * y).cast(f32), (1, 2)), (64, 64)))
    plan = hand_opts(Kernel(two, caps_of("sm_80")))
    assert plan[-1].op is OptOps.STAGE, plan
    uops = vector_uops(two, caps, plan)
    loops = [u for u in uops if u.op is Ops.RANGE]
    assert len(loops) == 2, "the window's loop and K's (96 = 3 iterations of 2 x 16)"
    copies = [u for u in uops if u.op is Ops.STORE and u.address.pointer.op is Ops.DEFINE_LOCAL]
    assert copies and all({r for r in u.address.offset.toposort if r.op is Ops.RANGE} == set(loops) for u in copies)
    k = Kernel(two, caps).apply_opts(plan[:-1])
    with pytest.raises(KernelOptError, match="asynchronous copies need the K loop to be the one reduce loop"):
        k.apply(Opt(OptOps.STAGE, plan[-1].axis, 1))
