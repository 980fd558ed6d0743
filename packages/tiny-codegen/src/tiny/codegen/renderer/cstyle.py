"""Renderers for C-like languages. `CStyleRenderer` holds what C, OpenCL C, CUDA C and HIP share;
`GPUCStyleRenderer` adds what the GPU dialects share (hardware indices, workgroup memory, barriers, limits
reported by the device); `CRenderer` is plain C for the CPU device (loops, no hardware indices)."""

from __future__ import annotations

import math
from collections.abc import Callable

from tiny.codegen.renderer.prefetch import locality, prefetches
from tiny.codegen.renderer.walker import BracedRenderer, Walk, summed_vector
from tiny.ir.device import VECTOR_DTYPES, RendererCaps
from tiny.ir.dtypes import DType, PtrDType, dtypes
from tiny.ir.uop import GroupOp, Ops, UOp

_CODE: dict[Ops, Callable[..., str]] = {
    Ops.ADD: lambda a, b: f"({a}+{b})",
    Ops.MUL: lambda a, b: f"({a}*{b})",
    Ops.FDIV: lambda a, b: f"({a}/{b})",
    Ops.CMPLT: lambda a, b: f"({a}<{b})",
    Ops.CMPNE: lambda a, b: f"({a}!={b})",
    Ops.AND: lambda a, b: f"({a}&{b})",
    Ops.OR: lambda a, b: f"({a}|{b})",
    Ops.XOR: lambda a, b: f"({a}^{b})",
    Ops.SHL: lambda a, b: f"({a}<<{b})",
    Ops.SHR: lambda a, b: f"({a}>>{b})",
    Ops.WHERE: lambda c, a, b: f"({c}?{a}:{b})",
}


class CWalk(Walk):
    """A C-like kernel being written: the walk, and the accumulator updates held back to be interleaved (an unrolled
    tile's accumulators take their terms in turns) and the dtypes of the updates written as one multiply-add."""

    def __init__(self, uops: list[UOp], inline_depth: int, repeats: frozenset[Ops]) -> None:
        super().__init__(uops, inline_depth=inline_depth, repeats=repeats)
        self.held: list[tuple[UOp, list[str]]] = []  # (accumulator, its terms' updates)
        self.held_indent = ""  # the indent they were written at
        self.fused: set[DType] = set()
        self.lane_sums: set[DType] = set()  # the vector dtypes whose lanes are summed by lane_sum
        self.prefetches: dict[UOp, int] = {}  # loads to prefetch ahead of (the CPU's C), with the elements ahead

    def line(self, text: str) -> None:
        if self.held:
            self.flush()
        super().line(text)

    def flush(self) -> None:
        """The held accumulators' updates one term at a time across all of them, not one chain after another:
        same arithmetic, but clang then keeps an unrolled register tile's operands in registers."""
        updates = [(self.names[acc], terms) for acc, terms in self.held]
        self.held.clear()
        for t in range(max(len(terms) for _, terms in updates)):
            self.lines.extend(f"{self.held_indent}{name} = {terms[t]};" for name, terms in updates if t < len(terms))


