"""How many kernels the scheduler makes: elementwise chains, views and epilogues fuse; results stay right.

Inputs are made from NumPy arrays, so they are buffers already and every kernel counted is the
computation's own.
"""

from __future__ import annotations

import numpy as np
import pytest
from tensor_helpers import assert_matches, random_array

from tiny.ir.uop import Ops
from tiny.tensor import GlobalCounters, Tensor, dtypes

F32 = dtypes.float32


def kernels(*tensors: Tensor) -> int:
    """The number of kernels realizing these tensors would run (copies between devices not counted)."""
    items = tensors[0].schedule(*tensors[1:])
    assert all(i.ast.op in (Ops.SINK, Ops.COPY) for i in items), [i.ast.op for i in items]
    return sum(1 for i in items if i.ast.op is Ops.SINK)


def inputs(device: str, *shapes: tuple[int, ...], dtype=F32) -> tuple[list[np.ndarray], list[Tensor]]:
    arrays = [random_array(s, dtype, seed=i) for i, s in enumerate(shapes)]
    return arrays, [Tensor(a, device=device, dtype=dtype) for a in arrays]


def realize_counting(t: Tensor) -> int:
    """Realize t and return how many kernels actually ran."""
    GlobalCounters.reset()
    t.realize()
    return GlobalCounters.kernels


def test_inputs_need_no_kernel(device):
    _, (a,) = inputs(device, (3, 4))
    assert a.schedule() == []
    assert realize_counting(a) == 0


def test_elementwise_chain_into_reduce_is_one_kernel(device):
    (na, nb, nc, nd), (a, b, c, d) = inputs(device, (4, 8), (4, 8), (4, 8), (4, 8))
    out = ((a * b + c).relu() * d).sum()
    assert kernels(out) == 1
    assert realize_counting(out) == 1
    assert_matches(out, (np.maximum(na * nb + nc, 0) * nd).astype(np.float64).sum(), F32, atol=1e-4)


def test_matmul_is_one_kernel(device):
    (na, nb), (a, b) = inputs(device, (5, 6), (6, 7))
    out = a @ b
    assert kernels(out) == 1
    assert_matches(out, na.astype(np.float64) @ nb, F32, atol=1e-4)


def test_matmul_epilogue_fuses(device):
    (na, nb, nbias), (a, b, bias) = inputs(device, (5, 6), (6, 7), (7,))
    out = (a @ b + bias).relu()
    assert kernels(out) == 1
    assert_matches(out, np.maximum(na.astype(np.float64) @ nb + nbias, 0), F32, atol=1e-4)


def test_batched_and_vector_matmul_are_one_kernel(device):
    (na, nb, nv), (a, b, v) = inputs(device, (2, 3, 4), (4, 5), (4,))
    for out, ref in ((a @ b, na @ nb), (a @ v, na @ nv), (v @ b, nv @ nb), (v @ v, nv @ nv)):
        assert kernels(out) == 1, out.shape
        assert_matches(out, ref, F32, atol=1e-4)


def test_matmul_of_views_is_one_kernel(device):
    (na, nb), (a, b) = inputs(device, (6, 5), (7, 6))
    out = a.T @ b.T.flip(0)
    assert kernels(out) == 1
    assert_matches(out, na.T.astype(np.float64) @ nb.T[::-1], F32, atol=1e-4)


