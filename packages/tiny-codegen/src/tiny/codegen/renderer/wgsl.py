"""The WGSL renderer: a linearized kernel as a WebGPU compute shader.

A kernel is one `@compute` entry point. Buffers are storage bindings 0, 1, ... in argument order; the integer
variables, when there are any, follow as one more read-only binding of i32s. Hardware indices come from the
`workgroup_id` and `local_invocation_id` builtins, local memory is `var<workgroup>`, barriers are
`workgroupBarrier()`.

WGSL has 32-bit integers and floats, f16 behind an extension, and nothing else, so:

- float64, int64 and uint64 are left out of the caps' dtypes (Tensor ops refuse them where they are called);
  float16 is in only when the target says the adapter has 'shader-f16'.
- bool, int8, uint8, int16, uint16 and bfloat16 live in registers as bool, i32, u32 and f32 (narrow integers are
  wrapped to their width after each op that can leave it, bfloat16 is rounded after each inexact op). In memory
  they are packed 4 or 2 to a u32 word: loads shift the element out of its word; a buffer that the kernel writes
  is an `array<atomic<u32>>` and a store clears its bits with atomicAnd and sets them with atomicOr, so threads
  writing neighbouring elements of one word never lose each other's writes.
- Integer division and remainder truncate as C does, and give 0 where the divisor is 0 (tiny.ir.alu).
- Floats: drivers (Mesa's lavapipe among them) compile float math as if there were no NaN or infinities, so
  NaN is tested on the bits, x * 0.0 is made of bits (they fold it to 0 where IEEE says NaN) and exp2's argument
  goes through a select (they fold exp2(log2(x) * y) into a pow that loses infinities). MAX lets NaN win as
  torch.maximum does. Float remainder is C's fmod, exact (tiny.ir.alu). The other float math is the builtins'
  (log2, sin, sqrt, trunc), whose results at infinities and NaN the driver decides.

A grid with more workgroups in some dimension than the adapter allows (`max_workgroups`) is launched folded
into up to three dimensions; the shader unfolds its workgroup number again (the WebGPU runtime folds it with
`tiny.ir.device.fold_grid`).
"""

from __future__ import annotations

import math

from tiny.codegen.renderer.walker import BracedRenderer, Walk
from tiny.ir.device import RendererCaps
from tiny.ir.dtypes import DType, PtrDType, dtypes
from tiny.ir.uop import GroupOp, Ops, UOp

INT32_MAX = 2**31 - 1

# the type a value of each dtype has in registers
_REGISTER = {
    "bool": "bool",
    "int8": "i32",
    "int16": "i32",
    "int32": "i32",
    "uint8": "u32",
    "uint16": "u32",
    "uint32": "u32",
    "float16": "f16",
    "bfloat16": "f32",
    "float32": "f32",
}
# dtypes kept several to a u32 word in memory: their width in bits
_PACKED_BITS = {"bool": 8, "int8": 8, "uint8": 8, "int16": 16, "uint16": 16, "bfloat16": 16}
# narrow integers: the ops whose result can leave the dtype's range (wrapped after them)
_WRAPPING = frozenset({Ops.ADD, Ops.MUL, Ops.NEG, Ops.SHL, Ops.IDIV})
# float ops whose result is exactly representable in the operands' dtype (no bfloat16 rounding after them)
_EXACT = frozenset({Ops.WHERE, Ops.MAX, Ops.NEG, Ops.TRUNC})
_MATH = {Ops.SQRT: "sqrt", Ops.EXP2: "exp2", Ops.LOG2: "log2", Ops.SIN: "sin", Ops.TRUNC: "trunc"}
_INFIX = {Ops.ADD: "+", Ops.MUL: "*", Ops.FDIV: "/", Ops.CMPLT: "<", Ops.AND: "&", Ops.OR: "|", Ops.XOR: "^"}