class CStyleRenderer(BracedRenderer):
    """The parts of C that every C-like language shares; subclasses name their types and intrinsics."""

    caps = RendererCaps(language="C")
    kernel_prefix = "void"
    buffer_prefix = ""
    arg_int = "int"
    type_names: dict[str, str] = {
        "bool": "_Bool",
        "int8": "signed char",
        "int16": "short",
        "int32": "int",
        "int64": "long long",
        "uint8": "unsigned char",
        "uint16": "unsigned short",
        "uint32": "unsigned int",
        "uint64": "unsigned long long",
        "float16": "_Float16",
        "bfloat16": "float",  # emulated: float in registers, rounded after each op; 16 bits in memory
        "float32": "float",
        "float64": "double",
    }
    # float math that the language has for these dtypes; others compute in float32
    math_fns: dict[Ops, str] = {
        Ops.SQRT: "sqrt",
        Ops.EXP2: "exp2",
        Ops.LOG2: "log2",
        Ops.SIN: "sin",
        Ops.TRUNC: "trunc",
    }

    int_suffix: dict[str, str] = {"int64": "ll", "uint64": "ull", "uint32": "u"}  # integer literals, by dtype
    nan_text = '__builtin_nanf("")'
    inf_text = "__builtin_inff()"

    special_params = False  # hardware indices arrive as arguments after the variables (a CPU thread's number)
    repeats_operands = frozenset({Ops.MAX, Ops.IDIV, Ops.MOD, Ops.CAST})  # their C text names an operand twice
    max_inline_depth = 32  # deeper expressions go through a variable: compilers limit nesting
    interleave_updates = True  # an unrolled tile's accumulators take their terms in turns (see CWalk.flush)

    emulate_bf16 = True  # the language has no bfloat16 arithmetic: store 16 bits, compute in float
    bf16_prelude = (
        "static inline float tiny_bf16_to_f32(unsigned short b) {\n"
        "  union { unsigned int u; float f; } x = { .u = (unsigned int)b << 16 }; return x.f;\n}\n"
        "static inline unsigned short tiny_f32_to_bf16(float f) {\n"
        "  union { float f; unsigned int u; } x = { .f = f }; unsigned int u = x.u;\n"
        "  if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fc0;\n"
        "  u += 0x7fffu + ((u >> 16) & 1u); return (unsigned short)(u >> 16);\n}\n"
        "static inline float tiny_bf16_round(float f) { return tiny_bf16_to_f32(tiny_f32_to_bf16(f)); }\n"
    )

    def type_name(self, dt: DType) -> str:
        if isinstance(dt, PtrDType):
            assert dt.base is not None
            return self.memory_type(dt.base) + "*"
        if dt.count > 1:
            return self.vector_type_name(dt)
        return self.type_names[dt.scalar.name]

    def memory_type(self, dt: DType) -> str:
        """The type of an element in memory (emulated bfloat16 is its 16 bits there)."""
        return self.type_names["uint16"] if self._bf16(dt) and dt.count == 1 else self.type_name(dt)

    def vector_type_name(self, dt: DType) -> str:
        return f"{dt.scalar.name}x{dt.count}"

    def vector_typedef(self, dt: DType) -> str:
        raise NotImplementedError(f"{type(self).__name__} has no vector types")

    def vector_prelude(self, dt: DType) -> str:
        """What a vector type needs after every type is declared: loads, stores, max, select, math."""
        raise NotImplementedError(f"{type(self).__name__} has no vector types")

    def vector_literal(self, dt: DType, lanes: list[str]) -> str:
        return f"(({self.vector_type_name(dt)}){{{', '.join(lanes)}}})"

    def value_type(self, w: CWalk, u: UOp) -> str:
        """The C type of the variable holding u's value (a dialect may hold some values in another form)."""
        return self.type_name(u.dtype)

    def vectorize(self, w: CWalk, u: UOp, lanes: list[str]) -> str:
        """A VECTORIZE of these lanes' values."""
        return self.vector_literal(u.dtype, lanes)

    def elided(self, w: CWalk, u: UOp) -> bool:
        """Whether a load is left out of the source (a dialect that reads its value some other way)."""
        return False

    def vector_load(self, dt: DType, addr: str) -> str:
        """A vector of dt read from the scalars at addr on (no alignment beyond the scalar's is assumed)."""
        return f"tiny_vload_{self.vector_type_name(dt)}({addr})"

    def vector_store(self, dt: DType, addr: str, value: str) -> str:
        return f"tiny_vstore_{self.vector_type_name(dt)}({addr}, {value});"

    def gep(self, vector: str, lane: int) -> str:
        """One lane of a vector."""
        return f"({vector})[{lane}]"

    def _bf16(self, dt: DType) -> bool:
        return self.emulate_bf16 and dt.scalar == dtypes.bfloat16

    def loaded(self, w: CWalk, u: UOp, raw: str) -> str:
        """The value read from memory, as a register value."""
        return f"tiny_bf16_to_f32({raw})" if self._bf16(u.dtype) else raw

    def stored(self, w: CWalk, value: UOp, expr: str) -> str:
        """A register value, as written to memory."""
        return f"tiny_f32_to_bf16({expr})" if self._bf16(value.dtype) else expr

    def rounded(self, u: UOp, expr: str) -> str:
        """An op's result brought to its dtype's precision where registers are wider (emulated bfloat16)."""
        exact = u.op in (Ops.WHERE, Ops.MAX, Ops.NEG, Ops.TRUNC, Ops.BITCAST)
        return f"tiny_bf16_round({expr})" if self._bf16(u.dtype) and not exact else expr

    def cast(self, u: UOp, x: str) -> str:
        """A value cast; float -> integer follows tiny.ir.dtypes.truncate where C leaves it undefined."""
        to, frm = u.dtype, u.source.dtype
        if not (frm.is_float and to.is_int):
            return f"(({self.type_name(to)})({x}))"
        f = "double" if frm.scalar == dtypes.float64 else "float"
        narrow = to.kind == "i" and to.itemsize == 4
        lo = "(-0x1p31)" if narrow else "(-0x1p63)"
        fits = f"(({f}){x} >= {lo} && ({f}){x} < -{lo})"  # false for NaN too
        low = self.const(dtypes.int32.min, dtypes.int32) if narrow else self.const(dtypes.int64.min, dtypes.int64)
        wide = self.type_names["int64"]
        return f"(({self.type_name(to)})({fits} ? ({wide})({f}){x} : {low}))"

    def bit_cast(self, to: str, frm: str, x: str) -> str:
        """Reinterpret the bits of x (of C type frm) as C type to: a union, which C compilers all take."""
        return f"((union {{ {frm} a; {to} b; }}){{ .a = {x} }}).b"

    def bitcast(self, u: UOp, x: str) -> str:
        src_dt = u.source.dtype
        bits = self.type_names["uint16"]
        if self._bf16(u.dtype):
            return f"tiny_bf16_to_f32({self.bit_cast(bits, self.type_name(src_dt), x)})"
        if self._bf16(src_dt):
            return self.bit_cast(self.type_name(u.dtype), bits, f"tiny_f32_to_bf16({x})")
        return self.bit_cast(self.type_name(u.dtype), self.type_name(src_dt), x)

    def const(self, value: int | float | bool, dt: DType) -> str:
        if dt.count > 1:  # a true bool lane is all ones, as vector comparisons make it
            lane = ("-1" if value else "0") if dt.is_bool else self.const(value, dt.scalar)
            return self.vector_literal(dt, [lane] * dt.count)
        if dt.is_bool:
            return "1" if value else "0"
        if dt.is_float:
            assert isinstance(value, (int, float))
            if math.isnan(value):
                text = self.nan_text
            elif math.isinf(value):
                text = ("-" if value < 0 else "") + self.inf_text
            else:
                text = repr(float(value)) + ("" if dt.scalar == dtypes.float64 else "f")
            return text if dt.scalar in (dtypes.float32, dtypes.float64) else f"(({self.type_name(dt)}){text})"
        suffix = self.int_suffix.get(dt.scalar.name, "")
        if dt.scalar.name == "int64" and value == dt.min:
            return f"({value + 1}{suffix}-1)"  # the literal itself would overflow
        if dt.scalar.name == "int32" and value == dt.min:
            return f"({value + 1}-1)"
        text = f"{value}{suffix}"
        return text if dt.scalar.itemsize >= 4 else f"(({self.type_name(dt)}){text})"

    def float_math(self, fn: str, args: list[str], dt: DType) -> str:
        """A libm function for dt: fn for double, fnf for float; narrower floats go through float."""
        if dt.scalar == dtypes.float64:
            return f"__builtin_{fn}({', '.join(args)})"
        if dt.scalar == dtypes.float32:
            return f"__builtin_{fn}f({', '.join(args)})"
        return f"(({self.type_name(dt)})__builtin_{fn}f({', '.join(f'(float){a}' for a in args)}))"

    def lane_math(self, op: Ops, scalar: DType) -> DType | None:
        """The vector dtype whose function defines op on scalar where it is not the language's scalar function
        (None: it is). Every lane of every width then takes its value from that function, a scalar from lane 0 of it,
        so a value computed again in another kernel, vectorized otherwise, is the same bits (a max's gradient
        compares a value with the max over it: a last bit apart, no element was the max and the gradient was NaN)."""
        return None

    def _vector_types(self, used: set[DType], scalar_math: list[tuple[Ops, DType]]) -> list[DType]:
        """The vector types a kernel declares: those it uses, and those lane_math's functions take, for its scalar
        math and for the math functions every float vector type comes with."""
        types = used | {v for op, s in scalar_math if (v := self.lane_math(op, s)) is not None}
        floats = {v.scalar for v in types if v.is_float}
        types |= {v for op in self.math_fns for s in floats if (v := self.lane_math(op, s)) is not None}
        return sorted(types, key=repr)

    def lane_math_helper(self, op: Ops, scalar: DType) -> str:
        """tiny_<fn>_<dtype>(x): op on one value through lane 0 of lane_math's vector function."""
        fn, s, v = self.math_fns[op], self.type_names[scalar.name], self.lane_math(op, scalar)
        assert v is not None
        t = self.vector_type_name(v)
        return f"static inline {s} tiny_{fn}_{scalar.name}({s} x) {{ {t} v = {{x}}; return tiny_v{fn}_{t}(v)[0]; }}\n"

    def alu(self, u: UOp, args: list[str]) -> str:
        op, dt = u.op, u.dtype
        if op in self.math_fns and dt.count > 1:
            return f"tiny_v{self.math_fns[op]}_{self.vector_type_name(dt)}({args[0]})"
        if op in self.math_fns and self.lane_math(op, dt) is not None:
            return f"tiny_{self.math_fns[op]}_{dt.scalar.name}({args[0]})"
        if op in self.math_fns:
            return self.float_math(self.math_fns[op], args, dt)
        if op is Ops.WHERE and dt.count > 1 and dt.is_bool:  # (masks of all-ones lanes: chosen bit by bit)
            return f"(({args[0]}&{args[1]})|(~{args[0]}&{args[2]}))"
        if op is Ops.WHERE and dt.count > 1:
            return f"tiny_vwhere_{self.vector_type_name(dt)}({', '.join(args)})"
        if op is Ops.NEG:
            if dt.is_bool:
                return f"(~{args[0]})" if dt.count > 1 else f"(!{args[0]})"
            return f"(-{args[0]})"
        if op is Ops.RECIP:
            return f"({self.const(1, dt)}/{args[0]})"
        if op is Ops.MAX:
            a, b = args
            if dt.count > 1:
                return f"tiny_vmax_{self.vector_type_name(dt)}({a}, {b})"
            if dt.is_float:  # NaN wins, as torch.maximum
                return f"((({a}!={a})|({a}>={b}))?{a}:{b})"
            return f"(({a}>={b})?{a}:{b})"
        if op is Ops.MOD and dt.is_float:
            return self.float_math("fmod", args, dt)
        if op in (Ops.IDIV, Ops.MOD):
            return self._int_div(u, *args)
        if op in (Ops.SHL, Ops.SHR) and dt.is_int:
            return self._shift(u, *args)
        if op in (Ops.ADD, Ops.MUL) and dt.is_bool:
            return f"({args[0]}{'|' if op is Ops.ADD else '&'}{args[1]})"
        return _CODE[op](*args)

    def multiply_add(self, dt: DType, a: str, b: str, acc: str) -> str | None:
        """acc + a * b as one fused multiply-add, for a reduction's update of its accumulator; None: the two ops.
        Only there: a reduction is computed in one kernel, whereas an elementwise value may be computed again in
        another, where it must round the same (a max's gradient compares a value with the max over it)."""
        return None

    def multiply_add_helper(self, dt: DType) -> str:
        """What a kernel that calls multiply_add for dt defines first."""
        return ""

    def lane_sum(self, dt: DType, vector: str) -> str | None:
        """The sum of the lanes of an integer vector (a vector reduction's last step) as one expression, where the
        target sums them faster than lane by lane; None: an add per lane."""
        return None

    def dot4_added(self, w: CWalk, u: UOp, args: list[str]) -> str | None:
        """An ADD of a DOT4 written as one accumulating call, or None (a renderer whose caps take DOT4 may)."""
        return None

    def dot4_helper(self, dt: DType, signed: bool) -> str:
        """What a kernel with a DOT4 (SDOT4: signed) of dt defines first (a renderer whose caps take DOT4 writes it)."""
        raise NotImplementedError(f"{type(self).__name__} has no DOT4 (RendererCaps.dot4 is off)")

    def lane_sum_helper(self, dt: DType) -> str:
        """What a kernel that calls lane_sum for dt defines first."""
        return ""

    def _wide(self, x: str) -> str:
        """x as the unsigned 64-bit type (OpenCL C spells it ulong, the others unsigned long long)."""
        return f"(({self.type_name(dtypes.uint64)})({x}))"

    def _shift(self, u: UOp, a: str, b: str) -> str:
        """A shift by the type's width or more (or by a negative amount) gives 0, or the sign in every bit for a
        signed right shift, as tiny.ir.alu says; C leaves it undefined (x86 takes the amount modulo the width)."""
        bits = u.dtype.scalar.itemsize * 8
        amount = u.src[1]
        text = f"({a}{'<<' if u.op is Ops.SHL else '>>'}{b})"
        low, high = _lane_bounds(amount)
        if 0 <= low and high < bits:  # (a constant, or an amount known in range: a nibble's 0 or 4, in every lane)
            return text
        far = f"({a}>>{bits - 1})" if u.op is Ops.SHR and u.dtype.scalar.kind == "i" else "0"
        return f"({self._wide(b)}>={bits}?{far}:{text})"

    def _int_div(self, u: UOp, a: str, b: str) -> str:
        """C's / and % toward zero; a zero divisor gives 0; for signed types MIN / -1 wraps to MIN and MIN % -1 is
        0 (C leaves both undefined, and a CPU running this code traps)."""
        sym, divisor = "/" if u.op is Ops.IDIV else "%", u.src[1]
        signed = u.dtype.scalar.kind == "i"
        if divisor.op is Ops.CONST and divisor.arg != 0 and not (signed and divisor.arg == -1):
            return f"({a}{sym}{b})"
        if not signed:
            return f"(({b})==0?0:({a}{sym}{b}))"
        if u.op is Ops.MOD:
            return f"((({b})==0||({b})==-1)?0:({a}%{b}))"
        wrapped = f"(({self.type_name(u.dtype)})({self._wide(0)}-{self._wide(a)}))"
        return f"(({b})==0?0:(({b})==-1?{wrapped}:({a}/{b})))"

    def index(self, pointer: str, offset: UOp, names: dict[UOp, str]) -> str:
        """The address of element `offset` of a buffer."""
        return f"({pointer}+{names[offset]})"

    def render_kernel(self, w: CWalk, name: str) -> str:
        """The kernel's function: its signature and the body the walk wrote."""
        return f"{self.kernel_prefix} {name}({', '.join(w.params())}) {{\n" + "\n".join(w.lines) + "\n}\n"

    # ---------------------------------------------------------------- the walk: a method per op (rules)

    rules = {
        Ops.DEFINE_GLOBAL: "write_buffer",
        Ops.DEFINE_VAR: "write_variable",
        Ops.CONST: "write_const",
        Ops.SPECIAL: "write_special",
        Ops.DEFINE_LOCAL: "write_local",
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
        **dict.fromkeys((Ops.CAST, Ops.BITCAST, Ops.VECTORIZE, Ops.GEP, Ops.WMMA, *GroupOp.ALU), "write_expression"),
    }

    def start(self, uops: list[UOp]) -> CWalk:
        """The walk of one kernel (a dialect that keeps more per kernel starts its own kind)."""
        return CWalk(uops, self.max_inline_depth, self.repeats_operands)

    def render(self, name: str, uops: list[UOp]) -> str:
        w = self.walk(self.start(uops))
        if w.held:
            w.flush()
        kernel = self.render_kernel(w, name)
        values = [u.dtype for u in uops if not isinstance(u.dtype, PtrDType)]
        scalar_math = {(u.op, u.dtype.scalar) for u in uops if u.op in self.math_fns and u.dtype.count == 1}
        scalar_math = sorted(((op, s) for op, s in scalar_math if self.lane_math(op, s) is not None), key=repr)
        vectors = self._vector_types({dt for dt in values if dt.count > 1}, scalar_math)
        types = "".join(self.vector_typedef(dt) for dt in vectors)
        helpers = "".join(self.lane_math_helper(op, s) for op, s in scalar_math)
        helpers += "".join(self.multiply_add_helper(dt) for dt in sorted(w.fused, key=repr))
        helpers += "".join(self.lane_sum_helper(dt) for dt in sorted(w.lane_sums, key=repr))
        dots = {(u.dtype, u.op is Ops.SDOT4) for u in uops if u.op in GroupOp.ByteDots}
        helpers += "".join(self.dot4_helper(dt, signed) for dt, signed in sorted(dots, key=repr))
        kernel = types + "".join(self.vector_prelude(dt) for dt in vectors) + helpers + kernel
        scalars = {_element(u.dtype).scalar for u in uops}
        uses_bf16 = self.emulate_bf16 and dtypes.bfloat16 in scalars
        return self.preamble(w, scalars) + (self.bf16_prelude if uses_bf16 else "") + kernel

    def write_buffer(self, w: CWalk, u: UOp) -> str:
        name = f"data{u.arg}"
        qual = "" if u in w.written else "const "
        w.buffers.append((u.arg, f"{self.buffer_prefix}{qual}{self.type_name(u.dtype)} restrict {name}"))
        return name

    def write_variable(self, w: CWalk, u: UOp) -> str:
        w.variables.append(f"{self.arg_int} {u.arg[0]}")
        return u.arg[0]

    def write_const(self, w: CWalk, u: UOp) -> str:
        return self.const(u.arg, u.dtype)

    def write_special(self, w: CWalk, u: UOp) -> str:
        if self.special_params:  # (after every variable: the CPU passes the thread's number last)
            w.specials.append(f"{self.arg_int} {u.arg[0]}")
        else:
            w.line(f"{self.type_name(u.dtype)} {u.arg[0]} = {self.special(w, u.arg[0])}; /* {u.arg[1]} */")
        return u.arg[0]

    def write_local(self, w: CWalk, u: UOp) -> str:
        assert isinstance(u.dtype, PtrDType) and u.dtype.base is not None
        w.line(self.define_local(u.arg[0], u.dtype.base, u.arg[1]))
        return u.arg[0]

    def write_range(self, w: CWalk, u: UOp) -> str:
        name = w.fresh("ridx")
        w.line(f"for ({self.type_name(u.dtype)} {name} = 0; {name} < {w.names[u.end]}; {name}++) {{")
        return name

    def write_index(self, w: CWalk, u: UOp) -> str:
        return self.index(w.names[u.pointer], u.offset, w.names)

    def write_load(self, w: CWalk, u: UOp) -> str | None:
        if self.elided(w, u):
            return None
        addr = u.address
        through_scalars = u.dtype.count > 1 and _element(addr.pointer.dtype).count == 1
        raw = self.vector_load(u.dtype, w.names[addr]) if through_scalars else self.loaded(w, u, f"*{w.names[addr]}")
        alt = u.alternative
        val = raw if addr.gate is None or alt is None else f"({w.names[addr.gate]}?{raw}:{w.names[alt]})"
        name = w.fresh("val")
        w.line(f"{self.value_type(w, u)} {name} = {val};")
        return name

    def write_store(self, w: CWalk, u: UOp) -> None:
        addr, value = u.address, w.names[u.value]
        if u.value.dtype.count > 1 and _element(addr.pointer.dtype).count == 1:
            store = self.vector_store(u.value.dtype, w.names[addr], value)
        else:
            store = f"*{w.names[addr]} = {self.stored(w, u.value, value)};"
        w.line(store if addr.gate is None else f"if ({w.names[addr.gate]}) {store}")

    def write_acc(self, w: CWalk, u: UOp) -> str:
        name = w.fresh("acc")
        w.line(f"{self.type_name(u.dtype)} {name} = {w.operands(u)[0]};")
        return name

    def write_assign(self, w: CWalk, u: UOp) -> str:
        acc, value = u.src
        terms = self._steps(w, acc, value) if self.interleave_updates else None
        if terms is None:
            w.line(f"{w.names[acc]} = {w.names[value]};")
        else:
            if any(acc is a or any(w.names[a] in t for t in terms) for a, _ in w.held):
                w.flush()  # an update that reads a held accumulator waits for it
            w.held.append((acc, terms))
            w.held_indent = "  " * (1 + w.depth)
        return w.names[acc]

    def write_barrier(self, w: CWalk, u: UOp) -> None:
        w.line(self.barrier())

    def write_expression(self, w: CWalk, u: UOp) -> str:
        """An op whose value is an expression: inlined into its reader or named (Walk.expression)."""
        op, src = u.op, w.operands(u)
        if op is Ops.WMMA:
            expr = self.wmma(u, src)
        elif op is Ops.VECTORIZE:
            lanes = [f"-({x})" for x in src] if u.dtype.is_bool else src  # a true lane is all ones
            expr = self.vectorize(w, u, lanes)
        elif op is Ops.GEP:
            expr = f"({self.gep(src[0], u.arg)} != 0)" if u.dtype.is_bool else self.gep(src[0], u.arg)
        elif op is Ops.CAST:
            expr = self.cast(u, src[0])
        elif op is Ops.BITCAST:
            expr = self.bitcast(u, src[0])
        elif (vector := summed_vector(u)) is not None and (total := self.lane_sum(vector.dtype, w.names[vector])):
            expr = total
            w.lane_sums.add(vector.dtype)
        elif op is Ops.ADD and self.caps.dot4 and (added := self.dot4_added(w, u, src)) is not None:
            expr = added
        else:
            expr = self.alu(u, src)
        expr = self.rounded(u, expr)
        return w.expression(u, expr, lambda name: f"{self.value_type(w, u)} {name} = {expr};")

    def _steps(self, w: CWalk, acc: UOp, value: UOp) -> list[str] | None:
        """value = ((acc op t0) op t1) ... with every op inlined: 'acc op t' for each term, in order."""
        ops: list[tuple[UOp, UOp]] = []
        while value is not acc:
            if value not in w.inlined or value.op not in (Ops.ADD, Ops.MUL) or (ops and value.op is not ops[0][0].op):
                return None
            ops.append((value, value.src[1]))
            value = value.src[0]
        return [self._step(w, v, w.names[acc], term) for v, term in reversed(ops)] or None

    def _step(self, w: CWalk, v: UOp, acc: str, term: UOp) -> str:
        """'acc op term'; a product added to the accumulator as one fused multiply-add where the target has one."""
        if v.op is Ops.ADD and term.op is Ops.MUL and term in w.inlined:
            text = self.multiply_add(v.dtype, w.names[term.src[0]], w.names[term.src[1]], acc)
            if text is not None:
                w.fused.add(v.dtype)
                return text
        return self.rounded(v, self.alu(v, [acc, w.names[term]]))

    def preamble(self, w: CWalk, scalars: set[DType]) -> str:
        """What the source starts with, given the scalar dtypes the kernel uses (extensions to enable ...)."""
        return ""

    def special(self, w: CWalk, name: str) -> str:
        raise NotImplementedError(f"{type(self).__name__} has no hardware indices")

    def wmma(self, u: UOp, args: list[str]) -> str:
        """A tensor-core multiply-accumulate on the fragments args (a dialect with tensor cores renders it)."""
        raise NotImplementedError(f"{type(self).__name__} cannot render WMMA: its target has no tensor cores")

    def define_local(self, name: str, dt: DType, size: int) -> str:
        raise NotImplementedError(f"{type(self).__name__} has no local memory")

    def barrier(self) -> str:
        raise NotImplementedError(f"{type(self).__name__} has no barriers")


