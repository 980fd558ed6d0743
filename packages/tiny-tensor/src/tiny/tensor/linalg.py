"""Matrix factorizations built from tensor ops, so they stay lazy and run on every device: qr (Householder
reflections) and svd (one-sided Jacobi rotations, a fixed number of sweeps). Both take (..., m, n) float32 or
float64 matrices, batched over the leading dims."""

from __future__ import annotations

from typing import TYPE_CHECKING

from tiny.ir.dtypes import dtypes
from tiny.tensor.base import TensorBase

if TYPE_CHECKING:
    from tiny.tensor.tensor import Tensor

LINALG_DTYPES = (dtypes.float32, dtypes.float64)
# one-sided Jacobi converges quadratically once the columns are nearly orthogonal: these sweeps reach the dtype's
# precision for the matrices of a few dozen columns that svd() is meant for
JACOBI_SWEEPS = {dtypes.float32: 8, dtypes.float64: 12}


class LinalgOps(TensorBase):
    __slots__ = ()

    def qr(self) -> tuple[Tensor, Tensor]:
        """The reduced QR factorization of (..., m, n) matrices, as torch.linalg.qr(mode='reduced'): Q (..., m, k)
        with orthonormal columns and R (..., k, n) upper triangular, k = min(m, n), Q @ R = self. Computed with
        Householder reflections, whose signs follow LAPACK's (and so torch's) for a matrix of full rank.

        >>> q, r = Tensor([[3.0, 1.0], [4.0, 2.0]]).qr()
        >>> [[round(x, 4) for x in row] for row in r.tolist()]
        [[-5.0, -2.2], [0.0, 0.4]]
        """
        a = self._linalg_input("qr")
        q, r = _householder(a, complete=False)
        return q, r

    def svd(self, full_matrices: bool = True) -> tuple[Tensor, Tensor, Tensor]:
        """The singular value decomposition of (..., m, n) matrices, returned as torch.linalg.svd returns it:
        (U, S, Vh) with self = U @ diag(S) @ Vh, S (..., k) descending, k = min(m, n). With full_matrices U is
        (..., m, m) and Vh (..., n, n); without, U is (..., m, k) and Vh (..., k, n). Vh is V transposed (the rows
        are the right singular vectors), as torch.linalg.svd, not V as torch.svd. Singular vectors are unique only up
        to sign (and within a subspace of equal singular values), so they may differ from torch's by that.
        Computed by one-sided Jacobi rotations of the columns, a fixed number of sweeps (8 in float32, 12 in
        float64), then a Householder QR that makes U orthonormal (and completes it with full_matrices).

        >>> u, s, vh = Tensor([[3.0, 0.0], [0.0, -4.0]]).svd()
        >>> [round(x, 4) for x in s.tolist()]
        [4.0, 3.0]
        """
        a = self._linalg_input("svd")
        m, n = a.shape[-2:]
        if m < n:  # the SVD of the transpose, transposed back: A^T = U' S V'^T gives A = V' S U'^T
            u, s, vh = a.transpose(-2, -1).svd(full_matrices)
            return vh.transpose(-2, -1), s, u.transpose(-2, -1)
        return _jacobi_svd(a, full_matrices)

    def _linalg_input(self, name: str) -> Tensor:
        """Check a factorization's input at the call: a float32 or float64 tensor of at least 2 dims."""
        if self.ndim < 2:
            raise ValueError(f"{name}() needs a matrix or a batch of them, shape (..., m, n), got shape {self.shape}")
        if self.dtype not in LINALG_DTYPES:
            raise TypeError(
                f"{name}() computes in float32 or float64, got {self.dtype.name}; cast the input first (.float())"
            )
        return self  # type: ignore[return-value]


