"""Zero-copy interop: Tensor.from_blob over memory the caller owns, and DLPack both ways with NumPy and PyTorch on the
CPU (values, no copy in either direction, lifetimes, strided producers, the errors). CUDA: where a GPU is present."""

from __future__ import annotations

import ctypes
import gc

import numpy as np
import pytest
import torch

from tiny.ir.device import Buffer, Device, DeviceUnavailable, UnknownDevice
from tiny.tensor import Tensor, dtypes

SHAPES = [(), (0,), (2, 0, 3), (5,), (2, 3, 4)]
NP_DTYPES = ["float16", "float32", "float64", "int8", "int16", "int32", "int64", "uint8", "bool"]
TORCH_DTYPES = [torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.int8, torch.int32, torch.int64,
                torch.uint8, torch.bool]  # fmt: skip


def _values(shape: tuple[int, ...], dtype: str) -> np.ndarray:
    values = np.arange(int(np.prod(shape)), dtype=np.int64).reshape(shape) * 3 - 7
    return np.asarray((values % 2 == 0) if dtype == "bool" else values.astype(dtype))


def _capsule_named(capsule: object, name: bytes) -> bool:
    is_valid = ctypes.pythonapi.PyCapsule_IsValid
    is_valid.restype, is_valid.argtypes = ctypes.c_int, [ctypes.py_object, ctypes.c_char_p]
    return bool(is_valid(capsule, name))


# ---------------------------------------------------------------- round trips


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype", NP_DTYPES)
def test_numpy_round_trip(dtype: str, shape: tuple[int, ...]) -> None:
    arr = _values(shape, dtype)
    t = Tensor.from_dlpack(arr)
    assert (t.shape, t.dtype) == (shape, getattr(dtypes, dtype))
    np.testing.assert_array_equal(t.numpy(), arr)
    back = np.from_dlpack(Tensor(arr, device="CPU"))
    assert (back.shape, back.dtype) == (shape, arr.dtype)
    np.testing.assert_array_equal(back, arr)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype", TORCH_DTYPES, ids=str)
def test_torch_round_trip(dtype: torch.dtype, shape: tuple[int, ...]) -> None:
    src = torch.from_numpy(_values(shape, "int64")).to(dtype)
    t = Tensor.from_dlpack(src)
    assert t.shape == shape and t.dtype.name == str(dtype).removeprefix("torch.")
    back = torch.from_dlpack(t)
    assert back.dtype == dtype and tuple(back.shape) == shape
    assert torch.equal(back, src)
    assert torch.equal(torch.from_dlpack(Tensor.from_dlpack(back)), src)


def test_lazy_tensor_is_realized_and_strided_tensor_exported_as_contiguous_copy() -> None:
    base = Tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]], device="CPU").realize()
    np.testing.assert_array_equal(np.from_dlpack(base * 2), [[2, 4, 6], [8, 10, 12]])
    transposed = base.permute(1, 0)
    out = torch.from_dlpack(transposed)
    assert out.is_contiguous() and out.tolist() == [[1, 4], [2, 5], [3, 6]]
    out[0, 0] = 9.0  # the copy is the transposed tensor's memory now, not base's
    assert transposed.tolist()[0][0] == 9.0 and base.tolist()[0][0] == 1.0


def test_dlpack_device_and_capsule_versions() -> None:
    t = Tensor([1, 2, 3], device="CPU").realize()
    assert t.__dlpack_device__() == (1, 0)
    old, new = t.__dlpack__(), t.__dlpack__(max_version=(1, 2))
    assert _capsule_named(old, b"dltensor") and _capsule_named(new, b"dltensor_versioned")
    assert torch.from_dlpack(old).tolist() == [1, 2, 3]
    assert _capsule_named(old, b"used_dltensor")  # renamed by the consumer, per the protocol
    assert Tensor.from_dlpack(np.arange(3)).tolist() == [0, 1, 2]


def test_consumed_capsule_is_renamed_and_refused_again() -> None:
    class Producer:  # hands out one capsule, twice
        def __init__(self) -> None:
            self.capsule = np.arange(3.0).__dlpack__()

        def __dlpack__(self, stream: object = None) -> object:
            return self.capsule

    producer = Producer()
    assert Tensor.from_dlpack(producer).tolist() == [0.0, 1.0, 2.0]
    assert _capsule_named(producer.capsule, b"used_dltensor")
    with pytest.raises(TypeError, match="already consumed is named 'used_dltensor'"):
        Tensor.from_dlpack(producer)


# ---------------------------------------------------------------- no copy, both directions


def test_numpy_producer_shares_memory() -> None:
    arr = np.zeros((2, 3), dtype=np.float32)
    t = Tensor.from_dlpack(arr)
    arr[1, 2] = 5.0  # NumPy writes, tiny reads
    assert t.numpy()[1, 2] == 5.0
    t.assign(t + 1).realize()  # tiny writes, NumPy reads
    np.testing.assert_array_equal(arr, [[1, 1, 1], [1, 1, 6]])


