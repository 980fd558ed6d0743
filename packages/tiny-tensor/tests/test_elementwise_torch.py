"""Elementwise math, activations and predicates against PyTorch: forward values and gradients, at smooth points, at
the corners where PyTorch picks a gradient, at 0/inf/NaN, in float16 and on integer inputs."""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import pytest
from tensor_helpers import torch_dtype_on
from torch_compare import compare

from tiny.tensor import DType, Tensor, dtypes

torch = pytest.importorskip("torch")
F = torch.nn.functional

INF, NAN = math.inf, math.nan
# every one-input test feeds N values, so that forward and backward kernels are shared between the tests (each
# distinct CPU kernel costs a compile)
N = 24


def values(*xs: float, dtype: type = np.float32) -> np.ndarray:
    """xs repeated to N values."""
    return np.resize(np.array(xs, dtype=dtype), N)


def act(name: str, torch_name: str | None = None, **kwargs: object) -> Callable:
    """x.name(**kwargs) on a tiny Tensor, torch.nn.functional.<torch_name or name>(x, **kwargs) on a torch one."""

    def fn(x):  # noqa: ANN001, ANN202  (a tiny or a torch tensor)
        if isinstance(x, torch.Tensor):
            return getattr(F, torch_name or name)(x, **kwargs)
        return getattr(x, name)(**kwargs)

    return fn


def method(name: str, **kwargs: object) -> Callable:
    """x.name(**kwargs): the same method name in tiny and in torch."""
    return lambda x: getattr(x, name)(**kwargs)


def quick_gelu(x):  # noqa: ANN001, ANN201  (not in torch: its definition)
    return x.quick_gelu() if isinstance(x, Tensor) else x * torch.sigmoid(1.702 * x)


# name -> (fn, low, high): random inputs away from the corners; the corners are tested below
UNARY = {
    "atan": (method("atan"), -6, 6),
    "asin": (method("asin"), -0.95, 0.95),
    "acos": (method("acos"), -0.95, 0.95),
    "sinh": (method("sinh"), -4, 4),
    "cosh": (method("cosh"), -4, 4),
    "tanh": (method("tanh"), -4, 4),
    "asinh": (method("asinh"), -20, 20),
    "acosh": (method("acosh"), 1.05, 20),
    "atanh": (method("atanh"), -0.95, 0.95),
    "erf": (method("erf"), -3, 3),
    "erfc": (method("erfc"), -3, 4),
    "expm1": (method("expm1"), -3, 3),
    "log1p": (method("log1p"), -0.9, 5),
    "log10": (method("log10"), 0.1, 50),
    "sigmoid": (method("sigmoid"), -8, 8),
    "rsqrt": (method("rsqrt"), 0.1, 9),
    "square": (method("square"), -3, 3),
    "frac": (method("frac"), -3, 3),
    "relu6": (act("relu6"), -3, 9),
    "hardtanh": (act("hardtanh", min_val=-0.5, max_val=1.5), -3, 3),
    "leaky_relu": (act("leaky_relu", negative_slope=0.2), -3, 3),
    "elu": (act("elu", alpha=1.5), -3, 3),
    "selu": (act("selu"), -3, 3),
    "celu": (act("celu", alpha=0.7), -3, 3),
    "gelu": (act("gelu"), -4, 4),
    "gelu_tanh": (act("gelu", approximate="tanh"), -4, 4),
    "quick_gelu": (quick_gelu, -4, 4),
    "silu": (act("silu"), -6, 6),
    "swish": (act("swish", "silu"), -6, 6),
    "mish": (act("mish"), -6, 6),
    "softplus": (act("softplus"), -6, 6),
    "softplus_beta": (act("softplus", beta=2.0, threshold=3.0), -3, 3),
    "softsign": (act("softsign"), -4, 4),
    "hardsigmoid": (act("hardsigmoid"), -5, 5),
    "hardswish": (act("hardswish"), -5, 5),
    "logsigmoid": (act("logsigmoid"), -8, 8),
}


@pytest.mark.parametrize("name", list(UNARY))
def test_unary(device: str, name: str) -> None:
    fn, low, high = UNARY[name]
    compare(device, fn, (N,), low=low, high=high)


