"""The methods and arguments a PyTorch user reaches for (issue 24), against PyTorch: values, dtypes and the
gradient of every float input, on every device under test; bad input raises a clear error at the call."""

from __future__ import annotations

import numpy as np
import pytest
from tensor_helpers import torch_dtype_on
from torch_compare import compare

from tiny.tensor import Tensor, dtypes

torch = pytest.importorskip("torch")
F = torch.nn.functional
NAN, INF = float("nan"), float("inf")


def same(device: str, ours, theirs, *arrays: np.ndarray) -> None:
    """Forward values, shapes and dtypes of ours(tiny tensors) and theirs(torch tensors), ints and bools exactly;
    either may return a tuple of tensors."""
    got = ours(*(Tensor(a, device=device) for a in arrays))
    ref = theirs(*(torch.tensor(a) for a in arrays))
    outs, refs = (tuple(got), tuple(ref)) if isinstance(got, (tuple, list)) else ((got,), (ref,))
    assert len(outs) == len(refs)
    for o, r in zip(outs, refs):
        r = r.numpy()
        assert o.shape == r.shape, f"shape {o.shape}, torch has {r.shape}"
        assert o.numpy().dtype == torch_dtype_on(device, r.dtype), f"dtype {o.dtype.name}, torch has {r.dtype}"
        if r.dtype.kind == "f":
            np.testing.assert_allclose(o.numpy(), r, rtol=1e-5, atol=1e-6)
        else:
            np.testing.assert_array_equal(o.numpy(), r)


def rand(*shape: int, seed: int = 0, low: float = -2.0, high: float = 2.0) -> np.ndarray:
    return np.random.default_rng(seed).uniform(low, high, size=shape).astype(np.float32)


# ---------------------------------------------------------------- conversions


@pytest.mark.parametrize("name", ["half", "float", "double", "bfloat16", "int", "long", "short", "bool"])
def test_dtype_shortcuts(device, name):
    data = np.array([[-2.5, 0.0, 1.75], [3.0, -0.5, 100.25]], np.float32)
    ours = getattr(Tensor(data, device=device), name)()
    ref = getattr(torch.tensor(data), name)()
    assert ours.dtype == getattr(dtypes, str(ref.dtype).removeprefix("torch."))
    np.testing.assert_array_equal(ours.numpy(), ref.float().numpy() if name == "bfloat16" else ref.numpy())


def test_clone_is_a_copy_with_gradients(device):
    compare(device, lambda x: x.clone() * 2, (2, 3))
    a = Tensor([1.0, 2.0], device=device).realize()
    b = a.clone()
    b += 1
    assert a.tolist() == [1.0, 2.0] and b.tolist() == [2.0, 3.0]


def test_size_data_and_array(device):
    t = Tensor(np.arange(6, dtype=np.int32).reshape(2, 3), device=device)
    assert t.size() == (2, 3) and t.size(1) == 3 and t.size(-2) == 2
    with pytest.raises(IndexError, match="out of range"):
        t.size(2)
    with pytest.raises(TypeError, match="int dim"):
        t.size("1")
    w = Tensor([1.0, 2.0], device=device, requires_grad=True)
    assert w.data.requires_grad is None and w.data.tolist() == [1.0, 2.0]
    arr = np.asarray(t)
    assert arr.dtype == np.int32 and arr.tolist() == [[0, 1, 2], [3, 4, 5]]
    assert np.asarray(Tensor(1.5, device=device), dtype=np.float64).dtype == np.float64
    assert np.array(t).shape == (2, 3)


# ---------------------------------------------------------------- functions of two tensors


def test_copysign(device):
    a = np.array([1.0, -2.0, 3.0, 0.0, -4.0, 5.0], np.float32)
    b = np.array([-1.0, 1.0, -0.0, -2.0, 0.0, -INF], np.float32)
    compare(device, lambda x, y: x.copysign(y) + 0 * y, data=[a, b])  # (no gradient flows to y: torch's is 0)
    same(device, lambda x, y: x.copysign(y), lambda x, y: x.copysign(y), np.array([1, -2, 3]), np.array([-1, 1, -5]))
    same(device, lambda x: x.copysign(-1), lambda x: x.copysign(-1), np.array([1.0, NAN, -INF], np.float32))


