"""A value is the same bits in every kernel that computes it: scalar or vectorized, at any width.

Autograd recomputes forward values in backward kernels that are fused and vectorized otherwise; a max's gradient
compares a value with the max over it, so a math function whose vector form rounds otherwise than its scalar form
(libmvec against libm, an inlined polynomial against a call) left no element equal to the max: a NaN gradient.
"""

import numpy as np
import pytest

from tiny.ir.config import Context
from tiny.tensor import Tensor, dtypes

MATH = ["exp2", "log2", "sin", "sqrt", "exp", "log", "cos", "tanh", "sigmoid"]
DTYPES = [dtypes.float32, dtypes.float64]


def _inputs(dtype) -> np.ndarray:
    rng = np.random.default_rng(7)
    x = np.concatenate([rng.uniform(-30, 30, 2043), rng.uniform(0, 4, 2048), [0.0, 1.0, -1.0, 0.5, 100.0]])
    return x.astype(np.dtype(dtype.name))


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
@pytest.mark.parametrize("fn", MATH)
def test_scalar_and_vector_kernels_agree_bit_for_bit(fn: str, dtype) -> None:
    x = _inputs(dtype)
    with np.errstate(all="ignore"):
        with Context(NOOPT=1):  # one value a loop step: the scalar functions
            scalar = getattr(Tensor(x), fn)().numpy()
        vector = getattr(Tensor(x), fn)().numpy()  # the CPU's rules take 16 values a step (vectors of the widest)
        narrow = getattr(Tensor(x[:3000]), fn)().numpy()  # ... and here 4 (narrower than libmvec's 8 floats)
    np.testing.assert_array_equal(scalar.view(np.uint8), vector.view(np.uint8), err_msg=f"{fn} {dtype.name}")
    np.testing.assert_array_equal(scalar[:3000].view(np.uint8), narrow.view(np.uint8), err_msg=f"{fn} {dtype.name}")


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
@pytest.mark.parametrize("reduce", ["min", "max"])
def test_max_of_a_logsumexp_has_a_gradient(dtype, reduce: str) -> None:
    """Autograd fuzz seed 5763: the min over a float64 logsumexp had NaN gradients (its forward kernel took log2 by
    libmvec on 4 lanes, the backward's recomputation by libm one value at a time)."""
    torch = pytest.importorskip("torch")
    data = np.random.default_rng([5763, 0]).uniform(-1, 1, (2, 3, 4, 5))
    w = np.random.default_rng([5763, 1004]).uniform(-1, 1, (2, 4))
    x = Tensor(data, dtype=dtype, requires_grad=True)
    (getattr(x.logsumexp(3, keepdim=True), reduce)((1, 3)) * Tensor(w, dtype=dtype)).sum().backward()
    t = torch.tensor(data, dtype=getattr(torch, dtype.name), requires_grad=True)
    (getattr(t.logsumexp(3, keepdim=True), "a" + reduce)((1, 3)) * torch.tensor(w, dtype=t.dtype)).sum().backward()
    assert x.grad is not None
    np.testing.assert_allclose(x.grad.numpy(), t.grad.numpy(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
def test_a_product_computed_again_rounds_as_it_did(dtype) -> None:
    """A product stored by one kernel and computed again by another is the same number: no compiler fuses the second
    one's multiply into the subtraction after it (x * x - y is exactly 0 where y holds x * x; fused, it is the first
    product's rounding error, as NVRTC's --fmad and OpenCL C's default FP_CONTRACT would make it)."""
    x = Tensor(np.random.default_rng(3).uniform(-3, 3, 4096).astype(np.dtype(dtype.name)))
    y = (x * x).realize()
    np.testing.assert_array_equal((x * x - y).numpy(), 0)
    z = (x * 1.1 + 0.3).realize()
    np.testing.assert_array_equal((x * 1.1 + 0.3 - z).numpy(), 0)