def _householder(a: Tensor, complete: bool) -> tuple[Tensor, Tensor]:
    """Q and R of a (..., m, n) by min(m, n) Householder reflections; Q is (..., m, m) when complete, else
    (..., m, k), and R is (..., k, n) (or (..., m, n) when complete). Each reflection I - scale * v v^T is applied
    to the whole matrix (v is 0 above its row), so every step has the same shapes."""
    m, n = a.shape[-2:]
    k = min(m, n)
    rows = a.arange(m, device=a.device).reshape(m, 1)
    r, reflections = a, []
    for j in range(k):
        x = r[..., :, j : j + 1]  # (..., m, 1)
        below = (rows > j).where(x, 0.0)
        head = x[..., j : j + 1, :]  # (..., 1, 1): the diagonal element
        tail = below.square().sum(-2, keepdim=True)
        norm = (head.square() + tail).sqrt()
        diagonal = (head >= 0).where(-norm, norm)  # R[j, j]: the sign opposite to head's, as LAPACK
        v = below + (rows == j).where(head - diagonal, 0.0)
        # nothing below the diagonal: no reflection (LAPACK's too), which also spares a zero column a 0/0
        reflect = tail > 0
        scale = reflect.where(2.0 / reflect.where(v.square().sum(-2, keepdim=True), 1.0), 0.0)
        r = r - v * ((v * r).sum(-2, keepdim=True) * scale)
        reflections.append((v, scale))
    q = a.eye(m, m if complete else k, dtype=a.dtype, device=a.device).expand(*a.shape[:-2], m, m if complete else k)
    for v, scale in reversed(reflections):  # Q = H_0 H_1 ... H_{k-1} E, applied right to left
        q = q - v * ((v * q).sum(-2, keepdim=True) * scale)
    return q, (r if complete else r[..., :k, :]).triu()


def _round_robin(n: int) -> list[tuple[list[int], list[int]]]:
    """The rounds of a sweep over n (even) columns: in each, n/2 disjoint pairs (first[i], second[i]), and every
    pair of columns meets in exactly one round (the circle method: column 0 stays, the others turn)."""
    ring, rounds = list(range(n)), []
    for _ in range(n - 1):
        rounds.append((ring[: n // 2], ring[n // 2 :][::-1]))
        ring = [ring[0], ring[-1], *ring[1:-1]]
    return rounds


def _jacobi_svd(a: Tensor, full_matrices: bool) -> tuple[Tensor, Tensor, Tensor]:
    """U, S, Vh of a (..., m, n) with m >= n. The columns of [A; I] are rotated in pairs until A's columns are
    orthogonal: then they are U * S and the rows below are V. An odd n gets a zero column, which never rotates."""
    m, n = a.shape[-2:]
    even = n + n % 2
    eye = a.eye(even, dtype=a.dtype, device=a.device).expand(*a.shape[:-2], even, even)
    w = a.pad(((0, 0),) * (a.ndim - 1) + ((0, even - n),)).cat(eye, dim=-2)  # (..., m + even, even)
    order = list(range(even))  # which of the first columns each column of w holds now
    for _ in range(JACOBI_SWEEPS[a.dtype]):
        for first, second in _round_robin(even):
            w = w[..., [order.index(c) for c in first + second]]
            order, half = first + second, even // 2
            p, q = w[..., :half], w[..., half:]
            alpha, beta = p[..., :m, :].square().sum(-2, keepdim=True), q[..., :m, :].square().sum(-2, keepdim=True)
            gamma = (p[..., :m, :] * q[..., :m, :]).sum(-2, keepdim=True)
            # tan of the angle that makes p and q orthogonal: the smaller root of gamma t^2 + (beta - alpha) t - gamma
            d = beta - alpha
            denominator = d.abs() + (d.square() + 4.0 * gamma.square()).sqrt()
            rotate = denominator > 0
            t = rotate.where((d >= 0).where(2.0 * gamma, -2.0 * gamma) / rotate.where(denominator, 1.0), 0.0)
            c = (t.square() + 1.0).rsqrt()
            s = c * t
            w = (c * p - s * q).cat(s * p + c * q, dim=-1)
    top, v = w[..., :m, :], w[..., m : m + n, :]  # A V and V (the zero column's row dropped)
    norms = top.square().sum(-2).sqrt()  # (..., even)
    key = norms
    if even != n:  # the padding column sorts last, whatever its norm
        padding = a.arange(even, device=a.device) == order.index(n)
        key = padding.where(-1.0, norms)
    idx = key.argsort(descending=True)[..., :n]  # (..., n)
    s = norms.gather(-1, idx)
    top = top.gather(-1, idx.unsqueeze(-2).expand(*a.shape[:-2], m, n))
    v = v.gather(-1, idx.unsqueeze(-2).expand(*a.shape[:-2], n, n))
    nonzero = s > 0
    u = top / nonzero.where(s, 1.0).unsqueeze(-2)
    # orthonormalize U (a zero singular value leaves a zero column): Q's first n columns are U's up to their
    # signs, which R's diagonal gives back; complete, Q also spans the rest of the m dims
    q, r = _householder(u, complete=full_matrices)
    signs = (r.diagonal(dim1=-2, dim2=-1)[..., :n] >= 0).where(1.0, -1.0)
    if full_matrices and m > n:
        signs = signs.pad(((0, 0),) * (signs.ndim - 1) + ((0, m - n),), value=1.0)
    return q * signs.unsqueeze(-2), s, v.transpose(-2, -1)
