"""Making tensors, reading them back, moving them between devices, random numbers, and what realize() runs."""

from __future__ import annotations

import math

import numpy as np
import pytest
from tensor_helpers import assert_matches, np_dtype, open_device, round_bf16, small

from tiny.tensor import Device, GlobalCounters, Tensor, dtypes
from tiny.tensor.checks import default_int, on_device

F32, I64, BOOL = dtypes.float32, dtypes.int64, dtypes.bool
ALL_DTYPES = list(dtypes.all())


# ---------------------------------------------------------------- creation


@pytest.mark.parametrize(
    "value,dtype,pyt",
    [(3, I64, int), (-2, I64, int), (2.5, F32, float), (True, BOOL, bool), (False, BOOL, bool)],
)
def test_from_python_scalar(device, value, dtype, pyt):
    t = Tensor(value, device=device)
    dtype = on_device(dtype, device)  # Python ints are int64, or int32 on a device without int64
    assert t.shape == () and t.ndim == 0 and t.numel() == 1
    assert t.dtype == dtype and t.device == device
    item = t.item()
    assert type(item) is pyt and item == value
    assert t.tolist() == value
    assert t.numpy().shape == () and t.numpy().dtype == np_dtype(dtype)


@pytest.mark.parametrize(
    "data,dtype",
    [
        ([1, 2, 3], I64),
        ([[1, 2], [3, 4]], I64),
        ([1.0, 2, 3], F32),
        ([[True, False]], BOOL),
        ([True, 2], I64),
        ([[[0.5]]], F32),
        ([], F32),
        ([[], []], F32),
        ((1, 2), I64),
    ],
)
def test_from_lists(device, data, dtype):
    t = Tensor(data, device=device)
    ref, dtype = np.array(data), on_device(dtype, device)
    assert t.dtype == dtype and t.shape == ref.shape
    assert t.tolist() == ref.astype(np_dtype(dtype)).tolist()
    assert_matches(t, ref, dtype)


def test_from_list_of_numpy_scalars(device):
    # what list(array) and [arr.max(), arr.min()] give: NumPy scalars, which torch.tensor takes like numbers
    arr = np.array([1.5, -2.0, 3.25], dtype=np.float32)
    t = Tensor(list(arr), device=device)
    assert t.dtype == F32
    assert_matches(t, arr, F32)
    i = Tensor([np.int64(3), np.int64(-4)], device=device)
    assert i.dtype == default_int(device) and i.tolist() == [3, -4]
    assert Tensor([np.bool_(True), np.bool_(False)], device=device).tolist() == [True, False]


@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=[d.name for d in ALL_DTYPES])
def test_from_list_with_dtype(device, dtype):
    if dtype not in Device[device].renderer.caps.dtypes:
        pytest.skip(f"{device} does not compute in {dtype.name}")
    if dtype.is_bool:
        data = [[True, False, True], [False, False, True]]
    elif dtype.is_unsigned:
        data = [[0, 1, 7], [dtype.max, 100, 2]]
    elif dtype.is_int:
        data = [[0, -1, 7], [dtype.min, dtype.max, -100]]
    else:
        data = [[0.0, -1.5, 3.25], [1e-3, 100.0, -7.0]]
    t = Tensor(data, device=device, dtype=dtype)
    assert t.dtype == dtype and t.shape == (2, 3)
    want = round_bf16(np.array(data, dtype=np.float32)) if dtype == dtypes.bfloat16 else np.array(data, np_dtype(dtype))
    # exact where the dtype holds the value, else within the dtype's precision (bfloat16: 8 bits of mantissa)
    assert_matches(t, want, dtype, rtol=0 if dtype != dtypes.float16 else 1e-3, atol=0)
    assert t.dtype.name == dtype.name


NUMPY_DTYPES = [d for d in ALL_DTYPES if d != dtypes.bfloat16]  # NumPy has no bfloat16


