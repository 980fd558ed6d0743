"""Reductions, scans and sorting against PyTorch: values, dtypes, indices, and the gradients of every input.

Float cases go through torch_compare.compare (forward and backward); integer and bool cases, indices and
empty tensors compare forward values and dtypes with `same`. Inputs stay at 64 elements or fewer, so that
the PYTHON emulator runs them quickly, and the cases are chosen so that few distinct kernels get compiled.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
from tensor_helpers import torch_dtype_on
from torch_compare import compare

from tiny.ir.uop import Ops
from tiny.tensor import Tensor, dtypes
from tiny.tensor import reduce as reduce_module

torch = pytest.importorskip("torch")

NAN, INF = float("nan"), float("inf")


def both(ours: Callable, theirs: Callable) -> Callable:
    """One function for compare(): `ours` on tiny tensors, `theirs` on torch tensors."""
    return lambda *xs: theirs(*xs) if isinstance(xs[0], torch.Tensor) else ours(*xs)


def same(device: str, ours: Callable, theirs: Callable, data: np.ndarray | list) -> None:
    """Forward values, shapes and dtypes of ours(tiny tensor) and theirs(torch tensor); ints exactly.
    Either may return a tuple of tensors (values, indices)."""
    arr = np.asarray(data)
    got, ref = ours(Tensor(arr, device=device)), theirs(torch.tensor(arr))
    outs, refs = (got, tuple(ref)) if isinstance(got, tuple) else ((got,), (ref,))
    assert len(outs) == len(refs)
    for o, r in zip(outs, refs):
        r = r.numpy()
        assert o.shape == r.shape, f"shape {o.shape}, torch has {r.shape}"
        assert o.numpy().dtype == torch_dtype_on(device, r.dtype), f"dtype {o.dtype.name}, torch has {r.dtype}"
        if r.dtype.kind == "f":
            np.testing.assert_allclose(o.numpy(), r, rtol=1e-5, atol=1e-6)
        else:
            np.testing.assert_array_equal(o.numpy(), r)


def kernels(t: Tensor) -> int:
    return len([i for i in t.schedule() if i.ast.op is Ops.SINK])


# ---------------------------------------------------------------- sum, prod, mean, var, std


@pytest.mark.parametrize(
    "axis, keepdim", [(None, False), (1, True), (-1, False), ((0, 2), True), ((-1, 0), False)], ids=str
)
def test_sum_prod_mean(device: str, axis, keepdim: bool) -> None:
    compare(device, lambda x: x.sum(axis, keepdim=keepdim), (3, 4, 2))
    if isinstance(axis, int):  # torch.prod takes one dim
        compare(device, lambda x: x.prod(axis, keepdim=keepdim), (3, 4, 2), low=0.5, high=1.5)
    else:
        compare(device, lambda x: x.mean(axis, keepdim=keepdim), (3, 4, 2))


def test_prod_of_all_and_of_axis_tuples(device: str) -> None:
    compare(device, lambda x: x.prod(), (3, 4, 2), low=0.5, high=1.5)
    compare(device, both(lambda x: x.prod((0, -1)), lambda x: x.prod(-1).prod(0)), (3, 4, 2), low=0.5)


def test_prod_gradient_with_zeros(device: str) -> None:
    """No zero: out/x. One zero: it gets the product of the rest, the others 0. Two zeros: all 0."""
    rows = [[1.5, 2.0, -3.0], [0.0, 2.0, 3.0], [0.0, 0.0, 3.0], [2.0, -1.0, 0.0], [0.0, 0.0, 0.0]]
    compare(device, lambda x: x.prod(1), data=[np.array(rows, dtype=np.float32)])
    compare(device, lambda x: x.prod(), data=[np.array([[2.0, 0.0], [3.0, 4.0]], dtype=np.float32)])


@pytest.mark.parametrize("dtype", ["int32", "uint8", "bool", "int64"])
def test_integer_sum_prod_are_int64(device: str, dtype: str) -> None:
    data = np.array([[1, 2, 0, 3], [4, 1, 1, 2], [3, 3, 1, 1]]).astype(dtype)
    same(device, lambda x: x.sum(1), lambda x: x.sum(1), data)
    same(device, lambda x: x.prod(0), lambda x: x.prod(0), data)


@pytest.mark.parametrize(
    "fn",
    [
        lambda x: x.var(1),
        lambda x: x.var((0, 2), correction=2, keepdim=True),
        lambda x: x.std(-1, False, True),  # torch's positional (dim, unbiased, keepdim)
        lambda x: x.var(correction=1.5),
    ],
    ids=["var", "var-correction2-tuple", "std-positional", "var-all"],
)
def test_var_std(device: str, fn: Callable) -> None:
    compare(device, fn, (3, 5, 2))


@pytest.mark.parametrize("i", [0, 1], ids=["var-or-std", "mean"])
def test_var_mean_std_mean(device: str, i: int) -> None:
    """torch has these as functions only; both results get their gradients checked."""
    compare(device, both(lambda x: x.var_mean(-1)[i], lambda x: torch.var_mean(x, -1)[i]), (4, 5))
    ours, theirs = (
        (lambda x: x.std_mean(0, correction=0, keepdim=True)[i]),
        (lambda x: torch.std_mean(x, 0, correction=0, keepdim=True)[i]),
    )
    compare(device, both(ours, theirs), (4, 5))


@pytest.mark.filterwarnings("ignore:var.*degrees of freedom")
def test_var_without_enough_elements(device: str) -> None:
    """torch divides by max(0, N - correction): one element gives NaN, too large a correction inf."""
    same(device, lambda x: x.var(0), lambda x: x.var(0), np.array([[1.0, 2.0]], dtype=np.float32))
    same(device, lambda x: x.var(correction=3), lambda x: x.var(correction=3), np.array([1.0, 2.0], np.float32))


# ---------------------------------------------------------------- max, min, argmax, argmin


@pytest.mark.parametrize(
    "fn",
    [
        lambda x: x.amax(),
        lambda x: x.amin(1),
        lambda x: x.amax(-1, keepdim=True),
        lambda x: x.amin((-1, 0), keepdim=True),
    ],
    ids=["max-all", "min-1", "max-neg-keepdim", "min-neg-tuple-keepdim"],
)
def test_max_min(device: str, fn: Callable) -> None:
    compare(device, fn, (3, 4, 2))


def test_max_is_amax(device: str) -> None:
    """tiny's max(axis) is torch.amax: the values only (argmax gives the indices)."""
    compare(device, both(lambda x: x.max(1, keepdim=True), lambda x: x.max(1, keepdim=True).values), (3, 4))
    compare(device, both(lambda x: x.min(-1), lambda x: x.min(-1).values), (3, 4))


