"""The LLVM IR renderer: a linearized kernel as LLVM's text IR, one function in SSA form.

Loops are basic blocks (a header with phi nodes for the counter and for every accumulator the loop assigns, a
latch, an exit); an IF is a branch around its body with phi nodes where it ends. Loads and stores go through
`getelementptr`; a gated load or store branches around the memory access. Vectors are LLVM vectors.

What depends on the target sits in `LLVMRenderer`'s target part (triple, data layout, address spaces, the
kernel's signature and how hardware indices and barriers are read); the CPU is the default, and a GPU target
(AMDGPU) overrides those few methods and keeps the rest.

Numbers follow tiny.ir.alu, as the C renderer does: integer division and remainder truncate toward zero and give
0 for a zero divisor, shifts by the width or more give 0 (or the sign), MAX lets NaN win, float -> integer casts
give the minimum where the value does not fit. bfloat16 is emulated as the C renderer does: float registers,
16 bits in memory, rounded after each op. float16 is LLVM's `half`; float64 -> float16 rounds once.
"""

from __future__ import annotations

import re
import struct
from collections.abc import Callable
from dataclasses import dataclass, field

from tiny.codegen.renderer.prefetch import locality, prefetches
from tiny.codegen.renderer.walker import ONE_METHOD_PER_OP, Walk, WalkingRenderer, summed_vector
from tiny.ir.device import RendererCaps
from tiny.ir.dtypes import DType, PtrDType, dtypes, truncate
from tiny.ir.uop import GroupOp, Ops, UOp

_TYPES = {
    "bool": "i1",
    "int8": "i8",
    "int16": "i16",
    "int32": "i32",
    "int64": "i64",
    "uint8": "i8",
    "uint16": "i16",
    "uint32": "i32",
    "uint64": "i64",
    "float16": "half",
    "bfloat16": "float",  # emulated: float in registers, rounded after each op; 16 bits in memory
    "float32": "float",
    "float64": "double",
}
_MEMORY_TYPES = _TYPES | {"bool": "i8", "bfloat16": "i16"}  # where memory holds another type than registers
_INTRINSICS = {Ops.SQRT: "sqrt", Ops.EXP2: "exp2", Ops.LOG2: "log2", Ops.SIN: "sin", Ops.TRUNC: "trunc"}
_EXACT = frozenset({Ops.WHERE, Ops.MAX, Ops.NEG, Ops.TRUNC, Ops.BITCAST})  # no bfloat16 rounding after these
_LOCAL_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.]*")

# Helper functions a kernel may call, defined in the module where used; LLVM inlines them.
_HELPERS = {
    "tiny_bf16_to_f32": (
        "define internal float @tiny_bf16_to_f32(i16 %b) alwaysinline {\n"
        "  %w = zext i16 %b to i32\n  %s = shl i32 %w, 16\n  %f = bitcast i32 %s to float\n  ret float %f\n}\n"
    ),
    # round to nearest even; a NaN becomes the quiet NaN 0x7fc0
    "tiny_f32_to_bf16": (
        "define internal i16 @tiny_f32_to_bf16(float %f) alwaysinline {\n"
        "  %u = bitcast float %f to i32\n  %abs = and i32 %u, 2147483647\n  %nan = icmp ugt i32 %abs, 2139095040\n"
        "  %hi = lshr i32 %u, 16\n  %odd = and i32 %hi, 1\n  %bias = add i32 %odd, 32767\n"
        "  %r = add i32 %u, %bias\n  %top = lshr i32 %r, 16\n  %t = trunc i32 %top to i16\n"
        "  %out = select i1 %nan, i16 32704, i16 %t\n  ret i16 %out\n}\n"
    ),
    "tiny_bf16_round": (
        "define internal float @tiny_bf16_round(float %f) alwaysinline {\n"
        "  %b = call i16 @tiny_f32_to_bf16(float %f)\n  %r = call float @tiny_bf16_to_f32(i16 %b)\n  ret float %r\n}\n"
    ),
    # float64 -> float32 rounded to odd: rounding that once more to float16 gives the correctly rounded value
    "tiny_f64_to_f32_odd": (
        "define internal float @tiny_f64_to_f32_odd(double %x) alwaysinline {\n"
        "  %f = fptrunc double %x to float\n  %back = fpext float %f to double\n"
        "  %inexact = fcmp one double %back, %x\n  %bits = bitcast float %f to i32\n"
        "  %ax = call double @llvm.fabs.f64(double %x)\n  %ab = call double @llvm.fabs.f64(double %back)\n"
        "  %up = fcmp ogt double %ab, %ax\n  %down = sub i32 %bits, 1\n"
        "  %toward0 = select i1 %up, i32 %down, i32 %bits\n  %odd = or i32 %toward0, 1\n"
        "  %r = select i1 %inexact, i32 %odd, i32 %bits\n  %out = bitcast i32 %r to float\n  ret float %out\n}\n"
    ),
}
# 2**f on [-0.5, 0.5], a degree-6 minimax polynomial (Cephes' exp2f), highest power first: the C renderer's
_EXP2_POLY = (
    1.535336188319500e-4,
    1.339887440266574e-3,
    9.618437357674640e-3,
    5.550332471162809e-2,
    2.402264791363012e-1,
    6.931472028550421e-1,
    1.0,
)
_ROUNDER = 12582912.0  # 1.5 * 2**23: adding and taking it away rounds a float in (-2**22, 2**22) to an integer