def test_logaddexp(device):
    compare(device, lambda x, y: x.logaddexp(y), (2, 3), (3,))
    big = np.array([1000.0, -1000.0, -INF, INF, -INF], np.float32)
    other = np.array([1000.0, -1000.0, -INF, 1.0, 3.0], np.float32)
    same(device, lambda x, y: x.logaddexp(y), lambda x, y: x.logaddexp(y), big, other)


def test_fmod(device):
    a = np.array([[-7.5, 7.5, -3.0, 2.25]], np.float32)
    b = np.array([[2.0], [-2.5]], np.float32)
    compare(device, lambda x, y: x.fmod(y), data=[a, b])
    ints = np.array([-7, -6, -1, 0, 5, 7], np.int32)
    same(device, lambda x: x.fmod(3), lambda x: x.fmod(3), ints)
    same(device, lambda x: x.fmod(-3), lambda x: x.fmod(-3), ints)
    with pytest.raises(TypeError, match="bool"):
        Tensor([True], device=device).fmod(Tensor([True], device=device))


@pytest.mark.parametrize("mode", [None, "trunc", "floor"])
def test_div_rounding_mode(device, mode):
    a = np.array([[-7.5, 7.5, -3.0, 2.25, 0.0]], np.float32)
    b = np.array([[2.0], [-2.5]], np.float32)
    compare(device, lambda x, y: x.div(y, rounding_mode=mode), data=[a, b])
    ints, divs = np.array([[-7, -6, -1, 0, 5, 7]], np.int32), np.array([[3], [-2]], np.int32)
    same(device, lambda x, y: x.div(y, rounding_mode=mode), lambda x, y: x.div(y, rounding_mode=mode), ints, divs)
    same(device, lambda x: x.div(2, rounding_mode=mode), lambda x: x.div(2, rounding_mode=mode), ints)


def test_div_rejects_an_unknown_rounding_mode(device):
    with pytest.raises(ValueError, match="rounding_mode"):
        Tensor([1.0], device=device).div(2, rounding_mode="round")


def test_isclose_allclose(device):
    a = np.array([1.0, 1.0, INF, -INF, INF, NAN, NAN, 0.0, 1e-9], np.float32)
    b = np.array([1.0 + 1e-6, 1.1, INF, INF, 1.0, NAN, 1.0, 1e-9, 0.0], np.float32)
    for kw in ({}, {"equal_nan": True}, {"rtol": 0.2}, {"atol": 1e-8, "rtol": 0.0}):
        same(device, lambda x, y, kw=kw: x.isclose(y, **kw), lambda x, y, kw=kw: torch.isclose(x, y, **kw), a, b)
    ints = np.array([3, 5, -2], np.int32)
    same(
        device, lambda x, y: x.isclose(y), lambda x, y: torch.isclose(x, y), ints, ints + np.array([0, 1, 0], np.int32)
    )
    x = Tensor(a[:3], device=device)
    assert x.allclose(x) is True
    assert Tensor(a[:2], device=device).allclose(Tensor(b[:2], device=device)) is False
    assert Tensor(a[:2], device=device).allclose(Tensor(b[:2], device=device), rtol=0.2) is True
    with pytest.raises(ValueError, match="rtol"):
        x.isclose(x, rtol=-1.0)


# ---------------------------------------------------------------- scans and softmin


@pytest.mark.parametrize("axis", [0, -1])
def test_logcumsumexp(device, axis):
    compare(device, lambda x: x.logcumsumexp(axis), (3, 5))
    wide = np.array([[1000.0, 0.0, -INF, 1001.0], [-INF, -INF, 2.0, -1000.0]], np.float32)
    same(device, lambda x: x.logcumsumexp(axis), lambda x: x.logcumsumexp(axis), wide)
    same(device, lambda x: x.logcumsumexp(0), lambda x: x.logcumsumexp(0), np.zeros((0, 2), np.float32))


def test_softmin(device):
    compare(device, lambda x: x.softmin(1) if isinstance(x, Tensor) else F.softmin(x, 1), (2, 4))
    compare(device, lambda x: x.softmin(0) if isinstance(x, Tensor) else F.softmin(x, 0), (3,))