def test_tiny_producer_shares_memory() -> None:
    t = Tensor([[1.0, 2.0], [3.0, 4.0]], device="CPU").realize()
    arr, ten = np.from_dlpack(t), torch.from_dlpack(t)
    arr[0, 0] = 10.0  # NumPy writes: tiny and torch read
    assert t.tolist()[0][0] == 10.0 and ten[0, 0].item() == 10.0
    ten[1, 1] = 40.0  # torch writes
    assert t.tolist()[1][1] == 40.0
    t.assign(t * 2).realize()  # tiny writes
    np.testing.assert_array_equal(arr, [[20, 4], [6, 80]])


def test_torch_producer_shares_memory() -> None:
    src = torch.zeros(4, dtype=torch.int32)
    t = Tensor.from_dlpack(src)
    src[2] = 7
    assert t.tolist() == [0, 0, 7, 0]
    t.assign(t + 1).realize()
    assert src.tolist() == [1, 1, 8, 1]


# ---------------------------------------------------------------- lifetimes


def test_producer_deleted_first() -> None:
    arr = np.arange(1000, dtype=np.float64)
    src = torch.arange(1000, dtype=torch.float32)
    from_np, from_torch = Tensor.from_dlpack(arr), Tensor.from_dlpack(src)
    del arr, src
    gc.collect()
    _ = [np.ones(1000) for _ in range(100)]  # (memory freed too early would be reused by these)
    np.testing.assert_array_equal(from_np.numpy(), np.arange(1000))
    np.testing.assert_array_equal(from_torch.numpy(), np.arange(1000))


def test_producer_memory_is_released_with_the_tiny_buffer() -> None:
    released = []

    class Producer:
        def __init__(self) -> None:
            self.arr = np.arange(4.0)

        def __dlpack__(self, stream: object = None, max_version: object = None) -> object:
            return self.arr.__dlpack__()

        def __del__(self) -> None:
            released.append(True)

    t = Tensor.from_dlpack(Producer())
    assert t.tolist() == [0.0, 1.0, 2.0, 3.0]
    del t
    gc.collect()
    # the capsule's owner is the producer's array, not the producer: the array is released with the tiny buffer
    assert released == [True]


def test_tiny_tensor_deleted_first() -> None:
    t = (Tensor.arange(6, device="CPU") * 2).realize()
    arr, ten = np.from_dlpack(t), torch.from_dlpack(t)
    del t
    gc.collect()
    _ = [Tensor.ones(6, device="CPU").realize() for _ in range(10)]  # (a freed buffer would be handed out again)
    assert arr.tolist() == [0, 2, 4, 6, 8, 10] and ten.tolist() == [0, 2, 4, 6, 8, 10]


# ---------------------------------------------------------------- strided producers


@pytest.mark.parametrize(
    "view",
    [
        lambda a: a[:, ::2, 1:3],
        lambda a: a.transpose(2, 0, 1),
        lambda a: a[1, :, ::-1],
        lambda a: a[::-1, 1:, ::3],
        lambda a: a[:, 1, :],
        lambda a: np.broadcast_to(a[0, 0], (3, 4)),
        lambda a: a[:, :, 2:3],
    ],
    ids=["slices", "transpose", "negative", "negative-step", "row", "broadcast", "one-wide"],
)
def test_strided_numpy_producer(view) -> None:  # noqa: ANN001
    base = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    t = Tensor.from_dlpack(view(base))
    np.testing.assert_array_equal(t.numpy(), view(base))
    base += 100  # a lazy view reads the producer's memory when it is computed
    np.testing.assert_array_equal(Tensor.from_dlpack(view(base)).numpy(), view(base))


def test_strided_torch_producer_with_byte_offset() -> None:
    src = torch.arange(30, dtype=torch.int64).reshape(5, 6)
    view = src[1:4, 2:].t()  # a storage offset and swapped strides
    t = Tensor.from_dlpack(view)
    assert t.tolist() == view.tolist()
    src[2, 3] = -1
    assert Tensor.from_dlpack(view).tolist() == view.tolist()


def test_overlapping_strides_are_refused() -> None:
    arr = np.arange(10.0)
    rows = np.lib.stride_tricks.as_strided(arr, shape=(4, 3), strides=(8, 8))  # each row starts one element on
    with pytest.raises(ValueError, match=r"strides \(1, 1\) .* of shape \(4, 3\) interleave dims"):
        Tensor.from_dlpack(rows)


# ---------------------------------------------------------------- from_blob


def test_from_blob_over_numpy_memory() -> None:
    arr = np.arange(12, dtype=np.int32)
    t = Tensor.from_blob(arr.ctypes.data, (3, 4), dtype="int32", device="CPU", owner=arr)
    assert t.tolist() == arr.reshape(3, 4).tolist()
    arr[5] = 99  # the caller writes, tiny reads
    assert t.numpy()[1, 1] == 99
    t.assign(t * 0 + 1).realize()  # tiny writes, the caller reads
    assert arr.tolist() == [1] * 12