def _vexp2_f32(n: int, const: Callable[[float], str]) -> str:
    """exp2 on <n x float>, in the vector unit and inlined, as the C renderer's tiny_vexp2 (at most 1 ulp): x is
    clamped to [-151, 129] (NaN stays NaN), split as k + f with k = round(x), 2**f by the polynomial and 2**k
    applied as two powers of two, 2**(k>>1) and 2**(k - (k>>1)), each a normal float, so a subnormal result is
    rounded once and one past the range is inf. k is read off the bits of x + 1.5 * 2**23 (its low bits hold the
    integer), so no float-to-int conversion is needed, which LLVM makes poison for NaN. llvm.exp2 on a vector is
    a libm call per lane: 8 to 20 times as slow in softmax's and the elementwise chain's kernels."""
    t, i = f"<{n} x float>", f"<{n} x i32>"

    def ints(v: int) -> str:
        return "<" + ", ".join([f"i32 {v}"] * n) + ">"

    lines = [
        f"%lo = fcmp olt {t} %x, {const(-151.0)}",
        f"%c0 = select <{n} x i1> %lo, {t} {const(-151.0)}, {t} %x",
        f"%hi = fcmp ogt {t} %c0, {const(129.0)}",
        f"%c = select <{n} x i1> %hi, {t} {const(129.0)}, {t} %c0",
        f"%r = fadd {t} %c, {const(_ROUNDER)}",
        f"%k0 = fsub {t} %r, {const(_ROUNDER)}",
        f"%f = fsub {t} %c, %k0",
        f"%p0 = fmul contract {t} %f, {const(_EXP2_POLY[0])}",
    ]
    p = "%p0"
    for j, coefficient in enumerate(_EXP2_POLY[1:], 1):
        lines.append(f"%s{j} = fadd contract {t} {p}, {const(coefficient)}")
        if j < len(_EXP2_POLY) - 1:
            lines.append(f"%p{j} = fmul contract {t} %s{j}, %f")
        p = f"%s{j}" if j == len(_EXP2_POLY) - 1 else f"%p{j}"
    lines += [
        f"%rb = bitcast {t} %r to {i}",
        f"%k = sub {i} %rb, {ints(0x4B400000)}",
        f"%h = ashr {i} %k, {ints(1)}",
        f"%kh = sub {i} %k, %h",
        f"%e1 = add {i} %h, {ints(127)}",
        f"%e2 = add {i} %kh, {ints(127)}",
        f"%b1 = shl {i} %e1, {ints(23)}",
        f"%b2 = shl {i} %e2, {ints(23)}",
        f"%m1 = bitcast {i} %b1 to {t}",
        f"%m2 = bitcast {i} %b2 to {t}",
        f"%q = fmul {t} {p}, %m1",
        f"%out = fmul {t} %q, %m2",
        f"ret {t} %out",
    ]
    body = "".join(f"  {line}\n" for line in lines)
    return f"define internal {t} @tiny_vexp2_v{n}f32({t} %x) alwaysinline {{\n{body}}}\n"


_HELPER_NEEDS = {"tiny_bf16_round": ("tiny_f32_to_bf16", "tiny_bf16_to_f32")}
_HELPER_DECLARES = {"tiny_f64_to_f32_odd": ("declare double @llvm.fabs.f64(double)",)}


@dataclass
class _Loop:
    """A RANGE being rendered: its blocks and the phi nodes of the accumulators it assigns."""

    counter: str
    next: str
    header: str
    latch: str
    exit: str
    phis: list[tuple[UOp, str, str, str, int]] = field(default_factory=list)  # acc, phi, value before, pred, line


@dataclass
class _If:
    """An IF being rendered: where it branched from, its end block and the accumulators' values before it."""

    pred: str
    end: str
    before: dict[UOp, str]


class _Function(Walk):
    """One function being written: the walk, the block it is in, the accumulators' SSA values, the loops and ifs
    open, and what the module needs besides (helpers, declarations, workgroup memory). Values and labels share one
    count (%v1, loop2, %acc3 ...)."""

    def __init__(self, uops: list[UOp]) -> None:
        super().__init__(uops, first=1)
        self.block = "entry"
        self.helpers: set[str] = set()
        self.declares: set[str] = set()
        self.module: list[str] = []  # global definitions (workgroup memory)
        self.fusable = _accumulator_updates(uops)  # accumulator updates acc + a*b and their products: contract
        self.acc: dict[UOp, str] = {}  # DEFINE_ACC -> the SSA value it holds now
        self.assigned = _assigned_inside(uops)
        self.loops: dict[UOp, _Loop] = {}  # each RANGE open
        self.ifs: dict[UOp, _If] = {}  # each IF open
        self.prefetches: dict[UOp, int] = {}  # loads to prefetch ahead of (on a CPU), with the elements ahead

    def val(self, s: UOp) -> str:
        """The SSA value an op stands for (an accumulator's: the value it holds now)."""
        if s.op is Ops.ASSIGN:
            return self.acc[s.src[0]]
        if s.op is Ops.DEFINE_ACC:
            return self.acc[s]
        return self.names[s]

    def fresh(self, prefix: str = "v", count: str | None = "") -> str:
        return "%" + super().fresh(prefix, count)

    def label(self, prefix: str) -> str:
        return super().fresh(prefix, "")

    def line(self, text: str) -> None:
        self.lines.append("  " + text)

    def placeholder(self) -> int:
        """An empty line to write later (a phi whose value comes at the loop's end): its index."""
        self.line("")
        return len(self.lines) - 1

    def value(self, rhs: str) -> str:
        name = self.fresh()
        self.line(f"{name} = {rhs}")
        return name

    def start_block(self, name: str) -> None:
        self.lines.append(f"{name}:")
        self.block = name

    def call(self, helper: str, ret: str, args: str) -> str:
        self.helpers.add(helper)
        return self.value(f"call {ret} @{helper}({args})")