def test_non_contiguous_inputs(device: str) -> None:
    # transposed, strided and flipped views feed the composite ops like any other input
    compare(device, lambda x: x.T.erf() * x.T.atan(), (3, 5))
    gelu, softplus = act("gelu"), act("softplus")
    compare(device, lambda x: gelu(x[:, ::2]) + x.flip(0)[:, 1::2].tanh(), (3, 6))
    compare(device, lambda x: softplus(x.permute(2, 0, 1)).sinh(), (2, 3, 4), low=-1, high=1)


def test_wide_ranges_stay_accurate(device: str) -> None:
    # tails, the switch points between series and formulas, and tiny values (where relative accuracy matters)
    data = [values(1e-6, -3e-5, 2e-3, -0.01, 0.3, -0.36, 0.49, 0.51, -0.99, 1.01, -1.5, 2.5, 7.0, -9.0, 15.0)]
    for name in ("atan", "sinh", "tanh", "asinh", "erf", "erfc", "expm1", "sigmoid", "gelu", "mish", "softplus"):
        fn, _, _ = UNARY[name]
        compare(device, fn, data=data, rtol=2e-5, atol=1e-7)
    compare(device, method("log1p"), data=[values(1e-7, -2e-6, 0.24, -0.26, 30.0, -0.999)])


# ---- corners: PyTorch's gradient where the function has a kink or a branch switch


CORNERS = {  # name -> the points where PyTorch chooses a gradient (the kwargs are UNARY's)
    "relu6": (-1.0, 0.0, 3.0, 6.0, 7.0),
    "hardtanh": (-2.0, -0.5, 0.0, 1.5, 2.0),
    "hardsigmoid": (-4.0, -3.0, 0.0, 3.0, 4.0),
    "hardswish": (-4.0, -3.0, 0.0, 3.0, 4.0),
    "leaky_relu": (-1.0, 0.0, 1.0),
    "elu": (-1.0, 0.0, 1.0),
    "selu": (-1.0, 0.0, 1.0),
    "celu": (-1.0, 0.0, 1.0),
    "softplus_beta": (-1.0, 0.0, 1.4, 1.5, 1.6),  # beta * x = threshold at 1.5
    "softsign": (-1.0, 0.0, 1.0),
    "square": (-1.0, 0.0, 1.0),
}


@pytest.mark.parametrize("name", list(CORNERS))
def test_gradients_at_the_corners(device: str, name: str) -> None:
    compare(device, UNARY[name][0], data=[values(*CORNERS[name])])


def test_gradients_at_zero(device: str) -> None:
    # odd functions split |x| with a where: f'(0) survives (an abs() would give 0 there)
    data = [values(-0.5, 0.0, 0.5)]
    for name in ("atan", "asin", "sinh", "tanh", "asinh", "atanh", "erf", "expm1", "log1p", "sigmoid", "gelu"):
        compare(device, UNARY[name][0], data=data)
    for name in ("mish", "silu", "logsigmoid", "softplus", "cosh", "erfc", "quick_gelu"):
        compare(device, UNARY[name][0], data=data)


def forward(device: str, fn: Callable, *arrays: np.ndarray, rtol: float = 1e-5, atol: float = 1e-6) -> None:
    """fn in tiny and in torch on the same arrays: the same dtype, the same values (NaN where torch has NaN)."""
    out = fn(*(Tensor(a, device=device) for a in arrays))
    ref = fn(*(torch.tensor(a) for a in arrays)).numpy()
    got = out.numpy()
    assert got.dtype == torch_dtype_on(device, ref.dtype), f"dtype {got.dtype}, torch gives {ref.dtype}"
    assert got.shape == ref.shape
    if got.dtype.kind == "f":
        np.testing.assert_allclose(got.astype(np.float64), ref.astype(np.float64), rtol=rtol, atol=atol)
    else:
        np.testing.assert_array_equal(got, ref)


SPECIAL = values(0.0, -0.0, 1.0, -1.0, INF, -INF, NAN, 1e30, -1e30, 50.0, -50.0, 0.5)
UNIT = values(0.0, -0.0, 1.0, -1.0, 0.5, -0.5, 1.5, -1.5, INF, -INF, NAN, 1e-3)


