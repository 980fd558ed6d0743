"""Shape ops, joining, gather/scatter and advanced indexing against PyTorch: forward values and every input's gradient.

Each function runs on tiny Tensors and on torch tensors alike; `ix` and `mask` make an index or a mask tensor of the
caller's kind. Shapes repeat on purpose (every distinct CPU kernel is a compile) and stay at <= 64 elements for the
PYTHON emulator.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from torch_compare import compare

from tiny.ir.uop import Ops
from tiny.tensor import Tensor, dtypes
from tiny.tensor.checks import default_int

torch = pytest.importorskip("torch")
F = torch.nn.functional


def is_torch(x: Any) -> bool:
    return isinstance(x, torch.Tensor)


def ix(like: Any, values: Any) -> Any:
    """An int64 index tensor on `like`'s side (and device)."""
    arr = np.asarray(values, dtype=np.int64)
    return torch.tensor(arr) if is_torch(like) else Tensor(arr, device=like.device)


def mask(like: Any, values: Any) -> Any:
    """A bool tensor on `like`'s side."""
    arr = np.asarray(values, dtype=bool)
    return torch.tensor(arr) if is_torch(like) else Tensor(arr, device=like.device)


def pad(x: Any, padding: tuple[int, ...], mode: str) -> Any:
    return F.pad(x, padding, mode=mode) if is_torch(x) else x.pad(padding, mode=mode)


def cat(xs: list[Any], dim: int = 0) -> Any:
    return torch.cat(xs, dim) if is_torch(xs[0]) else xs[0].cat(*xs[1:], dim=dim)


def stack(xs: list[Any], dim: int = 0) -> Any:
    return torch.stack(xs, dim) if is_torch(xs[0]) else xs[0].stack(*xs[1:], dim=dim)


def weighted(pieces: tuple[Any, ...]) -> list[Any]:
    """Each piece times its position + 1, so that a wrong piece order shows in values and gradients."""
    return [p * (k + 1) for k, p in enumerate(pieces)]


# ---------------------------------------------------------------- shape ops

SHAPE_OPS: dict[str, tuple[Callable, tuple[int, ...]]] = {
    "reshape": (lambda x: x.reshape(4, -1), (2, 3, 4)),
    "view_permute": (lambda x: x.view(6, 4).permute(1, 0), (2, 3, 4)),
    "transpose_neg": (lambda x: x.transpose(-1, 0), (2, 3, 4)),
    "expand": (lambda x: x.expand(2, 3, 4), (3, 1)),
    "flip": (lambda x: x.flip((0, -1)), (2, 3, 4)),
    "squeeze_unsqueeze": (lambda x: x.squeeze(1).unsqueeze(-1), (3, 1, 4)),
    "squeeze_dims": (lambda x: x.squeeze((0, -1, 1)), (1, 3, 1)),
    "flatten": (lambda x: x.flatten(1, 2), (2, 3, 4)),
    "unflatten": (lambda x: x.unflatten(1, (2, -1)), (3, 4)),
    "unflatten_neg": (lambda x: x.unflatten(-1, (2, 1, 2)), (3, 4)),
    "repeat": (lambda x: x.repeat(2, 1, 3), (3, 4)),
    "repeat_then_op": (lambda x: x.repeat(2, 1) * x.repeat(1, 1).repeat(2, 1).flip(0), (3, 4)),
    "repeat_interleave": (lambda x: x.repeat_interleave(2, 1), (3, 4)),
    "repeat_interleave_neg": (lambda x: x.repeat_interleave(3, -2), (3, 4)),
    "repeat_interleave_flat": (lambda x: x.repeat_interleave(2), (3, 4)),
    "roll": (lambda x: x.roll(1, 0), (3, 4)),
    "roll_dims": (lambda x: x.roll((-1, 5), (1, -1)), (2, 3, 4)),
    "roll_flat": (lambda x: x.roll(-5), (3, 4)),
    "roll_noncontiguous": (lambda x: x.permute(1, 0).roll(2, 0)[::2], (3, 4)),
    "tril": (lambda x: x.tril(), (3, 4)),
    "tril_diag": (lambda x: x.tril(-1), (2, 3, 4)),
    "triu_diag": (lambda x: x.triu(2), (3, 4)),
    "triu_tall": (lambda x: x.triu(-1), (4, 3)),
    "pad_reflect": (lambda x: pad(x, (2, 1), "reflect"), (2, 3, 4)),
    "pad_reflect_2d": (lambda x: pad(x, (1, 3, 2, 0), "reflect"), (2, 3, 4)),
    "pad_replicate": (lambda x: pad(x, (2, 1, 1, 2), "replicate"), (2, 3, 4)),
    "pad_circular": (lambda x: pad(x, (4, 1, 0, 3), "circular"), (2, 3, 4)),
    "pad_circular_crop": (lambda x: pad(x, (-1, 2), "circular"), (2, 3, 4)),
    "pad_constant": (lambda x: pad(x, (1, 1, 2, 0), "constant"), (2, 3, 4)),
}


