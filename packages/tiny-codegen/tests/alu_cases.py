"""Values for the GPU renderers' numeric tests (test_ptx_render, test_cuda_host): ALU edge cases to check against
tiny.ir.alu, sample values of every dtype for casts, and how a value of a dtype sits in a NumPy array (bfloat16 as
its 16 bits)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from kernel_helpers import NUMPY

from tiny.ir.dtypes import DType, bf16_to_float, dtypes, float_to_bf16, truncate
from tiny.ir.uop import Ops, UOp

f32, i32 = dtypes.float32, dtypes.int32
I64_MIN = -(2**63)
EDGE = [
    (Ops.MAX, f32, [1.0, math.nan, -0.0, math.inf, 2.0], [math.nan, 1.0, 0.0, -math.inf, 3.0]),
    (Ops.IDIV, i32, [7, -7, 7, -7, 5, -(2**31), 0, -(2**31)], [2, 2, -2, -2, 0, 3, 0, -1]),
    (Ops.MOD, i32, [7, -7, 7, -7, 5, -(2**31), 0, -(2**31)], [2, 2, -2, -2, 0, 3, 0, -1]),
    (Ops.IDIV, dtypes.int64, [I64_MIN, 9, -9], [-1, 0, 4]),
    (Ops.IDIV, dtypes.uint8, [255, 7, 0, 200], [2, 0, 3, 255]),
    (Ops.IDIV, dtypes.int8, [-128, 100, -7], [-1, 0, 2]),
    (Ops.MOD, dtypes.uint32, [2**32 - 1, 7, 5], [2, 0, 2**32 - 1]),
    (
        Ops.MOD,
        f32,
        [5.5, -5.5, 1.0, 7.25, 1e10, -1e10, 1e20, 3e9, math.inf, 2.0, math.nan],
        [2.0, 2.0, 3.0, -2.0, 3.0, -7.0, 0.1, 0.1, 2.0, 0.0, 1.0],
    ),
    (
        Ops.MOD,
        dtypes.float64,
        [1e300, -5.5, 1e-310, 7.0, 4.9e-324, 1.0],
        [3.0, math.inf, 3e-320, 1e-320, 4.9e-324, -0.1],
    ),
    (Ops.MOD, dtypes.float16, [1000.0, -7.5], [0.3, 2.0]),
    (Ops.MAX, i32, [-(2**31), 5, -1], [2**31 - 1, -5, -1]),
    (Ops.MAX, dtypes.uint16, [65535, 3], [1, 4]),
    (Ops.MAX, dtypes.float16, [1.0, math.nan, 2.0], [math.nan, 1.0, 3.0]),
    (Ops.ADD, dtypes.int8, [127, -128, 100], [1, -1, 100]),  # wraps
    (Ops.ADD, dtypes.float16, [1.0, 65504.0, 0.1], [2.0, 65504.0, 0.2]),
    (Ops.MUL, dtypes.uint16, [65535, 300, 2], [65535, 300, 3]),
    (Ops.MUL, dtypes.int16, [-32768, 300, -2], [-1, 300, 3]),
    (Ops.MUL, dtypes.uint64, [2**64 - 1, 2**40], [3, 2**30]),
    (Ops.CMPLT, f32, [1.0, math.nan, -0.0], [2.0, 1.0, 0.0]),
    (Ops.CMPLT, dtypes.uint32, [1, 2**32 - 1], [2**32 - 1, 1]),
    (Ops.CMPLT, dtypes.int8, [-1, 5], [1, -5]),
    (Ops.CMPLT, dtypes.bool, [False, True, False, True], [True, False, False, True]),
    (Ops.CMPNE, f32, [math.nan, -0.0, 1.0], [math.nan, 0.0, 2.0]),
    (Ops.CMPNE, dtypes.float16, [math.nan, 1.0], [math.nan, 1.0]),
    (Ops.SHL, dtypes.uint32, [1, 3, 0xFFFFFFFF, 5], [31, 4, 1, 32]),
    (Ops.SHL, dtypes.int8, [1, 3, -1], [7, 4, 9]),
    (Ops.SHL, dtypes.uint64, [1, 3], [63, 64]),
    (Ops.SHR, i32, [-8, 64, 2**31 - 1, -5, 9], [1, 3, 30, 40, 33]),
    (Ops.SHR, dtypes.uint8, [255, 128], [7, 9]),
    (Ops.SHR, dtypes.int64, [-(2**40), 5], [70, 1]),
    (Ops.FDIV, f32, [1.0, -1.0, 0.0, 3.0], [0.0, 0.0, 0.0, 7.0]),
    (Ops.FDIV, dtypes.float16, [1.0, 3.0], [0.0, 7.0]),
    (Ops.ADD, dtypes.bool, [False, True, True], [False, False, True]),
    (Ops.MUL, dtypes.bool, [False, True, True], [True, False, True]),
    (Ops.XOR, dtypes.int16, [-1, 0x0F0F], [0x00FF, 0x7070]),
    (Ops.AND, dtypes.uint8, [0xF0, 0xFF], [0x3C, 0x01]),
    (Ops.OR, dtypes.int64, [-(2**62), 1], [3, 2**40]),
]

ALL = [dtypes.bool, dtypes.int8, dtypes.int16, dtypes.int32, dtypes.int64, dtypes.uint8, dtypes.uint16]
ALL += [dtypes.uint32, dtypes.uint64, dtypes.float16, dtypes.bfloat16, f32, dtypes.float64]
SAMPLES = [0, 1, -1, 7.75, -7.75, 100.5, -129.0, 300.25, 65504.0, 65520.0, 1e9 + 0.5, -3e9, 2**31 - 1]
SAMPLES += [2**32 + 3, 2**63 - 2**20, -(2**63), 1e20, 1e-40, 0.1, -0.0, math.inf, -math.inf, math.nan, 16777217]
SAMPLES += [2**24 + 2**16 + 1]  # rounded to float32, a tie of bfloat16: rounded once it is not


def same(got: Any, want: Any) -> bool:
    """Equal, with NaN equal to NaN and the sign of a float zero counted."""
    if isinstance(want, float) and math.isnan(want):
        return isinstance(got, float) and math.isnan(got)
    if isinstance(want, float) and want == 0 and isinstance(got, float):
        return math.copysign(1, got) == math.copysign(1, want)
    return got == want


def values(dt: DType) -> list[Any]:
    """SAMPLES as values of dt (as storing them would make them), without repeats."""
    out = []
    for v in SAMPLES:
        if dt.is_int and isinstance(v, float) and (math.isnan(v) or math.isinf(v)):
            continue
        t = truncate(dt, int(v) if dt.is_int and isinstance(v, float) and abs(v) < 2**64 else v)
        if not any(same(t, o) and type(t) is type(o) for o in out):
            out.append(t)
    return out


def np_dtype(dt: DType) -> np.dtype:
    return np.dtype(np.uint16) if dt == dtypes.bfloat16 else NUMPY[dt.name]


def to_memory(dt: DType, vals: list[Any]) -> np.ndarray:
    if dt == dtypes.bfloat16:
        return np.array([float_to_bf16(v) for v in vals], np.uint16)
    return np.array(vals, NUMPY[dt.name])


def read(dt: DType, raw: Any) -> Any:
    """An element of an array as a Python value of dt (bfloat16 arrives as its 16 bits)."""
    return bf16_to_float(int(raw.item())) if dt == dtypes.bfloat16 else raw.item()


def loop_uops(dts: list[DType], value: Any, n: int) -> list[UOp]:
    """A linearized kernel: out[i] = value(in1[i], in2[i] ...) for i in a loop (one thread), for dtypes dts (the
    output's first)."""
    gs = [UOp(Ops.DEFINE_GLOBAL, d.ptr(n), (), k) for k, d in enumerate(dts)]
    r = UOp.range(UOp.const(i32, n), 0)
    idx = [UOp(Ops.INDEX, g.dtype, (g, r)) for g in gs]
    loads = [UOp(Ops.LOAD, d, (ix,)) for d, ix in zip(dts[1:], idx[1:])]
    v = value(*loads)
    inner = [u for u in v.toposort if u not in loads and u is not v and u.op not in (Ops.INDEX, Ops.DEFINE_GLOBAL)]
    consts = [u for u in inner if u.op is Ops.CONST]
    ops = [u for u in inner if u.op is not Ops.CONST]
    uops = [*gs, UOp.const(i32, n), *consts, r, *idx, *loads, *ops, v, UOp(Ops.STORE, src=(idx[0], v))]
    return [*dict.fromkeys(uops), UOp(Ops.ENDRANGE, src=(r,))]