@pytest.mark.parametrize("name", [n for n in UNARY if n not in ("asin", "acos", "atanh", "acosh", "log1p")])
def test_special_values(device: str, name: str) -> None:
    if name == "gelu" and torch.isnan(torch.nn.functional.gelu(torch.tensor(SPECIAL))[SPECIAL == INF]).any():
        # PyTorch before 2.12 gives NaN for gelu(inf) on the CPU, in its vector loop (inf * 0.5 * erfc(-inf) is inf;
        # a lone scalar comes out right on 2.11): compare the rest
        forward(device, UNARY[name][0], SPECIAL[SPECIAL != INF])
        assert Tensor([INF], device=device).gelu().tolist() == [INF]
        return
    forward(device, UNARY[name][0], SPECIAL)


def test_special_values_of_bounded_domains(device: str) -> None:
    # +-1 are the poles (atanh) and ends (asin, acos); outside is NaN
    for name in ("asin", "acos", "atanh", "acosh", "log1p"):
        forward(device, UNARY[name][0], UNIT)
    forward(device, method("acosh"), values(1.0, 2.0, 1e30, 0.5))


def test_a_product_plus_a_value_rounds_after_each_op(device: str) -> None:
    """a * a - b with a = 1 + 2^-12, b = 1 + 2^-11: a * a rounds to b, so 0; fused into one rounding it is 2^-24.
    Every device rounds as written (as PYTHON does), so a value computed again in another kernel is the same to the
    bit: a max's gradient and argmax compare the input with the max. (The CPU compiled with -ffp-contract=fast.)"""
    a, b = np.full(8, 1 + 2**-12, np.float32), np.full(8, 1 + 2**-11, np.float32)
    x, y = Tensor(a, device=device), Tensor(b, device=device)
    np.testing.assert_array_equal((x * x - y).numpy(), np.zeros(8, np.float32))
    np.testing.assert_array_equal((y - x * x).numpy(), np.zeros(8, np.float32))


def test_round_half_to_even(device: str) -> None:
    halves = [0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 0.49999997, 2.4999998, 1e8, 8388609.0, 0.0, -0.0, INF, -INF, NAN]
    forward(device, lambda x: x.round(), np.array(halves, dtype=np.float32))
    x = np.array([1.2345, -15.55, 25.0, 1234.5, -0.004], dtype=np.float32)
    forward(device, lambda t: t.round(decimals=2), x)
    forward(device, lambda t: t.round(decimals=-2), x, rtol=1e-6)


def test_float16_forward(device: str) -> None:
    x = np.linspace(-3, 3, N, dtype=np.float16)
    for name in ("atan", "sinh", "tanh", "erf", "gelu", "mish", "softplus", "hardswish", "elu"):
        forward(device, UNARY[name][0], x, rtol=1e-2, atol=2e-3)
    for name in ("asin", "atanh"):
        forward(device, UNARY[name][0], x / 3.5, rtol=1e-2, atol=2e-3)
    forward(device, lambda t: t.round(), np.array([0.5, 1.5, 2.5, -2.5, 3.7], dtype=np.float16))


# ---- float64: the series and fits of float64's own precision (tiny/tensor/fits.py), not float32's

# both signs of large |x| (the tails, the clamps of tanh and erfc), of tiny |x|, and of the points where a function
# switches between a series and a formula (0.25, 0.35, tan(pi/8), 0.5, 1)
WIDE = [1e-9, 1e-5, 0.003, 0.2, 0.249, 0.251, 0.349, 0.351, 0.4142, 0.5, 0.75, 0.999, 1.0, 1.001, 1.5, 2.5, 4.0]
WIDE = sorted(s * v for s in (1, -1) for v in (*WIDE, 6.5, 9.9, 10.6, 15.0, 19.5, 25.0))
INSIDE_UNIT = sorted(s * v for s in (1, -1) for v in (1e-9, 1e-5, 0.003, 0.1, 0.249, 0.251, 0.3, 0.5, 0.75, 0.9, 0.99))
SERIES_AND_FITS = ["tanh", "atan", "erf", "erfc", "gelu", "gelu_tanh", "elu", "selu", "mish", "expm1", "sinh", "cosh"]
SERIES_AND_FITS += ["asinh", "softplus", "logsigmoid", "log1p", "asin", "acos", "atanh"]


