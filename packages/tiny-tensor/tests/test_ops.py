"""Every Tensor op compared with NumPy, on every device under test (see conftest.py).

Expected dtypes follow PyTorch: sums of integers are int64, true division of integers is float32, an int
tensor with a Python float is float32, comparisons are bool. Shapes are small on PYTHON (an interpreter).
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from tensor_helpers import assert_matches, check, random_array, round_bf16, small

from tiny.tensor import Tensor, dtypes

F32, F16, BF16 = dtypes.float32, dtypes.float16, dtypes.bfloat16
I8, I32, I64, U8, BOOL = dtypes.int8, dtypes.int32, dtypes.int64, dtypes.uint8, dtypes.bool
NUMERIC = [F32, F16, I32, I8, U8, I64]


def _ids(dts):
    return [d.name for d in dts]


# ---------------------------------------------------------------- binary arithmetic


def _gelu(x):
    return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))


def _sigmoid(x):
    return 1 / (1 + np.exp(-x))


BINARY = {
    "add": (lambda a, b: a + b, lambda a, b: a + b),
    "sub": (lambda a, b: a - b, lambda a, b: a - b),
    "mul": (lambda a, b: a * b, lambda a, b: a * b),
    "maximum": (lambda a, b: a.maximum(b), np.maximum),
    "minimum": (lambda a, b: a.minimum(b), np.minimum),
}


@pytest.mark.parametrize("dtype", NUMERIC, ids=_ids(NUMERIC))
@pytest.mark.parametrize("op", list(BINARY))
def test_binary_broadcast(device, op, dtype):
    tiny_fn, np_fn = BINARY[op]
    a, b = small(device, ((5, 1, 33), (7, 33)), ((2, 1, 5), (3, 5)))
    check(device, tiny_fn, np_fn, a, b, dtype=dtype)


OTHER_DTYPES = [dtypes.int16, dtypes.uint16, dtypes.uint32, dtypes.uint64, dtypes.float64]


@pytest.mark.parametrize("dtype", OTHER_DTYPES, ids=_ids(OTHER_DTYPES))
def test_other_dtypes(device, dtype):
    a, b = (3, 1, 4), (2, 4)
    divisor = random_array(b, dtype, 1, 9, seed=5)
    for tiny_fn, np_fn in (*BINARY.values(), (lambda x, y: x // y, np.floor_divide), (lambda x, y: x % y, np.mod)):
        check(device, tiny_fn, np_fn, a, divisor, dtype=dtype)
    check(device, lambda x, y: x < y, np.less, a, b, dtype=dtype, out_dtype=BOOL)
    check(
        device,
        lambda x: x.sum(1),
        lambda x: x.sum(1),
        a,
        dtype=dtype,
        out_dtype=dtype if dtype.is_float else (dtypes.uint64 if dtype == dtypes.uint64 else I64),
    )
    check(device, lambda x: x.max(0), lambda x: x.max(0), a, dtype=dtype)
    check(device, lambda x: x.min(-1), lambda x: x.min(-1), a, dtype=dtype)
    if dtype.is_float:
        check(device, lambda x: x.exp(), np.exp, a, dtype=dtype, rtol=1e-7)
        check(device, lambda x: x.sqrt(), np.sqrt, a, dtype=dtype, low=0, high=4, rtol=1e-7)
        check(device, lambda x, y: x / y, lambda x, y: x / y, a, divisor, dtype=dtype)
    else:
        check(device, lambda x, y: x & y | (x ^ 5), lambda x, y: x & y | (x ^ 5), a, b, dtype=dtype)


@pytest.mark.parametrize("dtype", NUMERIC, ids=_ids(NUMERIC))
def test_true_div(device, dtype):
    shape = small(device, (9, 17), (3, 5))
    divisor = random_array(shape, dtype, 1, 5, seed=7)
    out = F32 if dtype.is_int else dtype
    check(device, lambda a, b: a / b, lambda a, b: a / b, shape, divisor, dtype=dtype, out_dtype=out)
    check(device, lambda a, b: a.div(b), lambda a, b: a / b, shape, divisor, dtype=dtype, out_dtype=out)


@pytest.mark.parametrize("dtype", [I32, I8, I64], ids=_ids([I32, I8, I64]))
def test_floordiv_mod_negative_ints(device, dtype):
    # every sign combination, exact and inexact quotients: Python (and torch) floor semantics
    vals = np.array([-7, -6, -5, -1, 0, 1, 5, 6, 7], dtype=np.dtype(dtype.fmt))
    divs = np.array([-3, -2, -1, 1, 2, 3], dtype=np.dtype(dtype.fmt))
    a, b = vals.reshape(-1, 1), divs.reshape(1, -1)
    check(device, lambda x, y: x // y, lambda x, y: x // y, a, b, dtype=dtype)
    check(device, lambda x, y: x % y, lambda x, y: x % y, a, b, dtype=dtype)
    check(device, lambda x: x // -2, lambda x: x // -2, vals, dtype=dtype)
    check(device, lambda x: x % -2, lambda x: x % -2, vals, dtype=dtype)
    check(device, lambda x: -7 // x, lambda x: -7 // x, divs, dtype=dtype)
    check(device, lambda x: 7 % x, lambda x: 7 % x, divs, dtype=dtype)


def test_int_division_corners(device):
    # C leaves MIN / -1 and division by zero undefined (x86 traps on both); tiny defines them: no trap, MIN // -1
    # wraps to MIN (as PyTorch's int32 does), MIN % -1 is 0, and a zero divisor gives 0 (PyTorch raises there)
    lo = -(2**31)
    a = Tensor(np.array([lo, lo, lo + 1, 5, -5, 0], np.int32), device=device)
    b = Tensor(np.array([-1, 1, -1, 0, 0, 0], np.int32), device=device)
    assert (a // b).tolist() == [lo, lo, 2**31 - 1, 0, 0, 0]
    assert (a % b).tolist() == [0, 0, 0, 0, 0, 0]


def test_shifts_by_the_width_or_more(device):
    # a shift amount from data, at or past the width: 0, or the sign in every bit for >> of a negative value
    # (C leaves it undefined and x86 takes the amount modulo 32)
    a = Tensor(np.array([1, -8, 3, 3, -1], np.int32), device=device)
    s = Tensor(np.array([33, 40, 32, 31, 32], np.int32), device=device)
    assert (a << s).tolist() == [0, 0, 0, -(2**31), 0]
    assert (a >> s).tolist() == [0, -1, 0, 0, -1]


def test_floordiv_mod_uint8(device):
    a = np.array([0, 1, 7, 200, 255], dtype=np.uint8).reshape(-1, 1)
    b = np.array([1, 3, 16, 255], dtype=np.uint8).reshape(1, -1)
    check(device, lambda x, y: x // y, lambda x, y: x // y, a, b, dtype=U8)
    check(device, lambda x, y: x % y, lambda x, y: x % y, a, b, dtype=U8)


@pytest.mark.parametrize("dtype", [F32, F16], ids=_ids([F32, F16]))
def test_floordiv_mod_floats(device, dtype):
    a = np.array([-7.5, -6.0, -0.5, 0.0, 0.5, 6.0, 7.5], dtype=np.dtype(dtype.fmt)).reshape(-1, 1)
    b = np.array([-2.0, -0.75, 0.75, 2.0], dtype=np.dtype(dtype.fmt)).reshape(1, -1)
    check(device, lambda x, y: x // y, np.floor_divide, a, b, dtype=dtype)
    check(device, lambda x, y: x % y, np.mod, a, b, dtype=dtype)


def test_float_floordiv_agrees_with_mod(device):
    # torch, NumPy and Python floor-divide floats so that a == (a // b) * b + a % b: 1.0 // 0.1 is 9.0, since
    # float32 0.1 is a little more than 0.1 (rounding 1.0 / 0.1 up to 10 and flooring gives the wrong answer)
    a = np.array([1.0, 1.0, -1.0, 7.0, 0.3, -5.0, 5.0], dtype=np.float32)
    b = np.array([0.1, 0.2, 0.1, 0.7, 0.1, np.inf, -np.inf], dtype=np.float32)
    check(device, lambda x, y: x // y, np.floor_divide, a, b, rtol=0, atol=0)
    q, r = Tensor(a, device=device) // Tensor(b, device=device), Tensor(a, device=device) % Tensor(b, device=device)
    finite = np.isfinite(b)
    np.testing.assert_allclose(q.numpy()[finite] * b[finite] + r.numpy()[finite], a[finite], rtol=1e-6)


def test_float_mod_large_quotient(device):
    # the remainder is exact in floating point (fmod-based, as torch.remainder and np.mod), even when the
    # quotient has more digits than float32 holds: 1e10 % 3 == 1
    a = np.array([1e10, -1e10, 123456789.0, 3e9, 1e20], dtype=np.float32).reshape(-1, 1)
    b = np.array([3.0, -7.0, 0.1], dtype=np.float32).reshape(1, -1)
    check(device, lambda x, y: x % y, np.mod, a, b, rtol=0, atol=0)


@pytest.mark.parametrize("dtype", [F32, I32], ids=_ids([F32, I32]))
def test_pow(device, dtype):
    shape = small(device, (4, 9), (2, 5))
    check(device, lambda x: x**2, lambda x: x**2, shape, dtype=dtype)
    check(device, lambda x: x**0, lambda x: x**0, shape, dtype=dtype)
    check(device, lambda x: x**3, lambda x: x**3, shape, dtype=dtype)
    check(device, lambda x: x**0.5, lambda x: x**0.5, shape, dtype=dtype, low=0, high=9, out_dtype=F32)
    check(device, lambda x: x**-1.5, lambda x: x**-1.5, shape, dtype=dtype, low=1, high=9, out_dtype=F32)
    check(device, lambda x: 2.0**x, lambda x: 2.0**x, shape, dtype=dtype, out_dtype=F32)


def test_pow_float_special(device):
    # negative bases: integral exponents keep the sign's parity, fractional ones give nan; x**0 == 1
    a = np.array([-2.0, -1.5, 0.0, 1.5, 2.0], dtype=np.float32).reshape(-1, 1)
    b = np.array([-2.0, -1.0, 0.0, 0.5, 1.0, 2.0, 3.0], dtype=np.float32).reshape(1, -1)
    check(device, lambda x, y: x**y, lambda x, y: x**y, a, b)
    check(device, lambda x, y: x.pow(y), np.power, a, b)


@pytest.mark.parametrize("dtype", [I32, I8, U8], ids=_ids([I32, I8, U8]))
def test_pow_int_keeps_int(device, dtype):
    # torch: an integer tensor to an integer power (scalar or tensor) stays an integer tensor
    base = np.array([0, 1, 2, 3], dtype=np.dtype(dtype.fmt))
    exps = np.array([0, 1, 2, 9], dtype=np.dtype(dtype.fmt))
    check(device, lambda x: x**9, lambda x: x**9, base, dtype=dtype)
    check(device, lambda x: 2**x, lambda x: (2**x).astype(x.dtype), exps, dtype=dtype)
    check(device, lambda x, y: x**y, lambda x, y: x**y, base, exps, dtype=dtype)


# ---------------------------------------------------------------- scalars on either side

SCALAR_OPS = [
    ("t+2", lambda x: x + 2),
    ("2+t", lambda x: 2 + x),
    ("t-3", lambda x: x - 3),
    ("3-t", lambda x: 3 - x),
    ("t*3", lambda x: x * 3),
    ("3*t", lambda x: 3 * x),
    ("t+1.5", lambda x: x + 1.5),
    ("1.5-t", lambda x: 1.5 - x),
    ("t*0.5", lambda x: x * 0.5),
    ("t/2", lambda x: x / 2),
    ("t/2.5", lambda x: x / 2.5),
    ("7/t", lambda x: 7 / x),
    ("t//3", lambda x: x // 3),
    ("7//t", lambda x: 7 // x),
    ("t%3", lambda x: x % 3),
    ("7%t", lambda x: 7 % x),
    ("t+True", lambda x: x + True),
]


def _scalar_out(name: str, dtype):
    """torch's result dtype: a Python float makes integer tensors float32; true division always does."""
    if dtype.is_float:
        return dtype
    return F32 if ("." in name or "/" in name.replace("//", "")) else dtype