def test_cummax_cummin_return_values_and_indices(device):
    data = np.array([[1.0, 3.0, 3.0, 2.0], [4.0, 1.0, 5.0, 0.0]], np.float32)
    for name in ("cummax", "cummin"):
        out = getattr(Tensor(data, device=device), name)(1)
        ref = getattr(torch.tensor(data), name)(1)
        np.testing.assert_array_equal(out.values.numpy(), ref.values.numpy())
        np.testing.assert_array_equal(out.indices.numpy(), ref.indices.numpy())
        values, indices = out
        assert values is out.values and indices is out.indices


# ---------------------------------------------------------------- diagonals, windows, grids


@pytest.mark.parametrize("offset, dim1, dim2", [(0, 0, 1), (1, 0, 1), (-1, 0, 1), (2, -1, 0), (0, 2, 0), (9, 0, 1)])
def test_diagonal(device, offset, dim1, dim2):
    compare(device, lambda x: x.diagonal(offset, dim1, dim2), (3, 4, 2))


@pytest.mark.parametrize("k", [0, 1, -2])
def test_diag(device, k):
    compare(device, lambda x: x.diag(k), (3,))
    compare(device, lambda x: x.diag(k), (3, 4))
    same(device, lambda x: x.diag(k), lambda x: x.diag(k), np.array([1, 2, 3], np.int32))


def test_diag_and_diagonal_reject_bad_input(device):
    x = Tensor.zeros(2, 2, 2, device=device)
    with pytest.raises(ValueError, match="1-d or 2-d"):
        x.diag()
    with pytest.raises(ValueError, match="two different dims"):
        x.diagonal(0, 1, 1)
    with pytest.raises(ValueError, match="at least 2 dims"):
        Tensor.zeros(3, device=device).diagonal()


@pytest.mark.parametrize("dim, size, step", [(0, 2, 1), (1, 3, 2), (-1, 1, 3), (1, 5, 1), (0, 3, 3)])
def test_unfold(device, dim, size, step):
    compare(device, lambda x: x.unfold(dim, size, step), (3, 5))


def test_unfold_rejects_bad_input(device):
    x = Tensor.zeros(3, 5, device=device)
    with pytest.raises(ValueError, match="size 6 is more"):
        x.unfold(1, 6, 1)
    with pytest.raises(ValueError, match="step >= 1"):
        x.unfold(1, 2, 0)


@pytest.mark.parametrize("indexing", ["ij", "xy"])
def test_meshgrid(device, indexing):
    def run(x, y, z):
        if isinstance(x, Tensor):
            return (
                Tensor.meshgrid(x, y, z, indexing=indexing)[0] * 1
                + Tensor.meshgrid([x, y, z], indexing=indexing)[2] * 2
                + x.meshgrid(y, z, indexing=indexing)[1] * 3
            )
        grids = torch.meshgrid(x, y, z, indexing=indexing)
        return grids[0] + grids[2] * 2 + grids[1] * 3

    compare(device, run, (2,), (3,), (4,))
    with pytest.raises(ValueError, match="indexing"):
        Tensor.meshgrid(Tensor([1], device=device), indexing="yx")
    with pytest.raises(ValueError, match="0-d or 1-d"):
        Tensor.meshgrid(Tensor.zeros(2, 2, device=device))


# ---------------------------------------------------------------- selections with data-dependent shapes


def test_masked_select(device):
    mask = np.array([[True, False, True, True]])
    ours = [Tensor(rand(3, 4), device=device, requires_grad=True)]
    theirs = [torch.tensor(rand(3, 4), requires_grad=True)]
    out, ref = ours[0].masked_select(Tensor(mask, device=device)), theirs[0].masked_select(torch.tensor(mask))
    np.testing.assert_allclose(out.numpy(), ref.detach().numpy())
    out.square().sum().backward()
    ref.square().sum().backward()
    np.testing.assert_allclose(ours[0].grad.numpy(), theirs[0].grad.numpy(), rtol=1e-6)
    with pytest.raises(TypeError, match="bool Tensor"):
        ours[0].masked_select(Tensor([1, 0, 1, 1], device=device))


@pytest.mark.parametrize("as_tuple", [False, True])
def test_nonzero(device, as_tuple):
    data = np.array([[0.0, 1.5, 0.0], [-2.0, 0.0, NAN]], np.float32)
    same(device, lambda x: x.nonzero(as_tuple=as_tuple), lambda x: x.nonzero(as_tuple=as_tuple), data)
    same(device, lambda x: x.nonzero(as_tuple=as_tuple), lambda x: x.nonzero(as_tuple=as_tuple), np.zeros(4, bool))
    same(device, lambda x: x.nonzero(), lambda x: x.nonzero(), np.array(3, np.int32))