@pytest.mark.parametrize("name", sorted(SHAPE_OPS))
def test_shape_ops(device: str, name: str) -> None:
    fn, shape = SHAPE_OPS[name]
    compare(device, fn, shape)


# ---------------------------------------------------------------- joining and splitting

JOIN_OPS: dict[str, tuple[Callable, tuple[tuple[int, ...], ...]]] = {
    "cat0": (lambda a, b: cat([a, b]), ((2, 4), (3, 4))),
    "cat_neg_dim": (lambda a, b: cat([a, b, a * 2], dim=-1), ((2, 4), (2, 3))),
    "cat_views": (lambda a, b: cat([a.flip(1), b[:, ::2], a[:, 1:]], dim=1), ((2, 4), (2, 3))),
    "cat_empty": (lambda a, b: cat([a, b[:0], b, a[:, :0].reshape(0, 4)], dim=0), ((2, 4), (3, 4))),
    "stack": (lambda a, b: stack([a, b[:2], a * b[1:]], dim=1), ((2, 4), (3, 4))),
    "stack_last": (lambda a, b: stack([a, b[1:]], dim=-1), ((2, 4), (3, 4))),
    "split_int": (lambda a, b: cat(weighted(a.split(3, 1)), dim=1), ((2, 7), (1,))),
    "split_sizes": (lambda a, b: cat(weighted(a.split([2, 0, 5], -1)), dim=-1), ((2, 7), (1,))),
    "chunk": (lambda a, b: cat(weighted(a.chunk(3, 1)), dim=1), ((2, 7), (1,))),
    "unbind": (lambda a, b: stack(weighted(a.unbind(1)), dim=0), ((2, 7), (1,))),
}


@pytest.mark.parametrize("name", sorted(JOIN_OPS))
def test_join_split(device: str, name: str) -> None:
    fn, shapes = JOIN_OPS[name]
    # b is unused by the split tests: give it a gradient of 0 through a product with 0
    compare(
        device, lambda a, b: fn(a, b) + (b.sum() * 0 if name.startswith(("split", "chunk", "unbind")) else 0), *shapes
    )


def test_cat_promotes_dtypes(device: str) -> None:
    a = Tensor([1, 2], device=device, dtype=dtypes.int32)
    b = Tensor([0.5], device=device)
    c = Tensor([True], device=device)
    out = a.cat(b, c)
    ref = torch.cat([torch.tensor([1, 2], dtype=torch.int32), torch.tensor([0.5]), torch.tensor([True])])
    assert out.dtype == dtypes.float32
    np.testing.assert_array_equal(out.numpy(), ref.numpy())
    np.testing.assert_array_equal(c.cat(c.logical_not()).numpy(), [True, False])


