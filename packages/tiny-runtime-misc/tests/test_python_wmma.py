"""WMMA on the PYTHON device, the executable definition of every tensor core in tiny.ir.tensorcore: for random
A, B and C laid out in fragments as each layout says, one warp's WMMA gives A @ B + C laid out as D's fragment.
These tests pin the layouts: a renderer that emits the hardware instruction trusts the same description."""

from __future__ import annotations

import random
import struct

import pytest

from tiny.ir.device import CompileError
from tiny.ir.dtypes import DType, bf16_to_float, dtypes, float_to_bf16, truncate
from tiny.ir.spec import SpecError, validate
from tiny.ir.tensorcore import TENSOR_CORES, Fragment, TensorCore, tensor_cores_for
from tiny.ir.uop import Ops, UOp
from tiny.runtime.python import PythonCompiler, PythonDevice, PythonProgram, PythonRenderer

i32, f32 = dtypes.int32, dtypes.float32


def pack(dt: DType, values: list[float]) -> bytearray:
    if dt == dtypes.bfloat16:
        return bytearray(struct.pack(f"{len(values)}H", *(float_to_bf16(v) for v in values)))
    return bytearray(struct.pack(f"{len(values)}{dt.fmt}", *values))


def unpack(dt: DType, buf: bytearray) -> list[float]:
    return list(struct.unpack(f"{len(buf) // dt.itemsize}{dt.fmt}", buf))


def wmma_kernel(tc: TensorCore, warps: int) -> list[UOp]:
    """Each lane loads its A, B and C fragments (lane-major arrays: element e of lane l at l * elements + e),
    runs the WMMA and stores its D fragment the same way; `warps` warps side by side in one workgroup."""
    lane = UOp(Ops.SPECIAL, i32, (), ("lidx0", tc.threads * warps))
    out = UOp(Ops.DEFINE_GLOBAL, f32.ptr(), (), 0)
    frags = []
    for i, (frag, dt) in enumerate(((tc.a, tc.dtype_in), (tc.b, tc.dtype_in), (tc.c, tc.dtype_out))):
        buf = UOp(Ops.DEFINE_GLOBAL, dt.ptr(), (), i + 1)
        n = frag.elements
        loads = [UOp(Ops.LOAD, dt, (UOp(Ops.INDEX, buf.dtype, (buf, lane * n + e)),)) for e in range(n)]
        frags.append(UOp(Ops.VECTORIZE, dt.vec(n), tuple(loads)))
    d = UOp(Ops.WMMA, tc.c_dtype, tuple(frags), tc.name)
    n = tc.c.elements
    stores = [
        UOp(Ops.STORE, dtypes.void, (UOp(Ops.INDEX, out.dtype, (out, lane * n + e)), UOp(Ops.GEP, f32, (d,), e)))
        for e in range(n)
    ]
    return [u for u in UOp(Ops.SINK, dtypes.void, tuple(stores)).toposort if u.op is not Ops.SINK]


def run(uops: list[UOp], bufs: list[bytearray], threads: int) -> None:
    src = PythonRenderer().render("wmma", uops)
    prog = PythonProgram(PythonDevice("PYTHON"), "wmma", PythonCompiler().compile(src))
    prog(*bufs, local_size=(threads, 1, 1))


def scatter(frag: Fragment, tile: list[list[float]], threads: int) -> list[float]:
    """A tile as a lane-major fragment array, by the layout."""
    out = []
    for lane in range(threads):
        for e in range(frag.elements):
            r, c = frag.position(lane, e)
            out.append(tile[r][c])
    return out


def rounded(dt: DType, rows: int, cols: int, rng: random.Random) -> list[list[float]]:
    return [[truncate(dt, rng.uniform(-2, 2)) for _ in range(cols)] for _ in range(rows)]


@pytest.mark.parametrize("name", sorted(TENSOR_CORES))
def test_each_layout_gives_a_times_b_plus_c(name: str) -> None:
    tc = TENSOR_CORES[name]
    m, n, k = tc.dims
    rng = random.Random(name)
    warps = 2
    tiles = [
        (rounded(tc.dtype_in, m, k, rng), rounded(tc.dtype_in, k, n, rng), rounded(f32, m, n, rng))
        for _ in range(warps)
    ]
    # (values the core multiplies as they are: TF32's 10 mantissa bits; its rounding has a test of its own)
    tiles = [
        ([[tc.rounded(v) for v in row] for row in a], [[tc.rounded(v) for v in row] for row in b], c)
        for a, b, c in tiles
    ]
    arrays: list[list[float]] = [[], [], []]
    for a, b, c in tiles:
        for i, (frag, tile) in enumerate(((tc.a, a), (tc.b, b), (tc.c, c))):
            arrays[i] += scatter(frag, tile, tc.threads)
    out = bytearray(4 * tc.threads * tc.c.elements * warps)
    bufs = [out, pack(tc.dtype_in, arrays[0]), pack(tc.dtype_in, arrays[1]), pack(f32, arrays[2])]
    run(wmma_kernel(tc, warps), bufs, tc.threads * warps)
    got = unpack(f32, out)
    per_warp = tc.threads * tc.c.elements
    for w, (a, b, c) in enumerate(tiles):
        want = [[sum(a[i][x] * b[x][j] for x in range(k)) + c[i][j] for j in range(n)] for i in range(m)]
        d = got[w * per_warp : (w + 1) * per_warp]
        for lane in range(tc.threads):
            for e in range(tc.c.elements):
                r, col = tc.c.position(lane, e)
                assert d[lane * tc.c.elements + e] == pytest.approx(want[r][col], rel=1e-6, abs=1e-6), (lane, e)


