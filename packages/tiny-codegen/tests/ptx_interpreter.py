"""A small interpreter of the PTX that tiny.codegen.renderer.ptx writes, to check its numerics without a GPU (no PTX
emulator is packaged on PyPI or Debian). It runs each thread of each block, registers as raw bits of their declared
size, and follows the PTX ISA's definition of each instruction the renderer emits: typed reads of bit-size registers,
clamped shifts, saturating float -> integer cvt (NaN -> 0), sub-word loads that sign- or zero-extend, predicated
instructions, bar.sync across the threads of a block, and misaligned vector accesses as errors. Anything else is
a NotImplementedError: the renderer emitting an instruction this file does not know fails the test.

It checks the renderer against the ISA as written down here; it is not the hardware (exp2/log2/sin.approx are
computed exactly, the hardware's approximations are within about 2 ulp)."""

from __future__ import annotations

import math
import re
import struct
from collections.abc import Iterator
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

import numpy as np

_WIDTH = {"pred": 1, "b8": 8, "s8": 8, "u8": 8, "b16": 16, "s16": 16, "u16": 16, "f16": 16}
_WIDTH |= {"b32": 32, "s32": 32, "u32": 32, "f32": 32, "b64": 64, "s64": 64, "u64": 64, "f64": 64}
_REG = re.compile(r"^%([a-z]+)(\d+)$")
GLOBAL_BASE = 1 << 40  # buffer i lives at (i + 1) * GLOBAL_BASE (+ the misalignment asked for)


class PTXError(RuntimeError):
    """Something the hardware would refuse or fault on: a misaligned access, an address outside every buffer."""


def _mask(bits: int) -> int:
    return (1 << bits) - 1


def to_bits(value: Any, t: str) -> int:
    """A Python value of PTX type t as its bits (a float NaN keeps its payload)."""
    if t == "pred":
        return int(bool(value))
    if t in ("f16", "f32", "f64"):
        np_t, u = {"f16": (np.float16, np.uint16), "f32": (np.float32, np.uint32), "f64": (np.float64, np.uint64)}[t]
        return int(np.array(value, np_t).view(u))
    return int(value) & _mask(_WIDTH[t])


def from_bits(bits: int, t: str) -> Any:
    """The bits of a register (or memory) read as PTX type t."""
    w = _WIDTH[t]
    bits &= _mask(w)
    if t == "pred":
        return bool(bits)
    if t == "f32":
        return np.array(bits, np.uint32).view(np.float32)[()]
    if t == "f64":
        return struct.unpack("<d", struct.pack("<Q", bits))[0]
    if t == "f16":
        return np.array(bits, np.uint16).view(np.float16)[()]
    if t[0] == "s" and bits >> (w - 1):
        return bits - (1 << w)
    return bits


@dataclass
class _Thread:
    tid: tuple[int, int, int]
    regs: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class _Instr:
    guard: tuple[str, bool] | None  # (predicate register, wanted value)
    op: list[str]  # the opcode split at the dots
    args: list[str]