@pytest.mark.parametrize("dtype", [F32, I32, F16], ids=_ids([F32, I32, F16]))
@pytest.mark.parametrize("name,fn", SCALAR_OPS, ids=[n for n, _ in SCALAR_OPS])
def test_scalar_operands(device, name, fn, dtype):
    # positive inputs keep the divisions away from zero; the floor semantics have their own test
    shape = small(device, (5, 13), (2, 7))
    check(device, fn, fn, shape, dtype=dtype, low=1, high=9, out_dtype=_scalar_out(name, dtype))


def test_bool_arithmetic(device):
    # bool + bool is logical or, bool * bool logical and, as in torch; bool + int is int64
    a, b = (2, 8), (3, 1, 8)
    check(device, lambda x, y: x + y, lambda x, y: x + y, a, b, dtype=BOOL)
    check(device, lambda x, y: x * y, lambda x, y: x * y, a, b, dtype=BOOL)
    check(device, lambda x: x + 1, lambda x: x.astype(np.int64) + 1, a, dtype=BOOL, out_dtype=I64)
    check(device, lambda x: x * 2.5, lambda x: x * 2.5, a, dtype=BOOL, out_dtype=F32)


def test_mixed_dtype_promotion(device):
    shape = (3, 4)
    cases = [
        (I8, U8, dtypes.int16),
        (I32, F16, F16),
        (I64, F32, F32),
        (U8, I32, I32),
        (BOOL, I8, I8),
        (F16, F32, F32),
    ]
    for da, db, want in cases:
        check(device, lambda x, y: x + y, lambda x, y: x + y, shape, shape, in_dtypes=[da, db], out_dtype=want)
        check(device, lambda x, y: x * y, lambda x, y: x * y, shape, shape, in_dtypes=[db, da], out_dtype=want)


# ---------------------------------------------------------------- unary math

