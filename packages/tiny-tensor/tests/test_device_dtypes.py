"""A device whose renderer leaves dtypes out of its caps (WEBGPU: WGSL has no float64, int64 or uint64) refuses them
where the op is called, with an error that names the device, the dtype and the dtypes it does compute in; it never
gets as far as a shader compiler. On a device without int64 the default int is int32: Python ints, NumPy's int64
arrays (where their values fit), indices and integer sums are int32 there."""

from __future__ import annotations

import numpy as np
import pytest
from tensor_helpers import open_device

from tiny.tensor import Device, DType, Tensor, dtypes

WIDE = (dtypes.float64, dtypes.int64, dtypes.uint64)


def refuses_clearly(device: str, dtype: DType) -> None:
    makers = (
        lambda: Tensor([1, 2], device=device, dtype=dtype),
        lambda: Tensor([1.0, 2.0], device=device).cast(dtype),
        lambda: Tensor.zeros(2, device=device, dtype=dtype),
        lambda: Tensor.arange(3, device=device, dtype=dtype),
        lambda: Tensor(np.full(2, 2**40, dtype=np.dtype(dtype.fmt)), device=device),  # int64 narrows where it fits
    )
    for make in makers:
        with pytest.raises(TypeError) as e:
            make()
        msg = str(e.value)
        assert f"device {device} cannot compute in {dtype.name}" in msg and "float32" in msg, msg


def test_wide_dtypes_a_device_lacks_are_refused_at_the_call(device: str) -> None:
    missing = [d for d in WIDE if d not in Device[device].renderer.caps.dtypes]
    if not missing:
        pytest.skip(f"{device} computes in float64, int64 and uint64")
    for dtype in missing:
        refuses_clearly(device, dtype)
    # the 32-bit dtypes still compute
    t = Tensor([1, -2, 3], device=device, dtype=dtypes.int32)
    assert (t * 2).tolist() == [2, -4, 6] and t.cast(dtypes.float32).max().item() == 3.0


def test_webgpu_has_no_64_bit_dtypes() -> None:
    device = open_device("WEBGPU")
    caps = Device[device].renderer.caps.dtypes
    assert not set(WIDE) & caps and {dtypes.int8, dtypes.uint16, dtypes.bfloat16, dtypes.bool} <= caps
    for dtype in WIDE:
        refuses_clearly(device, dtype)
    default_int_is_int32(device)


def default_int_is_int32(device: str) -> None:
    """Where PyTorch gives int64 by default, a device without it gives int32; int64 asked for is refused."""
    i32 = dtypes.int32
    assert Tensor([1, 2], device=device).dtype == i32 and Tensor(7, device=device).dtype == i32
    assert Tensor.arange(4, device=device).dtype == i32 and Tensor.randint(9, (3,), device=device).dtype == i32
    small = Tensor(np.array([[3, -1], [2, 5]]), device=device)  # NumPy's int64, values that fit
    assert small.dtype == i32 and small.tolist() == [[3, -1], [2, 5]]
    x = Tensor([[1.0, 5.0, 2.0], [7.0, 0.0, 7.0]], device=device)
    for out, want in (
        (small.sum(), 9),
        (small.sum(1), [2, 7]),
        (Tensor([True, True, False], device=device).sum(), 2),
        (small.cumsum(1), [[3, 2], [2, 7]]),
        (x.argmax(1), [1, 0]),
        (x.argmin(), 4),
        (x.sort(1)[1], [[0, 2, 1], [1, 0, 2]]),
        (x.topk(1)[1], [[1], [0]]),
        (Tensor([0, 2], device=device).one_hot(3), [[1, 0, 0], [0, 0, 1]]),
        (Tensor([True, False], device=device) + 1, [2, 1]),
    ):
        assert out.dtype == i32 and out.tolist() == want, (out.dtype, out.tolist(), want)
    for make in (
        lambda: Tensor([1, 2], device=device, dtype=dtypes.int64),
        lambda: Tensor(np.array([2**40]), device=device),
        lambda: Tensor.randint(-(2**40), 2**40, (2,), device=device),
        lambda: small.sum(dtype=dtypes.int64),
    ):
        with pytest.raises(TypeError, match=f"device {device} cannot compute in int64"):
            make()
