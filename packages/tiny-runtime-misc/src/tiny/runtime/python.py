"""The PYTHON device: runs linearized kernels in Python, as the executable reference of the device op set.

Every other backend must compute what this one computes; tiny.ir.spec describes the ops in words, this file
in code. It needs no compiler at all. Kernels travel as text (tiny.runtime.python_text).

The program runs all threads of a launch (global_size workgroups of local_size threads, as a CUDA grid of
blocks) in lockstep, one UOp at a time. A value that is the same on every thread (a constant, a loop counter,
a variable, and math on those) is held as one Python value; any other value is a list with one entry per
thread. Vectors are tuples of scalars. Thread t belongs to workgroup t // L (L threads per workgroup); the x
index of a workgroup or of a thread runs fastest.
"""

from __future__ import annotations

import functools
import math
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from itertools import repeat
from typing import Any

from tiny.ir.alu import exec_alu
from tiny.ir.device import (
    AllocatorCaps,
    Compiled,
    CompileError,
    Compiler,
    LRUAllocator,
    Program,
    Renderer,
    RendererCaps,
    host_memory,
)
from tiny.ir.dtypes import DType, bf16_to_float, dtypes, float_to_bf16, truncate
from tiny.ir.spec import SpecError, validate
from tiny.ir.tensorcore import TensorCore, tensor_core, tensor_cores_for
from tiny.ir.uop import GroupOp, Ops, UOp
from tiny.runtime.python_text import parse, render_text

__all__ = ["PythonAllocator", "PythonCompiler", "PythonDevice", "PythonProgram", "PythonRenderer", "parse"]

# ---------------------------------------------------------------- renderer and compiler


class PythonRenderer(Renderer):
    """Writes a linearized kernel as text the PYTHON compiler reads back (and DEBUG=4 prints)."""

    caps = RendererCaps(
        language="PYTHON",
        has_local=True,
        has_shared=True,
        global_max=(2**31 - 1, 65535, 65535),
        local_max=(1024, 1024, 64),
        local_total_max=1024,
        shared_max=65536,
        vector_width=4,
        dtypes=frozenset(dtypes.all()),
    )

    def __init__(self, target: str = "") -> None:
        """target: a GPU architecture ('sm_80', 'gfx1100', 'gfx1201', 'gfx942' ...) whose tensor cores this
        renderer declares and the emulator runs, and for NVIDIA's ';tf32=1' where float32 products take them too
        (TF32); '' for none."""
        super().__init__(target)
        arch, *options = target.split(";")
        if any(o not in ("tf32=1", "tf32=0") for o in options) or (options and not arch.startswith("sm_")):
            raise ValueError(
                f"the PYTHON renderer's target is an architecture, then ';tf32=1' for sm_*, got {target!r}"
            )
        cores = tensor_cores_for(arch, "tf32=1" in options)
        if arch and not cores:
            raise ValueError(
                f"the PYTHON renderer emulates tensor cores of sm_80+, gfx11, gfx12 or gfx942/gfx950, got {target!r}"
            )
        # (NVIDIA's from sm_80 copy asynchronously: COPY_ASYNC, which the emulator lands at a BARRIER ("async", n))
        # (... and store a C fragment's 16-bit neighbours as one 32-bit pair, as CUDA C and PTX do)
        nvidia = arch.startswith("sm_")
        self.caps = replace(PythonRenderer.caps, tensor_cores=cores, async_copy=nvidia, half_pairs=nvidia)

    def render(self, name: str, uops: list[UOp]) -> str:
        return render_text(name, uops)


class PythonCompiler(Compiler):
    """Parses and checks the text; the binary is the text itself (parsing it is cheaper than a disk cache)."""

    def __init__(self) -> None:
        super().__init__(cachekey=None)

    def compile(self, src: str) -> bytes:
        name, uops = parse(src)
        _Kernel(name, uops)  # raises CompileError for what the interpreter cannot run
        return src.encode()


# ---------------------------------------------------------------- per-thread functions


def _lanes_of(x: Any, count: int) -> tuple:
    """A vector's lanes; a scalar stands for `count` equal lanes."""
    return x if isinstance(x, tuple) else (x,) * count