def test_from_blob_owner_lives_as_long_as_the_tensor() -> None:
    arr = np.full(256, 3.0)
    t = Tensor.from_blob(arr.ctypes.data, 256, dtype=dtypes.float64, device="CPU", owner=arr)
    del arr
    gc.collect()
    _ = [np.zeros(256) for _ in range(50)]
    assert t.sum().item() == 3.0 * 256


def test_from_blob_errors() -> None:
    arr = np.zeros(4, dtype=np.float32)
    with pytest.raises(ValueError, match=r"null pointer \(ptr=0\)"):
        Tensor.from_blob(0, (4,), dtype="float32", device="CPU")
    with pytest.raises(TypeError, match="address as an int .* got float"):
        Tensor.from_blob(1.5, (4,), dtype="float32", device="CPU")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"shape of non-negative ints, got \(2, -2\)"):
        Tensor.from_blob(arr.ctypes.data, (2, -2), dtype="float32", device="CPU")
    with pytest.raises((TypeError, ValueError), match="float33"):
        Tensor.from_blob(arr.ctypes.data, (4,), dtype="float33", device="CPU")
    with pytest.raises(ValueError, match="PYTHON cannot wrap memory it did not allocate .*AllocatorCaps.foreign"):
        Tensor.from_blob(arr.ctypes.data, (4,), dtype="float32", device="PYTHON")


def test_from_blob_on_cuda() -> None:
    try:
        Device["CUDA"]
    except (DeviceUnavailable, UnknownDevice, KeyError) as e:
        pytest.skip(f"no CUDA device here: {e}")
    src = Tensor([1.0, 2.0, 3.0], device="CUDA").realize()
    address = Buffer.address.fget(src._buffer())  # a device pointer that src owns
    t = Tensor.from_blob(address, (3,), dtype="float32", device="CUDA", owner=src)
    assert t.tolist() == [1.0, 2.0, 3.0]
    t.assign(t * 2).realize()
    assert src.tolist() == [2.0, 4.0, 6.0]
    assert t.__dlpack_device__() == (2, 0)


def _cuda_for_both() -> None:
    """Skip unless tiny's CUDA device opens and PyTorch was built for CUDA with a GPU."""
    try:
        Device["CUDA"]
    except (DeviceUnavailable, UnknownDevice, KeyError) as e:
        pytest.skip(f"no CUDA device here: {e}")
    if not torch.cuda.is_available():
        pytest.skip("PyTorch here has no CUDA GPU")


def test_cuda_memory_is_shared_with_torch_both_ways() -> None:
    """On the GPU: a torch.cuda tensor seen by tiny and a tiny CUDA tensor seen by torch, without a copy (each side
    sees the other's writes), strided producers as views, and the devices' DLPack codes."""
    _cuda_for_both()
    src = torch.arange(12, dtype=torch.float32, device="cuda").reshape(3, 4)
    t = Tensor.from_dlpack(src)
    assert t.device.startswith("CUDA") and t.__dlpack_device__() == (2, 0)
    src[1, 2] = 50.0
    torch.cuda.synchronize()
    assert t.tolist()[1][2] == 50.0  # torch wrote, tiny reads
    t.assign(t + 1).realize()
    assert src[0, 0].item() == 1.0 and src[1, 2].item() == 51.0  # tiny wrote, torch reads
    np.testing.assert_array_equal(Tensor.from_dlpack(src.t()[1:]).numpy(), src.t()[1:].cpu().numpy())

    mine = Tensor([[1.0, 2.0], [3.0, 4.0]], device="CUDA").realize()
    theirs = torch.from_dlpack(mine)
    assert theirs.device.type == "cuda" and theirs.tolist() == [[1.0, 2.0], [3.0, 4.0]]
    theirs[0, 1] = 20.0
    torch.cuda.synchronize()
    assert mine.tolist()[0][1] == 20.0
    mine.assign(mine * 2).realize()
    assert theirs.tolist() == [[2.0, 40.0], [6.0, 8.0]]


# ---------------------------------------------------------------- errors


def test_from_dlpack_errors() -> None:
    with pytest.raises(TypeError, match="object with __dlpack__ .* got list"):
        Tensor.from_dlpack([1, 2, 3])
    with pytest.raises(TypeError, match="DLPack dtype complex64 has no tiny dtype"):
        Tensor.from_dlpack(np.zeros(2, dtype=np.complex64))


def test_export_errors() -> None:
    t = Tensor([1.0, 2.0], device="PYTHON")
    with pytest.raises(ValueError, match="no device type for tiny's PYTHON"):
        t.__dlpack_device__()
    with pytest.raises(ValueError, match="no device type for tiny's PYTHON"):
        np.from_dlpack(t)
    with pytest.raises(BufferError, match=r"dl_device=\(2, 0\)"):
        Tensor([1.0], device="CPU").__dlpack__(dl_device=(2, 0))
    # NumPy has no bfloat16: it refuses the capsule, and the refusal comes through as NumPy raised it (a RuntimeError
    # before NumPy 2.5, a BufferError since)
    with pytest.raises((RuntimeError, BufferError), match="Unsupported dtype"):
        np.from_dlpack(Tensor([1.0], device="CPU").bfloat16())