_HELPERS = """fn tiny_isnan(x: f32) -> bool { return (bitcast<u32>(x) & 0x7fffffffu) > 0x7f800000u; }
fn tiny_f32_to_bf16(x: f32) -> u32 {
  let u = bitcast<u32>(x);
  if ((u & 0x7fffffffu) > 0x7f800000u) { return 0x7fc0u; }
  return (u + 0x7fffu + ((u >> 16u) & 1u)) >> 16u;
}
fn tiny_bf16_round(x: f32) -> f32 { return bitcast<f32>(tiny_f32_to_bf16(x) << 16u); }
// C's fmod, exact: the sign of a; NaN where b is 0, a is infinite or either is NaN. Each step takes away the
// largest b * 2**k that fits, which floating point does without rounding.
fn tiny_fmod(a: f32, b: f32) -> f32 {
  let ua = bitcast<u32>(a) & 0x7fffffffu;
  let ub = bitcast<u32>(b) & 0x7fffffffu;
  if (ua >= 0x7f800000u || ub > 0x7f800000u || ub == 0u) { return bitcast<f32>(0x7fc00000u); }
  if (ub == 0x7f800000u) { return a; }
  var r = bitcast<f32>(ua);
  let m = bitcast<f32>(ub);
  let fm = frexp(m);
  for (var i = 0; i < 300 && r >= m; i++) {
    let fr = frexp(r);
    let k = fr.exp - fm.exp - select(0, 1, fm.fract > fr.fract);
    r = r - ldexp(m, k);
  }
  return bitcast<f32>(bitcast<u32>(r) | (bitcast<u32>(a) & 0x80000000u));
}
// the low 32 bits of trunc(x) as a 64-bit integer; 0 where x does not fit one (NaN, infinities, |x| >= 2**63)
fn tiny_f32_low_bits(x: f32) -> u32 {
  let b = bitcast<u32>(x);
  let e = i32((b >> 23u) & 0xffu) - 127;
  if (e < 0 || e >= 63) { return 0u; }
  let m = (b & 0x7fffffu) | 0x800000u;
  var mag = 0u;
  if (e >= 23) {
    if (e - 23 < 32) { mag = m << u32(e - 23); }
  } else {
    mag = m >> u32(23 - e);
  }
  return select(mag, 0u - mag, (b >> 31u) == 1u);
}
"""


def parse_target(target: str) -> dict[str, str]:
    """'f16;max_workgroups=65535;local=256,256,64' -> {'f16': '', 'max_workgroups': '65535', ...}."""
    out = {}
    for part in filter(None, target.split(";")):
        key, _, value = part.partition("=")
        out[key.strip()] = value.strip()
    return out


def _storage_type(dt: DType, written: bool) -> str:
    """The element type of a buffer of dt in a storage binding."""
    if dt.name in _PACKED_BITS:
        return "atomic<u32>" if written else "u32"
    return _REGISTER[dt.name]


class _WGSLWalk(Walk):
    """A shader being written: the walk, the module's declarations and the grid it is launched on."""

    def __init__(self, uops: list[UOp], max_workgroups: int) -> None:
        super().__init__(uops)
        self.decls: list[str] = []  # bindings and workgroup memory
        specials = {u.arg[0]: u.arg[1] for u in uops if u.op is Ops.SPECIAL}
        self.grid = (specials.get("gidx0", 1), specials.get("gidx1", 1), specials.get("gidx2", 1))
        self.local = (specials.get("lidx0", 1), specials.get("lidx1", 1), specials.get("lidx2", 1))
        self.folded = max(self.grid) > max_workgroups  # launched folded (tiny.ir.device.fold_grid)