# Each takes the tuple of a UOp's source values on one thread and gives its value on that thread.
_Lanewise = Callable[[tuple], Any]


def _alu_fn(u: UOp) -> _Lanewise:
    op, dt, count = u.op, u.dtype.scalar, u.dtype.count
    if count == 1:
        return functools.partial(exec_alu, op, dt)

    def vector_alu(xs: tuple) -> tuple:
        return tuple(exec_alu(op, dt, lane) for lane in zip(*(_lanes_of(x, count) for x in xs)))

    return vector_alu


def _cast_fn(u: UOp) -> _Lanewise:
    dt, count = u.dtype.scalar, u.dtype.count
    if count == 1:
        return lambda xs: truncate(dt, xs[0])
    return lambda xs: tuple(truncate(dt, lane) for lane in _lanes_of(xs[0], count))


def _bits_struct(dt: DType) -> struct.Struct:
    """How a value of dt lies in memory; bfloat16 is packed as its 16-bit pattern."""
    return struct.Struct(f"{dt.count}{dt.scalar.fmt or 'H'}")


def _bitcast_fn(u: UOp) -> _Lanewise:
    src_dt, dst_dt = u.src[0].dtype, u.dtype
    packer, unpacker = _bits_struct(src_dt), _bits_struct(dst_dt)
    from_bf16, to_bf16 = src_dt.scalar == dtypes.bfloat16, dst_dt.scalar == dtypes.bfloat16

    def bitcast(xs: tuple) -> Any:
        lanes = _lanes_of(xs[0], src_dt.count)
        raw = packer.pack(*(float_to_bf16(v) for v in lanes) if from_bf16 else lanes)
        out = unpacker.unpack(raw)
        if to_bf16:
            out = tuple(bf16_to_float(v) for v in out)
        return out[0] if dst_dt.count == 1 else out

    return bitcast


def _gep_fn(u: UOp) -> _Lanewise:
    lanes = u.arg if isinstance(u.arg, tuple) else (u.arg,)
    if u.dtype.count == 1:
        return lambda xs: xs[0][lanes[0]]
    return lambda xs: tuple(xs[0][i] for i in lanes)


def _vectorize(xs: tuple) -> tuple:
    return xs


def _zero(dt: DType) -> Any:
    zero = truncate(dt.scalar, 0)
    return zero if dt.count == 1 else (zero,) * dt.count


def _const(u: UOp) -> Any:
    if u.dtype.count == 1:
        return truncate(u.dtype, u.arg)
    return tuple(truncate(u.dtype.scalar, v) for v in _lanes_of(u.arg, u.dtype.count))


# ---------------------------------------------------------------- the kernel, prepared to run


@dataclass(frozen=True)
class _Step:
    """One UOp to execute: the value slot it writes, the slots it reads, what it computes per thread."""

    op: Ops
    uop: UOp
    out: int  # an ASSIGN writes (and is read through) its accumulator's slot
    src: tuple[int | None, ...]  # LOAD: (pointer, offset, gate, alternative); STORE: (pointer, offset, gate, value)
    fn: _Lanewise | None = None  # ALU, CAST, BITCAST, GEP, VECTORIZE: the value on one thread
    jump: int = -1  # RANGE/IF: the step of its ENDRANGE/ENDIF; ENDRANGE: the step of its RANGE


_ELEMENTWISE = GroupOp.ALU | {Ops.CAST, Ops.BITCAST, Ops.GEP, Ops.VECTORIZE}
_LAUNCH_VALUES = (Ops.DEFINE_GLOBAL, Ops.DEFINE_LOCAL, Ops.DEFINE_VAR, Ops.SPECIAL, Ops.CONST)  # set before the run


def _pointee(ptr: DType) -> DType:
    """The scalar dtype a pointer's memory holds (a pointer to float32x4 holds float32)."""
    return dtypes.from_name(ptr.name)


