"""Helpers of the tiny-codegen tests: tensor-level graphs built by hand, the kernels the scheduler makes of them,
a small interpreter of linearized kernels, and NumPy references. Only tiny.ir and tiny.codegen are used: no
runtime package, no tiny.tensor."""

from __future__ import annotations

import itertools
import math
import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from tiny.codegen.linearize import linearize
from tiny.codegen.lower import LoweredKernel, lower
from tiny.codegen.narrow import narrow_loops
from tiny.codegen.opt import Opt
from tiny.codegen.program import render_for
from tiny.codegen.vectorize import VectorTarget, vectorize
from tiny.ir.alu import exec_alu
from tiny.ir.device import Buffer, RendererCaps, buffer_of, new_buffer
from tiny.ir.dtypes import DType, dtypes, truncate
from tiny.ir.pattern import graph_rewrite
from tiny.ir.schedule import create_schedule
from tiny.ir.spec import validate
from tiny.ir.symbolic import symbolic
from tiny.ir.uop import GroupOp, Ops, UOp

f32 = dtypes.float32
DEV = "FAKE"  # new_buffer only records buffers: nothing is allocated on a device
LOOPS = RendererCaps(language="C")  # kernels with loops, as the C renderer wants them
NUMPY = {d.name: np.dtype(d.fmt) for d in dtypes.all() if d.fmt is not None}

# ---------------------------------------------------------------- tensor-level graphs


def tensor(*shape: int, dtype: DType = f32) -> UOp:
    buf = new_buffer(DEV, math.prod(shape), dtype)
    return UOp(Ops.RESHAPE, dtype, (buf,), tuple(shape))


def move(op: Ops, x: UOp, arg: Any) -> UOp:
    return UOp(op, x.dtype, (x,), arg)


def const(value: Any, shape: tuple[int, ...], dtype: DType = f32) -> UOp:
    c = UOp(Ops.CONST, dtype, (UOp(Ops.DEVICE, arg=DEV),), value)
    return move(Ops.EXPAND, move(Ops.RESHAPE, c, (1,) * len(shape)), shape)


def reduce(x: UOp, axes: tuple[int, ...], op: Ops = Ops.ADD) -> UOp:
    return UOp(Ops.REDUCE_AXIS, x.dtype, (x,), (op, axes))


def expand(x: UOp, shape: tuple[int, ...]) -> UOp:
    return move(Ops.EXPAND, x, shape)


# ---------------------------------------------------------------- kernels


def kernel_uops(ast: UOp, caps: RendererCaps = LOOPS, opts: Sequence[Opt] = ()) -> tuple[LoweredKernel, list[UOp]]:
    """Lower (after `opts`), simplify, narrow and linearize a kernel AST, as tiny.codegen.render_kernel does (its
    vectors aside), and validate the result."""
    kernel = lower(ast, caps, opts)
    uops = linearize(narrow_loops(graph_rewrite(kernel.sink, symbolic), caps))
    validate(uops)
    return kernel, uops


def vector_uops(ast: UOp, caps: RendererCaps, opts: Sequence[Opt]) -> list[UOp]:
    """kernel_uops with vectors formed (the vectorize pass) and no loops narrowed: the ops a renderer is given."""
    sink = graph_rewrite(
        graph_rewrite(lower(ast, caps, opts).sink, symbolic),
        vectorize,
        ctx=VectorTarget(caps.vector_width * 4, narrow=caps.narrow_vectors),
    )
    uops = linearize(sink)
    validate(uops)
    return uops


# a GPU's limits for the compile-only tests of the CUDA C and PTX renderers (an H100's, with a smaller workgroup)
GPU_TARGET = "arch=sm_90;local_max=1024,1024,64;local_total_max=256;shared_max=49152"


def renders_with(renderer: Any) -> Callable[..., tuple[str, LoweredKernel]]:
    """render(ast, opts=None) for one renderer: the source and the lowered kernel (its launch sizes) that
    tiny.codegen.render_for makes, after `opts` or the hand-written rules."""

    def render(ast: UOp, opts: list[Opt] | None = None) -> tuple[str, LoweredKernel]:
        r = render_for(ast, renderer, opts)
        return r.src, r.kernel

    return render