def test_cat_keeps_negative_zero(device: str) -> None:
    out = Tensor([-0.0], device=device).cat(Tensor([0.0, -0.0], device=device)).numpy()
    assert list(np.signbit(out)) == [True, False, True]


def test_split_chunk_shapes_match_torch(device: str) -> None:
    x, t = Tensor.zeros(5, 0, device=device), torch.zeros(5, 0)
    for ours, theirs in [
        (x.split(2), t.split(2)),
        (x.chunk(2), t.chunk(2)),
        (x.chunk(4, 1), t.chunk(4, 1)),
        (x.split(0, 1), t.split(0, 1)),
        (x.unbind(1), t.unbind(1)),
        (Tensor.zeros(6, device=device).chunk(4), torch.zeros(6).chunk(4)),
    ]:
        assert [p.shape for p in ours] == [tuple(p.shape) for p in theirs]


# ---------------------------------------------------------------- masks, one_hot

MASK = np.array([[True, False, False, True], [False, False, True, True], [True, True, False, False]])


def test_masked_fill(device: str) -> None:
    compare(device, lambda x: x.masked_fill(mask(x, MASK), -1.5), (3, 4))
    compare(device, lambda x: x.masked_fill(mask(x, MASK[1]), 2.0), (2, 3, 4))  # broadcast mask


def test_masked_fill_tensor_value_and_int(device: str) -> None:
    compare(
        device,
        lambda x, v: x.masked_fill(mask(x, MASK), v.reshape(())),
        (3, 4),
        (1,),
    )
    x = Tensor([[1, 2, 3, 4]] * 3, device=device, dtype=dtypes.int32)
    out = x.masked_fill(Tensor(MASK, device=device), 2.7)
    assert out.dtype == dtypes.int32
    np.testing.assert_array_equal(out.numpy(), torch.tensor(x.numpy()).masked_fill(torch.tensor(MASK), 2.7).numpy())


def test_one_hot(device: str) -> None:
    values = np.array([[0, 3, 1], [2, 2, 0]])
    for classes in (-1, 5):
        out = Tensor(values, device=device).one_hot(classes)
        ref = F.one_hot(torch.tensor(values), classes)
        assert out.dtype == default_int(device)
        np.testing.assert_array_equal(out.numpy(), ref.numpy())


# ---------------------------------------------------------------- gather, scatter

G_INDEX = [[0, 3, 3, 1], [2, 0, 1, 1], [3, 3, 0, 2]]  # values in [0, 4), repeats included


GATHER: dict[str, tuple[Callable, tuple[int, ...]]] = {
    "dim1": (lambda x: x.gather(1, ix(x, G_INDEX)), (3, 4)),
    "dim0": (lambda x: x.gather(0, ix(x, [[2, 0, 1, 1], [0, 0, 2, 1]])), (3, 4)),
    "neg_dim_wider": (lambda x: x.gather(-1, ix(x, [[4, 0, 3, 1, 1, 2]])), (2, 5)),
    "3d_smaller_index": (lambda x: x.gather(1, ix(x, [[[2, 0], [1, 1]]])), (2, 3, 4)),
    "noncontiguous": (lambda x: x.permute(1, 0).flip(0)[:, 1:].gather(0, ix(x, [[0, 3, 3], [2, 0, 1]])), (4, 4)),
    "computed_input": (lambda x: (x * 2 + 1).exp().gather(1, ix(x, G_INDEX)), (3, 4)),
}


@pytest.mark.parametrize("name", sorted(GATHER))
def test_gather(device: str, name: str) -> None:
    fn, shape = GATHER[name]
    compare(device, fn, shape)


S_INDEX = [[1, 3], [0, 2], [3, 0]]  # unique along dim 1 in each row, as torch.scatter needs