class WGSLRenderer(BracedRenderer):
    """WGSL for the WEBGPU device. target: 'f16;max_workgroups=N;local=X,Y,Z;local_total=N;shared=BYTES;buffers=N;
    loops=N', as the device reads them from its adapter (loops: llvmpipe ends a shader after that many loop iterations);
    without one, WebGPU's default limits and no float16."""

    def __init__(self, target: str = "") -> None:
        super().__init__(target)
        t = parse_target(target)
        self.max_workgroups = int(t.get("max_workgroups", 65535))
        local = tuple(int(x) for x in t["local"].split(",")) if "local" in t else (256, 256, 64)
        left_out = {dtypes.float64, dtypes.int64, dtypes.uint64} | (set() if "f16" in t else {dtypes.float16})
        self.caps = RendererCaps(
            language="WGSL",
            has_local=True,
            has_shared=True,
            global_max=(INT32_MAX, self.max_workgroups, self.max_workgroups),
            local_max=local,
            local_total_max=int(t.get("local_total", 256)),
            shared_max=int(t.get("shared", 16384)),
            vector_width=1,
            dtypes=frozenset(dtypes.all()) - left_out,
            max_buffers=int(t.get("buffers", 8)),  # storage buffers per shader stage: buffers and variables
            max_loop_iterations=int(t.get("loops", 0)),
        )

    # ---- values

    def const(self, value: int | float | bool, dt: DType) -> str:
        if dt.is_bool:
            return "true" if value else "false"
        reg = _REGISTER[dt.name]
        if reg == "i32":
            return "(-2147483647i - 1i)" if value == -(2**31) else f"{int(value)}i"
        if reg == "u32":
            return f"{int(value)}u"
        assert isinstance(value, (int, float))
        if math.isnan(value) or math.isinf(value):
            bits = 0x7FC00000 if math.isnan(value) else 0x7F800000 | (0x80000000 if value < 0 else 0)
            return f"bitcast<f32>({bits:#x}u)" if reg == "f32" else f"f16(bitcast<f32>({bits:#x}u))"
        return f"{float(value)!r}{'f' if reg == 'f32' else 'h'}"

    def bits_of(self, x: str, dt: DType) -> str:
        """The bits of register value x of dt, as a u32 (narrow dtypes in the low bits)."""
        name = dt.name
        if name == "bool":
            return f"select(0u, 1u, {x})"
        if name == "float16":
            return f"(pack2x16float(vec2<f32>(f32({x}), 0.0f)) & 0xffffu)"
        if name == "bfloat16":
            return f"tiny_f32_to_bf16({x})"
        if name in ("int8", "int16", "uint8", "uint16"):
            return f"(u32({x}) & {(1 << dt.bits) - 1:#x}u)"
        return f"bitcast<u32>({x})"

    def from_bits(self, bits: str, dt: DType) -> str:
        """A register value of dt from its bits in the low bits of a u32."""
        name = dt.name
        if name == "bool":
            return f"({bits} != 0u)"
        if name == "float16":
            return f"f16(unpack2x16float({bits}).x)"
        if name == "bfloat16":
            return f"bitcast<f32>({bits} << 16u)"
        if name in ("int8", "int16"):
            return f"(bitcast<i32>({bits} << {32 - dt.bits}u) >> {32 - dt.bits}u)"
        if name in ("uint8", "uint16"):
            return f"({bits} & {(1 << dt.bits) - 1:#x}u)"
        return f"bitcast<{_REGISTER[name]}>({bits})"

    def wrap(self, x: str, dt: DType) -> str:
        """A 32-bit integer value (i32 or u32) brought into integer dtype dt's range, as storing it would."""
        if dt.bits < 32:
            return self.from_bits(f"(u32({x}) & {(1 << dt.bits) - 1:#x}u)", dt)
        return f"{_REGISTER[dt.name]}({x})"  # i32(u32) and u32(i32) keep the bits

    def isnan(self, x: str, dt: DType) -> str:
        return f"tiny_isnan({x})" if _REGISTER[dt.name] == "f32" else f"tiny_isnan(f32({x}))"

    def cast(self, x: str, frm: DType, to: DType) -> str:
        if frm == to:
            return x
        reg = _REGISTER[to.name]
        if to.is_bool:
            zero = self.const(0, frm)
            return f"(({x} != {zero}) | {self.isnan(x, frm)})" if frm.is_float else f"({x} != {zero})"
        if frm.is_bool:
            return f"select({self.const(0, to)}, {self.const(1, to)}, {x})"
        if to.is_float:
            value = f"{reg}({x})"
            return f"tiny_bf16_round({value})" if to == dtypes.bfloat16 else value
        if frm.is_int:
            return self.wrap(x, to)
        f = x if _REGISTER[frm.name] == "f32" else f"f32({x})"
        if to == dtypes.int32:  # where it does not fit: int32's minimum (tiny.ir.dtypes.truncate)
            return f"select((-2147483647i - 1i), i32({f}), {f} >= -2147483648.0f && {f} < 2147483648.0f)"
        return self.wrap(f"tiny_f32_low_bits({f})", to)

    def alu(self, u: UOp, a: list[str]) -> str:
        op, dt = u.op, u.dtype
        operand = u.src[0].dtype
        if op is Ops.WHERE:
            return f"select({a[2]}, {a[1]}, {a[0]})"
        if op is Ops.EXP2:  # the select keeps drivers from folding exp2(log2(x) * y) into a pow that loses infinities
            big = self.const(128.0, dt)
            return f"exp2(select({a[0]}, {big}, {a[0]} > {big}))"
        if op in _MATH:
            return f"{_MATH[op]}({a[0]})"
        if op is Ops.RECIP:
            return f"({self.const(1, dt)} / {a[0]})"
        if dt.is_bool and op in (Ops.ADD, Ops.MAX, Ops.OR):
            return f"({a[0]} | {a[1]})"
        if dt.is_bool and op in (Ops.MUL, Ops.AND):
            return f"({a[0]} & {a[1]})"
        if op is Ops.NEG:
            if dt.is_bool:
                return f"(!{a[0]})"
            return f"(0u - {a[0]})" if _REGISTER[dt.name] == "u32" else f"(-{a[0]})"
        if op is Ops.CMPNE:
            if operand.is_float:
                nans = [self.isnan(x, operand) for x, s in zip(a, u.src) if s.op is not Ops.CONST or s.arg != s.arg]
                return "(" + " | ".join([f"({a[0]} != {a[1]})", *nans]) + ")"
            return f"({a[0]} != {a[1]})"
        if op is Ops.XOR and dt.is_bool:
            return f"({a[0]} != {a[1]})"
        if op is Ops.CMPLT and operand.is_bool:
            return f"((!{a[0]}) & {a[1]})"
        if op is Ops.MAX:
            if dt.is_float:  # NaN wins, as torch.maximum
                return f"select({a[1]}, {a[0]}, {self.isnan(a[0], dt)} | ({a[0]} >= {a[1]}))"
            return f"max({a[0]}, {a[1]})"
        if op is Ops.MUL and dt.is_float and (zero := _zero_operand(u)) is not None:
            return self.times_zero(a[1 - zero], u.src[zero].arg, dt)
        if op in (Ops.IDIV, Ops.MOD):
            if dt.is_float and op is Ops.MOD:
                reg = _REGISTER[dt.name]
                return f"{reg}(tiny_fmod(f32({a[0]}), f32({a[1]})))"
            sym, divisor, zero = "/" if op is Ops.IDIV else "%", u.src[1], self.const(0, dt)
            if divisor.op is Ops.CONST:
                return zero if divisor.arg == 0 else f"({a[0]} {sym} {a[1]})"
            return f"select({a[0]} {sym} {a[1]}, {zero}, {a[1]} == {zero})"
        if op in (Ops.SHL, Ops.SHR):
            shift = u.src[1]
            if shift.op is Ops.CONST and 0 <= shift.arg < 32:
                return f"({a[0]} {'<<' if op is Ops.SHL else '>>'} {shift.arg}u)"
            if op is Ops.SHR and _REGISTER[dt.name] == "i32":  # past the width: the sign bit everywhere
                return f"({a[0]} >> min(u32({a[1]}), 31u))"
            sym = "<<" if op is Ops.SHL else ">>"
            return f"select({self.const(0, dt)}, {a[0]} {sym} (u32({a[1]}) & 31u), u32({a[1]}) < 32u)"
        return f"({a[0]} {_INFIX[op]} {a[1]})"

    def times_zero(self, x: str, zero: float, dt: DType) -> str:
        """x * 0.0 made of bits: drivers fold it to 0 where IEEE says NaN (x infinite or NaN)."""
        f = x if _REGISTER[dt.name] == "f32" else f"f32({x})"
        sign = "^ 0x80000000u" if math.copysign(1.0, zero) < 0 else ""
        finite = f"((bitcast<u32>({f}) & 0x7f800000u) != 0x7f800000u)"
        bits = f"select(0x7fc00000u, (bitcast<u32>({f}) & 0x80000000u) {sign}, {finite})"
        return f"bitcast<f32>({bits})" if _REGISTER[dt.name] == "f32" else f"f16(bitcast<f32>({bits}))"

    def finish(self, u: UOp, expr: str) -> str:
        """An op's result brought to its dtype where registers are wider: narrow integers wrapped, bfloat16
        rounded."""
        dt = u.dtype
        if dt.is_int and dt.bits < 32 and u.op in _WRAPPING:
            return self.wrap(expr, dt)
        if dt == dtypes.bfloat16 and u.op in GroupOp.ALU and u.op not in _EXACT:
            return f"tiny_bf16_round({expr})"
        return expr

    # ---- memory

    def load(self, buf: str, offset: str, dt: DType, atomic: bool) -> str:
        if dt.name not in _PACKED_BITS:
            return f"{buf}[{offset}]"
        bits = _PACKED_BITS[dt.name]
        per_word = 32 // bits
        word = f"{buf}[{offset} >> {per_word.bit_length() - 1}u]"
        word = f"atomicLoad(&{word})" if atomic else word
        shift = f"(u32({offset} & {per_word - 1}) * {bits}u)"
        return self.from_bits(f"(({word} >> {shift}) & {(1 << bits) - 1:#x}u)", dt)

    def store(self, buf: str, offset: str, value: str, dt: DType, fresh: str) -> list[str]:
        """Statements that store value at element offset; `fresh` is a prefix for their temporaries."""
        if dt.name not in _PACKED_BITS:
            return [f"{buf}[{offset}] = {value};"]
        bits = _PACKED_BITS[dt.name]
        per_word, mask = 32 // bits, (1 << bits) - 1
        word, shift = f"{fresh}_word", f"{fresh}_shift"
        return [
            f"let {word} = {offset} >> {per_word.bit_length() - 1}u;",
            f"let {shift} = u32({offset} & {per_word - 1}) * {bits}u;",
            f"atomicAnd(&{buf}[{word}], ~({mask:#x}u << {shift}));",
            f"atomicOr(&{buf}[{word}], ({self.bits_of(value, dt)} & {mask:#x}u) << {shift});",
        ]

    # ---- the kernel

    def check_loops(self, name: str, uops: list[UOp]) -> None:
        """Refuse a kernel whose threads would loop more often than the driver lets a shader run (llvmpipe stops it
        after 65535 iterations of all its loops and keeps what it had: a wrong answer, silently)."""
        limit = self.caps.max_loop_iterations
        if not limit:
            return
        total, enclosing = 0, [1]
        for u in uops:
            if u.op is Ops.RANGE:
                enclosing.append(enclosing[-1] * int(u.src[0].vmax))
                total += enclosing[-1]
            elif u.op is Ops.ENDRANGE:
                enclosing.pop()
        if total > limit:
            raise ValueError(
                f"kernel {name} runs {total} loop iterations in each thread and this WebGPU driver stops a shader "
                f"after {limit} (llvmpipe); the scheduler splits reductions longer than that, so this kernel's loops "
                "come from elsewhere: reduce the size of the tensors (or use another device)"
            )

    rules = {
        Ops.DEFINE_GLOBAL: "write_buffer",
        Ops.DEFINE_LOCAL: "write_local",
        Ops.DEFINE_VAR: "write_variable",
        Ops.CONST: "write_const",
        Ops.SPECIAL: "write_special",
        Ops.RANGE: "write_range",
        Ops.IF: "write_if",
        Ops.ENDRANGE: "write_end",
        Ops.ENDIF: "write_end",
        Ops.INDEX: "write_index",
        Ops.LOAD: "write_load",
        Ops.STORE: "write_store",
        Ops.DEFINE_ACC: "write_acc",
        Ops.ASSIGN: "write_assign",
        Ops.BARRIER: "write_barrier",
        **dict.fromkeys((Ops.CAST, Ops.BITCAST, *GroupOp.ALU), "write_expression"),
    }

    def render(self, name: str, uops: list[UOp]) -> str:
        self.check_loops(name, uops)
        for u in uops:
            if u.dtype.count > 1 or u.op is Ops.WMMA:
                raise NotImplementedError(f"WGSL renderer: {u.op.name} of {u.dtype!r}: its caps declare no vectors")
            if u.op in (Ops.SPECIAL, Ops.DEFINE_VAR, Ops.RANGE) and u.dtype != dtypes.int32:
                raise NotImplementedError(f"WGSL renderer: {u.op.name} of {u.dtype!r}: WGSL indexes with 32 bits")
        w = _WGSLWalk(uops, self.max_workgroups)
        globals_ = sorted((u for u in uops if u.op is Ops.DEFINE_GLOBAL), key=lambda u: u.arg)
        for u in globals_:
            assert isinstance(u.dtype, PtrDType) and u.dtype.base is not None
            access = "read_write" if u in w.written else "read"
            element = _storage_type(u.dtype.base.scalar, u in w.written)
            w.decls.append(f"@group(0) @binding({u.arg}) var<storage, {access}> data{u.arg}: array<{element}>;")
        if any(u.op is Ops.DEFINE_VAR for u in uops):
            binding = 1 + max((u.arg for u in globals_), default=-1)
            w.decls.append(f"@group(0) @binding({binding}) var<storage, read> tiny_vars: array<i32>;")
        if w.folded:
            w.line("let tiny_flat = wid.x + nwg.x * (wid.y + nwg.y * wid.z);")
            w.line(f"if (tiny_flat >= {math.prod(w.grid)}u) {{ return; }}")
        self.walk(w)
        uses_f16 = any(u.dtype.scalar == dtypes.float16 or _pointee(u) == dtypes.float16 for u in uops)
        head = ("enable f16;\n" if uses_f16 else "") + _HELPERS + "\n".join(w.decls) + "\n"
        builtins = "@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>"
        builtins += ", @builtin(num_workgroups) nwg: vec3<u32>"
        size = ", ".join(str(s) for s in w.local)
        return f"{head}@compute @workgroup_size({size})\nfn {name}({builtins}) {{\n" + "\n".join(w.lines) + "\n}\n"

    def write_buffer(self, w: _WGSLWalk, u: UOp) -> str:
        return f"data{u.arg}"  # (declared as a binding before the walk)

    def write_local(self, w: _WGSLWalk, u: UOp) -> str:
        assert isinstance(u.dtype, PtrDType) and u.dtype.base is not None
        w.decls.append(f"var<workgroup> {u.arg[0]}: array<{_REGISTER[u.dtype.base.scalar.name]}, {u.arg[1]}>;")
        return u.arg[0]

    def write_variable(self, w: _WGSLWalk, u: UOp) -> str:
        name = f"var_{u.arg[0]}"
        w.line(f"let {name} = tiny_vars[{len(w.variables)}];")
        w.variables.append(name)
        return name

    def write_const(self, w: _WGSLWalk, u: UOp) -> str:
        return self.const(u.arg, u.dtype)

    def write_special(self, w: _WGSLWalk, u: UOp) -> str:
        w.line(f"let {u.arg[0]} = {self.special(u.arg[0], w.grid, w.folded)};")
        return u.arg[0]

    def write_range(self, w: _WGSLWalk, u: UOp) -> str:
        name = w.fresh("ridx")
        w.line(f"for (var {name} = 0i; {name} < {w.names[u.end]}; {name}++) {{")
        return name

    def write_index(self, w: _WGSLWalk, u: UOp) -> str:
        """The element offset; gated: element 0 where the gate is false, so no address is out of bounds."""
        offset = w.names[u.offset]
        return offset if u.gate is None else f"select(0i, {offset}, {w.names[u.gate]})"

    def write_load(self, w: _WGSLWalk, u: UOp) -> str:
        addr = u.address
        ptr = addr.pointer
        if ptr.op is Ops.DEFINE_LOCAL:  # local memory holds register types: nothing is packed
            raw = f"{w.names[ptr]}[{w.names[addr]}]"
        else:
            raw = self.load(w.names[ptr], w.names[addr], u.dtype, ptr in w.written)
        alt = u.alternative
        value = raw if addr.gate is None or alt is None else f"select({w.names[alt]}, {raw}, {w.names[addr.gate]})"
        name = w.fresh("val")
        w.line(f"let {name} = {value};")
        return name

    def write_store(self, w: _WGSLWalk, u: UOp) -> None:
        addr = u.address
        ptr, value = addr.pointer, w.names[u.value]
        if ptr.op is Ops.DEFINE_LOCAL:
            stmts = [f"{w.names[ptr]}[{w.names[addr]}] = {value};"]
        else:
            stmts = self.store(w.names[ptr], w.names[addr], value, u.value.dtype, w.fresh("st"))
        if addr.gate is not None:
            w.line(f"if ({w.names[addr.gate]}) {{")
            w.lines.extend("  " * (w.depth + 2) + s for s in stmts)
            w.line("}")
        else:
            w.lines.extend("  " * (w.depth + 1) + s for s in stmts)

    def write_acc(self, w: _WGSLWalk, u: UOp) -> str:
        name = w.fresh("acc")
        w.line(f"var {name}: {_REGISTER[u.dtype.name]} = {w.operands(u)[0]};")
        return name

    def write_assign(self, w: _WGSLWalk, u: UOp) -> str:
        acc, value = w.operands(u)
        w.line(f"{acc} = {value};")
        return acc

    def write_barrier(self, w: _WGSLWalk, u: UOp) -> None:
        w.line("workgroupBarrier();")

    def write_expression(self, w: _WGSLWalk, u: UOp) -> str:
        """CAST, BITCAST and the ALU ops: each named by a `let` (drivers fold what they see whole)."""
        src = w.operands(u)
        if u.op is Ops.CAST:
            expr = self.cast(src[0], u.source.dtype, u.dtype)
        elif u.op is Ops.BITCAST:
            expr = self.from_bits(self.bits_of(src[0], u.source.dtype), u.dtype)
        else:
            expr = self.finish(u, self.alu(u, src))
        return w.expression(u, expr, lambda name: f"let {name} = {expr};")

    def special(self, name: str, grid: tuple[int, int, int], folded: bool) -> str:
        dim = int(name[4:])
        if name.startswith("lidx"):
            return f"i32(lid.{'xyz'[dim]})"
        if not folded:
            return f"i32(wid.{'xyz'[dim]})"
        below = math.prod(grid[:dim])
        flat = "tiny_flat" if below == 1 else f"(tiny_flat / {below}u)"
        return f"i32({flat})" if dim == 2 else f"i32({flat} % {grid[dim]}u)"


def _zero_operand(u: UOp) -> int | None:
    """Which operand of a MUL is the constant 0.0 (or -0.0), if one is."""
    return next((i for i, s in enumerate(u.src) if s.op is Ops.CONST and s.arg == 0), None)


def _pointee(u: UOp) -> DType | None:
    return u.dtype.base.scalar if isinstance(u.dtype, PtrDType) and u.dtype.base is not None else None