# (rows of 1000: 250 threads share a row on a GPU, 4 values each; of 4100: 205 threads, 10 values each, and the rest
# of the row in a second workgroup that reduces the row again)
@pytest.mark.parametrize("shape", [(4, 9), (3, 1000), (2, 4100)])
@pytest.mark.parametrize("axis", [-1, 0])
def test_softmax_is_one_kernel(device, axis, shape):
    """A row's max and sum are computed in the kernel whose elements read them (the scheduler's rows): on the CPU
    the row is read again from cache, on a GPU a workgroup's threads share them through local memory. Rows along
    memory only: over the columns, three kernels."""
    (nx,), (x,) = inputs(device, shape)
    out = x.softmax(axis)
    n = 1 if axis == -1 else 3  # (over columns: a max, a sum and the elementwise kernel, each streaming the rows)
    assert kernels(out) == n
    e = np.exp(nx - nx.max(axis, keepdims=True))
    assert_matches(out, e / e.sum(axis, keepdims=True), F32)
    lsm = x.log_softmax(axis)
    assert kernels(lsm) == n
    assert_matches(lsm, np.log(e / e.sum(axis, keepdims=True)), F32, atol=1e-5)


def test_a_sums_gradient_through_a_product_whose_rows_are_alike(device):
    """(x @ w).sum(): the gradient of the sum is ones, so x's gradient has the same row for every row of x, a
    reduction over w's 8 columns that does not vary along x's 16 rows: a row on a GPU (ROWS), whose 8 threads take
    the whole reduction (the rules looked for a reduce part left to unroll and raised StopIteration)."""
    (nx, nw), (x, w) = inputs(device, (16, 64), (64, 8))
    x.requires_grad, w.requires_grad = True, True
    (x @ w).sum().backward()
    ones = np.ones((16, 8))
    assert_matches(x.grad, ones @ nw.T.astype(np.float64), F32, atol=1e-5)
    assert_matches(w.grad, nx.T.astype(np.float64) @ ones, F32, atol=1e-5)


def test_norms_are_one_kernel(device):
    """A layer norm reads its mean inside its variance's row; an RMS norm its mean square: each one kernel."""
    (nx, nw), (x, w) = inputs(device, (6, 96), (96,))
    ln = x.layernorm(-1) * w
    assert kernels(ln) == 1
    centered = nx - nx.mean(-1, keepdims=True)
    assert_matches(ln, centered / np.sqrt((centered**2).mean(-1, keepdims=True) + 1e-5) * nw, F32, atol=1e-5)
    rms = x * (x * x).mean(-1, keepdim=True).add(1e-6).rsqrt() * w
    assert kernels(rms) == 1
    assert_matches(rms, nx / np.sqrt((nx * nx).mean(-1, keepdims=True) + 1e-6) * nw, F32, atol=1e-5)


def test_softmax_divides_once_a_row(device):
    """A softmax's last kernel multiplies by each row's reciprocal sum (as PyTorch's CPU kernels do): one division
    a row, not one a value (4096 x 4096 on AVX2: the softmax 12.5 -> 12.1 ms)."""
    (nx,), (x,) = inputs(device, (6, 33))
    out = x.softmax(-1)
    last = out.schedule()[-1].ast
    ops = [u.op for u in last.toposort]
    assert Ops.RECIP in ops and Ops.FDIV not in ops
    e = np.exp(nx - nx.max(-1, keepdims=True))
    assert_matches(out, e / e.sum(-1, keepdims=True), F32)


def test_elementwise_on_views_is_one_kernel(device):
    (na, nb, nc), (a, b, c) = inputs(device, (3, 4), (4, 3), (5, 6))
    out = (a.permute(1, 0) + b.flip(0)).exp() * c.pad(((1, 0), (0, 1))).shrink(((0, 4), (2, 5)))
    assert kernels(out) == 1
    ref = np.exp(na.T + nb[::-1]) * np.pad(nc, ((1, 0), (0, 1)))[0:4, 2:5]
    assert_matches(out, ref, F32)


def test_expand_and_reshape_chain_is_one_kernel(device):
    (na, nb), (a, b) = inputs(device, (1, 4), (3, 2, 2))
    # splitting a dim of an expanded view, then permuting it, stays a view of one buffer
    out = a.expand(3, 4).reshape(3, 2, 2).permute(0, 2, 1) * b.reshape(12).reshape(3, 2, 2) + 1
    assert kernels(out) == 1
    ref = np.broadcast_to(na, (3, 4)).reshape(3, 2, 2).transpose(0, 2, 1) * nb + 1
    assert_matches(out, ref, F32)