def test_inputs_are_rounded_to_their_dtype_and_products_are_exact() -> None:
    """fp16 inputs that are not exact in bf16 and the other way round: the emulator multiplies what the registers
    hold; one product 1+2**-10 squared needs 21 mantissa bits, kept exactly in the float32 accumulator."""
    tc = TENSOR_CORES["nv_m16n8k16_float16_float32"]
    x = 1 + 2**-10
    a = [[x if (i, j) == (0, 0) else 0.0 for j in range(16)] for i in range(16)]
    b = [[x if (i, j) == (0, 0) else 0.0 for j in range(8)] for i in range(16)]
    c = [[0.0] * 8 for _ in range(16)]
    arrays = [scatter(tc.a, a, 32), scatter(tc.b, b, 32), scatter(tc.c, c, 32)]
    out = bytearray(4 * 32 * 4)
    run(
        wmma_kernel(tc, 1),
        [out, pack(dtypes.float16, arrays[0]), pack(dtypes.float16, arrays[1]), pack(f32, arrays[2])],
        32,
    )
    d = unpack(f32, out)
    lane0 = next(lane for lane in range(32) for e in range(4) if tc.c.position(lane, e) == (0, 0))
    elem0 = next(e for e in range(4) if tc.c.position(lane0, e) == (0, 0))
    assert d[lane0 * 4 + elem0] == x * x == 1 + 2**-9 + 2**-20
    assert bf16_to_float(float_to_bf16(x)) != x  # the same value would not survive bfloat16 inputs


def test_replicated_lanes_that_disagree_are_refused() -> None:
    """RDNA3 holds A and B twice (both half-waves): lanes that give different copies are a code generator bug."""
    tc = TENSOR_CORES["rdna3_16x16x16_float16_float32"]
    a = scatter(tc.a, [[1.0] * 16 for _ in range(16)], 32)
    a[16 * 16] = 2.0  # lane 16's first element, a copy of lane 0's
    b = scatter(tc.b, [[1.0] * 16 for _ in range(16)], 32)
    bufs = [bytearray(4 * 256), pack(dtypes.float16, a), pack(dtypes.float16, b), pack(f32, [0.0] * 256)]
    with pytest.raises(RuntimeError, match="give different values"):
        run(wmma_kernel(tc, 1), bufs, 32)


def test_a_workgroup_that_is_not_whole_warps_is_refused() -> None:
    tc = TENSOR_CORES["cdna_16x16x16_float16_float32"]
    uops = wmma_kernel(tc, 1)
    bufs = [bytearray(4 * 256), bytearray(2 * 256), bytearray(2 * 256), bytearray(4 * 256)]
    with pytest.raises(RuntimeError, match="whole warps of 64"):
        run(uops, bufs, 32)


def test_the_validator_checks_the_fragments() -> None:
    tc = TENSOR_CORES["nv_m16n8k16_bfloat16_float32"]
    good = wmma_kernel(tc, 1)
    validate(good)
    wmma = next(u for u in good if u.op is Ops.WMMA)
    a, b, c = wmma.src
    for bad, why in [
        (wmma.replace(arg="m16n8k16"), "names a tensor core"),
        (wmma.replace(src=(b, a, c)), "fragments A, B, C"),
        (wmma.replace(src=(a, b)), "takes the A, B and C"),
        (wmma.replace(dtype=f32.vec(8)), "gives the D fragment"),
    ]:
        with pytest.raises(SpecError, match=why):
            validate([u for u in UOp(Ops.SINK, dtypes.void, (bad,)).toposort if u.op is not Ops.SINK])
    with pytest.raises(CompileError, match="names a tensor core"):
        PythonCompiler().compile(
            PythonRenderer().render("w", [u if u is not wmma else u for u in good]).replace(tc.name, "nope")
        )