# name -> (tiny, numpy, low, high)
UNARY = {
    "neg": (lambda x: -x, lambda x: -x, -3, 3),
    "exp": (lambda x: x.exp(), np.exp, -4, 4),
    "exp2": (lambda x: x.exp2(), np.exp2, -4, 4),
    "log": (lambda x: x.log(), np.log, 0.05, 8),
    "log2": (lambda x: x.log2(), np.log2, 0.05, 8),
    "sqrt": (lambda x: x.sqrt(), np.sqrt, 0, 9),
    "rsqrt": (lambda x: x.rsqrt(), lambda x: 1 / np.sqrt(x), 0.1, 9),
    "reciprocal": (lambda x: x.reciprocal(), lambda x: 1 / x, 0.2, 5),
    "sin": (lambda x: x.sin(), np.sin, -6, 6),
    "cos": (lambda x: x.cos(), np.cos, -6, 6),
    "tan": (lambda x: x.tan(), np.tan, -1.2, 1.2),
    "trunc": (lambda x: x.trunc(), np.trunc, -5, 5),
    "floor": (lambda x: x.floor(), np.floor, -5, 5),
    "ceil": (lambda x: x.ceil(), np.ceil, -5, 5),
    "abs": (lambda x: x.abs(), np.abs, -3, 3),
    "sign": (lambda x: x.sign(), np.sign, -3, 3),
    "relu": (lambda x: x.relu(), lambda x: np.maximum(x, 0), -3, 3),
    "sigmoid": (lambda x: x.sigmoid(), _sigmoid, -6, 6),
    "tanh": (lambda x: x.tanh(), np.tanh, -4, 4),
    "gelu": (lambda x: x.gelu(approximate="tanh"), _gelu, -4, 4),
    "silu": (lambda x: x.silu(), lambda x: x * _sigmoid(x), -4, 4),
    "leaky_relu": (lambda x: x.leaky_relu(), lambda x: np.where(x < 0, 0.01 * x, x), -3, 3),
    "leaky_relu_0.2": (lambda x: x.leaky_relu(0.2), lambda x: np.where(x < 0, 0.2 * x, x), -3, 3),
    "square": (lambda x: x.square(), np.square, -3, 3),
    "clip": (lambda x: x.clip(-1, 0.5), lambda x: np.clip(x, -1, 0.5), -3, 3),
    "clamp_min": (lambda x: x.clamp(min_=0.25), lambda x: np.maximum(x, 0.25), -3, 3),
    "clamp_max": (lambda x: x.clamp(max_=0.25), lambda x: np.minimum(x, 0.25), -3, 3),
}


@pytest.mark.parametrize("dtype", [F32, F16], ids=_ids([F32, F16]))
@pytest.mark.parametrize("op", list(UNARY))
def test_unary_float(device, op, dtype):
    tiny_fn, np_fn, low, high = UNARY[op]
    shape = small(device, (7, 37), (4, 9))
    check(device, tiny_fn, np_fn, shape, dtype=dtype, low=low, high=high)


INT_UNARY = {
    "neg": (lambda x: -x, lambda x: -x),
    "abs": (lambda x: x.abs(), np.abs),
    "sign": (lambda x: x.sign(), np.sign),
    "relu": (lambda x: x.relu(), lambda x: np.maximum(x, 0)),
    "square": (lambda x: x.square(), np.square),
    "trunc": (lambda x: x.trunc(), lambda x: x),
    "floor": (lambda x: x.floor(), lambda x: x),
    "ceil": (lambda x: x.ceil(), lambda x: x),
    "clip": (lambda x: x.clip(-3, 4), lambda x: np.clip(x, -3, 4)),
}


@pytest.mark.parametrize("dtype", [I32, I8, I64], ids=_ids([I32, I8, I64]))
@pytest.mark.parametrize("op", list(INT_UNARY))
def test_unary_int_keeps_dtype(device, op, dtype):
    tiny_fn, np_fn = INT_UNARY[op]
    check(device, tiny_fn, np_fn, small(device, (6, 11), (3, 5)), dtype=dtype)


def test_unary_uint8(device):
    shape = small(device, (6, 11), (3, 5))
    check(device, lambda x: x.abs(), np.abs, shape, dtype=U8)
    check(device, lambda x: x.sign(), np.sign, shape, dtype=U8)
    check(device, lambda x: x.relu(), lambda x: x, shape, dtype=U8)


@pytest.mark.parametrize("op", ["exp", "log", "sqrt", "sin", "cos", "sigmoid", "tanh", "reciprocal"])
@pytest.mark.parametrize("dtype", [I32, U8, BOOL], ids=_ids([I32, U8, BOOL]))
def test_math_on_ints_is_float32(device, op, dtype):
    tiny_fn, np_fn, _, _ = UNARY[op]
    low = 1 if op in ("log", "reciprocal") and not dtype.is_bool else None
    x = random_array((3, 7), dtype, low, 6)
    if op in ("log", "reciprocal") and dtype.is_bool:
        x = np.ones((3, 7), dtype=bool)
    # NumPy computes small ints in float16; the reference takes them as float64
    check(device, tiny_fn, lambda v: np_fn(v.astype(np.float64)), x, dtype=dtype, out_dtype=F32)


def test_unary_special_values(device):
    x = np.array([0.0, -0.0, 1.0, -1.0, np.inf, -np.inf, np.nan, 1e30, -1e30, 100.0, -100.0], dtype=np.float32)
    # sign(nan) is left out: torch gives 0 and NumPy nan
    for name in ("exp", "exp2", "log", "log2", "sqrt", "abs", "neg", "relu", "sigmoid", "tanh", "trunc"):
        tiny_fn, np_fn, _, _ = UNARY[name]
        check(device, tiny_fn, np_fn, x)
    check(device, lambda t: t.reciprocal(), lambda t: 1 / t, x)
    check(device, lambda t: t.floor(), np.floor, x)
    check(device, lambda t: t.ceil(), np.ceil, x)
    check(device, lambda t: t.isnan(), np.isnan, x, out_dtype=BOOL)
    check(device, lambda t: t.isinf(), np.isinf, x, out_dtype=BOOL)
    check(device, lambda t: t.sin(), np.sin, np.array([0.0, np.inf, -np.inf, np.nan, 1e4], dtype=np.float32), atol=1e-4)


SIGNED_ZEROS = np.array([-0.0, 0.0, -0.5, 0.5, -2.5], dtype=np.float32)


def test_abs_of_negative_zero(device):
    # the sign of a zero shows through a reciprocal: abs(-0.0) is +0.0, as in torch and NumPy
    check(device, lambda t: t.abs().reciprocal(), lambda t: 1 / np.abs(t), SIGNED_ZEROS)


def test_rounding_keeps_negative_zero(device):
    # trunc(-0.5) and ceil(-0.5) are -0.0, as in torch and C
    x = SIGNED_ZEROS
    check(device, lambda t: t.trunc().reciprocal(), lambda t: 1 / np.trunc(t), x)
    check(device, lambda t: t.ceil().reciprocal(), lambda t: 1 / np.ceil(t), x)
    check(device, lambda t: (-t).reciprocal(), lambda t: 1 / -t, x)


@pytest.mark.parametrize("dtype", [F16, I32, BOOL], ids=_ids([F16, I32, BOOL]))
def test_isnan_isinf_other_dtypes(device, dtype):
    x = random_array((4, 5), dtype)
    if dtype == F16:
        x = np.array([[1.0, np.nan, np.inf, -np.inf, 65504.0]], dtype=np.float16)
    check(device, lambda t: t.isnan(), np.isnan, x, dtype=dtype, out_dtype=BOOL)
    check(device, lambda t: t.isinf(), np.isinf, x, dtype=dtype, out_dtype=BOOL)


def test_maximum_minimum_nan_propagates(device):
    a = np.array([np.nan, 1.0, np.nan, -np.inf, 2.0], dtype=np.float32)
    b = np.array([1.0, np.nan, np.nan, 3.0, np.inf], dtype=np.float32)
    check(device, lambda x, y: x.maximum(y), np.maximum, a, b)
    check(device, lambda x, y: x.minimum(y), np.minimum, a, b)
    check(device, lambda x: x.relu(), lambda x: np.maximum(x, 0), a)