@pytest.mark.parametrize(
    "index",
    [
        (slice(None, None, 2), slice(None, None, -3)),
        (slice(1, None, 3), slice(None, None, 2)),
        (slice(None, None, -2), 1),
        (Ellipsis, slice(None, None, -1)),
    ],
    ids=["::2,::-3", "1::3,::2", "::-2,1", "...,::-1"],
)
def test_strided_slice_is_one_kernel(device, index):
    (nx,), (x,) = inputs(device, (7, 8))
    view = x[index]
    assert kernels(view) == 1
    assert_matches(view, nx[index], F32)
    out = x[index] * 2 + x[index].exp()
    assert kernels(out) == 1
    assert_matches(out, nx[index] * 2 + np.exp(nx[index].astype(np.float64)), F32)


def test_reduce_with_epilogue_is_one_kernel(device):
    (nx, ny), (x, y) = inputs(device, (4, 6), (4,))
    out = (x.sum(1) * 2 + y).abs().sqrt()
    assert kernels(out) == 1
    assert_matches(out, np.sqrt(np.abs(nx.astype(np.float64).sum(1) * 2 + ny)), F32)
    out = x.max(1, keepdim=True) - 1
    assert kernels(out) == 1
    assert_matches(out, nx.max(1, keepdims=True) - 1, F32)


def test_constants_fold_into_the_kernel(device):
    out = Tensor.ones(3, 4, device=device) * 2 + Tensor.full((3, 4), 0.5, device=device)
    assert kernels(out) == 1
    assert_matches(out, np.full((3, 4), 2.5), F32)
    assert kernels(Tensor.zeros(5, device=device)) == 1


def test_mean_is_one_kernel(device):
    (nx,), (x,) = inputs(device, (3, 5))
    out = x.mean(1)
    assert kernels(out) == 1
    assert_matches(out, nx.mean(1), F32)


def test_two_outputs_sharing_an_input(device):
    (nx,), (x,) = inputs(device, (4, 4))
    a, b = x * 2, x.sum(0)
    assert kernels(a, b) <= 2
    GlobalCounters.reset()
    a.realize(b)
    assert GlobalCounters.kernels == kernels(x * 3, x.sum(1)) == 2
    assert_matches(a, nx * 2, F32)
    assert_matches(b, nx.sum(0), F32)


def test_realized_result_is_not_recomputed(device):
    (nx,), (x,) = inputs(device, (4, 4))
    y = (x * 3).exp()
    assert realize_counting(y) == 1
    assert y.schedule() == []
    z = y + 1
    assert kernels(z) == 1  # y is a buffer now: only the add runs
    assert_matches(z, np.exp(nx.astype(np.float64) * 3) + 1, F32)


def test_a_causal_masks_counts_are_index_math_in_the_scores_kernel(device):
    """is_causal compares arange(queries) with arange(keys): both are counted from the scores kernel's own index,
    so the mask adds no kernel and no buffer of integers (it was a kernel writing 48 counts, read twice a score)."""
    (nq, nk, nv), (q, k, v) = inputs(device, (2, 48, 8), (2, 48, 8), (2, 48, 8))
    causal = q.scaled_dot_product_attention(k, v, is_causal=True)
    assert kernels(causal) == kernels(q.scaled_dot_product_attention(k, v))
    for item in causal.schedule():
        assert all(b.dtype.is_float for b in item.buffers), [b.dtype for b in item.buffers]
    scores = np.where(np.tril(np.ones((48, 48), bool)), nq @ nk.transpose(0, 2, 1) / np.sqrt(8), -np.inf)
    weights = np.exp(scores - scores.max(-1, keepdims=True))
    assert_matches(causal, weights / weights.sum(-1, keepdims=True) @ nv, F32)
