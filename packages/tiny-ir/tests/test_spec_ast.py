"""The kernel AST's validator (tiny.ir.spec.validate_ast): the scheduler's kernels pass it, and a malformed AST is
refused with an error that names the op at fault and what was expected of it."""

from __future__ import annotations

import math
import pickle
from typing import Any

import pytest

from tiny.ir.device import new_buffer
from tiny.ir.dtypes import DType, dtypes
from tiny.ir.schedule import create_schedule
from tiny.ir.spec import SpecError, validate_ast
from tiny.ir.uop import Ops, UOp
from tiny.ir.views import View

f32, i32 = dtypes.float32, dtypes.int32
DEV = "FAKE"


def tensor(*shape: int, dtype: DType = f32) -> UOp:
    return UOp(Ops.RESHAPE, dtype, (new_buffer(DEV, math.prod(shape), dtype),), tuple(shape))


def move(op: Ops, x: UOp, arg: Any) -> UOp:
    return UOp(op, x.dtype, (x,), arg)


def kernels(*targets: UOp) -> list[UOp]:
    return [item.ast for item in create_schedule(list(targets)).items if item.ast.op is Ops.SINK]


def glob(i: int, size: int = 6, dtype: DType = f32) -> UOp:
    return UOp(Ops.DEFINE_GLOBAL, dtype.ptr(size), (), i)


def view(*shape: int) -> UOp:
    return UOp(Ops.VIEW, arg=View.create(shape))


def read(buf: UOp, v: UOp) -> UOp:
    return UOp(Ops.READ, buf.dtype.base, (buf, v))


def write(buf: UOp, v: UOp, value: UOp) -> UOp:
    return UOp(Ops.SINK, src=(UOp(Ops.WRITE, src=(buf, v, value)),))


def test_the_schedulers_kernels_are_well_formed() -> None:
    a, b = tensor(4, 6), tensor(6)
    padded = move(Ops.PAD, move(Ops.PERMUTE, a, (1, 0)), ((1, 1), (0, 0)))
    summed = UOp(Ops.REDUCE_AXIS, f32, (a * move(Ops.EXPAND, move(Ops.RESHAPE, b, (1, 6)), (4, 6)),), (Ops.ADD, (1,)))
    asts = kernels(padded.alu(Ops.EXP2), summed, a.cast(dtypes.float16))
    assert len(asts) == 3
    for ast in asts:
        validate_ast(ast)
        assert {u.op for u in ast.toposort} >= {Ops.SINK, Ops.WRITE, Ops.READ, Ops.VIEW, Ops.DEFINE_GLOBAL}


def test_the_named_slots_of_the_memory_ops() -> None:
    (ast,) = kernels(tensor(2, 3) + 1.0)
    (w,) = ast.src
    (r,) = [u for u in ast.toposort if u.op is Ops.READ]
    (c,) = [u for u in ast.toposort if u.op is Ops.CONST]
    assert w.buffer.op is Ops.DEFINE_GLOBAL and w.buffer.arg == 0 and r.buffer.arg == 1
    assert w.view == r.view == View.create((2, 3)) and w.shape == r.shape == (2, 3)
    assert w.value.op is Ops.ADD and r in w.value.src
    assert c.view == View.create(()) and UOp.const(f32, 1.0).view is None
    counted = move(Ops.RESHAPE, UOp(Ops.ARANGE, i32, (UOp(Ops.DEVICE, arg=DEV),), 6), (2, 3))
    (ast,) = kernels(move(Ops.PERMUTE, counted, (1, 0)).cast(f32))  # (reads no buffer: its view is its index)
    validate_ast(ast)
    (a,) = [u for u in ast.toposort if u.op is Ops.ARANGE]
    assert a.view == View.create((3, 2), (1, 3)) and a.shape == (3, 2) and counted.src[0].shape == (6,)
    assert not any(u.op is Ops.READ for u in ast.toposort) and counted.device == DEV
    with pytest.raises(AssertionError):
        w.value.buffer  # noqa: B018  (an ADD has no buffer)


A, B, C, V23 = glob(0), glob(1), glob(2), view(2, 3)
SUM_OVER_2 = UOp(Ops.REDUCE_AXIS, f32, (read(B, V23),), (Ops.ADD, (2,)))


@pytest.mark.parametrize(
    ("ast", "message"),
    [
        (UOp(Ops.SINK, src=(read(A, V23),)), "SINK: a kernel AST is a SINK of WRITEs"),
        (UOp(Ops.SINK, src=(UOp(Ops.WRITE, src=(A, read(B, V23))),)), r"WRITE: takes \(DEFINE_GLOBAL, VIEW, value\)"),
        (write(A, V23, UOp(Ops.LOAD, f32, (B, V23))), "LOAD: not a kernel AST op"),
        (write(A, V23, read(B, view(6))), "READ: its view has the kernel's 2 dims"),
        (write(A, V23, read(glob(1, dtype=i32), V23)), "WRITE: the buffer holds"),
        (write(A, V23, UOp(Ops.READ, i32, (B, V23))), "READ: the buffer holds dtypes.float"),
        (write(A, V23, read(C, V23)), r"SINK: the buffers are arguments 0 \.\. 1, got \[0, 2\]"),
        (write(A, view(2, 1), SUM_OVER_2), r"REDUCE_AXIS: arg is \(ADD, MUL or MAX, axes among 2 dims\)"),
        (write(A, V23, UOp(Ops.CONST, f32, (), 1.0)), "CONST: a kernel AST's constant has a VIEW"),
        (write(A, V23, UOp(Ops.ARANGE, i32, (), 6).cast(f32)), "ARANGE: a kernel AST's arange has a VIEW"),
        (write(A, V23, UOp(Ops.ARANGE, f32, (V23,), 6)), r"ARANGE: is integers 0 \.\. n-1"),
        (write(A, V23, UOp(Ops.ARANGE, i32, (view(6),), 6).cast(f32)), "ARANGE: its view has the kernel's 2 dims"),
    ],
)
def test_a_malformed_ast_is_refused_naming_the_op(ast: UOp, message: str) -> None:
    with pytest.raises(SpecError, match=message):
        validate_ast(ast)


def test_ops_pickle_by_name_and_read_pickles_made_by_number() -> None:
    assert b"Ops.WRITE" in pickle.dumps(Ops.WRITE) and pickle.loads(pickle.dumps(Ops.READ)) is Ops.READ

    class ByNumber:  # what Enum's own pickling wrote (recordings made before ops pickled by name)
        def __reduce__(self) -> tuple:
            return Ops, (Ops.LOAD.value,)

    assert pickle.loads(pickle.dumps(ByNumber())) is Ops.LOAD
    # READ and WRITE came after the others, DOT4 and SDOT4 after them: the ops before kept the numbers such recordings
    # hold
    assert sorted(Ops, key=lambda op: op.value)[-4:] == [Ops.READ, Ops.WRITE, Ops.DOT4, Ops.SDOT4]
