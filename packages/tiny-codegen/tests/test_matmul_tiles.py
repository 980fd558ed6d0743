"""Matrix products on the CPU: the register tile the hand-written rules choose, the loop order over B copied into
panels (tiny.tensor's matmul makes that copy for big products), and sums of unrolled lanes added to the
accumulator one lane at a time (a chain of multiply-adds)."""

from __future__ import annotations

import math
import re
import subprocess

import numpy as np
import pytest
from kernel_helpers import LOOPS, expand, interpret, move, reduce, tensor, vector_uops
from test_cstyle import compilers

from tiny.codegen import Kernel, Opt, OptOps
from tiny.codegen.opt import Kind
from tiny.codegen.opt.heuristic import hand_opts
from tiny.codegen.renderer.cstyle import CRenderer
from tiny.ir.device import RendererCaps
from tiny.ir.dtypes import DType, dtypes
from tiny.ir.schedule import create_schedule
from tiny.ir.uop import Ops, UOp

CPU = RendererCaps(language="C", vector_width=8, threads=2)


def ast_of(target: UOp) -> UOp:
    return create_schedule([target]).items[-1].ast


def panel_matmul(m: int, k: int, n: int, width: int = 16) -> UOp:
    """C (m, n) = A (m, k) @ B where B is given as panels (n / width, k, width): the kernel's shape is
    (m, n / width, width, k)."""
    a, panels = tensor(m, k), tensor(n // width, k, width)
    full = (m, n // width, width, k)
    rows = expand(move(Ops.RESHAPE, a, (m, 1, 1, k)), full)
    cols = expand(move(Ops.RESHAPE, move(Ops.PERMUTE, panels, (0, 2, 1)), (1, n // width, width, k)), full)
    out = move(Ops.RESHAPE, reduce(rows * cols, (3,)), (m, n))
    return ast_of(out)


def plain_matmul(m: int, k: int, n: int) -> UOp:
    a, b = tensor(m, k), tensor(k, n)
    prod = expand(move(Ops.RESHAPE, a, (m, 1, k)), (m, n, k)) * expand(
        move(Ops.RESHAPE, move(Ops.PERMUTE, b, (1, 0)), (1, n, k)), (m, n, k)
    )
    return ast_of(move(Ops.RESHAPE, reduce(prod, (2,)), (m, n)))


def global_order(k: Kernel) -> list[int]:
    """The dims of the output loops, outermost first (the thread piece left out)."""
    return [p.dim for p in k.parts if p.kind is Kind.GLOBAL]


def test_panels_tile_rows_of_a_and_keep_a_panel_in_cache() -> None:
    ast = panel_matmul(128, 128, 128)  # enough work to share across threads
    k = Kernel(ast, CPU)
    opts = hand_opts(k)
    k.apply_opts(opts)
    upcasts = {p.dim: p.size for p in k.of_kind(Kind.UPCAST)}
    assert upcasts == {2: 16, 0: 4}, "two vectors of a panel's row times four rows of A (not four panels)"
    assert global_order(k) == [1, 0], "the loop over panels outside, the loop over A's row blocks inside"
    assert any(o.op is OptOps.SWAP for o in opts)
    assert k.of_kind(Kind.THREAD) and k.of_kind(Kind.THREAD)[0].dim == 1, "threads take panels of their own"


def test_sixteen_lane_vectors_tile_sixteen_accumulators() -> None:
    """AVX-512 (16-lane vectors, 32 registers): a tile of 16 vectors, two of a panel's row times eight rows of A, where
    8-lane vectors (AVX2's 16 registers) keep 2 x 4; under a fused epilogue the size of an exact GELU's (99 AST
    nodes in all) too, and under a bigger one the narrow tile (its rendering time grows with the tile)."""
    wide = RendererCaps(language="C", vector_width=16, threads=2)
    ast = panel_matmul(128, 128, 128, width=32)
    k = Kernel(ast, wide)
    k.apply_opts(hand_opts(k))
    assert {p.dim: p.size for p in k.of_kind(Kind.UPCAST)} == {2: 32, 0: 8}
    k = Kernel(panel_matmul(128, 128, 128), CPU)
    k.apply_opts(hand_opts(k))
    assert {p.dim: p.size for p in k.of_kind(Kind.UPCAST)} == {2: 16, 0: 4}
    for steps, tile in ((45, 256), (75, 64)):  # epilogues of 90 and 150 more nodes
        a, b = tensor(128, 128), tensor(128, 128)
        full = (128, 128, 128)
        bt = move(Ops.RESHAPE, move(Ops.PERMUTE, b, (1, 0)), (1, 128, 128))
        out = reduce(expand(move(Ops.RESHAPE, a, (128, 1, 128)), full) * expand(bt, full), (2,))
        for _ in range(steps):
            out = out * out + out
        ast = ast_of(move(Ops.RESHAPE, out, (128, 128)))
        assert (96 < len(ast.toposort) <= 128) if tile == 256 else (128 < len(ast.toposort) <= 256)
        k = Kernel(ast, wide)
        k.apply_opts(hand_opts(k))
        assert math.prod(p.size for p in k.of_kind(Kind.UPCAST)) == tile, steps


def test_plain_matmul_keeps_its_loop_order() -> None:
    """B read in place: its column block is strided, so streaming B past a row block of A stays the order."""
    for m, kk, n in ((64, 128, 64), (100, 30, 20)):
        k = Kernel(plain_matmul(m, kk, n), CPU)
        opts = hand_opts(k)
        assert not any(o.op is OptOps.SWAP for o in opts), (m, kk, n, opts)
        k.apply_opts(opts)
        assert global_order(k)[-1] == 1, "columns of C innermost"


def test_unrolled_lanes_add_to_the_accumulator_one_at_a_time() -> None:
    ast = plain_matmul(8, 16, 8)
    uops = vector_uops(ast, CPU, [Opt(OptOps.UPCAST, 1, 8), Opt(OptOps.UNROLL, 1, 4)])
    (assign,) = [u for u in uops if u.op is Ops.ASSIGN]
    acc, update = assign.src
    chain = []
    while update is not acc:
        assert update.op is Ops.ADD, f"the update is a chain of adds onto the accumulator, found {update.op}"
        chain.append(update.src[1])
        update = update.src[0]
    assert len(chain) == 4 and all(t.op is Ops.MUL for t in chain), "one product per unrolled lane"


def test_a_term_outside_the_loop_is_computed_before_it() -> None:
    """sum_k (x[i, k] + y[i]): y[i] does not change inside the loop; added to the accumulator as a term of its own,
    it is still loaded before the loop starts."""
    x, y = tensor(4, 8), tensor(4, 1)
    ast = ast_of(move(Ops.RESHAPE, reduce(x + expand(y, (4, 8)), (1,)), (4,)))
    uops = vector_uops(ast, LOOPS, [])
    loads = [i for i, u in enumerate(uops) if u.op is Ops.LOAD and u.address.pointer.arg == 2]
    assert loads and loads[0] < next(i for i, u in enumerate(uops) if u.op is Ops.RANGE and u.arg == 1)
    rng = np.random.default_rng(0)
    xs, ys = rng.standard_normal((4, 8)).astype(np.float32), rng.standard_normal((4, 1)).astype(np.float32)
    out = np.zeros(4, np.float32)
    interpret(uops, [out, xs.reshape(-1), ys.reshape(-1)])
    np.testing.assert_allclose(out, (xs + ys).sum(1), rtol=1e-5)


@pytest.mark.skipif(not [c for c in compilers() if c != "gcc"], reason="no clang on PATH (gcc ignores the pragma)")
def test_panel_kernel_compiles_to_fused_multiply_adds() -> None:
    """The CPU compiles without contraction (-ffp-contract=off); the accumulator's updates still fuse, through the
    renderer's tiny_fma_* helper, whose pragma allows exactly that fusion."""
    ast = panel_matmul(64, 128, 64)
    r = CRenderer("x86_64;vector_width=8;threads=2;")
    src = r.render("mm", vector_uops(ast, r.caps, hand_opts(Kernel(ast, r.caps))))
    updates = re.findall(r"(acc\d+) = tiny_fma_float32x8\(.*, \1\);", src)
    assert updates == [f"acc{i}" for i in range(8)] * 4, "the 8 accumulators take the 4 unrolled steps in turns"
    cc = [c for c in compilers() if c != "gcc"][0]
    args = [cc, "-O2", "-mavx2", "-mfma", "-ffp-contract=off", "-S", "-x", "c", "-", "-o", "-"]
    out = subprocess.run(args, input=src.encode(), capture_output=True)
    assert out.returncode == 0, out.stderr.decode()
    asm = out.stdout.decode()
    assert asm.count("vfmadd") >= 32, "8 accumulators x 4 unrolled steps, each a fused multiply-add"


def test_rows_of_four_are_half_vectors_and_masks_stay_whole() -> None:
    """On AVX2 (8 floats a vector) 4 lanes still make a vector: a 128-bit half. Comparisons and selects do not:
    the renderer's masks are as wide as a whole vector."""
    a, b = tensor(16, 4), tensor(16, 4)
    uops = vector_uops(ast_of(a * b + a), CPU, [Opt(OptOps.UPCAST, 0, 4)])  # (16 x 4 contiguous: one dim)
    assert any(u.op is Ops.LOAD and u.dtype.count == 4 for u in uops)
    select = UOp(Ops.WHERE, a.dtype, (UOp(Ops.CMPLT, dtypes.bool, (a, b)), a, b))
    uops = vector_uops(ast_of(select), CPU, [Opt(OptOps.UPCAST, 0, 4)])
    assert not any(u.dtype.count == 4 for u in uops if u.op in (Ops.CMPLT, Ops.WHERE))


def matvec_rows(m: int, n: int, k: int, weight: DType = dtypes.float32) -> UOp:
    """C (m, n) = A (m, k) @ W.T with W (n, k) row-major, as a linear layer reads its weight: neither input is
    read along C's rows (n), both along the reduction. A weight of another dtype is cast to float32 as it is read."""
    a, w = tensor(m, k), tensor(n, k, dtype=weight)
    if weight != dtypes.float32:
        w = UOp(Ops.CAST, dtypes.float32, (w,))
    full = (m, n, k)
    prod = expand(move(Ops.RESHAPE, a, (m, 1, k)), full) * expand(move(Ops.RESHAPE, w, (1, n, k)), full)
    return ast_of(move(Ops.RESHAPE, reduce(prod, (2,)), (m, n)))


def test_a_row_major_weight_is_read_along_its_rows() -> None:
    """A matrix-vector product (a decode step's layers): no vector of outputs, whose lanes would load a row apart;
    each output accumulates in a vector along its row of W (8 lanes of AVX2), four rows of W a step sharing the
    vector of x, each row a whole cache line a step (two vectors); the rows of A (a prompt) and of W are a tile of
    4 x 2 vectors (8 accumulators: with a step's 6 loaded vectors they fit AVX2's 16 registers; 4 x 4 spilled), each
    loaded vector of W serving four rows of A, with the loop over A's rows innermost (W's rows of a tile stay in cache
    for every row of A)."""
    k = Kernel(matvec_rows(1, 256, 512), CPU)
    k.apply_opts(hand_opts(k))
    assert {p.dim: p.size for p in k.of_kind(Kind.UPCAST)} == {0: 4}, "four rows of W, no vector of them"
    assert [p.size for p in k.of_kind(Kind.UNROLL)] == [16], "a cache line of each row a step"
    uops = vector_uops(matvec_rows(1, 256, 512), CPU, hand_opts(Kernel(matvec_rows(1, 256, 512), CPU)))
    assert any(u.op is Ops.LOAD and u.dtype.count == 8 for u in uops), "vector loads along the row"
    assert len([u for u in uops if u.op is Ops.ASSIGN and u.dtype.count == 8]) == 4, "a vector accumulator a row"
    k = Kernel(matvec_rows(32, 256, 512), CPU)
    opts = hand_opts(k)
    k.apply_opts(opts)
    assert {p.dim: p.size for p in k.of_kind(Kind.UPCAST)} == {0: 4, 1: 2}, "4 rows of A x 2 rows of W"
    assert global_order(k)[-1] == 0, "the loop over A's rows innermost"


def test_a_prompt_over_a_row_major_weight_tiles_4_x_4_rows_on_avx512() -> None:
    """AVX-512's 32 registers hold a tile of 4 rows of A x 4 of W (16 accumulators and a step's 8 loaded vectors),
    where AVX2's 16 hold 4 x 2: each loaded vector of A serves four rows of W too (a float16 1B model's prompt of 32
    tokens, 32 x 2048 @ 5632 x 2048: 4.0 -> 2.5 ms; its prefill 346-351 -> 276-279 ms)."""
    k = Kernel(matvec_rows(32, 256, 512), RendererCaps(language="C", vector_width=16, threads=2))
    k.apply_opts(hand_opts(k))
    assert {p.dim: p.size for p in k.of_kind(Kind.UPCAST)} == {0: 4, 1: 4}, "4 rows of A x 4 rows of W"
    assert [p.size for p in k.of_kind(Kind.UNROLL)] == [16]
    k = Kernel(matvec_rows(1, 256, 512), RendererCaps(language="C", vector_width=16, threads=2))
    k.apply_opts(hand_opts(k))
    assert {p.dim: p.size for p in k.of_kind(Kind.UPCAST)} == {0: 4}, "a decode step's: four rows of W, as before"
    assert [p.size for p in k.of_kind(Kind.UNROLL)] == [16], "a float32 row's cache line: one vector"


def test_a_decode_step_reads_a_whole_cache_line_of_each_float16_row() -> None:
    """A matrix-vector product over a float16 weight (a decode step's) reads a whole cache line of each row a step,
    two vectors of 16 lanes where one was half a line (its streams' prefetches each line twice: 2048 x 5632 from
    memory on 2 AVX-512 cores 46.0 -> 48.6 GB/s, a float16 1B model's decode 5.9% faster); a prompt's tile of rows
    keeps one vector a step (its 16 accumulators and 8 loads fill the registers)."""
    caps = RendererCaps(language="C", vector_width=16, threads=2)
    k = Kernel(matvec_rows(1, 256, 512, dtypes.float16), caps)
    k.apply_opts(hand_opts(k))
    assert {p.dim: p.size for p in k.of_kind(Kind.UPCAST)} == {0: 4}
    assert [p.size for p in k.of_kind(Kind.UNROLL)] == [32]
    k = Kernel(matvec_rows(32, 256, 512, dtypes.float16), caps)
    k.apply_opts(hand_opts(k))
    assert [p.size for p in k.of_kind(Kind.UNROLL)] == [16]


def test_two_reductions_of_a_kernel_accumulate_in_vectors() -> None:
    """Two products over the same input in one kernel (a feed-forward's gate and up projections, multiplied after
    them): each accumulates in a vector, as one alone does."""
    x, g, u = tensor(1, 512), tensor(256, 512), tensor(256, 512)
    full = (1, 256, 512)
    xs = expand(move(Ops.RESHAPE, x, (1, 1, 512)), full)
    gate = reduce(xs * expand(move(Ops.RESHAPE, g, (1, 256, 512)), full), (2,))
    up = reduce(xs * expand(move(Ops.RESHAPE, u, (1, 256, 512)), full), (2,))
    ast = ast_of(move(Ops.RESHAPE, gate * up, (1, 256)))
    uops = vector_uops(ast, CPU, hand_opts(Kernel(ast, CPU)))
    accumulators = [u for u in uops if u.op is Ops.ASSIGN]
    # (two reductions for each of the tile's four rows of W)
    assert len(accumulators) == 8 and all(a.dtype.count == 8 for a in accumulators), [a.dtype for a in accumulators]