# ---------------------------------------------------------------- comparisons, logic, bits

COMPARE = {
    "lt": (lambda a, b: a < b, np.less),
    "le": (lambda a, b: a <= b, np.less_equal),
    "gt": (lambda a, b: a > b, np.greater),
    "ge": (lambda a, b: a >= b, np.greater_equal),
    "eq": (lambda a, b: a == b, np.equal),
    "ne": (lambda a, b: a != b, np.not_equal),
}
COMPARE_DTYPES = [F32, F16, I32, I8, U8, BOOL]


@pytest.mark.parametrize("dtype", COMPARE_DTYPES, ids=_ids(COMPARE_DTYPES))
@pytest.mark.parametrize("op", list(COMPARE))
def test_comparisons(device, op, dtype):
    tiny_fn, np_fn = COMPARE[op]
    # small integer ranges so that equal pairs occur
    low, high = (0, 3) if not dtype.is_bool else (None, None)
    a = random_array((4, 1, 6), dtype, low, high, seed=1)
    b = random_array((3, 6), dtype, low, high, seed=2)
    if dtype.is_float:
        a, b = np.round(a), np.round(b)
    check(device, tiny_fn, np_fn, a, b, dtype=dtype, out_dtype=BOOL)
    if dtype in (F32, I32, BOOL):  # a Python scalar on either side
        check(device, lambda x: tiny_fn(x, 1), lambda x: np_fn(x, 1), a, dtype=dtype, out_dtype=BOOL)
        check(device, lambda x: tiny_fn(1, x), lambda x: np_fn(1, x), a, dtype=dtype, out_dtype=BOOL)


def test_comparisons_nan_and_mixed(device):
    a = np.array([np.nan, 1.0, -np.inf, 2.0, np.inf], dtype=np.float32)
    b = np.array([np.nan, np.nan, -np.inf, 2.0, 1.0], dtype=np.float32)
    for op in COMPARE:
        tiny_fn, np_fn = COMPARE[op]
        check(device, tiny_fn, np_fn, a, b, out_dtype=BOOL)
    # an int tensor against a float tensor and a Python float compares as floats
    i = np.array([-2, -1, 0, 1, 2], dtype=np.int32)
    f = np.array([-1.5, -1.0, 0.5, 1.0, 2.5], dtype=np.float32)
    check(device, lambda x, y: x < y, np.less, i, f, in_dtypes=[I32, F32], out_dtype=BOOL)
    check(device, lambda x: x < 0.5, lambda x: x < 0.5, i, dtype=I32, out_dtype=BOOL)
    check(device, lambda x: x == 1.0, lambda x: x == 1.0, i, dtype=I32, out_dtype=BOOL)


BITWISE = {
    "and": (lambda a, b: a & b, np.bitwise_and),
    "or": (lambda a, b: a | b, np.bitwise_or),
    "xor": (lambda a, b: a ^ b, np.bitwise_xor),
}
BIT_DTYPES = [I32, I8, U8, BOOL]


@pytest.mark.parametrize("dtype", BIT_DTYPES, ids=_ids(BIT_DTYPES))
@pytest.mark.parametrize("op", list(BITWISE))
def test_bitwise(device, op, dtype):
    tiny_fn, np_fn = BITWISE[op]
    low, high = (None, None) if dtype.is_bool else ((0, 255) if dtype.is_unsigned else (-100, 100))
    a = random_array((3, 1, 5), dtype, low, high, seed=3)
    b = random_array((4, 5), dtype, low, high, seed=4)
    check(device, tiny_fn, np_fn, a, b, dtype=dtype)
    scalar = True if dtype.is_bool else 6
    check(device, lambda x: tiny_fn(x, scalar), lambda x: np_fn(x, scalar), a, dtype=dtype)
    check(device, lambda x: tiny_fn(scalar, x), lambda x: np_fn(scalar, x), a, dtype=dtype)


@pytest.mark.parametrize("dtype", BIT_DTYPES, ids=_ids(BIT_DTYPES))
def test_invert_and_logical_not(device, dtype):
    low, high = (None, None) if dtype.is_bool else ((0, 255) if dtype.is_unsigned else (-100, 100))
    a = random_array((4, 5), dtype, low, high, seed=5)
    check(device, lambda x: ~x, np.invert, a, dtype=dtype)
    check(device, lambda x: x.logical_not(), np.logical_not, a, dtype=dtype, out_dtype=BOOL)


def test_logical_not_float(device):
    a = np.array([0.0, -0.0, 1.0, -2.5, np.nan, np.inf], dtype=np.float32)
    check(device, lambda x: x.logical_not(), np.logical_not, a, out_dtype=BOOL)


@pytest.mark.parametrize("dtype", [I32, I8, U8, I64], ids=_ids([I32, I8, U8, I64]))
def test_shifts(device, dtype):
    low, high = (0, 255) if dtype.is_unsigned else (-100, 100)
    a = random_array((3, 7), dtype, low, high, seed=6)
    for s in (0, 1, 3):
        check(device, lambda x, s=s: x << s, lambda x, s=s: np.left_shift(x, s).astype(x.dtype), a, dtype=dtype)
        check(device, lambda x, s=s: x >> s, lambda x, s=s: np.right_shift(x, s).astype(x.dtype), a, dtype=dtype)


# ---------------------------------------------------------------- where, cast, bitcast


@pytest.mark.parametrize("dtype", [F32, F16, I32, U8, BOOL], ids=_ids([F32, F16, I32, U8, BOOL]))
def test_where(device, dtype):
    cond = random_array((3, 1, 5), BOOL, seed=8)
    a, b = random_array((4, 5), dtype, seed=9), random_array((1, 5), dtype, seed=10)
    check(device, lambda c, x, y: c.where(x, y), np.where, cond, a, b, in_dtypes=[BOOL, dtype, dtype], out_dtype=dtype)


def test_a_choice_between_conditions_in_a_vector_kernel(device):
    """where() over conditions (bools) chosen by a condition, inside a kernel of float vectors: on the CPU a vector
    of masks, chosen bit by bit (its helper for float vectors did not take them: the C did not compile)."""
    a, b, c = (random_array((64,), F32, seed=s) for s in (13, 14, 15))
    check(
        device,
        lambda x, y, z: (x < y).where(y < z, x < z).where(x * 2, -1.0),
        lambda x, y, z: np.where(np.where(x < y, y < z, x < z), x * 2, -1.0).astype(np.float32),
        a, b, c,
    )  # fmt: skip


def test_where_scalars_and_nonbool_condition(device):
    cond = random_array((3, 4), BOOL, seed=11)
    x = random_array((3, 4), F32, seed=12)
    check(device, lambda c: c.where(1.5, -2.0), lambda c: np.where(c, 1.5, -2.0), cond, dtype=BOOL, out_dtype=F32)
    check(device, lambda c: c.where(3, 4), lambda c: np.where(c, 3, 4), cond, dtype=BOOL, out_dtype=I64)
    check(
        device,
        lambda c, t: c.where(t, 0.0),
        lambda c, t: np.where(c, t, 0),
        cond,
        x,
        in_dtypes=[BOOL, F32],
        out_dtype=F32,
    )
    check(
        device,
        lambda c, t: c.where(-1, t),
        lambda c, t: np.where(c, -1, t),
        cond,
        x,
        in_dtypes=[BOOL, F32],
        out_dtype=F32,
    )
    # an int tensor with a float scalar promotes to float32
    i = random_array((3, 4), I32, seed=13)
    check(
        device,
        lambda c, t: c.where(t, 0.5),
        lambda c, t: np.where(c, t, 0.5),
        cond,
        i,
        in_dtypes=[BOOL, I32],
        out_dtype=F32,
    )
    # a non-bool condition means "nonzero"
    check(
        device,
        lambda t: t.where(1.0, 0.0),
        lambda t: np.where(t != 0, 1.0, 0.0),
        np.array([0.0, 2.0, -0.0, -1.0], dtype=np.float32),
    )