def test_max_ties_and_nan(device: str) -> None:
    ties = np.array([[1.0, 3.0, 3.0], [2.0, 2.0, 2.0], [-1.0, -5.0, -5.0]], dtype=np.float32)
    compare(device, lambda x: x.amax(1), data=[ties])
    compare(device, lambda x: x.amin(1), data=[ties])
    nans = np.array([[1.0, NAN, 3.0], [NAN, NAN, 0.0], [-INF, 2.0, INF]], dtype=np.float32)
    same(device, lambda x: x.max(1), lambda x: x.amax(1), nans)
    same(device, lambda x: x.min(0), lambda x: x.amin(0), nans)


def test_max_of_integers(device: str) -> None:
    data = np.array([[3, -7, 3], [0, 0, -1]], dtype=np.int32)
    same(device, lambda x: x.max(1), lambda x: x.amax(1), data)
    same(device, lambda x: x.min(), lambda x: x.amin(), data)
    same(device, lambda x: x.max(0), lambda x: x.amax(0), np.array([[True, False], [False, False]]))


ARG_DATA = {
    "ties": np.array([[1.0, 5.0, 5.0, 2.0], [7.0, 7.0, 0.0, 7.0], [-3.0, -1.0, -3.0, -1.0]], dtype=np.float32),
    "nan-inf": np.array([[1.0, NAN, 5.0, NAN], [7.0, 7.0, 0.0, INF], [-INF, -INF, -INF, -INF]], dtype=np.float32),
    "int": np.array([[3, 1, 3], [0, 9, 9]], dtype=np.int32),
    "bool": np.array([[False, True, True], [False, False, False]]),
}