def against_float64_torch(
    device: str, name: str, dtype: DType, rtol: float, atol: float, most: float = math.inf
) -> None:
    """UNARY[name] in `dtype`, its value and gradient, against PyTorch's in float64 on the same inputs."""
    fn = UNARY[name][0]
    x = np.array([v for v in (INSIDE_UNIT if name in ("log1p", "asin", "acos", "atanh") else WIDE) if abs(v) <= most])
    x = x.astype(dtype.name)
    ours, theirs = Tensor(x, dtype=dtype, device=device, requires_grad=True), torch.tensor(x, dtype=torch.float64)
    theirs.requires_grad_()
    out, ref = fn(ours), fn(theirs)
    out.sum().backward()
    ref.sum().backward()
    assert out.dtype == dtype and ours.grad.dtype == dtype
    np.testing.assert_allclose(out.numpy(), ref.detach().numpy(), rtol=rtol, atol=atol, err_msg=f"{name}({x})")
    np.testing.assert_allclose(ours.grad.numpy(), theirs.grad.numpy(), rtol=rtol, atol=atol, err_msg=f"{name}'({x})")


@pytest.mark.parametrize("name", SERIES_AND_FITS)
def test_float64_values_and_gradients_are_float64_accurate(device: str, name: str) -> None:
    # float32's series and fits gave 2e-8 to 3e-7 relative error in float64. The atol leaves room for PyTorch's own
    # cancellation (1 + erf(x) in gelu, 1 - tanh**2 in tanh's gradient: about 1e-16 absolute)
    against_float64_torch(device, name, dtypes.float64, rtol=1e-10, atol=1e-14)


@pytest.mark.parametrize("name", SERIES_AND_FITS)
def test_float32_values_and_gradients_keep_their_accuracy(device: str, name: str) -> None:
    # float32's fits are within a few float32 ulps (the exp in the tails loses more, hence |x| <= 4; gelu's gradient
    # is a difference of two near terms by x = -4, hence the atol)
    against_float64_torch(device, name, dtypes.float32, rtol=1e-6, atol=1e-7, most=4.0)


def test_integer_inputs(device: str) -> None:
    ints = values(-3, -1, 0, 1, 2, 5, dtype=np.int64)
    # math functions take integers as float32, as torch does
    for name in ("atan", "sinh", "erf", "expm1", "sigmoid", "tanh"):
        forward(device, UNARY[name][0], ints)
    forward(device, lambda t: t.rsqrt(), values(1, 4, 9, dtype=np.int64))
    forward(device, lambda t: t.log1p(), values(0, 1, 5, dtype=np.int64))
    # these keep the integer dtype
    for fn in (lambda t: t.round(), lambda t: t.sign(), lambda t: t.square(), lambda t: t.clamp(-1, 2)):
        forward(device, fn, ints)
    forward(device, lambda t: t.square(), np.array([True, False]))
    forward(device, lambda t: t.isfinite(), ints)


# ---- two or three inputs: broadcasting and gradients for each


def test_clamp_with_tensor_bounds(device: str) -> None:
    compare(device, lambda x, lo, hi: x.clamp(lo, hi), (4, 5, 3), (5, 1), (3,))
    compare(device, lambda x, lo: x.clip(min=lo), (2, 5), (5,))
    compare(device, lambda x, hi: x.clip(max=hi) * 2, (3, 4), (3, 1))
    # at the bounds x keeps the gradient; where min > max everything is max
    x = values(-1.0, 0.0, 0.5, 1.0, 2.0, 0.5, 1.0, 2.0)
    lo = values(0.0, 0.0, 0.0, 0.0, 0.0, 1.0, 1.0, 1.0)
    hi = values(1.0, 1.0, 1.0, 1.0, 1.0, 0.0, 0.0, 0.0)
    compare(device, lambda a, b, c: a.clamp(b, c), data=[x, lo, hi])
    # a NaN bound spreads, as in torch
    forward(device, lambda a, b: a.clamp(min=b), values(1.0, 2.0), values(NAN, 0.0, 3.0))
    forward(device, lambda a: a.clamp(NAN, 1.0), values(1.0, 2.0))
    # integers: an int bound keeps the dtype, a float bound promotes
    ints = np.array([-3, 0, 4, 9], dtype=np.int64)
    forward(device, lambda a: a.clamp(0, 5), ints)
    forward(device, lambda a: a.clamp(min=0.5), ints)


