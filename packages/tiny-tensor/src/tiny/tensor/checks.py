"""Checks made where an op is recorded, so bad input fails at the user's call, not in a compiler."""

from __future__ import annotations

from tiny.ir.device import Device, device_supports
from tiny.ir.dtypes import DType, truncate
from tiny.ir.uop import Ops, UOp

Scalar = int | float | bool


def check_dtype(device: str, dtype: DType) -> None:
    if not device_supports(device, dtype):
        raise TypeError(
            f"device {device} cannot compute in {dtype.name} (its renderer supports "
            f"{sorted(d.name for d in Device[device].renderer.caps.dtypes)})"
        )


def const(value: Scalar, dtype: DType, device: str) -> UOp:
    return UOp(Ops.CONST, dtype, (UOp(Ops.DEVICE, arg=device),), truncate(dtype, value))