# ---------------------------------------------------------------- normalize


@pytest.mark.parametrize("p, dim", [(2.0, 1), (1.0, 0), (3.0, -1)])
def test_normalize(device, p, dim):
    compare(device, lambda x: x.normalize(p, dim) if isinstance(x, Tensor) else F.normalize(x, p, dim), (3, 4))


def test_normalize_of_a_zero_vector(device):
    data = np.array([[0.0, 0.0], [3.0, 4.0]], np.float32)
    compare(device, lambda x: x.normalize(dim=1) if isinstance(x, Tensor) else F.normalize(x, dim=1), data=[data])
    with pytest.raises(ValueError, match="p > 0"):
        Tensor(data, device=device).normalize(p=0)


# ---------------------------------------------------------------- joining and indexing given as sequences


def test_stack_and_cat_take_one_sequence(device):
    a, b = rand(2, 3), rand(2, 3, seed=1)
    compare(
        device,
        lambda x, y: Tensor.stack([x, y], dim=1) if isinstance(x, Tensor) else torch.stack([x, y], 1),
        data=[a, b],
    )
    compare(
        device, lambda x, y: Tensor.cat((x, y), dim=-1) if isinstance(x, Tensor) else torch.cat((x, y), -1), data=[a, b]
    )
    with pytest.raises(TypeError, match="argument 1 is list"):
        Tensor.stack(Tensor(a, device=device), [1.0])
    with pytest.raises(TypeError, match="empty"):
        Tensor.stack([])


@pytest.mark.parametrize(
    "index",
    [((0, 2), (1, 3)), (((0, 1), (2, 0)),), ((0, 2), slice(None)), ([[0], [2]], (1, 3)), (slice(1, None), [1, -1])],
    ids=["two-tuples", "nested-tuples", "tuple-and-slice", "list-and-tuple", "slice-and-list"],
)
def test_indices_as_nested_lists_and_tuples(device, index):
    def run(x):
        if isinstance(x, Tensor):
            return x[index]
        return x[tuple(torch.tensor(i) if isinstance(i, (list, tuple)) else i for i in index)]

    compare(device, run, (3, 4))


# ---------------------------------------------------------------- random sampling


def test_multinomial(device):
    Tensor.manual_seed(3)
    weights = Tensor([[1.0, 0.0, 3.0, 4.0], [0.0, 0.0, 5.0, 0.0]], device=device)
    draws = weights.multinomial(400, replacement=True)
    assert draws.shape == (2, 400) and draws.dtype == torch_dtype_on_tiny(device)
    counts = np.stack([np.bincount(r, minlength=4) for r in draws.numpy()])
    assert counts[0, 1] == 0 and counts[1].tolist() == [0, 0, 400, 0]
    np.testing.assert_allclose(counts[0] / 400, [1 / 8, 0, 3 / 8, 4 / 8], atol=0.08)
    picked = weights[0].multinomial(3).numpy()
    assert picked.shape == (3,) and sorted(picked.tolist()) == [0, 2, 3]  # never repeats, never the zero weight
    with pytest.raises(ValueError, match="at most the 4"):
        weights.multinomial(5)
    with pytest.raises(ValueError, match="1-d or 2-d"):
        Tensor.ones(2, 2, 2, device=device).multinomial(1)


def test_randperm(device):
    Tensor.manual_seed(0)
    perm = Tensor.randperm(50, device=device)
    assert perm.dtype == torch_dtype_on_tiny(device) and sorted(perm.tolist()) == list(range(50))
    assert perm.tolist() != list(range(50))
    Tensor.manual_seed(0)
    assert Tensor.randperm(50, device=device).tolist() == perm.tolist()
    assert Tensor.randperm(0, device=device).shape == (0,)
    assert Tensor.randperm(4, dtype="float32", device=device, requires_grad=True).requires_grad
    with pytest.raises(ValueError, match="n >= 0"):
        Tensor.randperm(-1)


def torch_dtype_on_tiny(device: str):
    return dtypes.int64 if torch_dtype_on(device, np.dtype(np.int64)) == np.int64 else dtypes.int32