@pytest.mark.parametrize(
    "data, name, axis, keepdim",
    [
        ("ties", "argmax", 1, False),
        ("ties", "argmin", 0, True),
        ("ties", "argmax", -1, True),
        ("ties", "argmin", None, False),
        ("nan-inf", "argmax", 1, False),
        ("nan-inf", "argmin", None, False),
        ("int", "argmin", 0, True),
        ("int", "argmax", -1, True),
        ("bool", "argmax", 1, False),
        ("bool", "argmin", None, False),
    ],
)
def test_argmax_argmin_first_index(device: str, data: str, name: str, axis, keepdim: bool) -> None:
    data = ARG_DATA[data]
    ints = data.dtype == np.bool_  # torch has no argmax for bool: compare with it on ints
    ours = lambda x: getattr(x, name)(axis, keepdim)  # noqa: E731
    theirs = lambda x: getattr(x.int() if ints else x, name)(axis, keepdim)  # noqa: E731
    same(device, ours, theirs, data)


@pytest.mark.parametrize("seed", [16, 21, 24, 27, 34])
def test_argmax_of_a_fused_log_softmax(device: str, seed: int) -> None:
    """argmax compares its input, computed again in its own kernel, with the max: on the CPU, clang's contraction
    of x * w - log(sum) * ln2 in one kernel and not the other made every compare of a row miss, and argmax gave 4
    (past the end of the axis) for these seeds."""
    rng = np.random.default_rng(seed)
    x, w = rng.uniform(-1, 1, (1, 1, 4, 4)).astype(np.float32), rng.uniform(-1, 1, (1, 3, 1, 1)).astype(np.float32)
    got = (Tensor(x, device=device) * Tensor(w, device=device)).log_softmax(1).argmax(3).numpy()
    want = torch.tensor(x * w).log_softmax(1).argmax(3).numpy()
    np.testing.assert_array_equal(got, want)


def test_argmax_of_size_1_and_0_d(device: str) -> None:
    same(device, lambda x: x.argmax(1), lambda x: x.argmax(1), np.ones((3, 1), np.float32))
    same(device, lambda x: x.argmin(None, True), lambda x: x.argmin(None, True), np.ones((1, 2), np.float32))
    same(device, lambda x: x.argmax(), lambda x: x.argmax(), np.float32(2.0))


# ---------------------------------------------------------------- any, all


@pytest.mark.parametrize(
    "dtype, fn",
    [
        ("float32", lambda x: x.any()),
        ("float32", lambda x: x.all(-1, keepdim=True)),
        ("int32", lambda x: x.all()),
        ("int32", lambda x: x.any(1)),
        ("bool", lambda x: x.any(0)),
        ("bool", lambda x: x.all(1)),
    ],
    ids=["float-any", "float-all-neg-keepdim", "int-all", "int-any-1", "bool-any-0", "bool-all-1"],
)
def test_any_all(device: str, dtype: str, fn: Callable) -> None:
    same(device, fn, fn, np.array([[0, 0, 0], [1, 0, 2], [3, 1, 1]]).astype(dtype))


def test_any_all_of_nan_and_tuples(device: str) -> None:
    same(device, lambda x: x.all(), lambda x: x.all(), np.array([NAN, 1.0], dtype=np.float32))
    same(device, lambda x: x.any(), lambda x: x.any(), np.array([NAN, 0.0], dtype=np.float32))
    data = np.array([[[0, 1], [0, 0]], [[0, 0], [0, 0]]], dtype=np.int32)
    same(device, lambda x: x.any((0, 2)), lambda x: x.any((0, 2)), data)
    same(device, lambda x: x.all((1, -1), keepdim=True), lambda x: x.all((1, -1), keepdim=True), data)


# ---------------------------------------------------------------- logsumexp, softmax


@pytest.mark.parametrize(
    "fn",
    [
        lambda x: x.logsumexp(-1, keepdim=True),
        lambda x: x.logsumexp((0, 2)),
        both(lambda x: x.logsumexp(), lambda x: x.logsumexp((0, 1, 2))),
    ],
    ids=["neg-keepdim", "tuple", "all"],
)
def test_logsumexp(device: str, fn: Callable) -> None:
    compare(device, fn, (3, 4, 2))


