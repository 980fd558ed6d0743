"""Fragments read by ldmatrix (tiny.codegen.renderer.ldmatrix): checked against the scalar loads they stand for by
running both on numbers. Local memory holds its own addresses; the other indices (loop counters, workgroup ids) take
random values; every lane's fragment as ldmatrix delivers it (the PTX ISA's rule: lane 8j + r gives row r of matrix j,
lane l receives row l/4 at columns 2(l%4), 2(l%4)+1 of each, or with .trans rows 2(l%4), 2(l%4)+1 of column l/4)
must equal what its scalar loads read, and every row must start on 16 bytes."""

from __future__ import annotations

import random
import re

import pytest
from test_tc_action import matmul

from tiny.codegen.opt import Kernel, Opt, OptOps
from tiny.codegen.opt.heuristic import hand_opts
from tiny.codegen.program import render_for
from tiny.codegen.renderer.cuda import CUDARenderer
from tiny.codegen.renderer.ldmatrix import LANES, MatrixLoad, matrix_loads
from tiny.codegen.renderer.ptx import PTXRenderer
from tiny.ir.config import Context
from tiny.ir.dtypes import DType, dtypes
from tiny.ir.pattern import graph_rewrite
from tiny.ir.symbolic import symbolic
from tiny.ir.uop import Ops, UOp, substitute


def _value(x: UOp, values: dict[UOp, int]) -> int:
    out = graph_rewrite(substitute(x, {v: UOp.const(v.dtype, n) for v, n in values.items()}), symbolic)
    assert out.op is Ops.CONST, out
    return int(out.arg)


def _variables(x: UOp) -> list[UOp]:
    return [u for u in x.toposort if u.op in (Ops.SPECIAL, Ops.RANGE)]


def _delivered(m: MatrixLoad, rows: list[int], lane: int) -> list[int]:
    """What ldmatrix hands `lane`, from memory that holds its own addresses."""
    out = []
    for j in range(m.matrices):
        if m.trans:
            out += [rows[8 * j + 2 * (lane % 4)] + lane // 4, rows[8 * j + 2 * (lane % 4) + 1] + lane // 4]
        else:
            out += [rows[8 * j + lane // 4] + 2 * (lane % 4), rows[8 * j + lane // 4] + 2 * (lane % 4) + 1]
    return out


def _check(uops: list, seed: int) -> int:
    plans = matrix_loads(uops)
    rng = random.Random(seed)
    for frag, m in plans.items():
        offsets = [x.address.offset for x in frag.src]
        lane = next(u for u in _variables(offsets[0]) if u.op is Ops.SPECIAL and u.arg[0] == "lidx0")
        others = {u for o in offsets for u in _variables(o)} - {lane}
        for _ in range(3):
            values = {u: rng.randrange(u.arg[1] if u.op is Ops.SPECIAL else _value(u.src[0], {})) for u in others}
            rows = [_value(m.first.offset, values | {lane: n}) + m.shift[n] for n in range(LANES)]
            assert all(r % 8 == 0 for r in rows), "every row starts on 16 bytes"
            for n in range(LANES):
                scalar = [_value(o, values | {lane: n}) for o in offsets]
                assert _delivered(m, rows, n) == scalar, (n, m)
    return len(plans)


@pytest.mark.parametrize("dtype", [dtypes.float16, dtypes.bfloat16])
def test_the_rules_staged_product_reads_every_fragment_by_ldmatrix(dtype: DType) -> None:
    renderer = CUDARenderer("arch=sm_90")
    ast = matmul(256, 128, 256, dtype)
    assert any(o.op is OptOps.STAGE for o in hand_opts(Kernel(ast, renderer.caps)))
    r = render_for(ast, renderer, None)
    wmmas = [u for u in r.uops if u.op is Ops.WMMA]
    fragments = {f for w in wmmas for f in w.src[:2]}
    assert _check(r.uops, seed=1) == len(fragments) == 24  # A: 4 x 2, B: 8 x 2 fragments an iteration
    assert "tiny_ldmatrix_x4(" in r.src and "tiny_ldmatrix_x2_trans(" in r.src
    assert "= *(stage" not in r.src, "no fragment value is read on its own"


@pytest.mark.parametrize(
    "opts",
    [
        [Opt(OptOps.TC, 2, 0), Opt(OptOps.UNROLL, 2, 2), Opt(OptOps.LOCAL, 0, 2), Opt(OptOps.STAGE, 2)],
        [Opt(OptOps.TC, 2, 0), Opt(OptOps.UPCAST, 1, 4), Opt(OptOps.LOCAL, 1, 2), Opt(OptOps.STAGE, 2)],
        [Opt(OptOps.TC, 2, 0), Opt(OptOps.UNROLL, 2, 4), Opt(OptOps.UPCAST, 0, 2), Opt(OptOps.STAGE, 2)],
    ],
)
def test_other_tiles_read_by_ldmatrix_are_the_scalar_reads(opts: list[Opt]) -> None:
    uops = render_for(matmul(256, 128, 256), CUDARenderer("arch=sm_90"), opts).uops
    assert _check(uops, seed=2) > 0


@pytest.mark.parametrize("dtype", [dtypes.float16, dtypes.bfloat16])
def test_ptx_reads_the_staged_products_fragments_by_ldmatrix(dtype: DType) -> None:
    """The PTX renderer takes the same plans: one ldmatrix a fragment (x4 for A, x2.trans for B) at the first
    element's address plus the lane's row shift (a .const table each, read once where the lane is), its registers
    handed to mma.sync as they come; no fragment value is loaded from shared memory on its own. With LDMATRIX=0,
    the scalar reads."""
    ast = matmul(256, 128, 256, dtype)
    r = render_for(ast, PTXRenderer("arch=sm_90"), None)
    assert r.src.count("ldmatrix.sync.aligned.m8n8.x4.shared.b16") == 8
    assert r.src.count("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16") == 16
    tables = re.findall(r"^\.const \.align 4 \.b32 (tiny_rows\d+)\[32\] = \{([-\d, ]+)\};$", r.src, re.M)
    shifts = {tuple(int(x) for x in found.split(", ")) for _, found in tables}
    assert shifts == {m.shift for m in matrix_loads(r.uops).values()} and len(tables) == 2
    assert r.src.count("ld.const.b32") == 2 and not re.search(r"ld\.shared\.(b16|u16|f16)", r.src)
    with Context(LDMATRIX=0):
        scalar = render_for(ast, PTXRenderer("arch=sm_90"), None).src
    assert "ldmatrix" not in scalar and re.search(r"ld\.shared\.(b16|u16|f16)", scalar)


def test_fragments_in_global_memory_are_never_matrices() -> None:
    """ldmatrix reads local (shared) memory only: an unstaged product keeps its scalar reads."""
    ast = matmul(256, 128, 256)
    plain = [Opt(OptOps.TC, 2, 0), Opt(OptOps.UNROLL, 2, 2), Opt(OptOps.LOCAL, 0, 2)]
    r = render_for(ast, CUDARenderer("arch=sm_90"), plain)
    assert matrix_loads(r.uops) == {} and "ldmatrix" not in r.src


def test_ldmatrix_flag_off_keeps_the_scalar_reads() -> None:
    """LDMATRIX=0 renders the staged product with one shared-memory load per element (to measure what ldmatrix
    brings, and a way around it should a driver mis-run it)."""
    ast = matmul(256, 128, 256)
    with Context(LDMATRIX=0):
        r = render_for(ast, CUDARenderer("arch=sm_90"), None)
    assert "ldmatrix" not in r.src and "= *(stage" in r.src