class PTXKernel:
    """One parsed .entry: its parameters, register sizes, shared arrays, instructions and labels."""

    def __init__(self, src: str) -> None:
        body = src[src.index(".visible .entry") :]
        header, code = body.split("{", 1)
        self.params = re.findall(r"\.param\s+\.(\w+)\s+(\w+)", header)
        self.reg_width: dict[str, int] = {}
        self.shared: dict[str, tuple[int, int]] = {}  # name -> (offset, bytes)
        self.code: list[_Instr] = []
        self.labels: dict[str, int] = {}
        shared_size = 0
        # dynamic shared memory (tiny.codegen.renderer.shared): the module's extern array, its size from the source
        extern = re.search(r"^\.extern \.shared \.align \d+ \.b8 (\w+)\[\];$", src[: len(src) - len(body)], re.M)
        if extern is not None:
            size = re.search(r"^// dynamic shared memory: (\d+) bytes$", src, re.M)
            assert size is not None, "an extern shared array needs the size the launch gives it"
            self.shared[extern.group(1)] = (0, int(size.group(1)))
            shared_size = int(size.group(1))
        for raw in code.rsplit("}", 1)[0].splitlines():
            line = raw.strip()
            if not line or line.startswith("//"):
                continue
            if m := re.fullmatch(r"\.reg \.(\w+) %([a-z]+)<(\d+)>;", line):
                self.reg_width[m.group(2)] = _WIDTH[m.group(1)]
            elif m := re.fullmatch(r"\.shared \.align (\d+) \.b8 (\w+)\[(\d+)\];", line):
                shared_size = -(-shared_size // int(m.group(1))) * int(m.group(1))
                self.shared[m.group(2)] = (shared_size, int(m.group(3)))
                shared_size += int(m.group(3))
            elif line.endswith(":"):
                self.labels[line[:-1]] = len(self.code)
            else:
                self.code.append(_parse(line))
        self.shared_size = shared_size


def _parse(line: str) -> _Instr:
    assert line.endswith(";"), line
    line = line[:-1]
    guard = None
    if line.startswith("@"):
        pred, line = line.split(None, 1)
        guard = (pred[2:], False) if pred.startswith("@!") else (pred[1:], True)
    opcode, _, rest = line.partition(" ")
    args, depth, cur = [], 0, ""
    for ch in rest:
        if ch in "{[":
            depth += 1
        elif ch in "}]":
            depth -= 1
        if ch == "," and depth == 0:
            args.append(cur.strip())
            cur = ""
        else:
            cur += ch
    if cur.strip():
        args.append(cur.strip())
    return _Instr(guard, opcode.split("."), args)


class Launch:
    """Memory and parameters of one launch: buffers (bytes) by parameter, int values by name."""

    def __init__(self, kernel: PTXKernel, buffers: list[np.ndarray], vals: dict[str, int], misalign: int = 0) -> None:
        self.k = kernel
        self.buffers = [np.frombuffer(b, np.uint8) if b.flags.writeable is False else b.view(np.uint8) for b in buffers]
        self.misalign = misalign
        self.param_values: dict[str, int] = {}
        bufs = iter(range(len(buffers)))
        for t, name in kernel.params:
            if t == "u64":
                self.param_values[name] = (next(bufs) + 1) * GLOBAL_BASE + misalign
            else:
                self.param_values[name] = vals[name[4:]] & _mask(_WIDTH[t])

    def memory(self, space: str, addr: int, nbytes: int, shared: np.ndarray) -> np.ndarray:
        if space == "shared":
            if addr < 0 or addr + nbytes > len(shared):
                raise PTXError(f"shared access at {addr} of {nbytes} bytes is outside {len(shared)} bytes")
            return shared[addr : addr + nbytes]
        index, offset = addr // GLOBAL_BASE - 1, addr % GLOBAL_BASE - self.misalign
        if not 0 <= index < len(self.buffers) or offset < 0 or offset + nbytes > len(self.buffers[index]):
            raise PTXError(f"global access at buffer {index} byte {offset} ({nbytes} bytes) is out of bounds")
        return self.buffers[index][offset : offset + nbytes]


def run(
    src: str,
    buffers: list[np.ndarray],
    grid: tuple[int, int, int],
    block: tuple[int, int, int],
    vals: dict[str, int] | None = None,
    misalign: int = 0,
) -> None:
    """Run the kernel in `src` on NumPy arrays (written in place) over grid x block threads. `misalign` puts every
    buffer that many bytes past a 256-byte boundary (a vector access must then take its lane-by-lane path)."""
    k = PTXKernel(src)
    launch = Launch(k, buffers, vals or {}, misalign)
    for bz in range(grid[2]):
        for by in range(grid[1]):
            for bx in range(grid[0]):
                shared = np.zeros(max(k.shared_size, 1), np.uint8)
                threads = [
                    _execute(k, launch, shared, (bx, by, bz), (tx, ty, tz))
                    for tz in range(block[2])
                    for ty in range(block[1])
                    for tx in range(block[0])
                ]
                _run_block(threads)


def _run_block(threads: list[Iterator[None]]) -> None:
    """Each thread runs to its next bar.sync (a yield) or its end; a barrier some threads skip is an error."""
    alive = list(threads)
    while alive:
        reached, finished = [], []
        for t in alive:
            try:
                next(t)
                reached.append(t)
            except StopIteration:
                finished.append(t)
        if reached and finished:
            raise PTXError("some threads of a block ended while others wait at bar.sync")
        alive = reached


def _execute(
    k: PTXKernel, launch: Launch, shared: np.ndarray, ctaid: tuple[int, ...], tid: tuple[int, ...]
) -> Iterator[None]:
    regs: dict[str, int] = {}
    specials = {f"%tid.{a}": tid[i] for i, a in enumerate("xyz")} | {
        f"%ctaid.{a}": ctaid[i] for i, a in enumerate("xyz")
    }

    def width(reg: str) -> int:
        m = _REG.match(reg)
        if m is None or m.group(1) not in k.reg_width:
            raise NotImplementedError(f"not a declared register: {reg}")
        return k.reg_width[m.group(1)]

    def bits(x: str, t: str) -> int:
        if x.startswith("%") and x in specials:
            return specials[x]
        if x.startswith("%"):
            if x not in regs:
                raise PTXError(f"register {x} is read before it is written")
            return regs[x]
        if x in k.shared:
            return k.shared[x][0]
        if x.startswith("0f"):
            return int(x[2:], 16)
        if x.startswith("0d"):
            return int(x[2:], 16)
        return int(x, 0) & _mask(max(_WIDTH[t], 1))

    def read(x: str, t: str) -> Any:
        return from_bits(bits(x, t), t)

    def write(reg: str, value: Any, t: str, extend: str = "") -> None:
        b = to_bits(value, t)
        w = width(reg)
        if extend == "s" and _WIDTH[t] < w and b >> (_WIDTH[t] - 1):
            b |= _mask(w) ^ _mask(_WIDTH[t])
        regs[reg] = b & _mask(w) if w > 1 else b & 1

    pc = 0
    while pc < len(k.code):
        ins = k.code[pc]
        pc += 1
        if ins.guard is not None and bool(regs[ins.guard[0]]) != ins.guard[1]:
            continue
        op, a = ins.op, ins.args
        name = op[0]
        t = op[-1]
        if name == "ret":
            return
        if name == "bra":
            pc = k.labels[a[0]]
        elif name == "bar":
            yield
        elif name == "ld" and op[1] == "param":
            write(a[0], launch.param_values[a[1].strip("[]")], t)
        elif name == "cvta":
            regs[a[0]] = bits(a[1], "u64")
        elif name in ("ld", "st"):
            _memory(op, a, launch, shared, bits, write)
        elif name == "mov":
            if a[1].startswith("{"):
                lanes = [bits(x.strip(), "b32") for x in a[1].strip("{}").split(",")]
                lane_bits = _WIDTH[t] // len(lanes)
                write(a[0], sum(v << (i * lane_bits) for i, v in enumerate(lanes)), t)
            else:
                write(a[0], bits(a[1], t), "b" + str(_WIDTH[t]) if t != "pred" else "pred")
        elif name == "setp":
            write(a[0], _compare(op[1], read(a[1], t), read(a[2], t)), "pred")
        elif name == "selp":
            write(a[0], bits(a[1], t) if read(a[3], "pred") else bits(a[2], t), "b" + str(_WIDTH[t]))
        elif name == "cvt":
            _cvt(op, a, read, write)
        elif name in ("and", "or", "xor", "not"):
            xs = [bits(x, t) for x in a[1:]]
            if name == "not":
                r = ~xs[0]
            else:
                r = {"and": xs[0] & xs[1], "or": xs[0] | xs[1], "xor": xs[0] ^ xs[1]}[name]
            write(a[0], r & _mask(_WIDTH[t]), t)
        elif name in ("shl", "shr"):
            w, n = _WIDTH[t], read(a[2], "u32")
            if name == "shl":
                r = 0 if n >= w else bits(a[1], t) << n
            else:
                x = read(a[1], t)
                r = (x >> min(n, w - 1) if n >= w else x >> n) if t[0] == "s" else (0 if n >= w else x >> n)
            write(a[0], r, t)
        elif name == "bfe":
            pos, length = read(a[2], "u32"), read(a[3], "u32")
            write(a[0], (read(a[1], t) >> pos) & _mask(length), t)
        else:  # mul.wide.s32 reads s32 and writes s64
            dest = f"{t[0]}{2 * _WIDTH[t]}" if "wide" in op else t
            write(a[0], _arith(op, [read(x, t) for x in a[1:]]), dest)


def _compare(cmp: str, x: Any, y: Any) -> bool:
    nan = (isinstance(x, float) or isinstance(x, np.floating)) and (math.isnan(float(x)) or math.isnan(float(y)))
    if cmp == "nan":
        return bool(nan)
    if cmp.endswith("u") and nan:  # the unordered forms: true where either is NaN
        return True
    cmp = cmp.rstrip("u") if cmp != "u" else cmp
    if nan:
        return False
    return bool({"lt": x < y, "le": x <= y, "gt": x > y, "ge": x >= y, "eq": x == y, "ne": x != y}[cmp])


def _memory(op: list[str], a: list[str], launch: Launch, shared: np.ndarray, bits: Any, write: Any) -> None:
    space, t = op[1], op[-1]
    vec = int(op[2][1:]) if op[2].startswith("v") else 1
    size = _WIDTH[t] // 8
    addr_text = a[1] if op[0] == "ld" else a[0]
    base, _, disp = addr_text.strip("[]").partition("+")
    addr = bits(base, "u64") + (int(disp) if disp else 0)
    if addr % (size * vec):
        raise PTXError(f"misaligned {'.'.join(op)} at address {addr:#x}")
    mem = launch.memory(space, addr, size * vec, shared)
    if op[0] == "ld":
        dests = [x.strip() for x in a[0].strip("{}").split(",")]
        for i, d in enumerate(dests):
            raw = int.from_bytes(mem[i * size : (i + 1) * size].tobytes(), "little")
            write(d, raw, "b" + str(_WIDTH[t]), "s" if t[0] == "s" else "")
    else:
        values = [x.strip() for x in a[1].strip("{}").split(",")]
        for i, v in enumerate(values):
            mem[i * size : (i + 1) * size] = np.frombuffer(
                (bits(v, t) & _mask(size * 8)).to_bytes(size, "little"), np.uint8
            )


def _round_int(x: float, mode: str) -> float:
    return {"rzi": math.trunc, "rni": _rint, "rmi": math.floor, "rpi": math.ceil}[mode](x)


def _rint(x: float) -> float:
    return float(np.rint(x))


def _cvt(op: list[str], a: list[str], read: Any, write: Any) -> None:
    dt, st = op[-2], op[-1]
    mode = next((m for m in op[1:-2] if m in ("rn", "rz", "rm", "rp", "rni", "rzi", "rmi", "rpi")), "")
    x = read(a[1], st)
    if st[0] in "su" and dt[0] in "su":  # integer -> integer: the low bits
        write(a[0], x, dt, "s" if dt[0] == "s" else "")
    elif st[0] in "su":  # integer -> float, rounded to nearest
        write(a[0], _float_of(Fraction(int(x)), dt), dt)
    elif dt[0] in "su":  # float -> integer: rounded as asked, saturated, NaN -> 0
        f = float(x)
        w = _WIDTH[dt]
        lo, hi = (-(1 << (w - 1)), (1 << (w - 1)) - 1) if dt[0] == "s" else (0, (1 << w) - 1)
        if math.isnan(f):
            n = 0
        elif math.isinf(f):
            n = hi if f > 0 else lo
        else:
            n = min(max(int(_round_int(f, mode or "rzi")), lo), hi)
        write(a[0], n, dt, "s" if dt[0] == "s" else "")
    elif dt == "bf16":  # float32 -> bfloat16's bits (sm_80): to nearest even, NaN -> the canonical 0x7fff
        u = to_bits(x, "f32")
        assert st == "f32" and mode == "rn", op
        write(a[0], 0x7FFF if math.isnan(float(x)) else (u + 0x7FFF + ((u >> 16) & 1)) >> 16, "b16")
    else:  # float -> float
        f = float(x)
        if mode in ("rni", "rzi", "rmi", "rpi") and math.isfinite(f):
            f = _round_int(f, mode)
            f = math.copysign(f, float(x)) if f == 0 else f
        write(a[0], _float_of(f, dt), dt)


def _float_of(v: Fraction | float, t: str) -> Any:
    """A value rounded once to the float type t."""
    if isinstance(v, Fraction):
        if t == "f64":
            return float(v)
        v = float(v) if abs(v.numerator) < 2**53 and v.denominator == 1 else _once(v, t)
    if t == "f32":
        return np.float32(v)
    if t == "f16":
        return np.float16(v)
    return float(v)


def _once(v: Fraction, t: str) -> float:
    """An integer too wide for a double, rounded straight to float32/float16 (not through float64)."""
    bits = {"f32": 24, "f16": 11}[t]
    n = int(v)
    shift = max(abs(n).bit_length() - bits, 0)
    q, r = divmod(abs(n), 1 << shift)
    half = 1 << (shift - 1) if shift else 0
    if shift and (r > half or (r == half and q & 1)):
        q += 1
    return math.copysign(float(q << shift), n)


def _arith(op: list[str], xs: list[Any]) -> Any:
    name, t = op[0], op[-1]
    if t[0] == "f":
        return _float_arith(name, t, xs)
    w = _WIDTH[t]
    if name == "add":
        return xs[0] + xs[1]
    if name == "sub":
        return xs[0] - xs[1]
    if name == "mul":
        return xs[0] * xs[1]  # .lo keeps the low bits; .wide widens: both are the exact product, masked on write
    if name == "mad":
        return xs[0] * xs[1] + xs[2]
    if name == "neg":
        return -xs[0]
    if name == "clz":
        return w - (xs[0] & _mask(w)).bit_length()
    if name in ("min", "max"):
        return (min if name == "min" else max)(xs)
    if name in ("div", "rem"):
        a, b = xs
        if b == 0:
            return _mask(w)  # PTX leaves it unspecified; the hardware's all-ones shows a missing guard
        q = abs(a) // abs(b) * (1 if (a < 0) == (b < 0) else -1)
        return q if name == "div" else a - b * q
    raise NotImplementedError(f"the PTX interpreter has no {'.'.join(op)}")


def _float_arith(name: str, t: str, xs: list[Any]) -> Any:
    np_t = {"f16": np.float16, "f32": np.float32, "f64": np.float64}[t]
    v = [np_t(x) for x in xs]
    with np.errstate(all="ignore"):
        if name == "add":
            return v[0] + v[1]
        if name == "sub":
            return v[0] - v[1]
        if name == "mul":
            return v[0] * v[1]
        if name == "neg":
            return -v[0]
        if name == "abs":
            return np.abs(v[0])
        if name == "div":
            return v[0] / v[1]
        if name == "rcp":
            return np_t(1) / v[0]
        if name == "sqrt":
            return np.sqrt(v[0])
        if name == "fma":
            return _fma(v, np_t)
        if name == "ex2":
            return np_t(np.exp2(np.float64(v[0])))
        if name == "lg2":
            return np_t(np.log2(np.float64(v[0])))
        if name == "sin":
            return np_t(np.sin(np.float64(v[0])))
        if name in ("min", "max"):
            return (np.fmin if name == "min" else np.fmax)(v[0], v[1])
    raise NotImplementedError(f"the PTX interpreter has no {name}.{t}")


def _fma(v: list[Any], np_t: Any) -> Any:
    """a * b + c rounded once."""
    a, b, c = (float(x) for x in v)
    if not all(math.isfinite(x) for x in (a, b, c)):
        return np_t(a * b + c)
    exact = Fraction(a) * Fraction(b) + Fraction(c)
    return np_t(float(exact)) if np_t is np.float64 else np_t(_once_float(exact, np_t))


def _once_float(v: Fraction, np_t: Any) -> float:
    return float(np_t(float(v)))