def _byte_products(a: str, b: str, signed: bool = False) -> str:
    """C for DOT4 on two ints: a's bytes, unsigned (SDOT4: signed), times b's, signed, summed."""
    first = "(int)(signed char)({a} >> {i})" if signed else "(({a} >> {i}) & 255)"
    terms = [f"{first.format(a=a, i=i)} * (int)(signed char)({b} >> {i})" for i in (0, 8, 16, 24)]
    return "(" + " + ".join(terms) + ")"


def _byte_pairs(n: int, signed: bool) -> str:
    """The body of DOT4 (SDOT4: signed) on n int32 lanes (s += DOT4(a, b)) in x86's byte products, a hardware vector
    at a time (32 bytes, or 16 for n = 4): pmaddubsw sums two products of unsigned by signed bytes in int16, pmaddwd
    two of those in int32. DOT4: pmaddubsw saturates where both of a pair's unsigned bytes are past 127 (255 x -128
    twice), so a's bytes go as their low 7 bits and, apart, their top bit (times 128): each sum exact. Where a's bytes
    are known to be below 128 (Q4_0's nibbles) the compiler drops the top bits' products. SDOT4: |a| (-128's is 128,
    unsigned) times b with a's sign (psignb), one product a pair: exact where no byte of b is -128 (Ops.SDOT4's
    contract; |a| x |b| then at most 128 x 127, twice 32512)."""
    size = 32 if n >= 8 else 16
    suffix = "256" if size == 32 else "128"
    madd, maddubs = f"__builtin_ia32_pmaddwd{suffix}", f"__builtin_ia32_pmaddubsw{suffix}"
    one = ", ".join(["1"] * (size // 2))
    if signed:
        sign = f"__builtin_ia32_psignb{suffix}"
        products = (
            f"    tiny_q ax = {sign}((tiny_q)x, (tiny_q)x), sy = {sign}((tiny_q)y, (tiny_q)x);\n"
            f"    acc += (tiny_d){madd}({maddubs}(ax, sy), one);\n"
        )
    else:
        products = (
            "    tiny_d low = x & 0x7F7F7F7F, top = (x >> 7) & 0x01010101;\n"
            f"    acc += (tiny_d){madd}({maddubs}((tiny_q)low, (tiny_q)y), one);\n"
            f"    acc += (tiny_d){madd}({maddubs}((tiny_q)top, (tiny_q)y), one) << 7;\n"
        )
    return (
        f"  typedef char tiny_q __attribute__((vector_size({size})));\n"
        f"  typedef short tiny_h __attribute__((vector_size({size})));\n"
        f"  typedef int tiny_d __attribute__((vector_size({size})));\n"
        f"  const tiny_h one = {{{one}}};\n"
        f"  for (int p = 0; p < {n * 4 // size}; p++) {{\n"
        f"    tiny_d x, y, acc;\n"
        f"    __builtin_memcpy(&x, (char *)&a + {size} * p, {size});\n"
        f"    __builtin_memcpy(&y, (char *)&b + {size} * p, {size});\n"
        f"    __builtin_memcpy(&acc, (char *)&s + {size} * p, {size});\n"
        f"{products}"
        f"    __builtin_memcpy((char *)&s + {size} * p, &acc, {size});\n"
        f"  }}\n  return s;\n"
    )


def _dot4_name(u: UOp) -> str:
    """The C helper's name (less its type) for a DOT4 or SDOT4."""
    return "tiny_sdot4" if u.op is Ops.SDOT4 else "tiny_dot4"


def _lane_bounds(u: UOp) -> tuple[int | float, int | float]:
    """The least and greatest value of any lane of u: a vector's lanes each bounded as a scalar is (UOp.vmin_vmax
    gives a vector its dtype's whole range)."""
    if u.dtype.count > 1 and u.op is Ops.VECTORIZE:
        bounds = [_lane_bounds(s) for s in u.src]
        return min(b[0] for b in bounds), max(b[1] for b in bounds)
    if u.dtype.count > 1 and u.op is Ops.CONST:
        return u.arg, u.arg
    return u.vmin_vmax


def _element(dt: DType) -> DType:
    """A value's dtype, or the dtype a pointer points to."""
    return dt.base if isinstance(dt, PtrDType) and dt.base is not None else dt


def target_fields(target: str) -> dict[str, str]:
    """'key=value;key=value' (a GPU device's renderer target) -> {key: value}."""
    fields = {}
    for item in target.split(";") if target else []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ValueError(f"a renderer target is 'key=value;key=value...', got the item {item!r} in {target!r}")
        fields[key.strip()] = value.strip()
    return fields


class GPUCStyleRenderer(CStyleRenderer):
    """What the GPU dialects of C share (OpenCL C; CUDA C and HIP to come): hardware indices from builtins,
    workgroup memory and barriers, and the limits of the device, which reports them in the renderer target:

      vector_width=4;local_max=1024,1024,64;local_total_max=1024;shared_max=49152;features=fp16,fp64

    `features` names what the device has beyond the core of the language; `optional_dtypes` says which dtypes
    need which feature (a dtype whose feature is missing is left out of the caps, so Tensor ops refuse it).
    An empty target (rendering with no device) assumes every feature and the limits below.
    """

    language = "GPU"
    group_id = ""  # the workgroup index in dim {dim}, as an expression
    local_id = ""  # the thread's index inside its workgroup in dim {dim}
    local_qualifier = ""  # how workgroup memory is declared
    barrier_text = ""  # the statement that waits for the whole workgroup
    # workgroups in each grid dim (x, y, z) the kernel may be launched with; CUDA's runtime folds a bigger grid
    grid_max: tuple[int, int, int] = (2**31 - 1,) * 3
    optional_dtypes: dict[str, DType] = {}
    default_limits = {
        "vector_width": "4",
        "local_max": "1024,1024,64",
        "local_total_max": "1024",
        "shared_max": "32768",
    }

    def __init__(self, target: str = "") -> None:
        super().__init__(target)
        fields = self.default_limits | target_fields(target)
        features = set(fields["features"].split(",")) if "features" in fields else set(self.optional_dtypes)
        local_max = tuple(int(x) for x in fields["local_max"].split(","))
        if len(local_max) != 3:
            raise ValueError(f"local_max in the renderer target has 3 sizes, got {fields['local_max']!r}")
        self.features = frozenset(features)
        self.caps = RendererCaps(
            language=self.language,
            has_local=True,
            has_shared=True,
            global_max=self.grid_max,
            local_max=local_max,
            local_total_max=int(fields["local_total_max"]),
            shared_max=int(fields["shared_max"]),
            vector_width=int(fields["vector_width"]),
            dtypes=frozenset(dtypes.all()) - {dt for f, dt in self.optional_dtypes.items() if f not in features},
        )

    def special(self, w: CWalk, name: str) -> str:
        return (self.local_id if name.startswith("lidx") else self.group_id).format(dim=int(name[4:]))

    def define_local(self, name: str, dt: DType, size: int) -> str:
        return f"{self.local_qualifier}{self.memory_type(dt)} {name}[{size}];"

    def barrier(self) -> str:
        return self.barrier_text


_MASK_LANE = {1: "signed char", 2: "short", 4: "int", 8: "long long"}  # a vector mask's lanes, by their bytes

# glibc's vector math library (libmvec) for AVX2: 8 floats or 4 doubles per call (float32 exp2 is _vexp2_float32)
_MVEC = {
    (Ops.LOG2, 8, "float32"): "_ZGVdN8v_log2f",
    (Ops.SIN, 8, "float32"): "_ZGVdN8v_sinf",
    (Ops.EXP2, 4, "float64"): "_ZGVdN4v_exp2",
    (Ops.LOG2, 4, "float64"): "_ZGVdN4v_log2",
    (Ops.SIN, 4, "float64"): "_ZGVdN4v_sin",
}
_MVEC_LANES = {"float32": 8, "float64": 4}


# 2**f on [-0.5, 0.5], a degree-6 minimax polynomial (Cephes' exp2f), highest power first
_EXP2_POLY = (
    "1.535336188319500e-4f",
    "1.339887440266574e-3f",
    "9.618437357674640e-3f",
    "5.550332471162809e-2f",
    "2.402264791363012e-1f",
    "6.931472028550421e-1f",
    "1.0f",
)


_FUSED = (dtypes.float32, dtypes.float64)  # the dtypes whose accumulators take a product as one multiply-add (CPU)


def _fma_helper(t: str, n: int, scalar: str) -> str:
    """tiny_fma_t(a, b, c): a * b + c as one fused multiply-add, where the CPU compiles with -ffp-contract=off so that
    every other expression rounds after each op in every kernel alike (t: n lanes of scalar; n = 1 a scalar). clang:
    the pragma lets this one expression fuse (an fma where the host has one, else a multiply and an add). gcc ignores
    the pragma: where the host's fma is fast (__FP_FAST_FMAF / __FP_FAST_FMA) it is called for each lane, which gcc
    makes one vector instruction (softmax's exp-and-sum kernel took twice clang's time with gcc's separate multiplies
    and adds)."""
    fast, fn = ("__FP_FAST_FMA", "__builtin_fma") if scalar == "double" else ("__FP_FAST_FMAF", "__builtin_fmaf")
    lanes = (
        f"  return {fn}(a, b, c);\n"
        if n == 1
        else f"  {t} r;\n  for (int i = 0; i < {n}; i++) r[i] = {fn}(a[i], b[i], c[i]);\n  return r;\n"
    )
    return (
        f"static inline {t} tiny_fma_{t}({t} a, {t} b, {t} c) {{\n"
        f"#if !defined(__clang__) && defined({fast})\n{lanes}#else\n"
        "#pragma STDC FP_CONTRACT ON\n  return a * b + c;\n#endif\n}\n"
    )


def _vexp2_float32(t: str, n: int) -> str:
    """exp2 on a float32 vector of n lanes, in the vector unit and inlined: at most 1 ulp from the correctly rounded
    result (the tests' 400k inputs). Against libmvec's call it is about even in a loop that only maps values, and
    faster in a reduction's loop, where a call makes the compiler spill the accumulator and constants around it
    (softmax's exp-and-sum kernel 6.3 -> 4.3 ms with the linearizer's one-op accumulator updates); on hosts without
    libmvec it replaces a libm call per lane.
    x is clamped to [-151, 129] (NaN is computed as a finite value and given back: converting NaN to an integer is
    undefined, and a compiler that folds a constant NaN's exp2 made anything of it), split as n + f with n = round(x)
    (adding and taking away 1.5 * 2**23 rounds a float to the nearest integer), and 2**n is applied as two powers of
    two, 2**(n>>1) and 2**(n - (n>>1)), each a normal float, so a result that is subnormal is rounded once and one
    past the range is inf. Horner's steps are fused multiply-adds (tiny_fma_t, _fma_helper): the same text, so the
    same rounding, in every kernel. The clamp and the NaN's return are selects of masks for clang (which makes them
    a vector max, min and blend) and lane by lane for gcc (which makes those of the loops, where its code for the
    masks took twice the ops: softmax's exp-and-sum kernel)."""
    m = f"{t}_mask"
    horner = "".join(f"  p = tiny_fma_{t}(p, f, ({t}){{0}} + {c});\n" for c in _EXP2_POLY[1:])
    lanes = f"  for (int i = 0; i < {n}; i++)"
    return (
        f"static inline {t} tiny_vexp2_{t}({t} x) {{\n"
        "#if defined(__clang__)\n"
        f"  {t} c = tiny_vwhere_{t}(({m})(x < -151.0f), ({t}){{0}} - 151.0f, x);\n"
        f"  c = tiny_vwhere_{t}(({m})(c > 129.0f), ({t}){{0}} + 129.0f, c);\n"
        f"  c = tiny_vwhere_{t}(({m})(x != x), ({t}){{0}}, c);\n"
        "#else\n"
        f"  {t} c;\n{lanes} c[i] = x[i] > -151.0f ? x[i] : -151.0f;\n{lanes} c[i] = c[i] < 129.0f ? c[i] : 129.0f;\n"
        "#endif\n"
        f"  {t} n = (c + 12582912.0f) - 12582912.0f;\n"
        f"  {t} f = c - n;\n"
        f"  {t} p = ({t}){{0}} + {_EXP2_POLY[0]};\n"
        f"{horner}"
        f"  {m} k = __builtin_convertvector(n, {m});\n"
        f"  {m} h = k >> 1;\n"
        f"  {t} r = p * ({t})((h + 127) << 23) * ({t})((k - h + 127) << 23);\n"
        "#if defined(__clang__)\n"
        f"  return tiny_vwhere_{t}(({m})(x != x), x, r);\n"
        "#else\n"
        f"{lanes} r[i] = x[i] != x[i] ? x[i] : r[i];\n  return r;\n"
        "#endif\n}\n"
    )


class CRenderer(CStyleRenderer):
    """C for the CPU device, compiled by clang or gcc: GNU vector types, one call per thread (gidx0 its number)."""

    caps = RendererCaps(language="C", vector_width=8, narrow_vectors=True)
    special_params = True
    inline_exp2 = True  # float32 vector exp2 by _vexp2_float32, not libmvec's call (a CPU's vector unit)

    def vector_typedef(self, dt: DType) -> str:
        """GNU vector types; a bool vector is a mask of integers as wide as the lanes it was compared from."""
        t, n = self.vector_type_name(dt), dt.count
        size = self.caps.vector_width * 4 if dt.is_bool else dt.scalar.itemsize * n
        lane = self.type_names[dt.scalar.name] if not dt.is_bool else _MASK_LANE[size // n]
        text = f"typedef {lane} {t} __attribute__((vector_size({size})));\n"
        if not dt.is_bool:
            text += f"typedef {_MASK_LANE[dt.scalar.itemsize]} {t}_mask __attribute__((vector_size({size})));\n"
        return text

    def vector_prelude(self, dt: DType) -> str:
        if dt.is_bool:
            return ""
        t, s, n = self.vector_type_name(dt), self.type_names[dt.scalar.name], dt.count
        size = dt.scalar.itemsize * n
        pick = "(a != a) | (a >= b)" if dt.is_float else "a >= b"  # NaN wins, as torch.maximum
        has_math = dt.scalar in VECTOR_DTYPES and dt.is_float  # (a float16 vector is only loaded and converted)
        math_fns = "".join(self.vector_math(dt, op, fn) for op, fn in self.math_fns.items()) if has_math else ""
        math_fns += self._half_conversion(dt)
        fma = _fma_helper(t, n, s) if dt.scalar in _FUSED else ""  # (before the math: exp2's polynomial takes it)
        basics = (
            f"static inline {t} tiny_vload_{t}(const {s}* p) {{ {t} v; __builtin_memcpy(&v, p, {size}); return v; }}\n"
            f"static inline void tiny_vstore_{t}({s}* p, {t} v) {{ __builtin_memcpy(p, &v, {size}); }}\n"
            f"static inline {t} tiny_vwhere_{t}({t}_mask c, {t} a, {t} b) {{\n"
            f"  return ({t})((c & ({t}_mask)a) | (~c & ({t}_mask)b));\n}}\n"
            f"static inline {t} tiny_vmax_{t}({t} a, {t} b) {{ return tiny_vwhere_{t}(({t}_mask)({pick}), a, b); }}\n"
        )
        return basics + fma + math_fns

    def __init__(self, target: str = "") -> None:
        """target: 'machine;vector_width=N;threads=T;prefetch_locality=L;features' as the CPU device reports it
        (features: f16; the locality of prefetches, tiny.codegen.renderer.prefetch.locality, may be left out)."""
        super().__init__(target)
        parts = target.split(";") if target else []
        width = next((int(p.split("=")[1]) for p in parts if p.startswith("vector_width=")), 8)
        threads = next((int(p.split("=")[1]) for p in parts if p.startswith("threads=")), 1)
        self.prefetch_locality = locality(target)
        features = set(parts[-1].split(",")) if parts else {"f16", "bf16"}
        missing = {dtypes.float16} if "f16" not in features else set()
        all_ = frozenset(dtypes.all()) - missing
        dot4 = "vnni" in features or "avx2" in features
        sdot4 = "avx2" in features and "vnni" not in features  # (VNNI's SDOT4 takes two vpdpbusd: DOT4's one)
        caps = RendererCaps(
            language="C",
            vector_width=width,
            threads=threads,
            dtypes=all_,
            narrow_vectors=True,
            dot4=dot4,
            sdot4=sdot4,
        )
        self.caps = caps
        self.mvec = "mvec" in features

    def alu(self, u: UOp, args: list[str]) -> str:
        if u.op in GroupOp.ByteDots:
            return f"{_dot4_name(u)}_{self._fma_type(u.dtype)}({self.const(0, u.dtype)}, {args[0]}, {args[1]})"
        return super().alu(u, args)

    def dot4_added(self, w: CWalk, u: UOp, args: list[str]) -> str | None:
        """x + DOT4(a, b), the DOT4 inlined, as one call that adds to x: vpdpbusd's accumulator (an add each
        otherwise, and a zeroed register for each DOT4)."""
        for term, other in zip(u.src, reversed(args)):  # (either source may be the DOT4, the other the sum so far)
            if term.op in GroupOp.ByteDots and term in w.inlined:
                a, b = (w.names[s] for s in term.src)
                return f"{_dot4_name(term)}_{self._fma_type(u.dtype)}({other}, {a}, {b})"
        return None

    def dot4_helper(self, dt: DType, signed: bool) -> str:
        """tiny_dot4_<type>(acc, a, b), acc + DOT4(a, b) (tiny_sdot4_<type>: SDOT4): VNNI's vpdpbusd on 4, 8 or 16
        lanes (clang's or gcc's builtin) where the compiler targets it (SDOT4: over a's bytes offset by 128, less 128
        times b's sum, a second one); else AVX2's (SSSE3's for 4 lanes) byte products (_byte_pairs); else (and for a
        scalar) the four products written out lane by lane."""
        t, n, name = self._fma_type(dt), dt.count, "tiny_sdot4" if signed else "tiny_dot4"
        if n == 1:
            written = _byte_products("a", "b", signed)
            return f"static inline int {name}_int(int s, int a, int b) {{ return s + {written}; }}\n"
        head = f"static inline {t} {name}_{t}({t} s, {t} a, {t} b) {{\n"
        lanes = f"  for (int i = 0; i < {n}; i++) s[i] += {_byte_products('a[i]', 'b[i]', signed)};\n  return s;\n"
        if n not in (4, 8, 16):
            return f"{head}{lanes}}}\n"
        need = "defined(__AVX512VNNI__)"
        if n < 16:  # (AVX-512 VNNI's narrower forms come with VL; AVX-VNNI has them alone)
            need = f"defined(__AVXVNNI__) || {need} && defined(__AVX512VL__)"
        vnni = []
        for builtin in (f"__builtin_ia32_vpdpbusd{32 * n}", f"__builtin_ia32_vpdpbusd_v{n}si"):  # (clang's, gcc's)
            if signed:  # (0x80808080: each byte's top bit)
                vnni.append(
                    f"  {t} top = a - a - 2139062144;\n  return {builtin}(s, a ^ top, b) - {builtin}(a - a, top, b);\n"
                )
            else:
                vnni.append(f"  return {builtin}(s, a, b);\n")
        pairs = "defined(__SSSE3__)" if n == 4 else "defined(__AVX2__)"
        return (
            f"{head}#if defined(__clang__) && ({need})\n{vnni[0]}"
            f"#elif defined(__GNUC__) && ({need})\n{vnni[1]}"
            f"#elif {pairs}\n{_byte_pairs(n, signed)}#else\n{lanes}#endif\n}}\n"
        )

    def cast(self, u: UOp, x: str) -> str:
        """A vector conversion (narrow lanes to float32) lane by lane, as the scalar one; GNU C's cast of a vector
        would reinterpret its bits."""
        if u.dtype.count == 8 and u.source.dtype.scalar == dtypes.float16:
            return f"tiny_vcvt_float16x8({x})"
        if u.dtype.count > 1:
            return f"__builtin_convertvector({x}, {self.vector_type_name(u.dtype)})"
        return super().cast(u, x)

    def _half_conversion(self, dt: DType) -> str:
        """float16x8 -> float32x8: gcc 12 converts the lanes one at a time, F16C's instruction takes them at once
        (clang chooses it for the portable form)."""
        if dt != dtypes.float16.vec(8):
            return ""
        return (
            "static inline float32x8 tiny_vcvt_float16x8(float16x8 x) {\n"
            "#if defined(__F16C__) && !defined(__clang__)\n"
            "  typedef short tiny_short8 __attribute__((vector_size(16)));\n"
            "  return (float32x8)__builtin_ia32_vcvtph2ps256((tiny_short8)x);\n"
            "#else\n"
            "  return __builtin_convertvector(x, float32x8);\n"
            "#endif\n"
            "}\n"
        )

    def multiply_add(self, dt: DType, a: str, b: str, acc: str) -> str | None:
        return f"tiny_fma_{self._fma_type(dt)}({a}, {b}, {acc})" if dt.scalar in _FUSED else None

    def lane_sum(self, dt: DType, vector: str) -> str | None:
        return f"tiny_vsum_{self.vector_type_name(dt)}({vector})"

    def lane_sum_helper(self, dt: DType) -> str:
        """clang's reduction of the lanes (a tree of shuffles and vector adds), where the lane-by-lane sum is one
        extract and add per lane (clang's SLP vectorizer, off here, would have found the tree); elsewhere that sum."""
        t, s, n = self.vector_type_name(dt), self.type_names[dt.scalar.name], dt.count
        return (
            f"static inline {s} tiny_vsum_{t}({t} v) {{\n"
            "#if defined(__has_builtin) && __has_builtin(__builtin_reduce_add)\n"
            "  return __builtin_reduce_add(v);\n#else\n"
            f"  {s} s = 0;\n  for (int i = 0; i < {n}; i++) s += v[i];\n  return s;\n#endif\n}}\n"
        )

    def multiply_add_helper(self, dt: DType) -> str:
        """A scalar accumulator's fused multiply-add (a vector's is in its vector_prelude)."""
        return "" if dt.count > 1 else _fma_helper(self._fma_type(dt), 1, self.type_names[dt.scalar.name])

    def _fma_type(self, dt: DType) -> str:
        return self.vector_type_name(dt) if dt.count > 1 else self.type_names[dt.scalar.name]

    def lane_math(self, op: Ops, scalar: DType) -> DType | None:
        """float32 exp2 is _vexp2_float32 on 4 lanes (its lanes are alike at every width), where the host has libmvec
        its functions are theirs (8 floats or 4 doubles a call); the rest, libm's."""
        if op is Ops.EXP2 and scalar == dtypes.float32 and self.inline_exp2:
            return scalar.vec(4)
        lanes = _MVEC_LANES.get(scalar.name, 0)
        return scalar.vec(lanes) if self.mvec and (op, lanes, scalar.name) in _MVEC else None

    def vector_math(self, dt: DType, op: Ops, fn: str) -> str:
        """A math function on a vector: lane_math's function (libmvec's calls on narrower or wider vectors go a whole
        call at a time, the lanes past the end 1.0), else the scalar function lane by lane."""
        t, n, s = self.vector_type_name(dt), dt.count, dt.scalar.name
        if op is Ops.EXP2 and dt.scalar == dtypes.float32 and self.inline_exp2:
            return _vexp2_float32(t, dt.count)
        if (v := self.lane_math(op, dt.scalar)) is not None:
            name, w, m = _MVEC[(op, v.count, s)], self.vector_type_name(v), v.count
            declare = f"{w} {name}({w});\n"
            if m == n:
                return declare + f"static inline {t} tiny_v{fn}_{t}({t} x) {{ return {name}(x); }}\n"
            one = self.const(1.0, dt.scalar)
            return declare + (
                f"static inline {t} tiny_v{fn}_{t}({t} x) {{\n  {t} r;\n  for (int i = 0; i < {n}; i += {m}) {{\n"
                f"    {w} w, y;\n    for (int j = 0; j < {m}; j++) w[j] = i + j < {n} ? x[i + j] : {one};\n"
                f"    y = {name}(w);\n    for (int j = 0; j < {m} && i + j < {n}; j++) r[i + j] = y[j];\n  }}\n"
                "  return r;\n}\n"
            )
        lane = self.float_math(fn, ["x[i]"], dt.scalar)
        loop = f"for (int i = 0; i < {n}; i++) r[i] = {lane};"
        return f"static inline {t} tiny_v{fn}_{t}({t} x) {{ {t} r; {loop} return r; }}\n"

    def index(self, pointer: str, offset: UOp, names: dict[UOp, str]) -> str:
        """A constant term of the offset is added in 64 bits, which clang folds into the load's or store's address.
        Under -fwrapv an int sum must wrap at 32 bits before it is widened, which costs two instructions an access:
        a third of the inner loop of a convolution's register tile."""
        if offset.op is Ops.ADD and offset.dtype.count == 1 and offset.dtype.itemsize < 8:
            rest, last = offset.src
            if last.op is Ops.CONST:
                return f"({pointer}+((long long){names[rest]}+{names[last]}))"
        return super().index(pointer, offset, names)

    def render_kernel(self, w: CWalk, name: str) -> str:
        return f"void {name}({', '.join(w.params())}) {{\n" + "\n".join(w.lines) + "\n}\n"

    def walk(self, w: CWalk) -> CWalk:  # type: ignore[override]
        w.prefetches = prefetches(w.uops)
        return super().walk(w)  # type: ignore[return-value]

    def write_load(self, w: CWalk, u: UOp) -> str | None:
        name = super().write_load(w, u)
        if name is not None and (ahead := w.prefetches.get(u)) is not None:
            w.line(f"__builtin_prefetch({w.names[u.address]}+{ahead}, 0, {self.prefetch_locality});")  # (a read)
        return name
