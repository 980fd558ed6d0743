"""Tensor.qr and Tensor.svd (tiny.tensor.linalg) against torch.linalg: the factors reconstruct the input, Q, U and
Vh are orthonormal, R is upper triangular, the singular values are torch's; tall, wide, square and batched shapes,
float32 and float64, on every device under test."""

from __future__ import annotations

import numpy as np
import pytest

from tiny.tensor import Tensor

torch = pytest.importorskip("torch")

TOL = {np.float32: 2e-5, np.float64: 1e-12}  # absolute, on entries of size ~1 (inputs are standard normal)
# (shape, dtype): tall, wide, square and batched, each dtype on some
CASES = [((5, 3), np.float32), ((3, 5), np.float64), ((2, 4, 4), np.float32), ((2, 3, 2), np.float64)]


def matrix(shape: tuple[int, ...], dtype: type, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


def assert_orthonormal_columns(x: np.ndarray, tol: float) -> None:
    gram = x.swapaxes(-1, -2) @ x
    np.testing.assert_allclose(gram, np.broadcast_to(np.eye(x.shape[-1]), gram.shape), atol=tol)


@pytest.mark.parametrize("shape, dtype", CASES)
def test_qr(device: str, shape: tuple[int, ...], dtype: type) -> None:
    a = matrix(shape, dtype)
    q, r = Tensor(a, device=device).qr()
    k = min(shape[-2:])
    assert q.shape == (*shape[:-2], shape[-2], k) and r.shape == (*shape[:-2], k, shape[-1])
    qn, rn, tol = q.numpy(), r.numpy(), TOL[dtype]
    assert qn.dtype == dtype and rn.dtype == dtype
    np.testing.assert_allclose(qn @ rn, a, atol=tol)
    assert_orthonormal_columns(qn, tol)
    np.testing.assert_array_equal(np.triu(rn), rn)
    tq, tr = torch.linalg.qr(torch.tensor(a))  # a random matrix has full rank: the same signs as LAPACK's
    np.testing.assert_allclose(qn, tq.numpy(), atol=10 * tol)
    np.testing.assert_allclose(rn, tr.numpy(), atol=10 * tol)


def test_qr_zero_column(device: str) -> None:
    """A column already zero below (or entirely) needs no reflection: no 0/0, and Q stays orthonormal."""
    a = np.array([[0.0, 1.0, 2.0], [0.0, 3.0, 4.0], [0.0, 5.0, 7.0]])
    q, r = Tensor(a, device=device).qr()
    qn, rn = q.numpy(), r.numpy()
    assert np.isfinite(qn).all() and np.isfinite(rn).all()
    np.testing.assert_allclose(qn @ rn, a, atol=1e-12)
    assert_orthonormal_columns(qn, 1e-12)


def check_svd(a: np.ndarray, device: str, full_matrices: bool, tol: float) -> None:
    u, s, vh = Tensor(a, device=device).svd(full_matrices=full_matrices)
    tu, ts, tvh = torch.linalg.svd(torch.tensor(a), full_matrices=full_matrices)
    assert (u.shape, s.shape, vh.shape) == (tuple(tu.shape), tuple(ts.shape), tuple(tvh.shape))
    un, sn, vhn = u.numpy(), s.numpy(), vh.numpy()
    assert un.dtype == vhn.dtype == sn.dtype == a.dtype
    np.testing.assert_allclose(sn, ts.numpy(), atol=tol)
    assert (np.diff(sn, axis=-1) <= 0).all(), "singular values must come in descending order"
    k = sn.shape[-1]
    np.testing.assert_allclose((un[..., :k] * sn[..., None, :]) @ vhn[..., :k, :], a, atol=tol)
    assert_orthonormal_columns(un, tol)
    assert_orthonormal_columns(vhn.swapaxes(-1, -2), tol)


@pytest.mark.parametrize("shape, dtype", CASES)
def test_svd(device: str, shape: tuple[int, ...], dtype: type) -> None:
    check_svd(matrix(shape, dtype, seed=1), device, True, 5 * TOL[dtype])


@pytest.mark.parametrize("shape", [(4, 3), (3, 4)])
def test_svd_reduced(device: str, shape: tuple[int, int]) -> None:
    check_svd(matrix(shape, np.float64, seed=2), device, False, 1e-11)


def test_svd_rank_deficient(device: str) -> None:
    """Zero singular values (a rank-1 matrix, and an odd column count that gets padded): U is still completed to
    an orthonormal basis, and the padding column never shows up."""
    a = np.outer(np.arange(1.0, 5.0), np.array([1.0, -2.0, 0.5]))
    check_svd(a, device, True, 1e-11)


def test_svd_known_values(device: str) -> None:
    a = np.diag([3.0, -4.0, 1.0]).astype(np.float32)
    u, s, vh = Tensor(a, device=device).svd()
    np.testing.assert_allclose(s.numpy(), [4.0, 3.0, 1.0], atol=1e-6)
    np.testing.assert_allclose(np.abs(u.numpy()), np.abs(vh.numpy()), atol=1e-6)  # both a signed permutation


@pytest.mark.parametrize("method", ["qr", "svd"])
def test_errors(method: str) -> None:
    with pytest.raises(ValueError, match=rf"{method}\(\) needs a matrix .* got shape \(3,\)"):
        getattr(Tensor([1.0, 2.0, 3.0]), method)()
    with pytest.raises(TypeError, match=rf"{method}\(\) computes in float32 or float64, got int"):
        getattr(Tensor([[1, 2], [3, 4]]), method)()