@pytest.mark.parametrize("dtype", NUMPY_DTYPES, ids=[d.name for d in NUMPY_DTYPES])
def test_from_numpy(device, dtype):
    if dtype not in Device[device].renderer.caps.dtypes:
        pytest.skip(f"{device} does not compute in {dtype.name}")
    rng = np.random.default_rng(1)
    arr = rng.integers(0, 100, (3, 4)) if not dtype.is_bool else rng.random((3, 4)) < 0.5
    arr = arr.astype(np_dtype(dtype))
    t = Tensor(arr, device=device)  # the dtype comes from the array
    assert t.dtype == dtype and t.shape == (3, 4)
    np.testing.assert_array_equal(t.numpy(), arr)
    assert t.numpy().dtype == arr.dtype
    # non-contiguous arrays and 0-d arrays
    np.testing.assert_array_equal(Tensor(arr.T, device=device).numpy(), arr.T)
    np.testing.assert_array_equal(Tensor(arr[::2, ::-1], device=device).numpy(), arr[::2, ::-1])
    np.testing.assert_array_equal(Tensor(arr[1, 1], device=device).numpy(), arr[1, 1])
    # the tensor owns a copy: changing the array afterwards changes nothing
    before = arr.copy()
    arr[...] = 0
    np.testing.assert_array_equal(t.numpy(), before)


def test_numpy_with_dtype_converts(device):
    arr = np.array([[1.7, -2.2], [300.0, 0.0]])
    t = Tensor(arr, device=device, dtype=dtypes.int32)
    assert t.dtype == dtypes.int32
    np.testing.assert_array_equal(t.numpy(), arr.astype(np.int32))
    t = Tensor(np.array([1, 2], dtype=np.int8), device=device, dtype=F32)
    assert_matches(t, np.array([1.0, 2.0]), F32)


@pytest.mark.parametrize("dtype", [dtypes.bfloat16], ids=["bfloat16"])
def test_bfloat16_round_trip(device, dtype):
    if dtype not in Device[device].renderer.caps.dtypes:
        pytest.skip(f"{device} does not compute in bfloat16")
    vals = np.random.default_rng(2).uniform(-100, 100, (4, 8)).astype(np.float32)
    vals[0, :6] = [0.0, 1.0, -1.0, 3.0e38, np.inf, -np.inf]
    t = Tensor(vals, device=device, dtype=dtype)
    got = t.numpy()
    assert got.dtype == np.float32 and t.dtype == dtype
    np.testing.assert_allclose(got, vals, rtol=2**-8, atol=0)
    np.testing.assert_array_equal(got, round_bf16(vals))  # rounded to nearest even, like torch
    assert math.isnan(Tensor([math.nan], device=device, dtype=dtype).item())
    # computing in bfloat16 and back
    assert_matches((t * 2).cast(F32), round_bf16(vals).astype(np.float64) * 2, F32, rtol=2**-7, atol=0)
    assert_matches(Tensor(vals, device=device).cast(dtype), round_bf16(vals), dtype, rtol=0, atol=0)


def test_tolist_and_item(device):
    t = Tensor([[1, 2], [3, 4]], device=device)
    assert t.tolist() == [[1, 2], [3, 4]]
    assert all(type(v) is int for row in t.tolist() for v in row)
    assert Tensor([[0.5]], device=device).item() == 0.5
    assert type(Tensor([[0.5]], device=device).item()) is float
    assert Tensor([7], device=device, dtype=dtypes.uint8).item() == 7
    assert (Tensor([1.0, 2.0], device=device).sum()).item() == 3.0
    assert Tensor([True, False], device=device).tolist() == [True, False]
    assert Tensor.zeros(0, 2, device=device).tolist() == []
    assert Tensor.ones(2, 0, device=device).tolist() == [[], []]


def test_properties_and_repr(device):
    t = Tensor.zeros(2, 3, 4, device=device)
    assert (t.shape, t.ndim, t.numel(), len(t), t.dtype, t.device) == ((2, 3, 4), 3, 24, 2, F32, device)
    r = repr(t)
    assert "(2, 3, 4)" in r and "float32" in r and device in r