def test_logsumexp_is_stable(device: str) -> None:
    big = np.array([[1000.0, 999.0, 1000.0], [-1000.0, -1001.0, -1000.0]], dtype=np.float32)
    compare(device, lambda x: x.logsumexp(1), data=[big])
    infs = np.array([[-INF, -INF], [INF, 0.0], [-INF, 1.0], [NAN, 1.0]], dtype=np.float32)
    same(device, lambda x: x.logsumexp(1), lambda x: x.logsumexp(1), infs)


@pytest.mark.parametrize("axis", [0, -1])
def test_softmax_log_softmax_three_kernels(device: str, axis: int) -> None:
    x = Tensor(np.random.default_rng(0).uniform(-3, 3, (4, 5, 3)).astype(np.float32), device=device)
    assert kernels(x.softmax(axis)) <= 3
    assert kernels(x.log_softmax(axis)) <= 3
    compare(device, lambda x: x.softmax(axis) if axis == 0 else x.log_softmax(axis), (4, 5, 3))


def test_softmax_with_infinities(device: str) -> None:
    data = np.array([[-INF, 0.0, 1.0], [-INF, -INF, 2.0]], dtype=np.float32)
    compare(device, lambda x: x.softmax(-1), data=[data])
    same(device, lambda x: x.log_softmax(-1), lambda x: x.log_softmax(-1), data)
    same(device, lambda x: x.softmax(1, dtype=dtypes.float32), lambda x: x.softmax(1, dtype=torch.float32), [[1, 2]])


# ---------------------------------------------------------------- cumsum, cumprod, cummax, cummin


@pytest.mark.parametrize("axis", [0, -1])
def test_cumsum_cumprod(device: str, axis: int) -> None:
    compare(device, lambda x: x.cumsum(axis), (3, 4, 2))
    compare(device, lambda x: x.cumprod(axis), (3, 4, 2), low=0.5, high=1.5)


def test_cumsum_is_one_kernel(device: str) -> None:
    x = Tensor(np.ones((4, 16), np.float32), device=device)
    assert kernels(x.cumsum(1)) == 1
    assert kernels(x.cumsum(0) * 2 + 1) == 1  # the scan fuses with its epilogue


def test_cumprod_gradient_with_zeros(device: str) -> None:
    data = np.array([[2.0, 0.0, 3.0, 4.0], [0.0, 1.5, 0.0, 2.0], [1.0, 2.0, -1.0, 0.0]], dtype=np.float32)
    compare(device, lambda x: x.cumprod(1), data=[data])
    compare(device, lambda x: x.cumprod(0), data=[data])


@pytest.mark.parametrize("dtype", ["int32", "bool", "uint8"])
def test_integer_scans_are_int64(device: str, dtype: str) -> None:
    data = np.array([[1, 2, 0, 3], [1, 1, 1, 2]]).astype(dtype)
    same(device, lambda x: x.cumsum(1), lambda x: x.cumsum(1), data)
    same(device, lambda x: x.cumprod(-1), lambda x: x.cumprod(-1), data)