SCATTER: dict[str, tuple[Callable, tuple[tuple[int, ...], ...]]] = {
    "src": (lambda x, s: x.scatter(1, ix(x, S_INDEX), s), ((3, 4), (3, 2))),
    "index_smaller": (lambda x, s: x.scatter(1, ix(x, S_INDEX[:2]), s), ((3, 4), (2, 2))),
    "dim0": (lambda x, s: x.scatter(0, ix(x, [[2, 0, 1, 0]]), s), ((3, 4), (1, 4))),
    "neg_dim_3d": (lambda x, s: x.scatter(-2, ix(x, [[[1, 0]], [[0, 2]]]), s), ((2, 3, 2), (2, 1, 2))),
    "value": (lambda x, s: x.scatter(1, ix(x, S_INDEX), 2.5) + s.sum() * 0, ((3, 4), (1,))),
}


@pytest.mark.parametrize("name", sorted(SCATTER))
def test_scatter(device: str, name: str) -> None:
    fn, shapes = SCATTER[name]
    compare(device, fn, *shapes)


def test_scatter_src_larger_than_index(device: str) -> None:
    # torch's backward of this case returns a gradient of the index's shape for src, so compare values only
    x, s = np.arange(12.0).reshape(3, 4), -np.arange(1.0, 10.0).reshape(3, 3)
    out = Tensor(x, device=device).scatter(0, Tensor([[2, 0, 1]], device=device), Tensor(s, device=device))
    ref = torch.tensor(x).scatter(0, torch.tensor([[2, 0, 1]]), torch.tensor(s))
    np.testing.assert_array_equal(out.numpy(), ref.numpy())


R_INDEX = [[1, 1, 3], [0, 0, 0], [2, 3, 2]]  # repeats: several values reduce into one place

# repeats along the scattered dim: (dim, self's shape, index, src's shape)
REPEATS = {
    "dim1": (1, (3, 4), [[1, 1, 3, 1], [0, 0, 0, 2]], (2, 4)),
    "dim0": (0, (3, 2), [[1, 0], [1, 1], [1, 0]], (3, 2)),
    "neg_dim_3d": (-2, (2, 3, 2), [[[2, 0], [2, 2], [0, 0]], [[1, 1], [1, 2], [1, 1]]], (2, 3, 2)),
    "src_larger": (1, (2, 5), [[4, 4, 0], [3, 1, 3]], (2, 4)),
}


def _last_writes(dim: int, index: np.ndarray) -> np.ndarray:
    """Which index elements PyTorch's CPU scatter keeps: along dim, the last of those that name one place."""
    moved = np.moveaxis(index, dim, -1)
    kept = np.ones_like(moved, dtype=bool)
    for pos in np.ndindex(*moved.shape[:-1]):
        row = moved[pos]
        kept[pos] = [v not in row[j + 1 :] for j, v in enumerate(row)]
    return np.moveaxis(kept, -1, dim)


@pytest.mark.parametrize("name", sorted(REPEATS))
def test_scatter_with_repeated_indices_keeps_the_last_write(device: str, name: str) -> None:
    """Several indices naming one place used to add their values up; PyTorch's CPU kernel keeps the last in index
    order. The gradient of self matches torch's; src's is the place's gradient for the element written and 0 for
    the overwritten ones (torch hands the place's gradient to each of them, though the output does not depend on
    them)."""
    dim, shape, index, src_shape = REPEATS[name]
    rng = np.random.default_rng(0)
    x, s, g = (rng.uniform(-2, 2, sh).astype(np.float32) for sh in (shape, src_shape, shape))
    tx, ts = Tensor(x, device=device, requires_grad=True), Tensor(s, device=device, requires_grad=True)
    out = tx.scatter(dim, Tensor(index, device=device), ts)
    dx, ds = out.gradient(tx, ts, gradient=Tensor(g, device=device))
    idx = np.array(index)
    region = tuple(slice(0, n) for n in idx.shape)  # (torch's backward takes no src larger than the index)
    rx, rs = torch.tensor(x, requires_grad=True), torch.tensor(s[region], requires_grad=True)
    ref = rx.scatter(dim, torch.tensor(index), rs)
    ref.backward(torch.tensor(g))
    np.testing.assert_array_equal(out.numpy(), ref.detach().numpy())
    np.testing.assert_array_equal(dx.numpy(), rx.grad.numpy())
    want = np.zeros_like(s)
    want[region] = torch.tensor(g).gather(dim, torch.tensor(index)).numpy() * _last_writes(dim, idx)
    np.testing.assert_array_equal(ds.numpy(), want)