def test_tensor_of_tensor(device):
    t = Tensor([1.5, 2.5], device=device)
    u = Tensor(t, dtype=dtypes.int32, device=device)
    assert u.dtype == dtypes.int32 and u.tolist() == [1, 2]
    assert Tensor(t, device="NULL").device == "NULL"


# ---------------------------------------------------------------- creation functions


def test_zeros_ones_full(device):
    for make, fill in ((Tensor.zeros, 0.0), (Tensor.ones, 1.0)):
        for t in (make(2, 3, device=device), make((2, 3), device=device), make([2, 3], device=device)):
            assert t.dtype == F32 and t.device == device
            assert_matches(t, np.full((2, 3), fill), F32)
        assert_matches(make(3, dtype=dtypes.int8, device=device), np.full(3, fill), dtypes.int8)
        assert_matches(make(0, 4, device=device), np.zeros((0, 4)), F32)
        assert_matches(make(device=device), np.array(fill), F32)
    assert_matches(Tensor.full((2, 2), 7, device=device), np.full((2, 2), 7), I64)
    assert_matches(Tensor.full((2, 2), 7.5, device=device), np.full((2, 2), 7.5), F32)
    assert_matches(Tensor.full(3, True, device=device), np.full(3, True), BOOL)
    assert_matches(Tensor.full((2,), -1, dtype=dtypes.uint8, device=device), np.full(2, 255), dtypes.uint8)
    assert_matches(Tensor.full((2,), math.inf, device=device), np.full(2, np.inf), F32)
    assert_matches(Tensor.full((1, 2), 2.5, dtype="float16", device=device), np.full((1, 2), 2.5), dtypes.float16)


def test_like_constructors(device):
    x = Tensor([[1, 2, 3]], device=device, dtype=dtypes.int16)
    for t, fill in ((x.zeros_like(), 0), (x.ones_like(), 1), (x.full_like(9), 9)):
        assert t.shape == x.shape and t.device == device
        assert_matches(t, np.full((1, 3), fill), dtypes.int16)
    assert_matches(x.full_like(0.5, dtype=F32), np.full((1, 3), 0.5), F32)
    assert_matches(x.zeros_like(dtype="bool"), np.zeros((1, 3), dtype=bool), BOOL)


@pytest.mark.parametrize(
    "args,kwargs,ref,dtype",
    [
        ((5,), {}, np.arange(5), I64),
        ((2, 10, 3), {}, np.arange(2, 10, 3), I64),
        ((5, 0, -1), {}, np.arange(5, 0, -1), I64),
        ((-3, 3), {}, np.arange(-3, 3), I64),
        ((0,), {}, np.arange(0), I64),
        ((5, 5), {}, np.arange(5, 5), I64),  # (arange(5, 2) is an error, as in PyTorch: see test_creation)
        ((0, 1, 0.25), {}, np.arange(0, 1, 0.25), F32),
        ((1.5,), {}, np.arange(1.5), F32),
        ((-1.0, 1.0, 0.3), {}, np.arange(-1.0, 1.0, 0.3), F32),
        ((4,), {"dtype": dtypes.int32}, np.arange(4), dtypes.int32),
        ((4,), {"dtype": "float32"}, np.arange(4), F32),
        ((10, 0, -3), {"dtype": dtypes.int8}, np.arange(10, 0, -3), dtypes.int8),
    ],
)
def test_arange(device, args, kwargs, ref, dtype):
    t = Tensor.arange(*args, device=device, **kwargs)
    assert t.device == device
    assert_matches(t, ref, dtype, atol=1e-6)


def test_eye(device):
    assert_matches(Tensor.eye(3, device=device), np.eye(3), F32)
    assert_matches(Tensor.eye(2, 4, device=device), np.eye(2, 4), F32)
    assert_matches(Tensor.eye(4, 2, device=device), np.eye(4, 2), F32)
    assert_matches(Tensor.eye(3, dtype=dtypes.int32, device=device), np.eye(3), dtypes.int32)
    assert_matches(Tensor.eye(2, dtype=BOOL, device=device), np.eye(2, dtype=bool), BOOL)
    assert_matches(Tensor.eye(0, device=device), np.eye(0), F32)
    assert_matches(Tensor.eye(1, device=device), np.eye(1), F32)