def test_long_scans_run_in_blocks(device: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Axes longer than SCAN_DIRECT_MAX scan blocks of about sqrt(n). With it lowered these take that path:
    blocks that divide the axis (30 = 5 * 6), that do not (29, padded), and blocks of blocks (50)."""
    monkeypatch.setattr(reduce_module, "SCAN_DIRECT_MAX", 8)
    compare(device, lambda x: x.cumsum(0), (29,))
    data = np.random.default_rng(0).uniform(0.8, 1.2, (2, 30)).astype(np.float32)
    same(device, lambda x: x.cumprod(-1), lambda x: x.cumprod(-1), data)
    data = np.array([1.0, 3.0, 2.0, 3.0, NAN, 1.0, 7.0, 2.0, 9.0, 9.0, 0.0], dtype=np.float32)
    same(device, lambda x: x.cummax(0), lambda x: x.cummax(0), data)
    monkeypatch.setattr(reduce_module, "SCAN_DIRECT_MAX", 4)
    same(device, lambda x: x.cumsum(0), lambda x: x.cumsum(0), np.arange(-20, 30, dtype=np.int32))


CUM_DATA = np.array([[1.0, 3.0, 3.0, 2.0, 5.0], [4.0, 4.0, 1.0, 4.0, 0.0], [2.0, -1.0, 2.0, 2.0, -3.0]], np.float32)


@pytest.mark.parametrize("name, axis", [("cummax", 1), ("cummin", 0)])
def test_cummax_cummin(device: str, name: str, axis: int) -> None:
    """Ties: the index (and the gradient) goes to the last element equal to the running max, as in torch."""
    compare(device, lambda x: getattr(x, name)(axis).values, data=[CUM_DATA])
    same(device, lambda x: getattr(x, name)(axis), lambda x: getattr(x, name)(axis), CUM_DATA)


@pytest.mark.parametrize("name", ["cummax", "cummin"])
def test_cummax_cummin_nan(device: str, name: str) -> None:
    nans = np.array([[1.0, NAN, 2.0, NAN, 0.0], [-INF, 3.0, INF, 1.0, NAN]], dtype=np.float32)
    same(device, lambda x: getattr(x, name)(-1), lambda x: getattr(x, name)(-1), nans)


def test_cummax_cummin_ints(device: str) -> None:
    ints = np.array([[3, 1, 3, 4], [-2, -2, -5, 0]], dtype=np.int32)
    same(device, lambda x: x.cummin(-1), lambda x: x.cummin(-1), ints)
    same(device, lambda x: x.cummax(0), lambda x: x.cummax(0), np.array([False, True, False]))


# ---------------------------------------------------------------- sort, argsort, topk

SORT_DATA = {
    "ties": np.array([[3.0, 1.0, 2.0, 1.0, 3.0], [0.0, -1.0, 5.0, -1.0, -1.0], [2.0, 2.0, 2.0, 2.0, 2.0]], np.float32),
    "nan-inf": np.array([[NAN, 1.0, -INF, NAN, 0.0], [INF, NAN, 1.0, 1.0, -0.0]], np.float32),
    "int": np.array([[5, -3, 5, 0], [1, 1, -8, 1]], np.int32),
    "bool": np.array([[True, False, True, False]]),
}


@pytest.mark.parametrize("data", SORT_DATA.values(), ids=SORT_DATA.keys())
@pytest.mark.parametrize("descending", [False, True])
@pytest.mark.parametrize("axis", [-1])
def test_sort_is_stable(device: str, data: np.ndarray, descending: bool, axis: int) -> None:
    theirs = lambda x: x.sort(stable=True, dim=axis, descending=descending)  # noqa: E731
    same(device, lambda x: x.sort(axis, descending), theirs, data)
    same(device, lambda x: x.argsort(axis, descending), lambda x: theirs(x).indices, data)


def test_sort_along_axis_0(device: str) -> None:
    data = SORT_DATA["ties"]
    same(device, lambda x: x.sort(0, True), lambda x: x.sort(stable=True, dim=0, descending=True), data)
    same(device, lambda x: x.argsort(0), lambda x: x.argsort(stable=True, dim=0), data)


def test_sort_gradient(device: str) -> None:
    compare(device, lambda x: x.sort(1)[0], (3, 6))
    compare(device, lambda x: x.sort(0, descending=True)[0], (4, 3, 2))
    compare(device, both(lambda x: x.sort(1)[0], lambda x: x.sort(stable=True, dim=1)[0]), data=[SORT_DATA["ties"]])


NO_TIES = np.array([[3.0, -1.0, 2.5, 7.0, 0.0], [0.5, 4.0, -2.0, 1.0, 9.0], [6.0, 5.0, -3.0, 2.0, 1.5]], np.float32)


@pytest.mark.parametrize("k, axis, largest", [(2, -1, True), (1, 0, False), (5, 1, False), (0, 1, True)], ids=str)
def test_topk(device: str, largest: bool, k: int, axis: int) -> None:
    compare(device, lambda x: x.topk(k, axis, largest)[0], data=[NO_TIES])
    same(device, lambda x: x.topk(k, axis, largest), lambda x: x.topk(k, axis, largest), NO_TIES)


def test_topk_of_ints_ties_and_nan(device: str) -> None:
    """torch leaves the order of tied indices open: compare the values, and that the indices point at them."""
    ints = np.array([[7, 3, 9, 1], [2, 8, 4, 6]], dtype=np.int32)
    same(device, lambda x: x.topk(3, largest=False), lambda x: x.topk(3, largest=False), ints)
    data = np.array([[2.0, 5.0, 2.0, 5.0, NAN], [1.0, 1.0, 1.0, 0.0, 1.0]], np.float32)
    values, indices = Tensor(data, device=device).topk(3)
    ref = torch.tensor(data).topk(3)
    np.testing.assert_array_equal(values.numpy(), ref.values.numpy())
    np.testing.assert_array_equal(np.take_along_axis(data, indices.numpy(), 1), ref.values.numpy())


# ---------------------------------------------------------------- size-0, size-1 and 0-d


@pytest.mark.filterwarnings("ignore:var.*degrees of freedom")
def test_empty_reductions(device: str) -> None:
    empty = np.zeros((0, 3), np.float32)
    for fn in (
        lambda x: x.sum(0),
        lambda x: x.prod(0),
        lambda x: x.mean(0),
        lambda x: x.var(0),
        lambda x: x.any(0),
        lambda x: x.all(0),
        lambda x: x.logsumexp(0),
        lambda x: x.sum(1),
        lambda x: x.amax(1),
        lambda x: x.argmax(1),
        lambda x: x.cumsum(0),
        lambda x: x.cumprod(1),
        lambda x: x.softmax(0),
        lambda x: x.sort(0),
        lambda x: x.topk(0, 0),
    ):
        same(device, fn, fn, empty)
    same(device, lambda x: x.cummax(0), lambda x: x.cummax(0), empty)
    same(device, lambda x: x.sum(), lambda x: x.sum(), np.zeros((2, 0), np.int32))


def test_empty_without_identity_raises(device: str) -> None:
    x = Tensor(np.zeros((0, 3), np.float32), device=device)
    for fn in (x.max, x.amin, x.argmax, x.argmin):
        with pytest.raises(ValueError, match="empty"):
            fn(0)
    with pytest.raises(ValueError, match="empty"):
        x.argmax()


@pytest.mark.parametrize(
    "fn",
    [
        both(lambda x: x.prod((0, 2)), lambda x: x.prod(2).prod(0)),
        lambda x: x.var(1, keepdim=True),
        lambda x: x.cumsum(2),
        lambda x: x.sort(0)[0],
    ],
    ids=["prod", "var", "cumsum", "sort"],
)
def test_size_1_dims(device: str, fn: Callable) -> None:
    compare(device, fn, (1, 5, 1))


def test_zero_dim_tensors(device: str) -> None:
    scalar = np.float32(1.5)
    for fn in (
        lambda x: x.sum(),
        lambda x: x.prod(0),
        lambda x: x.amax(-1),
        lambda x: x.argmin(0),
        lambda x: x.cumsum(0),
        lambda x: x.any(),
        lambda x: x.logsumexp(0),
        lambda x: x.sort(),
        lambda x: x.topk(1, 0),
    ):
        same(device, fn, fn, scalar)
    same(device, lambda x: x.cummax(0), lambda x: x.cummax(0), scalar)


# ---------------------------------------------------------------- errors at the call


@pytest.mark.parametrize(
    "op",
    [
        lambda t: t.prod(2),
        lambda t: t.argmax(-3),
        lambda t: t.argmin(2),
        lambda t: t.any(5),
        lambda t: t.var(2),
        lambda t: t.logsumexp((0, 3)),
        lambda t: t.cumsum(2),
        lambda t: t.cummax(-3),
        lambda t: t.sort(2),
        lambda t: t.topk(1, 3),
    ],
)
def test_axis_out_of_range(op: Callable) -> None:
    with pytest.raises(IndexError, match="out of range"):
        op(Tensor.ones(2, 3))


def test_bad_arguments() -> None:
    x = Tensor.ones(2, 3)
    with pytest.raises(ValueError, match=r"topk\(\).*\[0, 3\]"):
        x.topk(4)
    with pytest.raises(ValueError, match="topk"):
        x.topk(-1)
    with pytest.raises(TypeError, match="one int axis"):
        x.argmax((0, 1))
    with pytest.raises(TypeError, match="one int axis"):
        x.cumsum((0, 1))
    with pytest.raises(TypeError, match="float"):
        Tensor([1, 2]).var()
    with pytest.raises(ValueError, match="either unbiased or correction"):
        x.std(0, unbiased=True, correction=1)
