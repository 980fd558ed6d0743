"""A device whose renderer leaves dtypes out of its caps (WEBGPU: WGSL has no float64, int64 or uint64) refuses them
where the op is called, with an error that names the device, the dtype and the dtypes it does compute in; it never
gets as far as a shader compiler."""

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
        lambda: Tensor(np.ones(2, dtype=np.dtype(dtype.fmt)), device=device),
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
    with pytest.raises(TypeError, match="cannot compute in int64"):
        Tensor([1, 2], device=device)  # Python ints are int64, as in PyTorch