# ---------------------------------------------------------------- moving between devices


def test_to_and_back(device, python_device):
    other = "CPU" if device != "CPU" else python_device
    open_device(other)
    arr = np.arange(12, dtype=np.float32).reshape(3, 4)
    t = Tensor(arr, device=device)
    assert t.to(device) is t
    GlobalCounters.reset()
    moved = t.to(other)
    assert moved.device == other and moved.dtype == F32 and moved.shape == (3, 4)
    np.testing.assert_array_equal(moved.numpy(), arr)
    assert GlobalCounters.copies == 1
    back = (moved * 2).to(device)
    assert back.device == device
    np.testing.assert_array_equal(back.numpy(), arr * 2)
    # a lazy view and an int dtype travel too
    i = Tensor(np.arange(6, dtype=np.int8).reshape(2, 3), device=device)
    np.testing.assert_array_equal(i.T.flip(0).to(other).numpy(), np.arange(6, dtype=np.int8).reshape(2, 3).T[::-1])
    assert Tensor([True, False], device=device).to(other).tolist() == [True, False]
    # a moved tensor computes on its new device with tensors that live there
    out = moved + Tensor.ones(3, 4, device=other)
    np.testing.assert_array_equal(out.numpy(), arr + 1)


def test_to_null_computes_nothing(device):
    t = Tensor([[1.0, 2.0]], device=device)
    n = t.to("NULL")
    assert n.device == "NULL" and n.shape == (1, 2) and n.dtype == F32
    out = (n * 3 + 1).sum(1)
    assert out.shape == (1,) and out.device == "NULL"
    np.testing.assert_array_equal(out.numpy(), np.zeros(1, dtype=np.float32))  # NULL buffers read as zeros
    assert Tensor([5, 6], device="NULL").to(device).tolist() == [0, 0]


def test_to_canonicalizes_names(device):
    t = Tensor([1.0], device="cpu")
    assert t.device == "CPU"
    assert t.to("CPU") is t
    assert Tensor([1.0], device="null").device == "NULL"


# ---------------------------------------------------------------- random numbers


def test_rand_statistics(device):
    n = small(device, 10_000, 2048)
    Tensor.manual_seed(1234)
    u = Tensor.rand(n, device=device)
    assert u.shape == (n,) and u.dtype == F32 and u.device == device
    x = u.numpy().astype(np.float64)
    assert x.min() >= 0.0 and x.max() < 1.0
    se = 1 / math.sqrt(n)
    assert abs(x.mean() - 0.5) < 5 * se * math.sqrt(1 / 12), x.mean()
    assert abs(x.std() - math.sqrt(1 / 12)) < 0.02, x.std()
    # every tenth of [0, 1) gets its share
    counts = np.histogram(x, bins=10, range=(0, 1))[0]
    assert counts.min() > n / 10 * 0.75, counts
    assert len(np.unique(x)) > n * 0.99


def test_randn_statistics(device):
    n = small(device, 10_000, 2048)
    Tensor.manual_seed(99)
    g = Tensor.randn(n, device=device)
    assert g.shape == (n,) and g.dtype == F32
    x = g.numpy().astype(np.float64)
    assert np.isfinite(x).all()
    assert abs(x.mean()) < 5 / math.sqrt(n), x.mean()
    assert abs(x.std() - 1) < 0.05, x.std()
    assert 0.60 < np.mean(np.abs(x) < 1) < 0.76  # 68.3% within one sigma
    assert np.abs(x).max() < 6


def test_rand_shapes_and_dtypes(device):
    Tensor.manual_seed(0)
    assert Tensor.rand(2, 3, device=device).shape == (2, 3)
    assert Tensor.rand((2, 3), device=device).shape == (2, 3)
    assert Tensor.rand(0, device=device).numpy().shape == (0,)
    h = Tensor.randn(4, 4, dtype=dtypes.float16, device=device)
    assert h.dtype == dtypes.float16 and np.isfinite(h.numpy()).all()
    r = Tensor.rand(8, dtype=dtypes.float16, device=device).numpy()
    assert r.dtype == np.float16 and (r >= 0).all() and (r <= 1).all()