class LLVMRenderer(WalkingRenderer):
    """LLVM IR for the CPU: one call per thread, its number (gidx0) an i32 argument after the variables."""

    caps = RendererCaps(language="LLVM", vector_width=8, narrow_vectors=True)
    prefetch = True  # loads that stream through memory prefetch ahead (a CPU's; not a GPU's)

    def __init__(self, target: str = "") -> None:
        """target: 'machine;vector_width=N;threads=T;prefetch_locality=L;features' as the CPU device reports it
        (features: f16; the locality of prefetches, tiny.codegen.renderer.prefetch.locality, may be left out)."""
        super().__init__(target)
        parts = target.split(";") if target else []
        width = next((int(p.split("=")[1]) for p in parts if p.startswith("vector_width=")), 8)
        threads = next((int(p.split("=")[1]) for p in parts if p.startswith("threads=")), 1)
        self.prefetch_locality = locality(target)
        features = set(parts[-1].split(",")) if parts else {"f16"}
        missing = {dtypes.float16} if "f16" not in features else set()
        self.caps = RendererCaps(
            language="LLVM",
            vector_width=width,
            threads=threads,
            dtypes=frozenset(dtypes.all()) - missing,
            narrow_vectors=True,
        )

    # ---------------------------------------------------------------- the target: what a GPU target overrides

    triple = ""  # empty: the compiler sets the host's triple and data layout
    datalayout = ""
    global_addrspace = 0
    local_addrspace = 3

    def signature(self, name: str, params: list[str]) -> str:
        return f'define void @"{name}"({", ".join(params)}) nounwind'

    arg_int = "i32"  # the type of integer arguments (variables, the CPU's thread number): C's int

    def special_param(self, u: UOp) -> str | None:
        """The parameter a hardware index arrives in, or None when the target reads it in the body (special())."""
        return f"{self.arg_int} %{_local_name(u.arg[0])}"

    def special(self, f: _Function, u: UOp) -> str:
        """The value of a hardware index the target reads in the body (a GPU's workitem id)."""
        raise NotImplementedError(f"{type(self).__name__} reads hardware indices as parameters")

    def barrier(self, f: _Function) -> None:
        raise NotImplementedError(f"{type(self).__name__} has no workgroup barriers: the CPU has no local memory")

    def helper_source(self, name: str) -> str:
        """The definition of a helper function a kernel calls (f.call); a target may add its own."""
        if (m := re.fullmatch(r"tiny_vexp2_v(\d+)f32", name)) is not None:
            n = int(m.group(1))
            return _vexp2_f32(n, lambda v: self.const(v, dtypes.float32.vec(n)))
        return _HELPERS[name]

    # ---------------------------------------------------------------- types and constants

    def ltype(self, dt: DType) -> str:
        """The LLVM type of a register value of dt."""
        if isinstance(dt, PtrDType):
            space = self.local_addrspace if dt.local else self.global_addrspace
            return f"ptr addrspace({space})" if space else "ptr"
        if dt.scalar.name not in _TYPES:
            raise NotImplementedError(f"{type(self).__name__} has no type for {dt!r}")
        t = _TYPES[dt.scalar.name]
        return t if dt.count == 1 else f"<{dt.count} x {t}>"

    def mtype(self, dt: DType) -> str:
        """The LLVM type of dt in memory (a bool is a byte there, a bfloat16 16 bits)."""
        t = _MEMORY_TYPES[dt.scalar.name]
        return t if dt.count == 1 else f"<{dt.count} x {t}>"

    def const(self, value: object, dt: DType) -> str:
        """A constant's text as an operand (its type is written by the instruction)."""
        if dt.count > 1:
            lanes = value if isinstance(value, tuple) else (value,) * dt.count
            lane_type = self.ltype(dt.scalar)
            return "<" + ", ".join(f"{lane_type} {self.const(v, dt.scalar)}" for v in lanes) + ">"
        if not isinstance(value, (int, float, bool)):
            raise TypeError(f"a constant of {dt!r} must be a number, got {value!r}")
        v = truncate(dt, value)
        if dt.is_bool:
            return "true" if v else "false"
        if dt.is_int:
            assert isinstance(v, int)
            return str(v - (1 << dt.bits) if v >= 1 << (dt.bits - 1) else v)  # LLVM integers are signless
        if dt == dtypes.float16:
            return "0xH" + struct.pack(">e", v).hex().upper()
        return "0x" + struct.pack(">d", v).hex().upper()  # float and double constants are written as doubles

    # ---------------------------------------------------------------- the kernel

    rules = ONE_METHOD_PER_OP

    def render(self, name: str, uops: list[UOp]) -> str:
        f = _Function(uops)
        if self.prefetch:
            f.prefetches = prefetches(uops)
        f = self.walk(f)
        header = [f'target triple = "{self.triple}"'] * bool(self.triple)
        header += [f'target datalayout = "{self.datalayout}"'] * bool(self.datalayout)
        helpers = _with_needs(f.helpers)
        declares = sorted(f.declares | {d for h in helpers for d in _HELPER_DECLARES.get(h, ())})
        body = "\n".join([self.signature(name, f.params()) + " {", "entry:", *f.lines, "  ret void", "}"])
        defined = "".join(self.helper_source(h) for h in helpers)
        parts = ["\n".join(header), "\n".join(f.module), defined, body, "\n".join(declares)]
        return "\n\n".join(p for p in parts if p) + "\n"

    def write_buffer(self, f: _Function, u: UOp) -> str:
        name = f"%data{u.arg}"
        f.buffers.append((u.arg, f"{self.ltype(u.dtype)} noalias {name}"))
        return name

    def write_variable(self, f: _Function, u: UOp) -> str:
        arg = "%" + _local_name(u.arg[0])
        f.variables.append(f"{self.arg_int} {arg}")
        return self._widened(f, arg, u.dtype)

    def write_local(self, f: _Function, u: UOp) -> str:
        name = f"@{_local_name(u.arg[0])}"
        assert isinstance(u.dtype, PtrDType) and u.dtype.base is not None
        n = u.arg[1] * u.dtype.count
        f.module.append(
            f"{name} = internal addrspace({self.local_addrspace})"
            f" global [{n} x {self.mtype(u.dtype.base.scalar)}] undef, align 16"
        )
        return name

    def write_special(self, f: _Function, u: UOp) -> str:
        param = self.special_param(u)
        if param is None:
            return self.special(f, u)
        f.specials.append(param)
        return self._widened(f, param.split()[-1], u.dtype)

    def write_const(self, f: _Function, u: UOp) -> str:
        return self.const(u.arg, u.dtype)

    def write_range(self, f: _Function, u: UOp) -> str:
        f.loops[u] = loop = self._open_loop(f, u, f.val(u.end), f.assigned.get(u, ()), f.acc)
        return loop.counter

    def write_endrange(self, f: _Function, u: UOp) -> None:
        self._close_loop(f, f.loops.pop(u.opened), self.ltype(u.opened.dtype), f.acc)

    def write_if(self, f: _Function, u: UOp) -> None:
        then, end = f.label("then"), f.label("endif")
        f.ifs[u] = _If(f.block, end, {a: f.acc[a] for a in f.assigned.get(u, ()) if a in f.acc})
        f.line(f"br i1 {f.val(u.condition)}, label %{then}, label %{end}")
        f.start_block(then)

    def write_endif(self, f: _Function, u: UOp) -> None:
        self._close_if(f, f.ifs.pop(u.opened), f.acc)

    def write_index(self, f: _Function, u: UOp) -> str:
        ptr, off = u.pointer, u.offset
        assert isinstance(ptr.dtype, PtrDType) and ptr.dtype.base is not None
        where = f"{self.ltype(ptr.dtype)} {f.val(ptr)}, {self.ltype(off.dtype)} {f.val(off)}"
        return f.value(f"getelementptr {self.mtype(ptr.dtype.base)}, {where}")

    def write_acc(self, f: _Function, u: UOp) -> None:
        f.acc[u] = f.val(u.src[0])  # (an accumulator's value is the SSA value it holds now: Function.val)

    def write_assign(self, f: _Function, u: UOp) -> None:
        f.acc[u.src[0]] = f.val(u.value)

    def write_barrier(self, f: _Function, u: UOp) -> None:
        self.barrier(f)

    def write_vectorize(self, f: _Function, u: UOp) -> str:
        vec, lane_type = "poison", self.ltype(u.dtype.scalar)
        for i, s in enumerate(u.src):
            vec = f.value(f"insertelement {self.ltype(u.dtype)} {vec}, {lane_type} {f.val(s)}, i32 {i}")
        return vec

    def write_gep(self, f: _Function, u: UOp) -> str:
        src = u.src[0]
        lanes = u.arg if isinstance(u.arg, tuple) else (u.arg,)
        t = self.ltype(src.dtype)
        if u.dtype.count == 1:
            return f.value(f"extractelement {t} {f.val(src)}, i32 {lanes[0]}")
        mask = ", ".join(f"i32 {i}" for i in lanes)
        return f.value(f"shufflevector {t} {f.val(src)}, {t} poison, <{len(lanes)} x i32> <{mask}>")

    def write_cast(self, f: _Function, u: UOp) -> str:
        return self._rounded(f, u, self._cast(f, u, f.val(u.source)))

    def write_bitcast(self, f: _Function, u: UOp) -> str:
        return self._bitcast(f, u, f.val(u.source))

    def write_alu(self, f: _Function, u: UOp) -> str:
        if (vector := summed_vector(u)) is not None:  # (the extracts and adds it replaces are left dead)
            t, vt = self.ltype(u.dtype), self.ltype(vector.dtype)
            name = f"llvm.vector.reduce.add.v{vector.dtype.count}{t}"
            f.declares.add(f"declare {t} @{name}({vt})")
            return f.value(f"call {t} @{name}({vt} {f.val(vector)})")
        return self._rounded(f, u, self._alu(f, u, [f.val(s) for s in u.src]))

    def write_wmma(self, f: _Function, u: UOp) -> str:
        return self.wmma(f, u, [f.val(s) for s in u.src])

    def wmma(self, f: _Function, u: UOp, args: list[str]) -> str:
        """A tensor-core multiply-accumulate (a target with tensor cores renders its instruction)."""
        raise NotImplementedError(f"{type(self).__name__} cannot render WMMA: its target has no tensor cores")

    def _widened(self, f: _Function, arg: str, dt: DType) -> str:
        """An integer argument (arg_int) as a value of dt, sign-extended as C's int converts."""
        if self.ltype(dt) == self.arg_int:
            return arg
        return f.value(f"sext {self.arg_int} {arg} to {self.ltype(dt)}")

    # ---------------------------------------------------------------- loops and ifs

    def _open_loop(self, f: _Function, r: UOp, end: str, accs: tuple[UOp, ...], acc: dict[UOp, str]) -> _Loop:
        t = self.ltype(r.dtype)
        pred = f.block
        loop = _Loop(f.fresh("r"), f.fresh("rnext"), f.label("loop"), f.label("latch"), f.label("exit"))
        f.line(f"br label %{loop.header}")
        f.start_block(loop.header)
        f.line(f"{loop.counter} = phi {t} [0, %{pred}], [{loop.next}, %{loop.latch}]")
        for a in (a for a in accs if a in acc):  # made before the loop; its phi is written at the loop's end
            phi = f.fresh("acc")
            loop.phis.append((a, phi, acc[a], pred, f.placeholder()))
            acc[a] = phi
        body = f.label("body")
        go_on = f.value(f"icmp slt {t} {loop.counter}, {end}")
        f.line(f"br i1 {go_on}, label %{body}, label %{loop.exit}")
        f.start_block(body)
        return loop

    def _close_loop(self, f: _Function, loop: _Loop, t: str, acc: dict[UOp, str]) -> None:
        f.line(f"br label %{loop.latch}")
        f.start_block(loop.latch)
        f.line(f"{loop.next} = add nsw {t} {loop.counter}, 1")
        f.line(f"br label %{loop.header}")
        for a, phi, before, pred, at in loop.phis:
            f.lines[at] = f"  {phi} = phi {self.ltype(a.dtype)} [{before}, %{pred}], [{acc[a]}, %{loop.latch}]"
            acc[a] = phi  # after the loop the register holds what the header saw last
        f.start_block(loop.exit)

    def _close_if(self, f: _Function, block: _If, acc: dict[UOp, str]) -> None:
        last = f.block
        f.line(f"br label %{block.end}")
        f.start_block(block.end)
        for a, before in block.before.items():
            if acc[a] != before:
                acc[a] = f.value(f"phi {self.ltype(a.dtype)} [{before}, %{block.pred}], [{acc[a]}, %{last}]")

    # ---------------------------------------------------------------- memory

    def _guarded(self, f: _Function, gate: str) -> tuple[str, str, str]:
        """Branch to a new block where `gate` holds; returns (the block before, the guarded block, the join)."""
        before, inside, join = f.block, f.label("gated"), f.label("join")
        f.line(f"br i1 {gate}, label %{inside}, label %{join}")
        f.start_block(inside)
        return before, inside, join

    def write_load(self, f: _Function, u: UOp) -> str:
        addr = u.address
        load = f"load {self.mtype(u.dtype)}, {self.ltype(addr.pointer.dtype)} {f.val(addr)}, align {u.dtype.itemsize}"
        if (ahead := f.prefetches.get(u)) is not None:  # (tiny.codegen.renderer.prefetch: a stream of memory)
            assert isinstance(addr.pointer.dtype, PtrDType) and addr.pointer.dtype.base is not None
            at = f"{self.mtype(addr.pointer.dtype.base)}, ptr {f.val(addr)}, i64 {ahead}"
            hint = self.prefetch_locality  # (a read, of data: the last 1)
            f.line(f"call void @llvm.prefetch.p0(ptr {f.value(f'getelementptr {at}')}, i32 0, i32 {hint}, i32 1)")
            f.declares.add("declare void @llvm.prefetch.p0(ptr, i32, i32, i32)")
        if addr.gate is None:
            return self._loaded(f, u.dtype, load)
        assert u.alternative is not None
        before, _, join = self._guarded(f, f.val(addr.gate))
        value = self._loaded(f, u.dtype, load)
        inside = f.block
        f.line(f"br label %{join}")
        f.start_block(join)
        return f.value(f"phi {self.ltype(u.dtype)} [{value}, %{inside}], [{f.val(u.alternative)}, %{before}]")

    def _loaded(self, f: _Function, dt: DType, load: str) -> str:
        raw = f.value(load)
        if dt.scalar == dtypes.bool:
            return f.value(f"icmp ne {self.mtype(dt)} {raw}, zeroinitializer")
        if dt.scalar == dtypes.bfloat16:
            return f.call("tiny_bf16_to_f32", "float", f"i16 {raw}")
        return raw

    def write_store(self, f: _Function, u: UOp) -> None:
        addr, value = u.address, u.value
        ptr_type = self.ltype(addr.pointer.dtype)
        join = None
        if addr.gate is not None:
            _, _, join = self._guarded(f, f.val(addr.gate))
        x = f.val(value)
        if value.dtype.scalar == dtypes.bool:
            x = f.value(f"zext {self.ltype(value.dtype)} {x} to {self.mtype(value.dtype)}")
        elif value.dtype.scalar == dtypes.bfloat16:
            x = f.call("tiny_f32_to_bf16", "i16", f"float {x}")
        f.line(f"store {self.mtype(value.dtype)} {x}, {ptr_type} {f.val(addr)}, align {value.dtype.itemsize}")
        if join is not None:
            f.line(f"br label %{join}")
            f.start_block(join)

    # ---------------------------------------------------------------- values

    def _rounded(self, f: _Function, u: UOp, x: str) -> str:
        """An op's result brought to bfloat16 precision where bfloat16 lives in float registers."""
        if u.dtype.scalar != dtypes.bfloat16 or u.op in _EXACT:
            return x
        if u.op is Ops.CAST and u.source.dtype.scalar == dtypes.bfloat16:
            return x
        assert u.dtype.count == 1, "bfloat16 is never a vector"
        return f.call("tiny_bf16_round", "float", f"float {x}")

    inline_vexp2 = True  # float32 vector exp2 by _vexp2_f32 (a CPU's vector unit), not a libm call per lane

    def _intrinsic(self, f: _Function, fn: str, dt: DType, args: list[str]) -> str:
        t = self.ltype(dt)
        if fn == "exp2" and dt.count > 1 and dt.scalar == dtypes.float32 and self.inline_vexp2:
            return f.call(f"tiny_vexp2_v{dt.count}f32", t, f"{t} {args[0]}")
        if fn == "exp2" and dt == dtypes.float32 and self.inline_vexp2:
            # one value through lane 0 of the vector exp2: its lanes round alike at every width, libm's exp2f does
            # not round as they do, and a value computed again in another kernel, vectorized otherwise, must be the
            # same bits (a max's gradient compares a value with the max over it)
            v = f.value(f"insertelement <4 x float> poison, float {args[0]}, i32 0")
            r = f.call("tiny_vexp2_v4f32", "<4 x float>", f"<4 x float> {v}")
            return f.value(f"extractelement <4 x float> {r}, i32 0")
        suffix = {"half": "f16", "float": "f32", "double": "f64"}[self.ltype(dt.scalar)]
        name = f"llvm.{fn}.{suffix if dt.count == 1 else f'v{dt.count}{suffix}'}"
        f.declares.add(f"declare {t} @{name}({', '.join([t] * len(args))})")
        return f.value(f"call {t} @{name}({', '.join(f'{t} {a}' for a in args)})")

    def _alu(self, f: _Function, u: UOp, args: list[str]) -> str:
        op, dt = u.op, u.dtype
        t = self.ltype(dt)
        if op is Ops.WHERE:
            c, a, b = args
            return f.value(f"select {self.ltype(u.src[0].dtype)} {c}, {t} {a}, {t} {b}")
        if op in GroupOp.Comparison:
            src = u.src[0].dtype
            if src.is_float:
                pred = "fcmp olt" if op is Ops.CMPLT else "fcmp une"  # NaN != NaN, as in C
            else:
                signed = src.scalar.kind == "i"
                pred = ("icmp slt" if signed else "icmp ult") if op is Ops.CMPLT else "icmp ne"
            return f.value(f"{pred} {self.ltype(src)} {args[0]}, {args[1]}")
        if op in _INTRINSICS:
            return self._intrinsic(f, _INTRINSICS[op], dt, args)
        if op is Ops.NEG:
            if dt.is_bool:
                return f.value(f"xor {t} {args[0]}, {self.const(True, dt)}")
            return f.value(f"fneg {t} {args[0]}" if dt.is_float else f"sub {t} {self.const(0, dt)}, {args[0]}")
        if op is Ops.RECIP:
            return f.value(f"fdiv {t} {self.const(1.0, dt)}, {args[0]}")
        a, b = args
        if op is Ops.MAX:
            return self._max(f, dt, a, b)
        if op in (Ops.IDIV, Ops.MOD) and dt.is_int:
            return self._int_div(f, u, a, b)
        if op in (Ops.SHL, Ops.SHR):
            return self._shift(f, u, a, b)
        if dt.is_float:
            # only a reduction's update acc + a*b may fuse (one rounding): a reduction is computed in one kernel, while
            # an elementwise value may be computed again in another, where it must round the same (a max's gradient
            # compares a value with the max over it: fused in one kernel and not the other, the compare missed).
            # float16 rounds after each op: on a host with AVX512-FP16 LLVM's half is native and would fuse
            fuse = " contract" if u in f.fusable and dt.scalar != dtypes.float16 else ""
            name = {Ops.ADD: f"fadd{fuse}", Ops.MUL: f"fmul{fuse}", Ops.FDIV: "fdiv", Ops.MOD: "frem"}[op]
        elif dt.is_bool:
            name = {Ops.ADD: "or", Ops.MUL: "and", Ops.AND: "and", Ops.OR: "or", Ops.XOR: "xor"}[op]
        else:
            name = {Ops.ADD: "add", Ops.MUL: "mul", Ops.AND: "and", Ops.OR: "or", Ops.XOR: "xor"}[op]
        return f.value(f"{name} {t} {a}, {b}")

    def _max(self, f: _Function, dt: DType, a: str, b: str) -> str:
        t = self.ltype(dt)
        if dt.is_float:  # NaN wins, as torch.maximum: a where a is NaN or a >= b, else b
            nan = f.value(f"fcmp uno {t} {a}, {a}")
            ge = f.value(f"fcmp oge {t} {a}, {b}")
            pick_a = f.value(f"or {self.ltype(dtypes.bool.vec(dt.count))} {nan}, {ge}")
        elif dt.is_bool:
            return f.value(f"or {t} {a}, {b}")
        else:
            pick_a = f.value(f"icmp {'sge' if dt.scalar.kind == 'i' else 'uge'} {t} {a}, {b}")
        return f.value(f"select {self.ltype(dtypes.bool.vec(dt.count))} {pick_a}, {t} {a}, {t} {b}")

    def _int_div(self, f: _Function, u: UOp, a: str, b: str) -> str:
        """C's / and %, toward zero; a zero divisor gives 0, and so does the one overflow (MIN / -1 wraps)."""
        dt, t = u.dtype, self.ltype(u.dtype)
        signed = dt.scalar.kind == "i"
        name = ("sdiv" if signed else "udiv") if u.op is Ops.IDIV else ("srem" if signed else "urem")
        divisor = u.src[1]
        if divisor.op is Ops.CONST and divisor.arg != 0 and not (signed and divisor.arg == -1):
            return f.value(f"{name} {t} {a}, {b}")
        mask = self.ltype(dtypes.bool.vec(dt.count))
        zero = f.value(f"icmp eq {t} {b}, {self.const(0, dt)}")
        bad = zero
        if signed:
            minus_one = f.value(f"icmp eq {t} {b}, {self.const(-1, dt)}")
            bad = f.value(f"or {mask} {zero}, {minus_one}")
        safe = f.value(f"select {mask} {bad}, {t} {self.const(1, dt)}, {t} {b}")
        q = f.value(f"{name} {t} {a}, {safe}")
        if signed:  # x / -1 is -x (wrapping), x % -1 is 0
            fix = f.value(f"sub {t} {self.const(0, dt)}, {a}") if u.op is Ops.IDIV else self.const(0, dt)
            q = f.value(f"select {mask} {minus_one}, {t} {fix}, {t} {q}")
        return f.value(f"select {mask} {zero}, {t} {self.const(0, dt)}, {t} {q}")

    def _shift(self, f: _Function, u: UOp, a: str, b: str) -> str:
        """Shifts by the type's width or more give 0, or (right, signed) the sign in every bit."""
        dt, t = u.dtype, self.ltype(u.dtype)
        signed = dt.scalar.kind == "i"
        name = "shl" if u.op is Ops.SHL else ("ashr" if signed else "lshr")
        amount = u.src[1]
        if amount.op is Ops.CONST and 0 <= amount.arg < dt.scalar.bits:
            return f.value(f"{name} {t} {a}, {b}")
        shifted = f.value(f"{name} {t} {a}, {b}")
        if u.op is Ops.SHR and signed:
            far = f.value(f"ashr {t} {a}, {self.const(dt.scalar.bits - 1, dt)}")
        else:
            far = self.const(0, dt)
        too_far = f.value(f"icmp uge {t} {b}, {self.const(dt.scalar.bits, dt)}")
        return f.value(f"select {self.ltype(dtypes.bool.vec(dt.count))} {too_far}, {t} {far}, {t} {shifted}")

    def _cast(self, f: _Function, u: UOp, x: str) -> str:
        """CAST as tiny.ir.dtypes.truncate defines it; float16 goes through float so that no runtime library
        function is needed, and float64 -> float16/bfloat16 rounds once."""
        frm, to = u.source.dtype, u.dtype
        fs, ts = frm.scalar, to.scalar
        ft, tt = self.ltype(frm), self.ltype(to)
        if to.is_bool:
            zero = "zeroinitializer"
            return f.value(f"fcmp une {ft} {x}, {zero}" if frm.is_float else f"icmp ne {ft} {x}, {zero}")
        if frm.is_bool:
            if to.is_int:
                return f.value(f"zext {ft} {x} to {tt}")
            return self._narrowed(f, to, f.value(f"uitofp {ft} {x} to {self.ltype(self._via(to))}"))
        if frm.is_int and to.is_int:
            if fs.bits == ts.bits:
                return x
            if fs.bits > ts.bits:
                return f.value(f"trunc {ft} {x} to {tt}")
            return f.value(f"{'sext' if fs.kind == 'i' else 'zext'} {ft} {x} to {tt}")
        if frm.is_int:
            conv = "sitofp" if fs.kind == "i" else "uitofp"
            # float16 through float: exact wherever the result is finite; bfloat16 through float32 as the reference
            return self._narrowed(f, to, f.value(f"{conv} {ft} {x} to {self.ltype(self._via(to))}"))
        if fs == dtypes.float16:  # widen first: float holds every half exactly
            frm = dtypes.float32.vec(frm.count)
            x, ft = f.value(f"fpext {ft} {x} to {self.ltype(frm)}"), self.ltype(frm)
        if to.is_int:
            return self._float_to_int(f, frm, to, x)
        if frm.scalar == dtypes.float64:
            if ts == dtypes.float64:
                return x
            if ts != dtypes.float16:  # float32, and bfloat16 (rounded to float32 first, as tiny.ir.dtypes does)
                return f.value(f"fptrunc {ft} {x} to {tt}")
            assert frm.count == 1, "float64 -> float16 is never a vector"
            return self._narrowed(f, to, f.call("tiny_f64_to_f32_odd", "float", f"double {x}"))
        if ts == dtypes.float64:  # from a float register (float32, bfloat16)
            return f.value(f"fpext {ft} {x} to {tt}")
        return self._narrowed(f, to, x)

    def _via(self, to: DType) -> DType:
        """The type a conversion to float dtype `to` lands in first: float for float16, else `to` itself."""
        return dtypes.float32.vec(to.count) if to.scalar == dtypes.float16 else to

    def _narrowed(self, f: _Function, to: DType, x: str) -> str:
        """A value of type _via(to) as a register of dtype `to`."""
        if to.scalar == dtypes.float16:
            return f.value(f"fptrunc {self.ltype(self._via(to))} {x} to {self.ltype(to)}")
        return x

    def _float_to_int(self, f: _Function, frm: DType, to: DType, x: str) -> str:
        """Toward zero; where the value does not fit (NaN, infinities) int32 gives its minimum and every other
        integer type int64's minimum, cut to its bits, as tiny.ir.dtypes.truncate does."""
        ft = self.ltype(frm)
        lo = -(2**31) if to.scalar.kind == "i" and to.scalar.itemsize == 4 else -(2**63)
        mask = self.ltype(dtypes.bool.vec(to.count))
        wide = self.ltype(dtypes.int64.vec(to.count))
        above = f.value(f"fcmp oge {ft} {x}, {self.const(float(lo), frm)}")
        below = f.value(f"fcmp olt {ft} {x}, {self.const(float(-lo), frm)}")
        fits = f.value(f"and {mask} {above}, {below}")
        n = f.value(f"fptosi {ft} {x} to {wide}")
        n = f.value(f"select {mask} {fits}, {wide} {n}, {wide} {self.const(lo, dtypes.int64.vec(to.count))}")
        return n if to.scalar.itemsize == 8 else f.value(f"trunc {wide} {n} to {self.ltype(to)}")

    def _bitcast(self, f: _Function, u: UOp, x: str) -> str:
        """The same bits as another type; bools and bfloat16s are taken in their memory form."""
        frm, to = u.source.dtype, u.dtype
        if frm.scalar == dtypes.bool:
            x = f.value(f"zext {self.ltype(frm)} {x} to {self.mtype(frm)}")
        elif frm.scalar == dtypes.bfloat16:
            x = f.call("tiny_f32_to_bf16", "i16", f"float {x}")
        if self.mtype(frm) != self.mtype(to):
            x = f.value(f"bitcast {self.mtype(frm)} {x} to {self.mtype(to)}")
        if to.scalar == dtypes.bool:
            return f.value(f"icmp ne {self.mtype(to)} {x}, zeroinitializer")
        if to.scalar == dtypes.bfloat16:
            return f.call("tiny_bf16_to_f32", "float", f"i16 {x}")
        return x