def test_scatter_of_a_value_and_of_ints_with_repeated_indices(device: str) -> None:
    index = [[1, 1, 3, 1], [0, 0, 0, 2]]
    x = np.arange(12).reshape(3, 4)
    s = -np.arange(1, 9).reshape(2, 4)
    out = Tensor(x, device=device).scatter(1, Tensor(index, device=device), Tensor(s, device=device))
    ref = torch.tensor(x).scatter(1, torch.tensor(index), torch.tensor(s))
    np.testing.assert_array_equal(out.numpy(), ref.numpy())
    out = Tensor(x, device=device).scatter(1, Tensor(index, device=device), 7)
    np.testing.assert_array_equal(out.numpy(), torch.tensor(x).scatter(1, torch.tensor(index), 7).numpy())


def test_scatter_add(device: str) -> None:
    compare(device, lambda x, s: x.scatter_add(1, ix(x, R_INDEX), s), (3, 4), (3, 3))
    compare(device, lambda x, s: x.scatter_add(0, ix(x, [[2, 0, 2, 2], [2, 1, 0, 2]]), s), (3, 4), (2, 4))


@pytest.mark.filterwarnings("ignore:The reduce argument of torch.scatter")
@pytest.mark.parametrize("reduce", ["add", "multiply"])
def test_scatter_with_reduce(device: str, reduce: str) -> None:
    """scatter(reduce=...) combines every value sent to a place with the one there (torch's values). torch has no
    gradient for it: ours are scatter_reduce's ("sum", "prod" with include_self), compared with torch's there."""
    same = {"add": "sum", "multiply": "prod"}[reduce]
    rng = np.random.default_rng(0)
    x, s = rng.uniform(-2, 2, (3, 4)).astype(np.float32), rng.uniform(-2, 2, (3, 3)).astype(np.float32)
    tx, ts = Tensor(x, device=device, requires_grad=True), Tensor(s, device=device, requires_grad=True)
    out = tx.scatter(1, Tensor(R_INDEX, device=device), ts, reduce=reduce)
    want = torch.tensor(x).scatter(1, torch.tensor(R_INDEX), torch.tensor(s), reduce=reduce)
    np.testing.assert_allclose(out.numpy(), want.numpy(), rtol=1e-6)
    dx, ds = out.square().sum().gradient(tx, ts)
    rx, rs = torch.tensor(x, requires_grad=True), torch.tensor(s, requires_grad=True)
    rx.scatter_reduce(1, torch.tensor(R_INDEX), rs, same, include_self=True).square().sum().backward()
    np.testing.assert_allclose(dx.numpy(), rx.grad.numpy(), atol=1e-5, rtol=1e-5)
    np.testing.assert_allclose(ds.numpy(), rs.grad.numpy(), atol=1e-5, rtol=1e-5)
    value = Tensor(x, device=device).scatter(0, Tensor([[2, 0, 2, 2]], device=device), 1.5, reduce=reduce)
    ref = torch.tensor(x).scatter(0, torch.tensor([[2, 0, 2, 2]]), 1.5, reduce=reduce)
    np.testing.assert_allclose(value.numpy(), ref.numpy(), rtol=1e-6)


def test_cat_then_slice_one_part(device: str) -> None:
    # a kernel whose loads of one buffer all fold away still takes that buffer: launches pass buffers by position
    a, b = Tensor([1.0, 2.0], device=device), Tensor([3.0, 4.0], device=device)
    np.testing.assert_array_equal(a.cat(b)[2:].numpy(), [3.0, 4.0])