class _Kernel:
    """A checked kernel: its launch-time values (buffers, variables, hardware indices, constants) and its steps."""

    def __init__(self, name: str, uops: list[UOp]) -> None:
        try:
            validate(uops)
        except SpecError as e:
            raise CompileError(f"kernel {name}: {e}") from None
        self.name, self.n_slots = name, len(uops)
        slot: dict[UOp, int] = {}
        for i, u in enumerate(uops):
            if u in slot:
                raise self._fail(u, f"appears twice in the kernel, at {slot[u]} and at {i}")
            slot[u] = slot[u.src[0]] if u.op is Ops.ASSIGN else i
            self._check(u)
        self.launch_values = [(slot[u], u) for u in uops if u.op in _LAUNCH_VALUES]
        self.n_buffers = 1 + max((u.arg for u in uops if u.op is Ops.DEFINE_GLOBAL), default=-1)
        self.variables = [u for u in uops if u.op is Ops.DEFINE_VAR]
        self.has_local = any(u.op is Ops.DEFINE_LOCAL for u in uops)
        self.steps: list[_Step] = []
        opened: list[int] = []  # steps of the RANGEs and IFs not closed yet
        for u in uops:
            if u.op in _LAUNCH_VALUES or u.op is Ops.INDEX or (u.op is Ops.BARRIER and u.copies_in_flight is None):
                continue  # BARRIER: threads in lockstep have all reached it (an "async" one lands the copies)
            step = self._step(u, slot)
            if u.op in (Ops.RANGE, Ops.IF):
                opened.append(len(self.steps))
            elif u.op in (Ops.ENDRANGE, Ops.ENDIF):
                start = opened.pop()
                self.steps[start] = replace(self.steps[start], jump=len(self.steps))
                step = replace(step, jump=start)
            self.steps.append(step)

    def _fail(self, u: UOp, what: str) -> CompileError:
        return CompileError(f"kernel {self.name}: {u.op.name} {u.dtype!r} arg={u.arg!r}: {what}")

    def _check(self, u: UOp) -> None:
        """What the interpreter needs beyond tiny.ir.spec.validate."""
        if any(s.op is Ops.INDEX for s in u.src) and u.op not in (Ops.LOAD, Ops.STORE, Ops.COPY_ASYNC):
            raise self._fail(u, "an INDEX is used only by LOAD, STORE and COPY_ASYNC")
        if u.op is Ops.INDEX:
            if u.pointer.op not in (Ops.DEFINE_GLOBAL, Ops.DEFINE_LOCAL):
                raise self._fail(u, f"indexes a {u.pointer.op.name}, not a DEFINE_GLOBAL or DEFINE_LOCAL")
            if u.offset.dtype.count != 1:
                raise self._fail(u, "the offset must be a scalar")
        if u.op in (Ops.LOAD, Ops.STORE):
            value_dtype = u.dtype if u.op is Ops.LOAD else u.value.dtype
            if value_dtype.scalar != _pointee(u.address.pointer.dtype):
                raise self._fail(u, f"moves {value_dtype!r} through a {u.address.pointer.dtype!r}")
        if u.op is Ops.BITCAST and u.src[0].dtype.nbytes != u.dtype.nbytes:
            raise self._fail(u, f"a BITCAST from {u.src[0].dtype!r} changes the size")
        if u.op is Ops.SPECIAL and u.arg[0][4:] not in ("0", "1", "2"):
            raise self._fail(u, "a hardware index is gidx0..2 or lidx0..2")
        if u.op is Ops.DEFINE_LOCAL and not (isinstance(u.arg, tuple) and len(u.arg) == 2 and u.arg[1] > 0):
            raise self._fail(u, "DEFINE_LOCAL needs arg=(name, number of elements)")
        if u.op is Ops.DEFINE_VAR and not (isinstance(u.arg, tuple) and len(u.arg) == 3):
            raise self._fail(u, "DEFINE_VAR needs arg=(name, min, max)")

    def _step(self, u: UOp, slot: dict[UOp, int]) -> _Step:
        if u.op is Ops.COPY_ASYNC:
            dst, src = u.address, u.copied_from
            gate = None if src.gate is None else slot[src.gate]
            return _Step(
                u.op, u, slot[u], (slot[dst.pointer], slot[dst.offset], slot[src.pointer], slot[src.offset], gate)
            )
        if u.op in (Ops.LOAD, Ops.STORE):
            index = u.address
            gate = None if index.gate is None else slot[index.gate]
            last = u.alternative if u.op is Ops.LOAD else u.value
            src = (slot[index.pointer], slot[index.offset], gate, None if last is None else slot[last])
            return _Step(u.op, u, slot[u], src)
        fn: _Lanewise | None = None
        if u.op in GroupOp.ALU:
            fn = _alu_fn(u)
        elif u.op is Ops.CAST:
            fn = _cast_fn(u)
        elif u.op is Ops.BITCAST:
            fn = _bitcast_fn(u)
        elif u.op is Ops.GEP:
            fn = _gep_fn(u)
        elif u.op is Ops.VECTORIZE:
            fn = _vectorize
        return _Step(u.op, u, slot[u], tuple(slot[s] for s in u.src), fn)


