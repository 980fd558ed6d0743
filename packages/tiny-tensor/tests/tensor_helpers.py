"""Run one computation in tiny and in NumPy on the same inputs and compare them.

`check(device, tiny_fn, np_fn, *inputs)` makes random inputs (or takes given arrays), runs `tiny_fn` on Tensors
of them on `device` and `np_fn` on the NumPy arrays, and asserts that the results have the same shape, the
expected tiny dtype (PyTorch's promotion rules, given explicitly where they differ from NumPy's) and the same
values within a tolerance chosen by the result's dtype.

NumPy computes float inputs in float64, so the reference is the exact answer rounded once to the result dtype;
integer inputs stay in their own dtype, so wrap-around and floor division match bit for bit.
"""

from __future__ import annotations

import os
import re
import threading
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import pytest

from tiny.ir.config import FLAGS
from tiny.tensor import Device, DType, Tensor, dtypes
from tiny.tensor.checks import default_int, on_device

SLOW_DEVICES = frozenset({"PYTHON"})  # interpreters: keep tensors at a few dozen elements (and AMD on its mock)

# (rtol, atol) by the dtype of the result; integers and bools compare exactly
TOLERANCE: dict[DType, tuple[float, float]] = {
    dtypes.float64: (1e-9, 1e-9),
    dtypes.float32: (1e-5, 1e-5),
    dtypes.float16: (1e-2, 1e-2),
    dtypes.bfloat16: (2e-2, 2e-2),
}


def open_device(name: str) -> str:
    """The canonical name of a device that opens here; skips the calling test with the reason when it does not."""
    try:
        canon = Device.canonicalize(name)
        Device[canon]
    except Exception as e:  # noqa: BLE001  (any failure to open means "skip, and say why")
        pytest.skip(f"device {name} cannot open here: {type(e).__name__}: {e}")
    return canon


def missing_dtype(device: object, error: BaseException | None) -> str | None:
    """The dtype that `error` (or an error it was raised from, as a failed pytest.raises is) says `device` cannot
    compute in, when its renderer's caps really leave that dtype out."""
    if not isinstance(device, str) or not Device[device].computes:
        return None
    claimed = {d.name for d in Device[device].renderer.caps.dtypes}
    seen = 0
    while error is not None and seen < 8:
        match = re.search(r"cannot compute in (\w+)", str(error)) if isinstance(error, TypeError) else None
        if match is not None and match.group(1) not in claimed:
            return match.group(1)
        error, seen = error.__cause__ or error.__context__, seen + 1
    return None


def is_slow(device: str) -> bool:
    """An interpreted device: PYTHON, or AMD on the mock driver (AMD_MOCK), whose kernels PYTHON runs."""
    name = device.split(":")[0]
    mock = FLAGS.get("AMD_MOCK")  # (declared by tiny-runtime-amd once imported, where it is installed)
    return name in SLOW_DEVICES or (name == "AMD" and bool(mock.value if mock else os.environ.get("AMD_MOCK")))


def small(device: str, fast: Any, slow: Any) -> Any:
    """`slow` on an interpreted device (see is_slow), else `fast`: sizes and shapes chosen per device."""
    return slow if is_slow(device) else fast


def torch_dtype_on(device: str, ref: np.dtype) -> np.dtype:
    """The NumPy dtype of a tiny result PyTorch gives `ref` for: int64 is the device's default int (int32 on a
    device without int64, where tiny computes indices and integer sums in int32)."""
    return np_dtype(default_int(device)) if ref == np.int64 else ref


def np_dtype(dt: DType) -> np.dtype:
    """The NumPy dtype tiny's .numpy() gives for a tiny dtype (bfloat16 reads back as float32)."""
    return np.dtype(np.float32) if dt == dtypes.bfloat16 else np.dtype(dt.fmt)


def random_array(
    shape: Sequence[int], dtype: DType, low: float | None = None, high: float | None = None, seed: int = 0
) -> np.ndarray:
    """Random values that `dtype` holds exactly (floats rounded to it), in [low, high]."""
    rng = np.random.default_rng(seed)
    shape = tuple(shape)
    if dtype.is_bool:
        return rng.random(shape) < 0.5
    if dtype.is_int:
        lo = int(low) if low is not None else (0 if dtype.is_unsigned else max(int(dtype.min), -10))
        hi = int(high) if high is not None else min(int(dtype.max), 20 if dtype.is_unsigned else 10)
        return rng.integers(lo, hi, size=shape, endpoint=True).astype(np_dtype(dtype))
    lo = -2.0 if low is None else float(low)
    hi = 2.0 if high is None else float(high)
    vals = rng.uniform(lo, hi, size=shape)
    if dtype == dtypes.bfloat16:
        return round_bf16(vals)
    return vals.astype(np_dtype(dtype))


