"""Sums that skip the padding they would read (tiny.codegen.narrow), and windows over an input padded along the dim
they slide over, read as one banded view (tiny.codegen.opt.actions.merge_windows)."""

from __future__ import annotations

import subprocess
from collections.abc import Sequence

import numpy as np
import pytest
from kernel_helpers import interpret, kernel_uops, move, reduce, tensor
from test_cstyle import compilers
from test_opt_actions import ast_of, loads_of

from tiny.codegen import Opt, OptOps
from tiny.codegen.opt.actions import merge_windows
from tiny.codegen.program import render_for
from tiny.codegen.renderer.cstyle import CRenderer
from tiny.ir.device import RendererCaps
from tiny.ir.uop import Ops, UOp
from tiny.ir.views import View

LOOPS = RendererCaps(language="C")


def row_window(rows: int, cols: int, k: int, pad: int, op: Ops = Ops.ADD) -> tuple[UOp, UOp]:
    """(x, kernel AST) of out[r, c] = op over j of xp[r + j, c], xp = x (rows, cols) with `pad` rows of zeros above and
    below: one view of xp per kernel row, each padded into its slot of the window dim, added up."""
    x = tensor(rows, cols)
    xp = move(Ops.PAD, x, ((pad, pad), (0, 0)))
    out = rows + 2 * pad - k + 1
    terms = []
    for j in range(k):
        view = move(Ops.RESHAPE, move(Ops.SHRINK, xp, ((j, j + out), (0, cols))), (out, cols, 1))
        terms.append(move(Ops.PAD, view, ((0, 0), (0, 0), (j, k - 1 - j))))
    total = terms[0]
    for t in terms[1:]:
        total = total + t
    return x, ast_of(move(Ops.RESHAPE, reduce(total, (2,), op), (out, cols)))


def expected(xv: np.ndarray, k: int, pad: int, op=np.add) -> np.ndarray:  # noqa: ANN001
    xp = np.pad(xv, ((pad, pad), (0, 0)))
    out = xp.shape[0] - k + 1
    return op.reduce(np.stack([xp[j : j + out] for j in range(k)]), axis=0)


def run(ast: UOp, xv: np.ndarray, out_shape: tuple[int, ...], opts: Sequence[Opt] = ()) -> tuple[np.ndarray, list[UOp]]:
    kernel, uops = kernel_uops(ast, LOOPS, opts)
    out = np.zeros(int(np.prod(out_shape)), np.float32)
    interpret(uops, [out, xv.reshape(-1)], kernel.global_size)
    return out.reshape(out_shape), uops


def reduce_loops(uops: list[UOp]) -> list[UOp]:
    return [u for u in uops if u.op is Ops.RANGE and u.end.op is not Ops.CONST]


@pytest.mark.parametrize("rows,k,pad", [(6, 3, 2), (5, 5, 4), (7, 3, 1), (4, 5, 3)])
def test_a_window_over_rows_of_padding_is_one_banded_view(rows: int, k: int, pad: int) -> None:
    x, ast = row_window(rows, 3, k, pad)
    assert len(loads_of(ast)) == k  # one view per kernel row, each masked where its rows fall in the padding
    (load,) = loads_of(merge_windows(ast))
    view: View = load.view
    assert view.mask is None and view.bands == ((0, 2, 1, pad, rows + pad),)  # pad <= r + j < rows + pad
    with pytest.raises(ValueError, match="banded"):
        view.permute((1, 0, 2))


@pytest.mark.parametrize("rows,k,pad", [(6, 3, 2), (5, 5, 4), (7, 3, 1), (4, 5, 3)])
def test_the_loop_over_kernel_rows_skips_the_padding(rows: int, k: int, pad: int) -> None:
    x, ast = row_window(rows, 3, k, pad)
    xv = np.random.default_rng(0).standard_normal((rows, 3)).astype(np.float32)
    got, uops = run(ast, xv, (rows + 2 * pad - k + 1, 3))
    np.testing.assert_allclose(got, expected(xv, k, pad), rtol=1e-6)
    (loop,) = reduce_loops(uops)  # its count depends on the output row
    assert all(u.src[0].gate is None for u in uops if u.op is Ops.LOAD)  # no load reads padding: none is gated