@pytest.mark.parametrize("include_self", [True, False])
@pytest.mark.parametrize("reduce", ["sum", "prod", "mean", "amax", "amin"])
def test_scatter_reduce(device: str, reduce: str, include_self: bool) -> None:
    compare(
        device,
        lambda x, s: x.scatter_reduce(1, ix(x, R_INDEX), s, reduce, include_self=include_self),
        (3, 4),
        (3, 3),
    )


@pytest.mark.parametrize("reduce", ["sum", "prod", "mean", "amax", "amin"])
def test_scatter_reduce_ints(device: str, reduce: str) -> None:
    rng = np.random.default_rng(1)
    x, s = rng.integers(-9, 9, (3, 4)), rng.integers(-9, 9, (3, 3))
    for include_self in (True, False):
        ours = Tensor(x, device=device).scatter_reduce(
            1, Tensor(R_INDEX, device=device), Tensor(s, device=device), reduce, include_self
        )
        ref = torch.tensor(x).scatter_reduce(
            1, torch.tensor(R_INDEX), torch.tensor(s), reduce, include_self=include_self
        )
        np.testing.assert_array_equal(ours.numpy(), ref.numpy(), err_msg=f"{reduce} include_self={include_self}")


# ---------------------------------------------------------------- advanced indexing

M1 = [True, False, True, True, False]
M2 = [[True, False, False, True, False], [False, False, True, True, True], [False] * 5, [True] * 5]

ADVANCED: dict[str, Callable] = {
    "one_tensor": lambda x: x[ix(x, [2, 0, -1, 2])],
    "list": lambda x: x[[3, 1, -4]],
    "2d_index_dim1": lambda x: x[:, ix(x, [[0, 4], [1, 1]])],
    "adjacent_pair": lambda x: x[:, ix(x, [4, 0, 2]), ix(x, [1, 2, 0])],
    "broadcast_pair": lambda x: x[ix(x, [[0], [3]]), ix(x, [1, 2, 4])],
    "separated_go_first": lambda x: x[ix(x, [0, 3]), :, ix(x, [2, 1])],
    "separated_by_none": lambda x: x[ix(x, [0, 3]), None, ix(x, [2, 1])],
    "int_then_tensor": lambda x: x[1, :, ix(x, [0, 2, 2])],
    "zero_d_tensor_acts_as_int": lambda x: x[ix(x, 1), :, ix(x, [0, 2])],
    "ellipsis": lambda x: x[..., ix(x, [2, 0]), None],
    "slices_and_steps": lambda x: x[None, ix(x, [1, 2]), ::2, ix(x, [0, 0])],
    "flipped": lambda x: x.flip(0)[:, ix(x, [4, -5]), 1:],
    "all_dims": lambda x: x[ix(x, [3, 0]), ix(x, [4, 4]), ix(x, [-1, 0])],
    "empty_index": lambda x: x[ix(x, np.zeros((0,), np.int64))],
    "of_computed": lambda x: (x * x)[ix(x, [1, 3])].permute(2, 0, 1)[::2] + 1,
    "bool_mask_dim1": lambda x: x[:, mask(x, M1)],
    "bool_mask_2d": lambda x: x[mask(x, M2)],
    "bool_mask_and_index": lambda x: x[mask(x, [True, False, True, False]), :, ix(x, [2, 0])],
    "bool_mask_list": lambda x: x[1, [False, True, True, False, True]],
    "numpy_array": lambda x: x[np.array([[1, 1], [0, 2]]), 1:3],
}


@pytest.mark.parametrize("name", sorted(ADVANCED))
def test_advanced_indexing(device: str, name: str) -> None:
    compare(device, ADVANCED[name], (4, 5, 3))


