"""Narrow lanes in vectors: int8, uint8, int16, uint16 and float16 values read, masked and shifted by constants and
converted to float32 a vector at a time, as a quantized or float16 weight is in a product (RendererCaps.
narrow_vectors: the CPU's C and LLVM paths). Every device computes the scalar code's values; on those paths the
kernels hold the vector conversions."""

from __future__ import annotations

import numpy as np
import pytest
from tensor_helpers import small

from tiny.codegen.program import render_for
from tiny.ir.uop import Ops
from tiny.tensor import Device, Tensor

NARROW = ["int8", "uint8", "int16", "uint16", "float16"]


def _values(dtype: str, shape: tuple[int, ...], seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    if dtype == "float16":
        return (
            np.concatenate([rng.standard_normal(shape[0] * shape[1] - 4), [65504, -65504, 6e-8, -0.0]])
            .astype(np.float16)
            .reshape(shape)
        )
    info = np.iinfo(dtype)  # every value, the extremes included
    return rng.integers(info.min, info.max, shape, endpoint=True).astype(dtype)


def _renders(t: Tensor) -> list:
    """The linearized ops of each kernel t's schedule runs, rendered for its device."""
    renderer = Device[t.device].renderer
    return [render_for(item.ast, renderer).uops for item in t.schedule() if item.ast.op is Ops.SINK]


def _vector_casts(t: Tensor) -> list:
    return [u for uops in _renders(t) for u in uops if u.op is Ops.CAST and u.dtype.count > 1]


def _narrows(device: str) -> bool:
    return Device[device].renderer.caps.narrow_vectors


@pytest.mark.parametrize("dtype", NARROW)
def test_narrow_values_convert_to_float32_exactly(device: str, dtype: str) -> None:
    w = _values(dtype, small(device, (64, 256), (4, 16)), seed=1)
    out = Tensor(w, device=device).cast("float32") * 1.0
    if _narrows(device) and not small(device, False, True):
        casts = _vector_casts(out)
        assert casts and all(c.src[0].dtype.scalar.name == dtype for c in casts), "converted a vector at a time"
    np.testing.assert_array_equal(out.numpy(), w.astype(np.float32))


@pytest.mark.parametrize("dtype", NARROW)
def test_a_product_over_narrow_values_matches_numpy(device: str, dtype: str) -> None:
    """A weight of narrow values times float32 rows, summed along the weight's rows (a linear layer's matrix-vector
    product): the rows load as narrow vectors and convert in the product's kernel."""
    rows, k = small(device, (64, 256), (4, 16))
    w = _values(dtype, (rows, k), seed=2)
    x = np.random.default_rng(3).standard_normal((2, k)).astype(np.float32)
    out = Tensor(x, device=device).linear(Tensor(w, device=device).cast("float32"))
    if _narrows(device) and not small(device, False, True):
        assert _vector_casts(out), "the weight's lanes converted in vectors"
    want = x.astype(np.float64) @ w.astype(np.float64).T
    np.testing.assert_allclose(out.numpy(), want, rtol=1e-5, atol=1e-5 * np.abs(want).max())


@pytest.mark.parametrize("dtype", ["uint8", "int8", "uint16", "int16"])
def test_bit_fields_shifted_by_constants_are_vector_shifts(device: str, dtype: str) -> None:
    """Fields of packed integers (4-bit halves, 2-bit quarters) taken with constant shifts and masks, as a GGUF
    block's quants: right shifts of signed lanes carry the sign, as in the scalar code."""
    k = small(device, 256, 16)
    packed = _values(dtype, (8, k), seed=4)
    p = Tensor(packed, device=device)
    fields = [(p >> s) & m for s, m in [(0, 15), (4, 15), (2, 3), (6, 3)]]
    x = np.random.default_rng(5).standard_normal(k).astype(np.float32)
    out = Tensor.stack(*[(f.cast("float32") * Tensor(x, device=device)).sum(1) for f in fields])
    if _narrows(device) and not small(device, False, True):
        shifts = [u for uops in _renders(out) for u in uops if u.op is Ops.SHR and u.dtype.count > 1]
        assert shifts and all(s.src[1].op is Ops.CONST for s in shifts)
    want = [
        ((packed >> s) & m).astype(np.float64) @ x.astype(np.float64) for s, m in [(0, 15), (4, 15), (2, 3), (6, 3)]
    ]
    np.testing.assert_allclose(out.numpy(), np.stack(want), rtol=1e-5, atol=1e-4)


def test_int32_bytes_packed_by_constant_shifts(device: str) -> None:
    """Four bytes packed into an int32 with constant left shifts, as a Q8_0 product packs its input's quants: each
    vector's amounts are a vector of constants, a plain shift (its guard for amounts past the width compared the
    vector as a 64-bit integer, which C refuses, on hosts whose int32 lanes are 8)."""
    n = small(device, 256, 16)
    parts = np.random.default_rng(6).integers(-128, 128, (4, n)).astype(np.int32)
    t = Tensor(parts, device=device)
    words = (t[0] & 255) | ((t[1] & 255) << 8) | ((t[2] & 255) << 16) | (t[3] << 24)
    want = (parts[0] & 255) | ((parts[1] & 255) << 8) | ((parts[2] & 255) << 16) | (parts[3] << 24)
    np.testing.assert_array_equal(words.numpy(), want)


def test_a_shift_by_a_loaded_amount_stays_scalar_and_saturates(device: str) -> None:
    """A shift amount read from memory may be the lanes' width or more (0, as tiny.ir.alu says; C and x86 would take
    it modulo the width): it keeps the scalar code and its test."""
    k = small(device, 64, 8)
    packed = np.full((4, k), 0xB5, np.uint8)
    amounts = np.array([0, 3, 8, 9], np.uint8).reshape(4, 1)
    out = (Tensor(packed, device=device) >> Tensor(amounts, device=device)).cast("float32") * 1.0
    if _narrows(device) and not small(device, False, True):
        assert not [u for uops in _renders(out) for u in uops if u.op is Ops.SHR and u.dtype.count > 1]
    want = np.where(amounts >= 8, 0, packed >> np.minimum(amounts, 7)).astype(np.float32)
    np.testing.assert_array_equal(out.numpy(), np.broadcast_to(want, (4, k)))


def test_bfloat16_bits_widen_shift_and_bitcast_in_vectors(device: str) -> None:
    """A bfloat16 weight kept as its 16-bit patterns (GGUF's BF16): widened to 32 bits, shifted by a constant 16 and
    read as float32, every pattern (NaNs, infinities, subnormals) the float32 whose high half it is."""
    rows, k = small(device, (64, 256), (4, 16))
    bits = np.random.default_rng(6).integers(0, 1 << 16, (rows, k), dtype=np.uint16)
    bits[0, :4] = [0x7F80, 0xFF80, 0x7FC1, 0x0001]  # inf, -inf, a NaN, a subnormal
    out = (Tensor(bits, device=device).cast("uint32") << 16).bitcast("float32") * 1.0
    if _narrows(device) and not small(device, False, True):
        ops = [u for uops in _renders(out) for u in uops if u.dtype.count > 1]
        assert {Ops.CAST, Ops.SHL, Ops.BITCAST} <= {u.op for u in ops}, "widened, shifted and read a vector at a time"
    want = (bits.astype(np.uint32) << 16).view(np.float32)
    np.testing.assert_array_equal(out.numpy().view(np.uint32), want.view(np.uint32))


def test_an_integer_dot_sums_its_lanes_at_once(device: str) -> None:
    """int8 x int8 products summed in int32 (a quantized product's block sums): NumPy's values, the extremes included;
    where the CPU's renderers vectorize the sum, a vector's lanes are added by one reduction (C: tiny_vsum_*, clang's
    __builtin_reduce_add; LLVM IR: llvm.vector.reduce.add), not one extract and add per lane."""
    x, w = _values("int8", (4, 256), seed=5), _values("int8", (32, 256), seed=6)
    x[0], w[0] = -128, -128  # (the largest sum: 256 x 16384)
    out = (Tensor(x, device=device).reshape(4, 1, 256).cast("int32") * Tensor(w, device=device).cast("int32")).sum(
        axis=-1, dtype="int32"
    )
    renderer = Device[device].renderer
    summed = {"C": "tiny_vsum_int32x", "LLVM": "@llvm.vector.reduce.add.v"}.get(renderer.caps.language)
    if _narrows(device) and summed and not small(device, False, True):
        sources = [render_for(item.ast, renderer).src for item in out.schedule() if item.ast.op is Ops.SINK]
        assert any(summed in s for s in sources)
    np.testing.assert_array_equal(out.numpy(), x.astype(np.int64) @ w.astype(np.int64).T)


def test_a_big_matrix_vector_product_reads_its_prefetched_rows_right() -> None:
    """A float16 matrix of 2 MB times a vector: on the CPU (C or LLVM IR) its rows are prefetched ahead of the loads
    (the last prefetches reach past the matrix's end, which a prefetch may); the product is NumPy's either way."""
    rng = np.random.default_rng(7)
    w = rng.standard_normal((2048, 512)).astype(np.float16)
    x = rng.standard_normal((1, 512)).astype(np.float32)
    t = Tensor(x).linear(Tensor(w).cast("float32"))
    if (language := Device[t.device].renderer.caps.language) in ("C", "LLVM"):
        sources = [render_for(item.ast, Device[t.device].renderer).src for item in t.schedule()]
        assert any(("__builtin_prefetch" if language == "C" else "@llvm.prefetch") in src for src in sources)
    np.testing.assert_allclose(t.numpy(), x @ w.astype(np.float32).T, rtol=1e-4, atol=1e-3)