def test_lanes_with_different_bounds_loop_over_their_union_and_keep_their_gates() -> None:
    x, ast = row_window(6, 3, 3, 2)
    xv = np.random.default_rng(1).standard_normal((6, 3)).astype(np.float32)
    got, uops = run(ast, xv, (8, 3), [Opt(OptOps.UPCAST, 0, 2)])  # two output rows per iteration
    np.testing.assert_allclose(got, expected(xv, 3, 2), rtol=1e-6)
    assert len(reduce_loops(uops)) == 1
    assert any(u.src[0].gate is not None for u in uops if u.op is Ops.LOAD)  # (each row's own bound stays a gate)


def test_a_max_over_padding_is_not_narrowed() -> None:
    x, ast = row_window(5, 2, 3, 1, Ops.MAX)  # the padding's zeros take part in a max
    xv = -1 - np.random.default_rng(2).random((5, 2)).astype(np.float32)
    got, uops = run(ast, xv, (5, 2))
    np.testing.assert_array_equal(got, expected(xv, 3, 1, np.maximum))
    assert got[0].tolist() == [0.0, 0.0] and not reduce_loops(uops)


def test_a_narrowed_loop_renders_as_c_that_compiles() -> None:
    _, ast = row_window(5, 8, 5, 4)
    r = CRenderer("x86_64;vector_width=8;threads=2;")
    src = render_for(ast, r).src
    cc = compilers()[0]
    out = subprocess.run([cc, "-c", "-x", "c", "-", "-o", "/dev/null"], input=src.encode(), capture_output=True)
    assert out.returncode == 0, out.stderr.decode()
    assert "?" in src.split("for (")[-1].split(";")[1]  # the loop's bound: a max/min of the row, not a number


@pytest.mark.parametrize("size,threads", [(4099, 2), (4099, 4), (10, 4), (13, 3)])
def test_a_dim_padded_for_threads_loops_to_its_end_without_gates(size: int, threads: int) -> None:
    """A prime dim padded to a multiple of the threads and split across them: each thread's loop stops where the
    dim does (the last one's share is shorter, or empty), so no load or store is gated, and the loop is the plain
    one a C compiler vectorizes."""
    a, b = tensor(size), tensor(size)
    ast = ast_of(a * b + a)
    opts = [Opt(OptOps.PADTO, 0, threads), Opt(OptOps.THREAD, 0, threads)]
    kernel, uops = kernel_uops(ast, RendererCaps(language="C", threads=threads), opts)
    av, bv = (np.random.default_rng(i).standard_normal(size).astype(np.float32) for i in range(2))
    out = np.full(size, np.nan, np.float32)
    interpret(uops, [out, av, bv], kernel.global_size)
    np.testing.assert_allclose(out, av * bv + av, rtol=1e-6)
    (loop,) = [u for u in uops if u.op is Ops.RANGE]
    assert loop.end.op is not Ops.CONST  # min(share, size - gidx0 * share)
    assert all(u.address.gate is None for u in uops if u.op in (Ops.LOAD, Ops.STORE))


def test_an_output_loop_with_a_store_that_is_not_gated_is_not_narrowed() -> None:
    """Two stores, one of them writing every iteration: the loop must run them all."""
    a = tensor(13)
    padded = move(Ops.PAD, a, ((0, 3),))  # 16 outputs, the last 3 zeros: the store is not gated, the load is
    _, uops = kernel_uops(ast_of(padded * 2), RendererCaps(language="C", threads=2), [Opt(OptOps.THREAD, 0, 2)])
    (loop,) = [u for u in uops if u.op is Ops.RANGE]
    assert loop.end.op is Ops.CONST and loop.end.arg == 8