@dataclass
class Case:
    """A tensor-level graph, its inputs and what NumPy says it computes."""

    name: str
    targets: list[UOp]
    inputs: dict[UOp, np.ndarray]  # BUFFER node -> its contents
    expected: list[np.ndarray]
    rtol: float = 1e-5


def _rng() -> np.random.Generator:
    return np.random.default_rng(0)


def _inputs(*pairs: tuple[UOp, np.ndarray]) -> dict[UOp, np.ndarray]:
    return {t.src[0]: a for t, a in pairs}


def _c_div(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Integer division and remainder as C does them: toward zero."""
    q = np.trunc(a / b).astype(a.dtype)
    return q, a - b * q


def make_cases() -> list[Case]:
    rng = _rng()
    cases: list[Case] = []

    a, b = tensor(4, 4), tensor(4, 4)
    av, bv = rng.standard_normal((4, 4)).astype(np.float32), rng.standard_normal((4, 4)).astype(np.float32)
    out = a * b + a.alu(Ops.EXP2)
    cases.append(Case("elementwise", [out], _inputs((a, av), (b, bv)), [av * bv + np.exp2(av)]))

    col, row = tensor(4, 1), tensor(1, 5)
    cv, rv = rng.standard_normal((4, 1)).astype(np.float32), rng.standard_normal((1, 5)).astype(np.float32)
    out = expand(col, (4, 5)) - expand(row, (4, 5)).maximum(const(0.0, (4, 5)))
    cases.append(Case("broadcast", [out], _inputs((col, cv), (row, rv)), [cv - np.maximum(rv, 0)]))

    x = tensor(4, 8)
    xv = rng.standard_normal((4, 8)).astype(np.float32)
    cases.append(Case("sum_rows", [reduce(x, (1,))], _inputs((x, xv)), [xv.sum(1, keepdims=True)]))
    x = tensor(4, 8)
    cases.append(Case("sum_cols", [reduce(x, (0,))], _inputs((x, xv)), [xv.sum(0, keepdims=True)]))
    x = tensor(4, 8)
    cases.append(Case("max_all", [reduce(x, (0, 1), Ops.MAX)], _inputs((x, xv)), [xv.max(keepdims=True)]))

    a, b = tensor(4, 8), tensor(4, 8)
    r = reduce((a * b).alu(Ops.EXP2), (1,))
    out = r * const(2.0, (4, 1)) + const(1.0, (4, 1))
    want = np.exp2(xv * xv[::-1]).sum(1, keepdims=True) * 2 + 1
    cases.append(Case("reduce_prologue_epilogue", [out], _inputs((a, xv), (b, xv[::-1].copy())), [want], 1e-4))

    m, n = tensor(5, 8), tensor(8, 3)
    mv, nv = rng.standard_normal((5, 8)).astype(np.float32), rng.standard_normal((8, 3)).astype(np.float32)
    prod = expand(move(Ops.RESHAPE, m, (5, 8, 1)), (5, 8, 3)) * expand(move(Ops.RESHAPE, n, (1, 8, 3)), (5, 8, 3))
    out = move(Ops.RESHAPE, reduce(prod, (1,)), (5, 3))
    cases.append(Case("matmul", [out], _inputs((m, mv), (n, nv)), [mv @ nv], 1e-4))

    a = tensor(2, 3)
    av = rng.standard_normal((2, 3)).astype(np.float32)
    moved = move(Ops.FLIP, move(Ops.PAD, move(Ops.PERMUTE, a, (1, 0)), ((1, 0), (0, 2))), (0,))
    out = move(Ops.SHRINK, moved, ((0, 3), (1, 4)))
    want = np.flip(np.pad(av.T, ((1, 0), (0, 2))), 0)[0:3, 1:4]
    cases.append(Case("movement", [out], _inputs((a, av)), [want]))

    a = tensor(3)
    av = np.array([1.0, 2.0, 4.0], np.float32)
    out = move(Ops.PAD, (a + const(1.0, (3,))).alu(Ops.RECIP), ((2, 1),))
    cases.append(Case("padded_alu", [out], _inputs((a, av)), [np.pad(1 / (av + 1), (2, 1))]))

    a = tensor(4, 8)
    out = reduce(move(Ops.PAD, a, ((0, 0), (2, 2))) + const(1.0, (4, 12)), (1,))
    cases.append(
        Case("sum_of_padded", [out], _inputs((a, xv)), [(np.pad(xv, ((0, 0), (2, 2))) + 1).sum(1, keepdims=True)])
    )

    i, j = tensor(8, dtype=dtypes.int32), tensor(8, dtype=dtypes.int32)
    iv = np.array([-7, -3, 0, 3, 7, 100, -100, 2**31 - 1], np.int32)
    jv = np.array([2, 2, 5, -2, 3, 7, 7, 2], np.int32)
    q, rem = _c_div(iv, jv)
    out = i.lt(const(3, (8,), dtypes.int32)).where(i // j, i % j)
    cases.append(Case("int_div_mod", [out], _inputs((i, iv), (j, jv)), [np.where(iv < 3, q, rem)]))

    p, s = tensor(6, dtype=dtypes.int8), tensor(6)
    pv = np.array([-128, -1, 0, 1, 100, 127], np.int8)
    sv = np.linspace(-2, 2, 6).astype(np.float32)
    out = p.cast(f32) * s
    flag = s.lt(p.cast(f32))
    cases.append(Case("casts_and_bool", [out, flag], _inputs((p, pv), (s, sv)), [pv.astype(np.float32) * sv, sv < pv]))

    x = tensor(4, 8)
    mx = reduce(x, (1,), Ops.MAX)
    e = (x - expand(mx, (4, 8))).alu(Ops.EXP2)
    out = e * expand(reduce(e, (1,)), (4, 8)).alu(Ops.RECIP)
    ev = np.exp2(xv - xv.max(1, keepdims=True))
    cases.append(Case("softmax", [out], _inputs((x, xv)), [ev / ev.sum(1, keepdims=True)], 1e-5))

    z = tensor(4, 0)
    out = reduce(z, (1,))
    cases.append(
        Case("empty_reduce", [out], _inputs((z, np.zeros((4, 0), np.float32))), [np.zeros((4, 1), np.float32)])
    )
    return cases


# ---------------------------------------------------------------- running a schedule


Runner = Callable[[UOp, list[np.ndarray]], None]  # runs one kernel AST on flat arrays (output first)


def run_case(case: Case, run_kernel: Runner) -> list[np.ndarray]:
    """Schedule the case, run each kernel with `run_kernel`, and return the targets' contents."""
    schedule = create_schedule(case.targets)
    memory: dict[int, np.ndarray] = {id(buffer_of(b)): a.reshape(-1).copy() for b, a in case.inputs.items()}
    for item in schedule.items:
        arrays = []
        for buf in item.buffers:
            if id(buf) not in memory:
                memory[id(buf)] = np.zeros(buf.size, NUMPY[buf.dtype.name])
            arrays.append(memory[id(buf)])
        run_kernel(item.ast, arrays)
    return [memory[id(_buffer(schedule.becomes[t]))].reshape(t.shape) for t in case.targets]


def _buffer(view: UOp) -> Buffer:
    return buffer_of(view.src[0])


# ---------------------------------------------------------------- an interpreter of linearized kernels


def _python(x: Any) -> Any:
    return x.item() if isinstance(x, np.generic) else x


def _bitcast(value: Any, src: DType, dst: DType) -> Any:
    return struct.unpack(dst.fmt, struct.pack(src.fmt, value))[0]


def interpret(uops: list[UOp], buffers: list[np.ndarray], global_size: tuple[int, int, int] = (1, 1, 1)) -> None:
    """Run a linearized kernel on flat NumPy arrays: loops by jumping back, hardware indices by running it once
    per (gidx0, gidx1, gidx2)."""
    ends = {}
    for pc, u in enumerate(uops):
        if u.op in (Ops.ENDRANGE, Ops.ENDIF):
            ends[u.src[0]] = pc
    for g2, g1, g0 in itertools.product(*(range(n) for n in reversed(global_size))):
        _interpret_once(uops, buffers, {"gidx0": g0, "gidx1": g1, "gidx2": g2}, ends)


def _interpret_once(uops: list[UOp], buffers: list[np.ndarray], specials: dict[str, int], ends: dict) -> None:
    values: dict[UOp, Any] = {}
    starts = {u: pc for pc, u in enumerate(uops) if u.op is Ops.RANGE}
    pc = 0
    while pc < len(uops):
        u = uops[pc]
        src = [values.get(s) for s in u.src]
        op = u.op
        if op is Ops.DEFINE_GLOBAL:
            values[u] = buffers[u.arg]
        elif op is Ops.CONST:
            values[u] = u.arg
        elif op is Ops.SPECIAL:
            values[u] = specials[u.arg[0]]
        elif op is Ops.RANGE:
            values[u] = 0
            if src[0] <= 0:
                pc = ends[u]
        elif op is Ops.ENDRANGE:
            r = u.src[0]
            values[r] += 1
            if values[r] < values[r.end]:
                pc = starts[r]
        elif op is Ops.IF:
            if not src[0]:
                pc = ends[u]
        elif op is Ops.INDEX:
            values[u] = (src[0], src[1], src[2] if len(src) > 2 else True)
        elif op is Ops.LOAD:
            array, offset, ok = src[0]
            values[u] = _python(array[offset]) if ok else src[1]
        elif op is Ops.STORE:
            array, offset, ok = src[0]
            if ok:
                array[offset] = src[1]
        elif op is Ops.DEFINE_ACC:
            values[u] = src[0]
        elif op is Ops.ASSIGN:
            values[u.src[0]] = values[u] = src[1]
        elif op is Ops.CAST:
            values[u] = truncate(u.dtype, src[0])
        elif op is Ops.BITCAST:
            values[u] = _bitcast(src[0], u.src[0].dtype, u.dtype)
        elif op in GroupOp.ALU:
            values[u] = exec_alu(op, u.dtype, tuple(src))
        elif op is not Ops.ENDIF:
            raise NotImplementedError(f"the test interpreter has no {op}")
        pc += 1


def interpret_ast(ast: UOp, buffers: list[np.ndarray], caps: RendererCaps = LOOPS) -> None:
    kernel, uops = kernel_uops(ast, caps)
    interpret(uops, buffers, kernel.global_size)


# float32 inputs of exp2 that probe a vector polynomial: both ends of its range, every half, rounding edges
EXP2_INPUTS = np.concatenate(
    [
        np.random.default_rng(0).uniform(-160, 140, 200_000),
        np.random.default_rng(1).uniform(-2, 2, 200_000),
        np.arange(-152, 130, 0.25),  # every integer and half: the rounding of n and both ends of f
        np.nextafter(np.float32([-126, -149, -149.5, 127, 128, -0.5, 0.5]), np.float32(np.inf)),
        np.nextafter(np.float32([-126, -149, -150, 127, 128, -0.5, 0.5]), np.float32(-np.inf)),
        [0.0, -0.0, 1e-30, -1e-30, 3.4e38, -3.4e38, np.inf, -np.inf, np.nan],
    ]
).astype(np.float32)


def past_static_shared(floats: int = 8192) -> tuple[list[UOp], np.ndarray]:
    """A kernel of two local buffers of `floats` each (8192: 64 KiB in all, past NVIDIA's 48 KiB of static shared
    memory): each of 32 threads writes the last 32 floats of both, and after the barrier reads another thread's two
    and adds them; the uops and the 32 floats it stores."""
    f32, i32 = dtypes.float32, dtypes.int32
    out = UOp(Ops.DEFINE_GLOBAL, f32.ptr(32), (), 0)
    a, b = (UOp(Ops.DEFINE_LOCAL, f32.ptr(floats, local=True), (), (name, floats)) for name in ("a", "b"))
    lx = UOp(Ops.SPECIAL, i32, (), ("lidx0", 32))
    value = lx.cast(f32)
    at = lx + UOp.const(i32, floats - 32)
    stores = [UOp(Ops.STORE, dtypes.void, (UOp(Ops.INDEX, a.dtype, (a, at)), value))]
    stores.append(UOp(Ops.STORE, dtypes.void, (UOp(Ops.INDEX, b.dtype, (b, at)), value * UOp.const(f32, 2.0))))
    barrier = UOp(Ops.BARRIER, dtypes.void, tuple(stores))
    back = UOp.const(i32, floats - 1) - lx
    la, lb = (UOp(Ops.LOAD, f32, (UOp(Ops.INDEX, m.dtype, (m, back)), barrier)) for m in (a, b))
    store = UOp(Ops.STORE, dtypes.void, (UOp(Ops.INDEX, out.dtype, (out, lx)), la + lb))
    uops = [u for u in UOp(Ops.SINK, dtypes.void, (store,)).toposort if u.op is not Ops.SINK]
    return uops, (31 - np.arange(32, dtype=np.float32)) * 3