def _accumulator_updates(uops: list[UOp]) -> set[UOp]:
    """The float ADDs that update an accumulator (acc + t, down the chain of an unrolled update) and the products
    they add: the only ops whose product and sum may fuse into one multiply-add."""
    out: set[UOp] = set()
    for u in uops:
        if u.op is not Ops.ASSIGN:
            continue
        v = u.value
        while v.op is Ops.ADD and v.dtype.is_float:
            out.add(v)
            for term in v.src:
                if term.op is Ops.MUL:
                    out.add(term)
            v = v.src[0]
    return out


def _assigned_inside(uops: list[UOp]) -> dict[UOp, tuple[UOp, ...]]:
    """For each RANGE and IF, the accumulators assigned between it and its end, in order of first assignment."""
    open_blocks: list[UOp] = []
    out: dict[UOp, dict[UOp, None]] = {}
    for u in uops:
        if u.op in (Ops.RANGE, Ops.IF):
            open_blocks.append(u)
            out[u] = {}
        elif u.op in (Ops.ENDRANGE, Ops.ENDIF):
            open_blocks.pop()
        elif u.op is Ops.ASSIGN:
            for b in open_blocks:
                out[b][u.src[0]] = None
    return {b: tuple(accs) for b, accs in out.items()}


def _local_name(name: str) -> str:
    if not _LOCAL_NAME.fullmatch(name):
        raise ValueError(f"{name!r} cannot name an LLVM value; expected letters, digits, '_' and '.'")
    return name


def _with_needs(helpers: set[str]) -> list[str]:
    """The helper functions to define: those called and those they call, in a fixed order."""
    out = set(helpers)
    for h in helpers:
        out.update(_HELPER_NEEDS.get(h, ()))
    return sorted(out)