def test_manual_seed_reproducible(device):
    shape = small(device, (16, 17), (4, 5))
    Tensor.manual_seed(42)
    a1, b1 = Tensor.rand(*shape, device=device).numpy(), Tensor.randn(*shape, device=device).numpy()
    Tensor.manual_seed(42)
    a2, b2 = Tensor.rand(*shape, device=device).numpy(), Tensor.randn(*shape, device=device).numpy()
    np.testing.assert_array_equal(a1, a2)
    np.testing.assert_array_equal(b1, b2)
    # the next call, and another seed, give other numbers
    assert not np.array_equal(Tensor.rand(*shape, device=device).numpy(), a1)
    Tensor.manual_seed(43)
    assert not np.array_equal(Tensor.rand(*shape, device=device).numpy(), a1)


def test_same_random_numbers_on_cpu_and_python(python_device):
    cpu = open_device("CPU")
    out = {}
    for dev in (cpu, python_device):
        Tensor.manual_seed(7)
        out[dev] = (Tensor.rand(5, 7, device=dev).numpy(), Tensor.randn(3, 4, device=dev).numpy())
    np.testing.assert_array_equal(out[cpu][0], out[python_device][0])
    np.testing.assert_allclose(out[cpu][1], out[python_device][1], rtol=1e-5, atol=1e-6)


# ---------------------------------------------------------------- realize


def test_realize_twice_is_a_no_op(device):
    x = Tensor(np.arange(6, dtype=np.float32), device=device)
    y = (x * 2 + 1).exp2()
    GlobalCounters.reset()
    assert y.realize() is y
    assert GlobalCounters.kernels == 1
    first = y.numpy()
    assert y.realize() is y
    assert y.realize(y) is y
    assert GlobalCounters.kernels == 1
    np.testing.assert_array_equal(y.numpy(), first)
    assert GlobalCounters.kernels == 1


def test_realized_tensor_is_not_recomputed(device):
    x = Tensor(np.arange(12, dtype=np.float32).reshape(3, 4), device=device)
    y = (x * x).sum(1)
    GlobalCounters.reset()
    y.numpy()
    assert GlobalCounters.kernels == 1
    # y is used again in two new computations: only their own kernels run
    z = y + 1
    w = y * y
    z.realize()
    w.realize()
    assert GlobalCounters.kernels == 3
    np.testing.assert_array_equal(z.numpy(), (np.arange(12).reshape(3, 4) ** 2).sum(1) + 1)
    assert GlobalCounters.kernels == 3


def test_shared_subexpression_realized_through_another_tensor(device):
    x = Tensor(np.arange(4, dtype=np.float32), device=device)
    y = x.exp()
    z = y + 1
    GlobalCounters.reset()
    y.realize()
    z.realize()  # uses y's buffer, not a second exp
    z2 = (y + 1).schedule()
    assert len(z2) == 1
    np.testing.assert_allclose(z.numpy(), np.exp(np.arange(4)) + 1, rtol=1e-6)
    assert GlobalCounters.kernels == 2


def test_realize_several_at_once(device):
    x = Tensor(np.arange(4, dtype=np.float32), device=device)
    a, b = x + 1, x * 2
    GlobalCounters.reset()
    a.realize(b)
    kernels = GlobalCounters.kernels
    assert 1 <= kernels <= 2
    np.testing.assert_array_equal(a.numpy(), np.arange(4) + 1)
    np.testing.assert_array_equal(b.numpy(), np.arange(4) * 2)
    assert GlobalCounters.kernels == kernels


def test_schedule_does_not_run(device):
    x = Tensor(np.arange(4, dtype=np.float32), device=device)
    y = x + 1
    GlobalCounters.reset()
    items = y.schedule()
    assert len(items) == 1 and GlobalCounters.kernels == 0
    y.realize()
    assert GlobalCounters.kernels == 1