def round_bf16(x: np.ndarray) -> np.ndarray:
    """float32 values rounded to the nearest bfloat16 (to nearest even), as float32."""
    bits = np.asarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    bits = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) << 16
    return bits.astype(np.uint32).view(np.float32)


def assert_matches(
    out: Tensor,
    ref: Any,
    dtype: DType,
    rtol: float | None = None,
    atol: float | None = None,
    what: str = "",
) -> np.ndarray:
    """`out` has dtype `dtype` (int64 as the device holds it: int32 where it has no int64), the shape of `ref`
    and its values within the dtype's tolerance."""
    ref = np.asarray(ref)
    dtype = on_device(dtype, out.device)
    assert out.dtype == dtype, f"{what}: dtype {out.dtype.name}, expected {dtype.name}"
    assert out.shape == ref.shape, f"{what}: shape {out.shape}, expected {ref.shape}"
    got = out.numpy()
    assert got.dtype == np_dtype(dtype), f"{what}: numpy() gave {got.dtype}, expected {np_dtype(dtype)}"
    assert got.shape == ref.shape, f"{what}: numpy() gave shape {got.shape}, expected {ref.shape}"
    if dtype.is_float:
        d_rtol, d_atol = TOLERANCE[dtype]
        with np.errstate(all="ignore"):
            expect = ref.astype(np.float64).astype(np_dtype(dtype)).astype(np.float64)
        np.testing.assert_allclose(
            got.astype(np.float64),
            expect,
            rtol=d_rtol if rtol is None else rtol,
            atol=d_atol if atol is None else atol,
            equal_nan=True,
            err_msg=what,
        )
    else:
        expect = ref.astype(np_dtype(dtype))
        np.testing.assert_array_equal(got, expect, err_msg=what)
    return got


def check(
    device: str,
    tiny_fn: Callable[..., Tensor],
    np_fn: Callable[..., Any],
    *inputs: Sequence[int] | np.ndarray,
    dtype: DType = dtypes.float32,
    in_dtypes: Sequence[DType] | None = None,
    out_dtype: DType | None = None,
    low: float | None = None,
    high: float | None = None,
    rtol: float | None = None,
    atol: float | None = None,
    seed: int = 0,
) -> np.ndarray:
    """Compare tiny_fn(*tensors) with np_fn(*arrays) on `device`; returns tiny's result as a NumPy array.

    Each input is a shape (random values of its dtype) or an array. Inputs have dtype `dtype` unless
    `in_dtypes` gives one per input; the result must have `out_dtype`, by default the first input's dtype.
    """
    dts = list(in_dtypes) if in_dtypes is not None else [dtype] * len(inputs)
    assert len(dts) == len(inputs), "one dtype per input"
    arrays = [
        random_array(x, dt, low, high, seed + i) if not isinstance(x, np.ndarray) else x
        for i, (x, dt) in enumerate(zip(inputs, dts))
    ]
    tensors = [Tensor(a, device=device, dtype=dt) for a, dt in zip(arrays, dts)]
    for t, a, dt in zip(tensors, arrays, dts):
        assert t.shape == a.shape and t.dtype == dt and t.device == device
    # floats in float64 so the reference is exact; ints in their own dtype so that they wrap like tiny's
    np_inputs = [a.astype(np.float64) if dt.is_float else a for a, dt in zip(arrays, dts)]
    with np.errstate(all="ignore"):
        ref = np_fn(*np_inputs)
    out = tiny_fn(*tensors)
    assert isinstance(out, Tensor), f"tiny_fn returned {type(out).__name__}"
    assert out.device == device, f"result on {out.device}, expected {device}"
    want = out_dtype if out_dtype is not None else (dts[0] if dts else dtypes.float32)
    return assert_matches(out, ref, want, rtol, atol, what=f"on {device}")


def poison(buffer: Any) -> None:
    """Fill a (allocated) buffer with 0xA5 bytes, a value no kernel under test computes: run before a kernel whose
    output is compared, so that a cell it leaves unwritten shows instead of keeping an earlier run's value."""
    buffer.copyin(memoryview(bytes([0xA5]) * buffer.nbytes))


def errors_in_threads(work: Callable[[int], None], count: int) -> list[BaseException]:
    """work(0) ... work(count - 1), each on a Python thread of its own, all at once; what they raised."""
    errors: list[BaseException] = []

    def run(i: int) -> None:
        try:
            work(i)
        except BaseException as e:  # noqa: BLE001  (handed to the test, which asserts there is none)
            errors.append(e)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return errors