def test_mask_from_tensor_values(device: str) -> None:
    # the mask is computed from the data: realized and read to know the result's size
    compare(device, lambda x: x[x > 0.5] * 2, (3, 4))
    compare(device, lambda x: x[:, (x > 0).sum(0) >= 2], (3, 4))


def test_int_dtypes_and_bools_pass_through(device: str) -> None:
    x = np.arange(12).reshape(3, 4)
    for dt in (dtypes.int32, dtypes.int8, dtypes.bool, dtypes.float16):
        t = Tensor(x, device=device, dtype=dt)
        ref = torch.tensor(x).to(getattr(torch, dt.name))
        out = t[Tensor([2, 0], device=device), 1:]
        assert out.dtype == dt
        np.testing.assert_array_equal(out.numpy(), ref[torch.tensor([2, 0]), 1:].numpy())
        np.testing.assert_array_equal(
            t.gather(1, Tensor(G_INDEX, device=device)).numpy(), ref.gather(1, torch.tensor(G_INDEX)).numpy()
        )
        np.testing.assert_array_equal(t.cat(t.flip(0), dim=1).numpy(), torch.cat([ref, ref.flip(0)], 1).numpy())


def test_index_dtypes(device: str) -> None:
    x = Tensor(np.arange(12.0).reshape(3, 4), device=device)
    for dt in (dtypes.uint8, dtypes.int16, dtypes.int32, dtypes.int64):
        np.testing.assert_array_equal(x[:, Tensor([3, 1], device=device, dtype=dt)].numpy(), [[3, 1], [7, 5], [11, 9]])


def test_out_of_range_tensor_index_reads_zero(device: str) -> None:
    # an index tensor is never read on the host: a value outside the dim matches nothing (documented)
    x = Tensor(np.arange(1.0, 7.0).reshape(2, 3), device=device)
    np.testing.assert_array_equal(x[:, Tensor([1, 5, -4], device=device)].numpy(), [[2, 0, 0], [5, 0, 0]])
    np.testing.assert_array_equal(x.gather(1, Tensor([[3], [-1]], device=device)).numpy(), [[0], [0]])


# ---------------------------------------------------------------- errors at the call site