CASTS = [
    (F32, I32),
    (F32, I8),
    (F32, U8),
    (F32, BOOL),
    (F32, F16),
    (F32, I64),
    (F32, BF16),
    (I32, F32),
    (I32, F16),
    (I32, I8),
    (I32, U8),
    (I32, BOOL),
    (I64, I32),
    (U8, I8),
    (I8, U8),
    (I8, F32),
    (U8, F32),
    (BOOL, F32),
    (BOOL, I32),
    (F16, F32),
    (F16, I32),
]


@pytest.mark.parametrize("src,dst", CASTS, ids=[f"{a.name}->{b.name}" for a, b in CASTS])
def test_cast(device, src, dst):
    if src.is_float and dst.is_int:
        # float -> int truncates toward zero; stay inside the target's range (outside is undefined, as in C)
        hi = 100 if dst.itemsize == 1 else 1000
        x = random_array((5, 7), src, 0 if dst.is_unsigned else -hi, hi, seed=14)
    elif src.is_int and dst.is_int:
        x = random_array(
            (5, 7),
            src,
            0 if src.is_unsigned else -300 if src.itemsize > 1 else -128,
            255 if src.is_unsigned else 300 if src.itemsize > 1 else 127,
            seed=14,
        )
    else:
        x = random_array((5, 7), src, seed=14)
    if src.is_float:
        x[0, :3] = [0.5, -0.5, 0.0]

    def ref(v):
        if dst == BF16:
            return round_bf16(v)
        return v.astype(np.dtype(dst.fmt))

    check(device, lambda t: t.cast(dst), ref, x, dtype=src, out_dtype=dst)


def test_cast_float_to_int_truncates(device):
    x = np.array([-2.9, -2.5, -0.7, 0.7, 2.5, 2.9], dtype=np.float32)
    check(device, lambda t: t.cast(I32), lambda t: np.trunc(t).astype(np.int32), x, out_dtype=I32)
    check(device, lambda t: t.int(), lambda t: np.trunc(t).astype(np.int32), x, out_dtype=I32)
    check(device, lambda t: t.cast("int8"), lambda t: np.trunc(t).astype(np.int8), x, out_dtype=I8)
    i = np.array([-3, 0, 5], dtype=np.int32)
    check(device, lambda t: t.float(), lambda t: t.astype(np.float32), i, dtype=I32, out_dtype=F32)


BITCASTS = [(F32, I32), (F32, dtypes.uint32), (I32, F32), (F16, dtypes.int16), (dtypes.uint16, F16), (U8, I8)]


@pytest.mark.parametrize("src,dst", BITCASTS, ids=[f"{a.name}->{b.name}" for a, b in BITCASTS])
def test_bitcast(device, src, dst):
    x = random_array((3, 5), src, seed=15)
    if src == dtypes.uint16:
        x = np.array([0x3C00, 0xC000, 0x7C00, 0x0001, 0x7BFF], dtype=np.uint16)  # 1, -2, inf, tiny, 65504
    check(
        device,
        lambda t: t.bitcast(dst),
        lambda v: v.astype(np.dtype(src.fmt)).view(np.dtype(dst.fmt)),
        x,
        dtype=src,
        out_dtype=dst,
        rtol=0,
        atol=0,
    )


def test_bitcast_of_computed_value(device):
    x = np.array([1.0, -2.0, 0.5], dtype=np.float32)
    check(
        device,
        lambda t: (t * 2).bitcast(I32) + 1,
        lambda v: (v * 2).astype(np.float32).view(np.int32) + 1,
        x,
        out_dtype=I32,
    )


# ---------------------------------------------------------------- size 0 and size 1


def test_size_zero_elementwise(device):
    check(device, lambda a, b: a + b, lambda a, b: a + b, (0, 3), (1, 3))
    check(device, lambda a: a.exp() * 2, lambda a: np.exp(a) * 2, (2, 0, 4))
    check(device, lambda a, b: a * b, lambda a, b: a * b, (0,), (1,), dtype=I32)
    check(device, lambda a: a < 0, lambda a: a < 0, (3, 0), out_dtype=BOOL)
    check(device, lambda a: a.reshape(0, 5).permute(1, 0), lambda a: a.reshape(0, 5).T, (5, 0))


def test_size_one_elementwise(device):
    check(device, lambda a, b: a + b, lambda a, b: a + b, (1, 1), (1,))
    check(device, lambda a, b: a * b, lambda a, b: a * b, (1, 4, 1), (3, 1, 1))
    check(device, lambda a: a.exp(), np.exp, (1,))
    check(device, lambda a: -a, lambda a: -a, ())
    check(device, lambda a, b: a - b, lambda a, b: a - b, (), (2, 3))


# ---------------------------------------------------------------- non-contiguous inputs


def test_ops_on_views(device):
    check(device, lambda a: a.permute(2, 0, 1).exp(), lambda a: np.exp(a.transpose(2, 0, 1)), (2, 3, 4))
    check(device, lambda a, b: a.T + b, lambda a, b: a.T + b, (4, 3), (3, 4))
    check(device, lambda a: a.pad(((1, 2), (0, 1))) * 3, lambda a: np.pad(a, ((1, 2), (0, 1))) * 3, (3, 4))
    check(
        device,
        lambda a: a.pad(((1, 0), (2, 1)), value=-1.5).sqrt(),
        lambda a: np.sqrt(np.pad(a, ((1, 0), (2, 1)), constant_values=-1.5)),
        (3, 4),
        low=0,
        high=4,
    )
    check(device, lambda a: a.flip(0) - a, lambda a: a[::-1] - a, (5, 3))
    check(device, lambda a: a.shrink(((1, 3), (0, 2))).relu(), lambda a: np.maximum(a[1:3, 0:2], 0), (4, 3))
    check(device, lambda a, b: a.expand(3, 4) * b, lambda a, b: np.broadcast_to(a, (3, 4)) * b, (1, 4), (3, 4))
    check(device, lambda a: a[::2, ::-1].sin(), lambda a: np.sin(a[::2, ::-1]), (5, 6))
    check(device, lambda a: a.permute(1, 0).reshape(-1)[1:7], lambda a: a.T.reshape(-1)[1:7], (3, 4))
    check(
        device,
        lambda a: a.flip(1).pad(((0, 0), (1, 1))).permute(1, 0).flip(0) + 1,
        lambda a: np.pad(a[:, ::-1], ((0, 0), (1, 1))).T[::-1] + 1,
        (2, 5),
    )
    # the same buffer read through two different views in one expression
    check(device, lambda a: a + a.T + a.flip(0, 1), lambda a: a + a.T + a[::-1, ::-1], (4, 4))
    check(device, lambda a: a.sum(0) + a.permute(1, 0).max(1), lambda a: a.sum(0) + a.T.max(1), (3, 5), atol=1e-5)