# ---------------------------------------------------------------- memory as a kernel sees it


class _BitsView:
    """Elements a memoryview cannot be cast to (float16, bfloat16), kept as 16-bit patterns."""

    def __init__(self, raw: memoryview, to_py: Callable[[int], float], from_py: Callable[[float], int]) -> None:
        self.bits, self.to_py, self.from_py = raw.cast("H"), to_py, from_py

    def __len__(self) -> int:
        return len(self.bits)

    def __getitem__(self, i: Any) -> Any:
        if isinstance(i, slice):
            return [self.to_py(b) for b in self.bits[i]]
        return self.to_py(self.bits[i])

    def __setitem__(self, i: int, value: float) -> None:
        self.bits[i] = self.from_py(value)


_HALF, _U16 = struct.Struct("e"), struct.Struct("H")


def _half_from_bits(bits: int) -> float:
    return _HALF.unpack(_U16.pack(bits))[0]


def _half_to_bits(value: float) -> int:
    return _U16.unpack(_HALF.pack(value))[0]


def _typed_view(buf: Any, dt: DType) -> Any:
    """Index a buffer's bytes by elements of the scalar dtype dt."""
    raw = memoryview(buf)
    if raw.format != "B" or raw.ndim != 1:
        raw = raw.cast("B")
    raw = raw[: len(raw) // dt.itemsize * dt.itemsize]
    if dt == dtypes.float16:
        return _BitsView(raw, _half_from_bits, _half_to_bits)
    if dt == dtypes.bfloat16:
        return _BitsView(raw, bf16_to_float, float_to_bf16)
    return raw.cast(dt.fmt)


@dataclass(frozen=True)
class _Memory:
    """A buffer or a local memory, indexed by scalar element."""

    name: str  # how an error names it
    data: Any  # a typed memoryview, a _BitsView or (local memory) a list
    size: int  # scalars in the buffer, or in each workgroup's part of local memory
    scale: int  # scalars per element of the pointer (its vector width)
    local: bool


# ---------------------------------------------------------------- one launch


def _dims(size: tuple[int, ...]) -> tuple[int, int, int]:
    if len(size) > 3 or any(int(s) < 0 for s in size):
        raise ValueError(f"a launch size has at most 3 non-negative dimensions, got {size}")
    return tuple(int(s) for s in size) + (1,) * (3 - len(size))  # type: ignore[return-value]


class _Launch:
    """The state of one run of a kernel: a value per slot (one Python value, or a list over threads)."""

    def __init__(self, kernel: _Kernel, bufs: tuple, global_size: tuple, local_size: tuple, vals: tuple) -> None:
        self.kernel = kernel
        self.global_size, self.local_size = _dims(global_size), _dims(local_size)
        self.group_threads = math.prod(self.local_size)
        self.n = math.prod(self.global_size) * self.group_threads
        self.vals: list[Any] = [None] * kernel.n_slots
        self.mask: list[bool] | None = None  # the threads inside every open IF; None: all of them
        self.masks: list[list[bool] | None] = []  # the masks outside the open IFs
        self.loop_end: dict[int, int] = {}
        self.group_of = [t // self.group_threads for t in range(self.n)] if kernel.has_local else []
        # COPY_ASYNCs issued since the last BARRIER ("async", n): (memory, addresses, values); each such barrier
        # makes them a group and writes all but the n latest groups (never sooner, so a kernel that reads local
        # memory before the barrier that lands a copy reads what was there before)
        self.in_flight: list[tuple[_Memory, list[int], list]] = []
        self.groups: list[list[tuple[_Memory, list[int], list]]] = []
        if len(bufs) < kernel.n_buffers:
            raise ValueError(f"kernel {kernel.name} takes {kernel.n_buffers} buffers, got {len(bufs)}")
        if len(vals) != len(kernel.variables):
            names = [v.arg[0] for v in kernel.variables]
            raise ValueError(f"kernel {kernel.name} takes the variables {names}, got {len(vals)} values")
        var_values = dict(zip(kernel.variables, vals))
        for slot, u in kernel.launch_values:
            self.vals[slot] = self._launch_value(u, bufs, var_values)
        self.handlers: dict[Ops, Callable[[_Step], int | None]] = {op: self._elementwise for op in _ELEMENTWISE}
        self.handlers |= {
            Ops.LOAD: self._load,
            Ops.STORE: self._store,
            Ops.DEFINE_ACC: self._define_acc,
            Ops.ASSIGN: self._assign,
            Ops.RANGE: self._range,
            Ops.ENDRANGE: self._endrange,
            Ops.IF: self._if,
            Ops.ENDIF: self._endif,
            Ops.WMMA: self._wmma,
            Ops.COPY_ASYNC: self._copy_async,
            Ops.BARRIER: self._land_copies,
        }

    def run(self) -> None:
        if self.n == 0:
            return
        steps, handlers, pc = self.kernel.steps, self.handlers, 0
        while pc < len(steps):
            step = steps[pc]
            jump = handlers[step.op](step)
            pc = pc + 1 if jump is None else jump

    # ---- values fixed for the whole launch

    def _launch_value(self, u: UOp, bufs: tuple, var_values: dict[UOp, int]) -> Any:
        if u.op is Ops.CONST:
            return _const(u)
        if u.op is Ops.DEFINE_VAR:
            name, lo, hi = u.arg
            if not lo <= var_values[u] <= hi:
                raise ValueError(f"kernel {self.kernel.name}: variable {name}={var_values[u]} is not in [{lo}, {hi}]")
            return int(var_values[u])
        if u.op is Ops.SPECIAL:
            return self._hardware_index(*u.arg)
        dt = _pointee(u.dtype)
        if u.op is Ops.DEFINE_LOCAL:
            size = u.arg[1] * u.dtype.count
            groups = self.n // self.group_threads if self.group_threads else 0
            return _Memory(f"local memory {u.arg[0]!r}", [_zero(dt)] * (size * groups), size, u.dtype.count, True)
        data = _typed_view(bufs[u.arg], dt)
        size = len(data) if u.dtype.size < 0 else min(len(data), u.dtype.size * u.dtype.count)
        return _Memory(f"buffer {u.arg} ({dt.name})", data, size, u.dtype.count, False)

    def _hardware_index(self, name: str, bound: int) -> int | list[int]:
        """gidx<d>: the thread's workgroup index in dim d; lidx<d>: its index inside the workgroup."""
        dim, in_group = int(name[4:]), name.startswith("lidx")
        sizes = self.local_size if in_group else self.global_size
        if sizes[dim] > bound:
            raise ValueError(f"kernel {self.kernel.name}: {name} counts to {bound}, launched with {sizes[dim]}")
        if sizes[dim] == 1:
            return 0
        stride, size, per_group = math.prod(sizes[:dim]), sizes[dim], self.group_threads
        if in_group:
            return [t % per_group // stride % size for t in range(self.n)]
        return [t // per_group // stride % size for t in range(self.n)]

    # ---- helpers

    def _lanes(self, value: Any) -> list:
        """A value on every thread, as a list."""
        return value if type(value) is list else [value] * self.n

    def _restrict(self, cond: Any) -> list[bool] | None:
        """The threads active now where `cond` also holds: None for all threads, else a bool per thread."""
        if type(cond) is not list:
            return self.mask if cond else [False] * self.n
        if self.mask is not None:
            cond = [m and c for m, c in zip(self.mask, cond)]
        return None if all(cond) else cond

    def _thread(self, t: int) -> str:
        """Thread t's hardware indices, for error messages."""

        def coords(i: int, sizes: tuple[int, int, int]) -> tuple[int, int, int]:
            return (i % sizes[0], i // sizes[0] % sizes[1], i // (sizes[0] * sizes[1]))

        group = coords(t // self.group_threads, self.global_size)
        return f"thread gidx={group} lidx={coords(t % self.group_threads, self.local_size)}"

    def _addresses(self, step: _Step, mem: _Memory, offsets: list[int], threads: Any) -> list[int]:
        """The scalar addresses of `threads` (offsets are in pointer elements); an IndexError when out of bounds."""
        dt = step.uop.value.dtype if step.op is Ops.STORE else step.uop.dtype
        count = dt.count
        addrs = [offsets[t] * mem.scale for t in threads] if mem.scale != 1 else [offsets[t] for t in threads]
        if addrs and (min(addrs) < 0 or max(addrs) + count > mem.size):
            t, off = next((t, offsets[t]) for t in threads if not 0 <= offsets[t] * mem.scale <= mem.size - count)
            raise IndexError(
                f"kernel {self.kernel.name}: {step.op.name} of {dt!r} at element {off} of {mem.name},"
                f" which holds {mem.size // mem.scale} elements"
                f" ({self._thread(t)}); an ungated access out of bounds is a code generator bug"
            )
        if mem.local:
            addrs = [self.group_of[t] * mem.size + a for t, a in zip(threads, addrs)]
        return addrs

    # ---- the ops

    def _elementwise(self, step: _Step) -> None:
        args = tuple(self.vals[s] for s in step.src)
        if not any(type(a) is list for a in args):
            self.vals[step.out] = step.fn(args)
            return
        self.vals[step.out] = list(map(step.fn, zip(*(a if type(a) is list else repeat(a) for a in args))))

    def _load(self, step: _Step) -> None:
        ptr, off, gate, alt = step.src
        mem: _Memory = self.vals[ptr]
        offsets, count, data = self.vals[off], step.uop.dtype.count, mem.data
        active = self.mask if gate is None else self._restrict(self.vals[gate])
        if active is None and type(offsets) is not list and not mem.local:  # one address: read it once
            (a,) = self._addresses(step, mem, [offsets], [0])
            self.vals[step.out] = data[a] if count == 1 else tuple(data[a : a + count])
            return
        offsets = self._lanes(offsets)
        threads = range(self.n) if active is None else [t for t in range(self.n) if active[t]]
        addrs = self._addresses(step, mem, offsets, threads)
        read = [data[a] for a in addrs] if count == 1 else [tuple(data[a : a + count]) for a in addrs]
        if active is None:
            self.vals[step.out] = read
            return
        out = list(self._lanes(self.vals[alt])) if alt is not None else [_zero(step.uop.dtype)] * self.n
        for t, value in zip(threads, read):
            out[t] = value
        self.vals[step.out] = out

    def _store(self, step: _Step) -> None:
        ptr, off, gate, val = step.src
        mem: _Memory = self.vals[ptr]
        offsets, value, count, data = self.vals[off], self.vals[val], step.uop.value.dtype.count, mem.data
        active = self.mask if gate is None else self._restrict(self.vals[gate])
        if active is None and type(offsets) is not list and type(value) is not list and not mem.local:
            addrs, values, threads = self._addresses(step, mem, [offsets], [0]), [value], [0]
        else:
            offsets, values = self._lanes(offsets), self._lanes(value)
            threads = range(self.n) if active is None else [t for t in range(self.n) if active[t]]
            addrs = self._addresses(step, mem, offsets, threads)
        if count == 1:
            for t, a in zip(threads, addrs):
                data[a] = values[t]
            return
        for t, a in zip(threads, addrs):
            for lane, v in enumerate(values[t]):
                data[a + lane] = v

    def _copy_async(self, step: _Step) -> None:
        """Each active thread reads its values now (zeros where the gate is false) and they land in local memory at
        the BARRIER ("async", n) that leaves fewer than n newer groups of copies in flight."""
        dst_ptr, dst_off, src_ptr, src_off, gate = step.src
        dst, src, count = self.vals[dst_ptr], self.vals[src_ptr], step.uop.dtype.count
        active = self.mask if gate is None else self._restrict(self.vals[gate])
        threads = [t for t in range(self.n) if self.mask is None or self.mask[t]]
        reading = [t for t in threads if active is None or active[t]]
        read = dict(zip(reading, self._addresses(step, src, self._lanes(self.vals[src_off]), reading)))
        zeros = (_zero(step.uop.dtype.scalar),) * count
        values = [tuple(src.data[read[t] : read[t] + count]) if t in read else zeros for t in threads]
        self.in_flight.append((dst, self._addresses(step, dst, self._lanes(self.vals[dst_off]), threads), values))

    def _land_copies(self, step: _Step) -> None:
        n = step.uop.copies_in_flight
        assert n is not None
        self.groups.append(self.in_flight)
        keep = max(len(self.groups) - n, 0)
        landing, self.groups = self.groups[:keep], self.groups[keep:]
        for mem, addrs, values in (copy for group in landing for copy in group):
            for a, lanes in zip(addrs, values):
                mem.data[a : a + len(lanes)] = list(lanes)
        self.in_flight = []

    def _wmma(self, step: _Step) -> None:
        """Each warp's lanes (consecutive threads of a workgroup) give their fragments of A, B and C; the warp
        computes D = A @ B + C (products exact, each sum rounded once to dtype_out) and each lane gets its part."""
        tc = tensor_core(step.uop.arg)
        if self.group_threads % tc.threads:
            raise RuntimeError(
                f"kernel {self.kernel.name}: {tc.name} needs workgroups of whole warps of {tc.threads} threads,"
                f" launched with {self.group_threads} threads per workgroup"
            )
        a, b, c = (self._lanes(self.vals[s]) for s in step.src)
        out = list(c)
        for w in range(0, self.n, tc.threads):
            warp = range(w, w + tc.threads)
            if self.mask is not None and not all(self.mask[t] for t in warp):
                if any(self.mask[t] for t in warp):
                    raise RuntimeError(
                        f"kernel {self.kernel.name}: {tc.name} runs on part of a warp ({self._thread(w)})"
                    )
                continue
            d = _warp_mma(tc, [a[t] for t in warp], [b[t] for t in warp], [c[t] for t in warp], self.kernel.name)
            out[w : w + tc.threads] = d
        self.vals[step.out] = out

    def _define_acc(self, step: _Step) -> None:
        self.vals[step.out] = self.vals[step.src[0]]

    def _assign(self, step: _Step) -> None:
        new = self.vals[step.src[1]]
        if self.mask is not None:  # inside an IF: only the active threads' registers change
            old = self._lanes(self.vals[step.out])
            new = [n if m else o for m, n, o in zip(self.mask, self._lanes(new), old)]
        self.vals[step.out] = new

    def _range(self, step: _Step) -> int | None:
        end = self.vals[step.src[0]]
        if type(end) is list:  # the trip count must be the same on every thread that runs the loop
            ends = {e for e, m in zip(end, self.mask or repeat(True)) if m}
            if len(ends) != 1:
                raise RuntimeError(f"kernel {self.kernel.name}: a loop's end differs between threads: {sorted(ends)}")
            (end,) = ends
        if end <= 0:
            return step.jump + 1  # past its ENDRANGE
        self.vals[step.out], self.loop_end[step.out] = 0, end
        return None

    def _endrange(self, step: _Step) -> int | None:
        counter = step.src[0]
        if self.vals[counter] + 1 < self.loop_end[counter]:
            self.vals[counter] += 1
            return step.jump + 1  # the first step inside the loop
        return None

    def _if(self, step: _Step) -> int | None:
        self.masks.append(self.mask)
        self.mask = self._restrict(self.vals[step.src[0]])
        if self.mask is not None and not any(self.mask):
            return step.jump  # no thread enters: straight to the ENDIF
        return None

    def _endif(self, step: _Step) -> None:
        self.mask = self.masks.pop()


# ---------------------------------------------------------------- tensor cores


def _gather(tc: TensorCore, operand: str, frags: list[tuple], kernel: str) -> dict[tuple[int, int], float]:
    """An operand's tile from the fragments of a warp's lanes; lanes holding one element must agree on it."""
    layout = tc.fragments()[operand]
    tile: dict[tuple[int, int], float] = {}
    for lane, frag in enumerate(frags):
        for elem, value in enumerate(frag):
            pos = layout.position(lane, elem)
            if tile.setdefault(pos, value) != value and not (value != value and tile[pos] != tile[pos]):
                raise RuntimeError(
                    f"kernel {kernel}: {tc.name}: lanes that hold element {pos} of {operand} give different values"
                    f" ({tile[pos]} and {value} at lane {lane})"
                )
    return tile


def _warp_mma(tc: TensorCore, a: list[tuple], b: list[tuple], c: list[tuple], kernel: str) -> list[tuple]:
    """One warp's WMMA: D = A @ B + C on the tiles the lanes' fragments make, scattered back into D fragments."""
    m, n, k = tc.dims
    ta, tb, tcc = _gather(tc, "A", a, kernel), _gather(tc, "B", b, kernel), _gather(tc, "C", c, kernel)
    if tc.mantissa is not None:  # (TF32: the inputs multiplied with 10 mantissa bits)
        ta, tb = ({pos: tc.rounded(v) for pos, v in t.items()} for t in (ta, tb))
    d = {
        (i, j): truncate(tc.dtype_out, tcc[i, j] + sum(ta[i, x] * tb[x, j] for x in range(k)))
        for i in range(m)
        for j in range(n)
    }
    return [tuple(d[tc.c.position(lane, e)] for e in range(tc.c.elements)) for lane in range(tc.threads)]


# ---------------------------------------------------------------- the device


class PythonProgram(Program):
    """A kernel interpreted in Python; bufs are bytearrays or memoryviews, vals the DEFINE_VARs in order."""

    def __init__(self, device: Compiled, name: str, binary: bytes) -> None:
        super().__init__(device, name, binary)
        _, uops = parse(binary.decode())
        self.kernel = _Kernel(name, uops)

    def __call__(
        self,
        *bufs: Any,
        global_size: tuple[int, int, int] = (1, 1, 1),
        local_size: tuple[int, int, int] = (1, 1, 1),
        vals: tuple[int, ...] = (),
        wait: bool = False,
    ) -> float | None:
        start = time.perf_counter()
        _Launch(self.kernel, bufs, tuple(global_size), tuple(local_size), tuple(vals)).run()
        return time.perf_counter() - start if wait else None


def _bytes_view(mv: memoryview) -> memoryview:
    return mv if mv.format == "B" and mv.ndim == 1 else mv.cast("B")


class PythonAllocator(LRUAllocator):
    """Memory is host memory: a memoryview of a bytearray."""

    caps = AllocatorCaps(host_visible=True)

    def _alloc(self, size: int) -> memoryview:
        return memoryview(bytearray(size))

    def memory(self) -> tuple[int, int] | None:
        return host_memory()

    def copyin(self, dest: memoryview, src: memoryview) -> None:
        src = _bytes_view(src)
        dest[: len(src)] = src

    def copyout(self, dest: memoryview, src: memoryview) -> None:
        dest = _bytes_view(dest)
        dest[:] = src[: len(dest)]

    def as_memoryview(self, opaque: memoryview, size: int) -> memoryview:
        return opaque[:size]


class PythonDevice(Compiled):
    """Runs kernels in the Python interpreter: slow, exact, and needing nothing but Python."""

    priority = -10  # never the default while any other device starts
    renderers = ("PYTHON",)

    def __init__(self, name: str, renderer: str = "PYTHON", tensor_cores_of: str = "") -> None:
        """tensor_cores_of: a GPU architecture whose tensor cores the device emulates (see PythonRenderer)."""
        super().__init__(name, PythonAllocator(), PythonProgram, renderer)
        self.tensor_cores_of = tensor_cores_of

    def renderer_target(self) -> str:
        return self.tensor_cores_of

    def compiler(self) -> Compiler:
        return PythonCompiler()