def test_errors(device: str) -> None:
    x = Tensor.zeros(3, 4, device=device)
    with pytest.raises(TypeError, match="float32"):
        x[Tensor([1.0, 2.0], device=device)]
    with pytest.raises(IndexError, match="index 4 is out of bounds for dimension 1 with size 4"):
        x[:, [0, 4]]
    with pytest.raises(IndexError, match=r"mask of shape \(4,\)"):
        x[[True, False, True, False]]
    with pytest.raises(TypeError, match="ints or bools"):
        x[[0.5]]
    with pytest.raises(IndexError, match="too many indices"):
        x[[0], [0], [0]]
    with pytest.raises(IndexError, match=r"shapes \[\(2,\), \(3,\)\] cannot be broadcast"):
        x[Tensor([0, 1], device=device), Tensor([0, 1, 2], device=device)]
    with pytest.raises(ValueError, match=r"shapes equal but in that dim.*\(3, 4\) and \(3, 5\)"):
        x.cat(Tensor.zeros(3, 5, device=device))
    with pytest.raises(ValueError, match="0-d"):
        Tensor(1.0, device=device).cat(Tensor(2.0, device=device))
    with pytest.raises(ValueError, match="one shape"):
        x.stack(Tensor.zeros(4, 3, device=device))
    with pytest.raises(TypeError, match="integer index tensor"):
        x.gather(1, Tensor([[0.0]], device=device))
    with pytest.raises(ValueError, match="as many dims"):
        x.gather(1, Tensor([0, 1], device=device))
    with pytest.raises(ValueError, match="larger than input"):
        x.gather(1, Tensor([[0]] * 4, device=device))
    with pytest.raises(IndexError, match="out of range"):
        x.gather(2, Tensor([[0]], device=device))
    with pytest.raises(ValueError, match="does not fit src"):
        x.scatter(1, Tensor([[0, 1]], device=device), Tensor([[1.0]], device=device))
    with pytest.raises(ValueError, match="reduce must be one of"):
        x.scatter_reduce(1, Tensor([[0]], device=device), x, "max")
    with pytest.raises(ValueError, match="reduce must be None, 'add' or 'multiply', got 'sum'"):
        x.scatter(1, Tensor([[0]], device=device), x, reduce="sum")
    with pytest.raises(ValueError, match="less than its size"):
        x.pad((4, 0), mode="reflect")
    with pytest.raises(ValueError, match="more than once"):
        x.pad((0, 5), mode="circular")
    with pytest.raises(ValueError, match="takes no value"):
        x.pad((1, 1), value=1.0, mode="replicate")
    with pytest.raises(ValueError, match="mode must be"):
        x.pad((1, 1), mode="mirror")
    with pytest.raises(ValueError, match="a count for each"):
        x.repeat(2)
    with pytest.raises(ValueError, match="adding up"):
        x.split([1, 2], 1)
    with pytest.raises(ValueError, match="do not make dim"):
        x.unflatten(1, (3, -1))
    with pytest.raises(ValueError, match="comes after"):
        x.flatten(1, 0)
    with pytest.raises(TypeError, match="integer tensor"):
        x.one_hot(3)
    with pytest.raises(TypeError, match="bool mask"):
        x.masked_fill(x, 1.0)
    with pytest.raises(ValueError, match="does not broadcast"):
        x.masked_fill(Tensor([True, False], device=device), 1.0)
    with pytest.raises(ValueError, match="at least 2 dims"):
        Tensor.zeros(3, device=device).tril()


def test_index_on_another_device_is_an_error(device: str, python_device: str) -> None:
    if device == python_device:
        pytest.skip("needs a second device")
    x, i = Tensor.zeros(3, 4, device=device), Tensor([0], device=python_device)
    with pytest.raises(ValueError, match="PYTHON"):
        x[i]
    with pytest.raises(ValueError, match="PYTHON"):
        x.gather(0, i.reshape(1, 1))
    with pytest.raises(ValueError, match="PYTHON"):
        x.cat(Tensor.zeros(1, 4, device=python_device))


# ---------------------------------------------------------------- kernels


def kernels(t: Tensor) -> int:
    return sum(1 for item in t.schedule() if item.ast.op is Ops.SINK)


def test_kernel_counts(device: str) -> None:
    rng = np.random.default_rng(0)
    a, b = (Tensor(rng.random(s, dtype=np.float32), device=device) for s in ((3, 4), (2, 4)))
    index = Tensor(np.array(G_INDEX), device=device)
    assert kernels(a.cat(b, a) * 2) == 1
    assert kernels(a.stack(a, dim=1)) == 1
    assert kernels(a.gather(1, index) * 2 + 1) == 1
    assert kernels(a[Tensor([2, 0, 1], device=device)] + 1) == 1
    assert kernels(a[Tensor([[2], [0]], device=device), Tensor([1, 3, 3], device=device)].exp()) == 1
    assert kernels(a.roll((1, -1), (0, 1)) * 2) == 1
    for mode in ("reflect", "replicate", "circular"):
        assert kernels(a.pad((2, 1, 1, 2), mode=mode) + 1) == 1
    # a scatter first finds the index elements a later one repeats (they write nothing), then writes in one kernel
    assert kernels(a.scatter(1, index[:, :2], b.pad((0, 1, 0, 0))[:, :2].cat(b[:1, :2]))) == 2
    assert kernels(a.scatter_add(1, index, a)) == 1
    assert kernels(a.scatter_reduce(1, index, a, "amax")) == 1
    assert kernels(a.repeat(2, 1)) == 1  # read through further ops, a repeat is a copy first (one view cannot say it)