def test_clamp_names(device: str) -> None:
    x = Tensor([-2.0, 0.5, 3.0], device=device)
    assert x.clamp(min_=-1, max_=1).tolist() == x.clip(min=-1, max=1).tolist() == [-1.0, 0.5, 1.0]
    assert x.clamp(max=0).tolist() == [-2.0, 0.0, 0.0]


def test_lerp(device: str) -> None:
    compare(device, lambda a, b: a.lerp(b, 0.3), (3, 4), (4,))
    compare(device, lambda a, b: a.lerp(b, 0.8), (3, 4), (3, 1))
    compare(device, lambda a, b, w: a.lerp(b, w), (2, 1, 3), (4, 3), (2, 4, 1), low=-1, high=1.5)
    # exact at both ends
    a, b = np.array([1.1, -7.3], dtype=np.float32), np.array([3.7, 2.9], dtype=np.float32)
    forward(device, lambda s, e: s.lerp(e, 1.0), a, b, rtol=0, atol=0)
    forward(device, lambda s, e: s.lerp(e, 0.0), a, b, rtol=0, atol=0)


def test_maximum_minimum_broadcast(device: str) -> None:
    compare(device, lambda a, b: a.maximum(b) + a.minimum(b) * 2, (4, 1, 3), (5, 1))
    forward(device, lambda a, b: a.maximum(b), values(NAN, 1.0, -INF), values(0.0, NAN, 2.0, 1.0))


def test_logical_and_bitwise(device: str) -> None:
    rng = np.random.default_rng(3)
    a, b = rng.integers(-4, 5, size=(3, 1, 4)), rng.integers(-4, 5, size=(2, 4))
    f = np.array([0.0, 0.5, NAN, -1.0], dtype=np.float32)
    for name in ("logical_and", "logical_or", "logical_xor"):
        forward(device, lambda x, y, n=name: getattr(x, n)(y), a, b)
        forward(device, lambda x, y, n=name: getattr(x, n)(y), f, a[0, 0])
    forward(device, lambda x: x.logical_not(), f)
    for name in ("bitwise_and", "bitwise_or", "bitwise_xor"):
        forward(device, lambda x, y, n=name: getattr(x, n)(y), a, b)
        forward(device, lambda x, y, n=name: getattr(x, n)(y), a > 0, b > 0)
    forward(device, lambda x: x.bitwise_not(), a)
    forward(device, lambda x: x.bitwise_not(), a > 0)
    shifts = np.array([0, 1, 3, 7], dtype=np.int64)
    forward(device, lambda x, s: x.bitwise_left_shift(s), a, shifts)
    forward(device, lambda x, s: x.bitwise_right_shift(s), a * 100, shifts)


def test_predicates(device: str) -> None:
    for name in ("isnan", "isinf", "isfinite", "sign"):
        forward(device, method(name), SPECIAL)
    forward(device, lambda x: x.isfinite(), np.array([1, 2], dtype=np.int32))


# ---- bad input fails at the call, saying what was expected


def test_errors(device: str) -> None:
    x = Tensor([1.0, 2.0], device=device)
    with pytest.raises(ValueError, match="approximate"):
        x.gelu(approximate="fast")
    with pytest.raises(ValueError, match="min_val <= max_val"):
        x.hardtanh(2.0, 1.0)
    with pytest.raises(ValueError, match="alpha"):
        x.celu(0.0)
    with pytest.raises(ValueError, match="neither"):
        x.clamp()
    with pytest.raises(ValueError, match="both min and min_"):
        x.clamp(min=0, min_=1)
    with pytest.raises(TypeError, match="end as a Tensor"):
        x.lerp(3.0, 0.5)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="float tensors"):
        Tensor([1, 2], device=device).lerp(Tensor([3, 4], device=device), 0.5)
    with pytest.raises(TypeError, match="weight"):
        x.lerp(x, "half")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="decimals"):
        x.round(1.5)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="integer or bool"):
        x.bitwise_and(1)
    with pytest.raises(TypeError, match="integer or bool"):
        x.bitwise_not()
    assert x.logical_and(0).dtype == dtypes.bool
