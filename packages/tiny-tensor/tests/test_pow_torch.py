"""pow at the edges of its domain against PyTorch: zeros, infinities, NaN, negative bases and the exponents that
make them special (0, integers, odd integers, fractions, +-inf), for tensor ** scalar, tensor ** tensor and
scalar ** tensor, forward and every gradient. NaN must match NaN, and an infinity must have torch's sign.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from tiny.tensor import Tensor

torch = pytest.importorskip("torch")

INF, NAN = math.inf, math.nan
BASES = [-INF, -2.5, -1.0, -0.5, -0.0, 0.0, 0.5, 1.0, 2.5, INF, NAN]
EXPONENTS = [-INF, -2.5, -2.0, -1.0, -0.5, 0.0, 0.2, 0.3, 1.0, 2.0, 3.0, 5.5, INF, NAN]
# Python exponents: ints take pow's integer path (small ones: products), floats the general one
SCALAR_EXPONENTS = [0, 1, 2, 3, 5, -1, -2, 0.0, 0.2, 0.3, 0.5, -0.5, -1.0, 2.0, 5.5, INF, -INF, NAN]
SCALAR_BASES = [0.0, -0.0, 1.0, 2.5, 0.5, -2.5, -1.0, INF]


def _same(ours: Tensor | None, theirs: torch.Tensor, what: str) -> None:
    """Equal up to float32 rounding, NaN where torch has NaN, infinities of the same sign."""
    assert ours is not None, f"{what}: no gradient"
    got, want = ours.numpy(), theirs.detach().numpy()
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6, equal_nan=True, err_msg=what)


def _grid() -> tuple[np.ndarray, np.ndarray]:
    a, b = np.meshgrid(np.array(BASES, np.float32), np.array(EXPONENTS, np.float32), indexing="ij")
    return a.ravel(), b.ravel()


def test_tensor_to_a_tensor_power(device: str) -> None:
    a, b = _grid()
    ta, tb = Tensor(a, device=device, requires_grad=True), Tensor(b, device=device, requires_grad=True)
    out = ta**tb
    da, db = out.sum().gradient(ta, tb)
    ra, rb = torch.tensor(a, requires_grad=True), torch.tensor(b, requires_grad=True)
    ref = ra**rb
    ref.sum().backward()
    pairs = ", ".join(f"{x}**{y}" for x, y in zip(a, b))
    _same(out, ref, f"forward of {pairs}")
    _same(da, ra.grad, "d/d base")
    _same(db, rb.grad, "d/d exponent")


@pytest.mark.parametrize("exponent", SCALAR_EXPONENTS, ids=repr)
def test_tensor_to_a_scalar_power(device: str, exponent: float) -> None:
    a = np.array(BASES, np.float32)
    ta, ra = Tensor(a, device=device, requires_grad=True), torch.tensor(a, requires_grad=True)
    out, ref = ta**exponent, ra**exponent
    (da,) = out.sum().gradient(ta)
    ref.sum().backward()
    _same(out, ref, f"{BASES} ** {exponent}")
    _same(da, ra.grad, f"d/d base of {BASES} ** {exponent}")


@pytest.mark.parametrize("base", SCALAR_BASES, ids=repr)
def test_a_scalar_to_a_tensor_power(device: str, base: float) -> None:
    b = np.array(EXPONENTS, np.float32)
    tb, rb = Tensor(b, device=device, requires_grad=True), torch.tensor(b, requires_grad=True)
    out, ref = base**tb, base**rb
    (db,) = out.sum().gradient(tb)
    ref.sum().backward()
    _same(out, ref, f"{base} ** {EXPONENTS}")
    _same(db, rb.grad, f"d/d exponent of {base} ** {EXPONENTS}")


def test_the_edges_named_in_the_issue(device: str) -> None:
    """Each of them once differed from torch: the gradient of x ** 5.5 and x ** 0.2 at negative x (0, torch nan),
    (-inf) ** 0.3 (nan, torch inf), the gradients of 0 ** 0.3 (0, torch inf), inf ** 0 (nan, torch 0), 0 ** 0 with
    respect to the exponent (nan, torch 0) and x ** -1 at 0 (0, torch -inf)."""

    def grads(base: float, exponent: float) -> tuple[float, float, float]:
        ta = Tensor([base], device=device, requires_grad=True)
        tb = Tensor([exponent], device=device, requires_grad=True)
        out = ta**tb
        da, db = out.sum().gradient(ta, tb)
        return out.item(), da.item(), db.item()

    assert math.isnan(grads(-2.0, 5.5)[1]) and math.isnan(grads(-2.0, 0.2)[1])
    assert grads(-INF, 0.3)[0] == INF
    assert grads(0.0, 0.3)[1] == INF
    assert grads(INF, 0.0)[1] == 0.0
    assert grads(0.0, 0.0)[2] == 0.0
    assert grads(0.0, -1.0)[1] == -INF
    x = Tensor([0.0, -2.0], device=device, requires_grad=True)
    (dx,) = (x**-1).sum().gradient(x)
    assert dx.tolist()[0] == -INF
    (dx,) = (x**5.5).sum().gradient(x)
    assert math.isnan(dx.tolist()[1])


def test_second_derivative_of_a_power(device: str) -> None:
    a = np.array([0.5, 1.5, 2.0, 3.0], np.float32)
    b = np.array([2.5, -1.5, 0.5, 3.0], np.float32)
    ta, tb = Tensor(a, device=device, requires_grad=True), Tensor(b, device=device, requires_grad=True)
    da, db = (ta**tb).sum().gradient(ta, tb)
    dda, ddb = (da * db).sum().gradient(ta, tb)
    ra, rb = torch.tensor(a, requires_grad=True), torch.tensor(b, requires_grad=True)
    rda, rdb = torch.autograd.grad((ra**rb).sum(), (ra, rb), create_graph=True)
    rdda, rddb = torch.autograd.grad((rda * rdb).sum(), (ra, rb))
    _same(dda, rdda, "d/d base of the first derivatives' product")
    _same(ddb, rddb, "d/d exponent of the first derivatives' product")