def test_layouts_cover_their_tiles_and_targets_pick_them() -> None:
    for tc in TENSOR_CORES.values():
        m, n, k = tc.dims
        for frag, rows, cols in ((tc.a, m, k), (tc.b, k, n), (tc.c, m, n)):
            held = {frag.position(lane, e) for lane in range(tc.threads) for e in range(frag.elements)}
            assert held == {(r, c) for r in range(rows) for c in range(cols)}
    assert {tc.name for tc in tensor_cores_for("sm_90")} == {
        "nv_m16n8k16_float16_float32",
        "nv_m16n8k16_bfloat16_float32",
    }
    assert tensor_cores_for("sm_75") == () and tensor_cores_for("gfx1030") == ()
    assert tensor_cores_for("gfx1100")[0].threads == 32 and tensor_cores_for("gfx942")[0].threads == 64
    assert tensor_cores_for("gfx1201")[0].a.elements == 8 and tensor_cores_for("gfx1100")[0].a.elements == 16
    with pytest.raises(ValueError, match="fragment C gives the bits"):
        nv = TENSOR_CORES["nv_m16n8k16_float16_float32"]
        TensorCore(
            "bad", (16, 8, 16), dtypes.float16, f32, 32, nv.a, nv.b, Fragment("m", "n", nv.c.lane_bits, ("n0", "n0"))
        )


def test_the_nvidia_layout_is_the_ptx_one() -> None:
    """Spot checks against the PTX ISA's formulas (groupID = lane >> 2, tig = lane % 4)."""
    tc = TENSOR_CORES["nv_m16n8k16_float16_float32"]
    for lane in range(32):
        g, t = lane >> 2, lane % 4
        for i in range(8):
            assert tc.a.position(lane, i) == (g + 8 * (i >> 1 & 1), t * 2 + (i & 1) + 8 * (i >> 2))
        for i in range(4):
            assert tc.b.position(lane, i) == (t * 2 + (i & 1) + 8 * (i >> 1), g)
            assert tc.c.position(lane, i) == (g + 8 * (i >> 1), t * 2 + (i & 1))


def test_the_amd_layouts() -> None:
    """RDNA3: D row 2*v + lane // 16; RDNA4: row 8*(lane // 16) + v; CDNA: row 4*(lane // 16) + v; column lane % 16."""
    for prefix, row in (
        ("rdna3", lambda ln, v: 2 * v + ln // 16),
        ("rdna4", lambda ln, v: 8 * (ln // 16) + v),
        ("cdna", lambda ln, v: 4 * (ln // 16) + v),
    ):
        tc = TENSOR_CORES[f"{prefix}_16x16x16_float16_float32"]
        for lane in range(tc.threads):
            for v in range(tc.c.elements):
                assert tc.c.position(lane, v) == (row(lane, v), lane % 16)
            for e in range(tc.a.elements):
                assert tc.a.position(lane, e)[0] == lane % 16 and tc.b.position(lane, e)[1] == lane % 16
    rdna3 = TENSOR_CORES["rdna3_16x16x16_float16_float32"]
    assert [rdna3.a.position(17, e) for e in range(16)] == [(1, e) for e in range(16)]  # the half-waves agree


def test_tf32_inputs_are_rounded_to_ten_mantissa_bits_ties_away() -> None:
    """mma.m16n8k8.tf32 multiplies each float32 input rounded to 10 mantissa bits, to nearest with ties away from
    zero (cvt.rna.tf32.f32): one product of A's and B's first elements, the rest zero."""
    tc = TENSOR_CORES["nv_m16n8k8_tf32_float32"]
    m, n, k = tc.dims
    half_ulp = 1 + 2**-11  # exactly between 1 and 1 + 2**-10: rounds away, to 1 + 2**-10
    a = [[half_ulp if (i, x) == (0, 0) else 0.0 for x in range(k)] for i in range(m)]
    b = [[-3.0 - 2**-12 if (x, j) == (0, 0) else 0.0 for j in range(n)] for x in range(k)]  # below half: to -3
    c = [[0.0] * n for _ in range(m)]
    arrays = [scatter(tc.a, a, tc.threads), scatter(tc.b, b, tc.threads), scatter(tc.c, c, tc.threads)]
    out = bytearray(4 * tc.threads * tc.c.elements)
    run(wmma_kernel(tc, 1), [out, pack(f32, arrays[0]), pack(f32, arrays[1]), pack(f32, arrays[2])], tc.threads)
    d = unpack(f32, out)
    first = next(
        lane * tc.c.elements + e
        for lane in range(tc.threads)
        for e in range(tc.c.elements)
        if tc.c.position(lane, e) == (0, 0)
    )
    assert d[first] == (1 + 2**-10) * -3.0
    assert tc.rounded(-half_ulp) == -(1 + 2**-10) and tc.rounded(float("inf")) == float("inf")