def test_int_ops_on_views(device):
    check(device, lambda a: a.permute(1, 0) // 3, lambda a: a.T // 3, (3, 4), dtype=I32)
    check(
        device,
        lambda a: a.flip(0).pad(((1, 1), (0, 0)), value=7) % 4,
        lambda a: np.pad(a[::-1], ((1, 1), (0, 0)), constant_values=7) % 4,
        (3, 2),
        dtype=I8,
    )
    check(device, lambda a: a[::-2].sum(), lambda a: a[::-2].sum(), (7,), dtype=U8, out_dtype=I64)


# ---------------------------------------------------------------- reductions

AXES = [None, 0, 1, 2, -1, -3, (0, 1), (0, 2), (1, 2), (0, 1, 2), (-1, 0)]


def _np_reduce(fn, axis, keepdim):
    return lambda a: fn(a, axis=axis, keepdims=keepdim)


@pytest.mark.parametrize("keepdim", [False, True])
@pytest.mark.parametrize("axis", AXES, ids=[str(a) for a in AXES])
def test_reduce_axes_float32(device, axis, keepdim):
    shape = small(device, (5, 6, 7), (2, 3, 4))
    for name, np_fn in (("sum", np.sum), ("max", np.max), ("min", np.min), ("mean", np.mean)):
        check(
            device,
            lambda a, name=name: getattr(a, name)(axis, keepdim),
            _np_reduce(np_fn, axis, keepdim),
            shape,
            atol=1e-4,
        )


@pytest.mark.parametrize(
    "axis,keepdim", [(None, False), (0, True), (-1, False), ((0, 2), True)], ids=["None", "0-keep", "-1", "(0,2)-keep"]
)
@pytest.mark.parametrize("dtype", [I32, I8, U8, BOOL, F16, I64], ids=_ids([I32, I8, U8, BOOL, F16, I64]))
def test_reduce_dtypes(device, dtype, axis, keepdim):
    shape = small(device, (4, 5, 6), (2, 3, 4))
    sum_dtype = I64 if (dtype.is_int or dtype.is_bool) else dtype
    check(
        device,
        lambda a: a.sum(axis, keepdim),
        _np_reduce(np.sum, axis, keepdim),
        shape,
        dtype=dtype,
        out_dtype=sum_dtype,
    )
    check(device, lambda a: a.max(axis, keepdim), _np_reduce(np.max, axis, keepdim), shape, dtype=dtype)
    check(device, lambda a: a.min(axis, keepdim), _np_reduce(np.min, axis, keepdim), shape, dtype=dtype)
    if dtype.is_float:
        check(device, lambda a: a.mean(axis, keepdim), _np_reduce(np.mean, axis, keepdim), shape, dtype=dtype)


def test_reduce_extremes(device):
    i8 = np.array([[-128, 127, 0], [5, -128, 127]], dtype=np.int8)
    u8 = np.array([[0, 255, 7], [255, 255, 1]], dtype=np.uint8)
    for arr, dt in ((i8, I8), (u8, U8)):
        check(device, lambda a: a.max(1), lambda a: a.max(1), arr, dtype=dt)
        check(device, lambda a: a.min(1), lambda a: a.min(1), arr, dtype=dt)
        check(device, lambda a: a.sum(), lambda a: a.astype(np.int64).sum(), arr, dtype=dt, out_dtype=I64)
    f = np.array([[-np.inf, -np.inf], [np.inf, 1.0], [np.nan, 1.0]], dtype=np.float32)
    check(device, lambda a: a.max(1), lambda a: a.max(1), f)
    check(device, lambda a: a.min(1), lambda a: a.min(1), f)
    i64 = np.array([2**40, -(2**41), 3], dtype=np.int64)
    check(device, lambda a: a.sum(), lambda a: a.sum(), i64, dtype=I64)
    check(device, lambda a: a.max(), lambda a: a.max(), i64, dtype=I64)


def test_reduce_sum_dtype_argument(device):
    check(device, lambda a: a.sum(1, dtype=F32), lambda a: a.sum(1), (3, 4), dtype=I32, out_dtype=F32)
    check(device, lambda a: a.sum(dtype="int32"), lambda a: a.sum(), (3, 4), dtype=I8, out_dtype=I32)


def test_mean_float16_does_not_overflow(device):
    # torch accumulates half precision in float32 and divides before rounding: the mean of 4 x 40000 is 40000,
    # although the sum (160000) does not fit in float16
    x = np.full((4, 2), 40000.0, dtype=np.float16)
    check(device, lambda a: a.mean(0), lambda a: a.mean(0), x, dtype=F16)
    check(device, lambda a: a.mean(), lambda a: a.mean(), x, dtype=F16)


def test_reduce_size_zero_and_one(device):
    check(device, lambda a: a.sum(1), lambda a: a.sum(1), (2, 0, 3))
    check(device, lambda a: a.sum(), lambda a: a.sum(), (2, 0, 3))
    check(device, lambda a: a.sum(0), lambda a: a.sum(0), (2, 0, 3))
    check(device, lambda a: a.max(0), lambda a: a.max(0), (2, 0, 3))
    check(device, lambda a: a.sum(1, keepdim=True), lambda a: a.sum(1, keepdims=True), (3, 0), dtype=I32, out_dtype=I64)
    check(device, lambda a: a.mean(1), lambda a: np.full((2, 3), np.nan), (2, 0, 3))
    check(device, lambda a: a.sum((0, 2)), lambda a: a.sum((0, 2)), (1, 3, 1))
    check(device, lambda a: a.max(0), lambda a: a.max(0), (1, 4))
    check(device, lambda a: a.min(), lambda a: a.min(), (1, 1, 1))
    check(device, lambda a: a.sum(), lambda a: a.sum(), ())
    check(device, lambda a: a.max(), lambda a: a.max(), ())


def test_reduce_of_elementwise_and_views(device):
    check(device, lambda a, b: (a * b + 1).sum(1), lambda a, b: (a * b + 1).sum(1), (4, 6), (1, 6))
    check(device, lambda a: a.permute(2, 0, 1).max((0, 2)), lambda a: a.transpose(2, 0, 1).max((0, 2)), (3, 4, 5))
    check(device, lambda a: a.expand(3, 4, 5).sum(0), lambda a: np.broadcast_to(a, (3, 4, 5)).sum(0), (1, 4, 5))
    check(
        device,
        lambda a: a.pad(((1, 1), (2, 0)), value=-9.0).max(1),
        lambda a: np.pad(a, ((1, 1), (2, 0)), constant_values=-9.0).max(1),
        (3, 4),
    )
    check(device, lambda a: a.flip(0)[::2].mean(0), lambda a: a[::-1][::2].mean(0), (5, 3))
    # a reduction feeding another op and a second reduction
    check(
        device,
        lambda a: (a - a.max(1, keepdim=True)).exp().sum(),
        lambda a: np.exp(a - a.max(1, keepdims=True)).sum(),
        (4, 5),
        atol=1e-4,
    )


@pytest.mark.parametrize("axis", [-1, 0, 1])
def test_softmax_log_softmax(device, axis):
    shape = small(device, (6, 19), (3, 5))

    def np_softmax(a):
        e = np.exp(a - a.max(axis, keepdims=True))
        return e / e.sum(axis, keepdims=True)

    def np_log_softmax(a):
        s = a - a.max(axis, keepdims=True)
        return s - np.log(np.exp(s).sum(axis, keepdims=True))

    check(device, lambda a: a.softmax(axis), np_softmax, shape, low=-5, high=5)
    check(device, lambda a: a.log_softmax(axis), np_log_softmax, shape, low=-5, high=5, atol=1e-5)
    # stable for large inputs
    big = random_array(shape, F32, 500, 1000)
    check(device, lambda a: a.softmax(axis), np_softmax, big)
    check(device, lambda a: a.log_softmax(axis), np_log_softmax, big, atol=1e-4)


def test_softmax_dtypes_and_3d(device):
    def np_softmax(a, axis):
        e = np.exp(a - a.max(axis, keepdims=True))
        return e / e.sum(axis, keepdims=True)

    check(device, lambda a: a.softmax(), lambda a: np_softmax(a, -1), (2, 3, 4), dtype=I32, out_dtype=F32)
    check(device, lambda a: a.softmax(1), lambda a: np_softmax(a, 1), (2, 3, 4), dtype=F16)
    check(device, lambda a: a.softmax(0), lambda a: np_softmax(a, 0), (2, 3, 4))
    check(device, lambda a: a.softmax(-1), lambda a: np_softmax(a, -1), (3, 1))


# ---------------------------------------------------------------- matmul

MATMUL_SHAPES = [
    ((3, 4), (4, 5)),
    ((4,), (4, 5)),
    ((3, 4), (4,)),
    ((4,), (4,)),
    ((2, 3, 4), (4, 5)),
    ((3, 4), (2, 4, 5)),
    ((2, 1, 3, 4), (3, 4, 2)),
    ((4,), (2, 4, 3)),
    ((2, 3, 4), (4,)),
    ((3, 1), (1, 4)),
    ((1, 1), (1, 1)),
    ((0, 4), (4, 5)),
    ((3, 0), (0, 5)),
    ((3, 4), (4, 0)),
    ((0,), (0,)),
    ((2, 0, 3), (3, 2)),
]


@pytest.mark.parametrize("sa,sb", MATMUL_SHAPES, ids=[f"{a}@{b}" for a, b in MATMUL_SHAPES])
def test_matmul_shapes(device, sa, sb):
    check(device, lambda a, b: a @ b, np.matmul, sa, sb, atol=1e-5)


@pytest.mark.parametrize("dtype", [F32, F16, I32, I8, I64], ids=_ids([F32, F16, I32, I8, I64]))
def test_matmul_dtypes(device, dtype):
    sa, sb = small(device, ((17, 33), (33, 9)), ((3, 6), (6, 4)))
    # float16 products are rounded to float16 before the float32 accumulation: the dtype's own tolerance
    atol = 1e-4 if dtype == F32 else None
    check(device, lambda a, b: a.matmul(b), np.matmul, sa, sb, dtype=dtype, atol=atol)
    check(device, lambda a, b: a.dot(b), np.matmul, sa, sb, dtype=dtype, atol=atol)


def test_matmul_mixed_dtypes(device):
    check(device, lambda a, b: a @ b, np.matmul, (3, 4), (4, 2), in_dtypes=[I32, F32], out_dtype=F32)
    check(device, lambda a, b: a @ b, np.matmul, (3, 4), (4, 2), in_dtypes=[U8, I8], out_dtype=dtypes.int16)


def test_matmul_views(device):
    check(device, lambda a, b: a.T @ b, lambda a, b: a.T @ b, (4, 3), (4, 5))
    check(device, lambda a, b: a @ b.T, lambda a, b: a @ b.T, (3, 4), (5, 4))
    check(device, lambda a, b: a[::2] @ b.flip(0), lambda a, b: a[::2] @ b[::-1], (5, 4), (4, 3))
    check(device, lambda a, b: a.expand(3, 4) @ b, lambda a, b: np.broadcast_to(a, (3, 4)) @ b, (1, 4), (4, 2))
    check(
        device, lambda a, b: a.pad(((0, 0), (1, 1))) @ b, lambda a, b: np.pad(a, ((0, 0), (1, 1))) @ b, (3, 2), (4, 3)
    )
    # a matmul feeding an elementwise epilogue and a second matmul
    check(
        device,
        lambda a, b, c: (a @ b).relu() @ c,
        lambda a, b, c: np.maximum(a @ b, 0) @ c,
        (3, 4),
        (4, 5),
        (5, 2),
        atol=1e-4,
    )


def test_rmatmul_list(device):
    b = random_array((2, 3), F32)
    out = [[1.0, 2.0]] @ Tensor(b, device=device)
    assert_matches(out, np.array([[1.0, 2.0]]) @ b, F32)


# ---------------------------------------------------------------- movement


def test_reshape_view(device):
    check(device, lambda a: a.reshape(4, 6), lambda a: a.reshape(4, 6), (2, 3, 4))
    check(device, lambda a: a.reshape(-1), lambda a: a.reshape(-1), (2, 3, 4))
    check(device, lambda a: a.reshape((2, -1)), lambda a: a.reshape(2, -1), (2, 3, 4))
    check(device, lambda a: a.view(3, 1, -1, 2), lambda a: a.reshape(3, 1, -1, 2), (2, 3, 4))
    check(device, lambda a: a.reshape(()), lambda a: a.reshape(()), (1, 1))
    check(device, lambda a: a.reshape(0, 3), lambda a: a.reshape(0, 3), (3, 0))
    check(device, lambda a: a.permute(1, 0).reshape(2, 6), lambda a: a.T.reshape(2, 6), (4, 3))


def test_permute_transpose(device):
    check(device, lambda a: a.permute(2, 0, 1), lambda a: a.transpose(2, 0, 1), (2, 3, 4))
    check(device, lambda a: a.permute((1, -1, 0)), lambda a: a.transpose(1, 2, 0), (2, 3, 4))
    check(device, lambda a: a.transpose(0, 2), lambda a: a.swapaxes(0, 2), (2, 3, 4))
    check(device, lambda a: a.transpose(), lambda a: a.T, (2, 3))
    check(device, lambda a: a.transpose(-1, -2), lambda a: a.swapaxes(-1, -2), (2, 3, 4))
    check(device, lambda a: a.T, lambda a: a.T, (2, 3, 4))
    check(device, lambda a: a.T, lambda a: a.T, (5,))


def test_expand(device):
    check(device, lambda a: a.expand(2, 3, 4), lambda a: np.broadcast_to(a, (2, 3, 4)), (3, 1))
    check(device, lambda a: a.expand(-1, 5), lambda a: np.broadcast_to(a, (3, 5)), (3, 1))
    check(device, lambda a: a.expand((4, 2)), lambda a: np.broadcast_to(a, (4, 2)), ())
    check(device, lambda a: a.expand(0, 3), lambda a: np.broadcast_to(a, (0, 3)), (1, 3))
    check(device, lambda a: a.expand(2, 2, 3), lambda a: np.broadcast_to(a, (2, 2, 3)), (1, 3), dtype=BOOL)


def test_pad(device):
    check(device, lambda a: a.pad(((1, 2), (3, 0))), lambda a: np.pad(a, ((1, 2), (3, 0))), (2, 3))
    # torch style: flat pairs from the last dimension backwards
    check(device, lambda a: a.pad((1, 2)), lambda a: np.pad(a, ((0, 0), (1, 2))), (2, 3))
    check(device, lambda a: a.pad((1, 2, 0, 1)), lambda a: np.pad(a, ((0, 1), (1, 2))), (2, 3))
    check(device, lambda a: a.pad(((1, 1), (1, 1)), value=2.5), lambda a: np.pad(a, 1, constant_values=2.5), (2, 3))
    check(device, lambda a: a.pad(((0, 2),), value=-np.inf), lambda a: np.pad(a, (0, 2), constant_values=-np.inf), (3,))
    check(device, lambda a: a.pad(((2, 1),), value=7), lambda a: np.pad(a, (2, 1), constant_values=7), (3,), dtype=I32)
    check(
        device,
        lambda a: a.pad(((1, 0), (0, 1)), value=True),
        lambda a: np.pad(a, ((1, 0), (0, 1)), constant_values=True),
        (2, 2),
        dtype=BOOL,
    )
    # negative padding crops, as in torch
    check(device, lambda a: a.pad(((-1, 1), (0, -2))), lambda a: np.pad(a[1:, :-2], ((0, 1), (0, 0))), (3, 4))
    check(device, lambda a: a.pad(((0, 0), (0, 0))), lambda a: a, (2, 2))
    check(device, lambda a: a.pad(((1, 1),)), lambda a: np.pad(a, 1), (0,))


def test_shrink_flip(device):
    check(device, lambda a: a.shrink(((1, 3), None, (0, 2))), lambda a: a[1:3, :, 0:2], (4, 3, 5))
    check(device, lambda a: a.shrink(((1, 1), (0, 3))), lambda a: a[1:1, 0:3], (2, 3))
    check(device, lambda a: a.flip(0), lambda a: a[::-1], (4, 3))
    check(device, lambda a: a.flip(-1), lambda a: a[:, ::-1], (4, 3))
    check(device, lambda a: a.flip(0, 2), lambda a: a[::-1, :, ::-1], (2, 3, 4))
    check(device, lambda a: a.flip((0, 1)), lambda a: a[::-1, ::-1], (2, 3), dtype=U8)
    check(device, lambda a: a.flip(0).flip(0), lambda a: a, (3, 2))


def test_flatten_squeeze_unsqueeze(device):
    check(device, lambda a: a.flatten(), lambda a: a.reshape(-1), (2, 3, 4))
    check(device, lambda a: a.flatten(1), lambda a: a.reshape(2, -1), (2, 3, 4))
    check(device, lambda a: a.flatten(0, 1), lambda a: a.reshape(6, 4), (2, 3, 4))
    check(device, lambda a: a.flatten(-2, -1), lambda a: a.reshape(2, 12), (2, 3, 4))
    check(device, lambda a: a.flatten(), lambda a: a.reshape(1), ())
    check(device, lambda a: a.squeeze(), lambda a: a.squeeze(), (1, 3, 1, 2))
    check(device, lambda a: a.squeeze(0), lambda a: a.squeeze(0), (1, 3, 1, 2))
    check(device, lambda a: a.squeeze(-2), lambda a: a.squeeze(-2), (1, 3, 1, 2))
    check(device, lambda a: a.squeeze(1), lambda a: a, (1, 3, 1, 2))  # not size 1: unchanged, as torch
    check(device, lambda a: a.unsqueeze(0), lambda a: a[None], (2, 3))
    check(device, lambda a: a.unsqueeze(-1), lambda a: a[..., None], (2, 3))
    check(device, lambda a: a.unsqueeze(1), lambda a: a[:, None], (2, 3))
    check(device, lambda a: a.unsqueeze(0), lambda a: a[None], ())


INDICES = [
    1,
    -1,
    (0, 2),
    (-2, -1, 0),
    slice(None),
    slice(1, 3),
    slice(None, None, 2),
    slice(None, None, -1),
    slice(None, None, -2),
    slice(3, 0, -2),
    slice(-2, None),
    slice(5, 1),
    slice(10, 20),
    (slice(None, None, 2), slice(None, None, -3)),
    (Ellipsis, 1),
    (1, Ellipsis),
    (None, 1, None),
    (Ellipsis, None),
    (slice(1, None), None, slice(None, None, 3), -1),
    (slice(None, None, -1), 0, slice(None, None, -4)),
    (slice(None, None, 3), slice(1, -1), slice(None, None, 2)),
    (0, slice(None, None, 5)),
    (slice(None, None, 100),),
    (slice(-100, 100),),
    (),
    Ellipsis,
    None,
]


@pytest.mark.parametrize("index", INDICES, ids=[repr(i) for i in INDICES])
def test_getitem(device, index):
    check(device, lambda a: a[index], lambda a: a[index], (4, 3, 5))


def test_getitem_then_ops(device):
    check(device, lambda a: a[1:, ::2] * a[:-1, 1::2], lambda a: a[1:, ::2] * a[:-1, 1::2], (4, 6))
    check(device, lambda a: a[::-1, 1][::2].exp(), lambda a: np.exp(a[::-1, 1][::2]), (7, 3))
    check(device, lambda a: a[..., ::3].sum(-1), lambda a: a[..., ::3].sum(-1), (2, 3, 7), dtype=I32, out_dtype=I64)
    check(device, lambda a: a[1][2].reshape(1) + 1, lambda a: a[1][2].reshape(1) + 1, (3, 4))


# lengths that are and are not a multiple of the step, and shorter than it
@pytest.mark.parametrize("n", [1, 6, 7, 12])
@pytest.mark.parametrize("step", [2, -3, 5])
def test_getitem_steps_every_length(device, n, step):
    check(device, lambda a: a[::step], lambda a: a[::step], (n,))
    check(device, lambda a: a[1::step], lambda a: a[1::step], (n,))
    check(device, lambda a: a[-2::step], lambda a: a[-2::step], (n,))


def test_contiguous(device):
    check(device, lambda a: a.permute(1, 0).contiguous(), lambda a: a.T, (3, 4))
    check(device, lambda a: a.contiguous() + 1, lambda a: a + 1, (3, 4))


# ---------------------------------------------------------------- lengths around vector widths


@pytest.mark.parametrize("n", [1, 3, 7, 8, 9, 15, 16, 17])
def test_lengths_around_vector_widths(device, n):
    # upcast and vectorized loops must handle the elements left over after the last full vector
    check(device, lambda a, b, c: a * b + c, lambda a, b, c: a * b + c, (3, n), (3, n), (1, n))
    check(device, lambda a: a.sum(-1), lambda a: a.sum(-1), (3, n))
    check(device, lambda a: a.max(0), lambda a: a.max(0), (3, n), dtype=I8)
    check(device, lambda a, b: a @ b, np.matmul, (2, n), (n, 3))


# ---------------------------------------------------------------- broadcasting and reduce axes


@pytest.mark.parametrize(
    "sa,sb",
    [
        ((3,), (2, 3)),
        ((2, 1), (1, 3)),
        ((1,), (0,)),
        ((2, 0), (2, 1)),
        ((4, 1, 3), (1, 2, 1)),
        ((), (3, 1)),
    ],
)
def test_broadcast_shapes(device, sa, sb):
    for tiny_fn, np_fn in (BINARY["add"], BINARY["mul"], COMPARE["lt"]):
        out = check(device, tiny_fn, np_fn, sa, sb, out_dtype=BOOL if tiny_fn is COMPARE["lt"][0] else F32)
        assert out.shape == np.broadcast_shapes(sa, sb)


def test_sum_every_axis_subset_4d(device):
    # every subset of the axes of a 4-D input: the reduce path for any axis pattern
    shape = small(device, (2, 3, 4, 5), (1, 2, 3, 2))
    for r in range(5):
        for axes in itertools.combinations(range(4), r):
            check(
                device,
                lambda a, axes=axes: a.sum(axes, keepdim=True),
                lambda a, axes=axes: a.sum(axes, keepdims=True),
                shape,
                atol=1e-5,
            )
