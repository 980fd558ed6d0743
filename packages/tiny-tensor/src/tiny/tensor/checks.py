"""Checks made where an op is recorded, so bad input fails at the user's call, not in a compiler."""

from __future__ import annotations

from tiny.ir.device import Device, device_supports
from tiny.ir.dtypes import DType, dtypes, truncate
from tiny.ir.uop import Ops, UOp

Scalar = int | float | bool


def shards_of(u: UOp) -> tuple[UOp, ...]:
    """A MULTI's node per device; any other node alone."""
    return u.src if u.op is Ops.MULTI else (u,)


def first_device(device: str | tuple[str, ...]) -> str:
    """A device that stands for several (the first: they are checked to agree where it matters)."""
    return device[0] if type(device) is tuple else device


def check_dtype(device: str | tuple[str, ...], dtype: DType) -> None:
    if type(device) is tuple:
        for d in device:
            check_dtype(d, dtype)
        return
    if not device_supports(device, dtype):
        raise TypeError(
            f"device {device} cannot compute in {dtype.name} (its renderer supports "
            f"{sorted(d.name for d in Device[device].renderer.caps.dtypes)})"
        )


def default_int(device: str | tuple[str, ...]) -> DType:
    """The integer dtype a device gives Python ints, indices and integer sums: int64 as in PyTorch, or int32
    where the device has no 64-bit integers (WebGPU); on several devices, int32 unless all have int64."""
    if type(device) is tuple:
        return dtypes.int64 if all(default_int(d) == dtypes.int64 for d in device) else dtypes.int32
    return dtypes.int64 if device_supports(device, dtypes.int64) else dtypes.int32


def wide_ints(device: str, why: str) -> None:
    """Refuse values only int64 holds on a device without int64, with check_dtype's message and the reason."""
    try:
        check_dtype(device, dtypes.int64)
    except TypeError as e:
        raise TypeError(f"{e}; {why}") from None


def on_device(dtype: DType, device: str) -> DType:
    """A dtype chosen by default (not asked for) as the device holds it: int64 narrows to default_int."""
    return default_int(device) if dtype == dtypes.int64 else dtype


def const(value: Scalar, dtype: DType, device: str) -> UOp:
    return UOp(Ops.CONST, dtype, (UOp(Ops.DEVICE, arg=device),), truncate(dtype, value))


def tensors_given(first: object, rest: tuple, name: str, base: type) -> list:
    """The tensors of a call made as `a.op(b, c)`, `Tensor.op(a, b, c)` or `Tensor.op([a, b, c])` (PyTorch's
    form: one sequence), checked to be tensors of `base`; a TypeError names the first that is not."""
    given = list(first) if isinstance(first, (list, tuple)) and not rest else [first, *rest]
    if not given:
        raise TypeError(f"{name}() needs at least one tensor, got an empty sequence")
    for i, t in enumerate(given):
        if not isinstance(t, base):
            raise TypeError(f"{name}() takes Tensors (or one list of them); argument {i} is {type(t).__name__}")
    return given
