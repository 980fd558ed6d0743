"""The NIR renderer: a linearized kernel as a Mesa NIR compute shader, built through libtinymesa's NIR builder.

Buffers and Variables are the shader's arguments, read from uniform block 0 (`load_ubo`): each buffer's 64-bit
address, then each Variable's 32-bit value. Global memory is read and written through those addresses
(`load_global`/`store_global`, the element offset widened to 64 bits and scaled by the item size); local memory is
the workgroup's shared memory (`load_shared`/`store_shared` at byte offsets, its size in the shader's info). A CPU
thread number or a GPU group id is `load_workgroup_id`, a lane of a workgroup `load_local_invocation_id`.

Loops and accumulators are NIR registers (`decl_reg`, `load_reg`, `store_reg`), which
`nir_lower_reg_intrinsics_to_ssa` turns into SSA values and phis before the shader is serialized: a loop is
`loop { i = counter; if (i >= end) break; body; counter = i + 1 }`, an accumulator a register written where the
kernel assigns it and read where it is used. A gated load is an `if` around the load, its alternative written to the
result's register in the `else`; a gated store an `if` around the store.

Numbers follow tiny.ir.alu, as the C and LLVM renderers do: integer division and remainder truncate toward zero and
give 0 for a zero divisor, shifts by the width or more give 0 (or the sign), MAX lets NaN win. bool is NIR's 1-bit
value in registers and a byte in memory. bfloat16 is not NIR's: the renderer refuses it.

The source is the shader as nir_print_shader writes it, followed by one line `// nir_serialize: <base64>` holding
what nir_serialize wrote: what a compiler back end (llvmpipe, NAK, ir3) deserializes (`serialized`).
"""

from __future__ import annotations

import base64
import ctypes
import struct
from collections.abc import Callable
from typing import Any

from tiny.codegen.renderer.mesa import (
    ACCESS_CAN_REORDER,
    INFO_NUM_UBOS,
    INFO_SHARED_SIZE,
    INFO_WORKGROUP_SIZE,
    MESA_SHADER_COMPUTE,
    NIR_JUMP_BREAK,
    NIR_MEMORY_ACQ_REL,
    NIR_VAR_MEM_SHARED,
    SCOPE_WORKGROUP,
    SHADER_INFO,
    Mesa,
    Scalar,
    check_version,
    mesa,
    print_shader,
    serialize,
    wheel_version,
)
from tiny.ir.device import DeviceUnavailable, Renderer, RendererCaps
from tiny.ir.dtypes import DType, PtrDType, dtypes
from tiny.ir.uop import GroupOp, Ops, UOp

SERIALIZED = "// nir_serialize: "
NIR_DTYPES = frozenset(d for d in dtypes.all() if d != dtypes.bfloat16)


def serialized(src: str) -> bytes:
    """The nir_serialize blob a NIR renderer's source carries on its last line."""
    last = src.rstrip("\n").rsplit("\n", 1)[-1]
    if not last.startswith(SERIALIZED):
        raise ValueError(f"not a NIR renderer's source: its last line should start with {SERIALIZED!r}")
    return base64.b64decode(last.removeprefix(SERIALIZED))


def _kind(dt: DType) -> str:
    """'f', 'i' (signed), 'u' (unsigned) or 'b' (bool): which of NIR's ops a dtype takes."""
    return dt.kind


def _bits(dt: DType) -> int:
    """The width of a dtype's value in NIR registers (bool: 1)."""
    return 1 if dt == dtypes.bool else dt.itemsize * 8


# ALU ops by the kind of their first operand: the NIR op, or a function of the builder and operands
_ALU: dict[str, dict[Ops, str]] = {
    "f": {Ops.ADD: "fadd", Ops.MUL: "fmul", Ops.FDIV: "fdiv", Ops.CMPLT: "flt", Ops.CMPNE: "fneu", Ops.NEG: "fneg"},
    "i": {Ops.ADD: "iadd", Ops.MUL: "imul", Ops.CMPLT: "ilt", Ops.CMPNE: "ine", Ops.NEG: "ineg", Ops.MAX: "imax"},
    "u": {Ops.ADD: "iadd", Ops.MUL: "imul", Ops.CMPLT: "ult", Ops.CMPNE: "ine", Ops.NEG: "ineg", Ops.MAX: "umax"},
    "b": {Ops.ADD: "ior", Ops.MUL: "iand", Ops.CMPNE: "ixor", Ops.MAX: "ior"},
}
_BITWISE = {Ops.AND: "iand", Ops.OR: "ior", Ops.XOR: "ixor"}
_FLOAT_MATH = {Ops.SQRT: "fsqrt", Ops.EXP2: "fexp2", Ops.LOG2: "flog2", Ops.SIN: "fsin", Ops.TRUNC: "ftrunc"}


class NIRRenderer(Renderer):
    """A kernel as a NIR compute shader: loops for the CPU (llvmpipe) by default; a GPU target overrides `caps`."""

    caps = RendererCaps(language="NIR", vector_width=4, dtypes=NIR_DTYPES)

    @classmethod
    def unavailable(cls) -> str | None:
        """Why the tinymesa wheel cannot be used (not installed, another Mesa); with it, llvmpipe's library may still
        be missing (`tiny.codegen.renderer.mesa.llvmpipe_problem`), which NAK and ir3 do not need."""
        try:
            check_version(wheel_version())
        except DeviceUnavailable as e:
            return str(e)
        return None

    def render(self, name: str, uops: list[UOp]) -> str:
        for u in uops:
            dt = u.dtype.base if isinstance(u.dtype, PtrDType) and u.dtype.base is not None else u.dtype
            if dt.scalar not in self.caps.dtypes and dt.scalar != dtypes.void:
                raise NotImplementedError(
                    f"{type(self).__name__} cannot take {dt.scalar!r} ({u.op.name}): not a type of NIR's"
                )
        m = mesa()
        build = _Build(m, name)
        try:
            build.kernel(uops, self)
            m.nir_lower_reg_intrinsics_to_ssa(build.shader)  # registers -> SSA values and phis
            m.nir_validate_shader(build.shader, b"tiny NIR renderer")  # (Mesa aborts, printing what is wrong)
            text, blob = print_shader(build.shader), serialize(build.shader)
        finally:
            m.ralloc_free(build.shader)
        return f"{text}{SERIALIZED}{base64.b64encode(blob).decode()}\n"

    def param(self, b: _Build, offset: int, bits: int) -> Any:
        """An argument: `bits` wide at byte `offset` of uniform block 0 (the shader's one uniform block)."""
        b.set_info(INFO_NUM_UBOS, ctypes.c_uint8, 1)
        zero = b.const(0, dtypes.uint32)
        at = b.const(offset, dtypes.uint32)
        return b.intrinsic(
            "load_ubo", [zero, at], 1, bits, access=ACCESS_CAN_REORDER, align_mul=bits // 8, range=1 << 30
        )


class _Build:
    """One shader being built: the builder, the value of each op, and helpers for instructions."""

    def __init__(self, m: Mesa, name: str) -> None:
        self.m = m
        self.b = m.nir_builder_init_simple_shader(MESA_SHADER_COMPUTE, None, name.encode())
        self.bp = ctypes.pointer(self.b)
        self.shader: int = self.b.shader

    # ---------------------------------------------------------------- instructions

    def alu(self, op: str, *srcs: Any) -> Any:
        if op not in self.m.ops:
            raise NotImplementedError(f"this libtinymesa has no NIR ALU op {op}")
        return getattr(self.m, f"nir_build_alu{len(srcs)}")(self.bp, self.m.ops[op], *srcs)

    def const(self, value: Any, dt: DType, lanes: int = 1) -> Any:
        instr = self.m.nir_load_const_instr_create(self.shader, lanes, _bits(dt)).contents
        if dt == dtypes.bool:
            bits = int(bool(value))
        elif dt.is_float:
            fmt = {2: "<e", 4: "<f", 8: "<d"}[dt.itemsize]
            bits = int.from_bytes(struct.pack(fmt, value), "little")
        else:
            bits = int(value) & ((1 << (dt.itemsize * 8)) - 1)
        for i in range(lanes):
            instr.values(lanes)[i] = bits
        self.m.nir_builder_instr_insert(self.bp, ctypes.addressof(instr))
        return ctypes.pointer(instr.def_)

    def intrinsic(self, name: str, srcs: list[Any], lanes: int = 0, bits: int = 0, **indices: int) -> Any:
        """An intrinsic with these sources and indices; its def (lanes x bits) when lanes > 0, else None."""
        op = self.m.intrinsics[name]
        instr = self.m.nir_intrinsic_instr_create(self.shader, op).contents
        info = self.m.intrinsic_infos[op]
        # a vectorized intrinsic (a def or source of no fixed width) says its width; any other says 0
        sized = [c == 0 for c in info.src_components[: info.num_srcs]]
        if info.has_dest and info.dest_components == 0:
            instr.num_components = lanes
        elif not info.has_dest:
            instr.num_components = next((s.contents.num_components for s, v in zip(srcs, sized) if v), 0)
        for kind, value in indices.items():
            instr.const_index[self.m.index_slot(op, kind)] = value
        for i, s in enumerate(srcs):
            instr.sources(len(srcs))[i].ssa = s
        if lanes:
            self.m.nir_def_init(ctypes.addressof(instr), ctypes.byref(instr.def_), lanes, bits)
        self.m.nir_builder_instr_insert(self.bp, ctypes.addressof(instr))
        return ctypes.pointer(instr.def_) if lanes else None

    def lanes(self, parts: list[tuple[Any, int]]) -> Any:
        """A vector (or one scalar) of the given (value, lane) components."""
        scalars = (Scalar * len(parts))(*(Scalar(d, c) for d, c in parts))
        return self.m.nir_vec_scalars(self.bp, scalars, len(parts))

    def reg(self, dt: DType, lanes: int) -> Any:
        return self.intrinsic("decl_reg", [], 1, 32, num_components=lanes, bit_size=_bits(dt))

    def load_reg(self, reg: Any, dt: DType, lanes: int) -> Any:
        return self.intrinsic("load_reg", [reg], lanes, _bits(dt))

    def store_reg(self, reg: Any, value: Any) -> None:
        self.intrinsic("store_reg", [value, reg], write_mask=(1 << value.contents.num_components) - 1)

    def if_(self, cond: Any, then: Callable[[], None], otherwise: Callable[[], None] | None = None) -> None:
        nif = self.m.nir_push_if(self.bp, cond)
        then()
        if otherwise is not None:
            self.m.nir_push_else(self.bp, nif)
            otherwise()
        self.m.nir_pop_if(self.bp, nif)

    def break_(self) -> None:
        self.m.nir_builder_instr_insert(self.bp, self.m.nir_jump_instr_create(self.shader, NIR_JUMP_BREAK))

    def set_info(self, offset: int, ctype: Any, value: Any) -> None:
        ctype.from_address(self.shader + SHADER_INFO + offset).value = value

    # ---------------------------------------------------------------- the kernel

    def kernel(self, uops: list[UOp], renderer: NIRRenderer) -> None:
        vals: dict[UOp, Any] = {}
        regs: dict[UOp, tuple[Any, DType, int]] = {}  # DEFINE_ACC -> its register
        loops: list[tuple[UOp, Any, Any]] = []  # (RANGE, counter register, loop)
        ifs: list[Any] = []
        n_bufs = sum(u.op is Ops.DEFINE_GLOBAL for u in uops)
        n_vars, shared = 0, 0
        for u in uops:
            if u.op is Ops.SPECIAL and u.arg[0].startswith("lidx"):
                self.set_info(INFO_WORKGROUP_SIZE + 2 * int(u.arg[0][-1]), ctypes.c_uint16, u.arg[1])

        def val(s: UOp) -> Any:
            if s.op in (Ops.DEFINE_ACC, Ops.ASSIGN):
                acc = s if s.op is Ops.DEFINE_ACC else s.src[0]
                return self.load_reg(*regs[acc])
            return vals[s]

        for u in uops:
            op = u.op
            if op is Ops.DEFINE_GLOBAL:
                vals[u] = renderer.param(self, 8 * u.arg, 64)
            elif op is Ops.DEFINE_VAR:
                vals[u] = self.cast(renderer.param(self, 8 * n_bufs + 4 * n_vars, 32), dtypes.int32, u.dtype)
                n_vars += 1
            elif op is Ops.DEFINE_LOCAL:
                assert isinstance(u.dtype, PtrDType) and u.dtype.base is not None
                vals[u] = self.const(shared, dtypes.uint32)
                shared += u.arg[1] * u.dtype.count * u.dtype.base.scalar.itemsize
                shared = (shared + 15) // 16 * 16
                self.set_info(INFO_SHARED_SIZE, ctypes.c_uint32, shared)
            elif op is Ops.SPECIAL:
                vals[u] = self.special(u)
            elif op is Ops.CONST:
                vals[u] = self.const(u.arg, u.dtype.scalar, u.dtype.count)
            elif op is Ops.RANGE:
                counter = self.reg(u.dtype, 1)
                self.store_reg(counter, self.const(0, u.dtype))
                loop = self.m.nir_push_loop(self.bp)
                vals[u] = self.load_reg(counter, u.dtype, 1)
                self.if_(self.alu(_ALU[_kind(u.dtype)][Ops.CMPLT], vals[u], val(u.end)), lambda: None, self.break_)
                loops.append((u, counter, loop))
            elif op is Ops.ENDRANGE:
                rng, counter, loop = loops.pop()
                self.store_reg(counter, self.alu("iadd", vals[rng], self.const(1, rng.dtype)))
                self.m.nir_pop_loop(self.bp, loop)
            elif op is Ops.IF:
                ifs.append(self.m.nir_push_if(self.bp, val(u.src[0])))
            elif op is Ops.ENDIF:
                self.m.nir_pop_if(self.bp, ifs.pop())
            elif op is Ops.INDEX:
                vals[u] = self.address(u, val)
            elif op is Ops.LOAD:
                vals[u] = self.load(u, val)
            elif op is Ops.STORE:
                self.store(u, val)
            elif op is Ops.DEFINE_ACC:
                regs[u] = (self.reg(u.dtype.scalar, u.dtype.count), u.dtype.scalar, u.dtype.count)
                self.store_reg(regs[u][0], val(u.src[0]))
            elif op is Ops.ASSIGN:
                self.store_reg(regs[u.src[0]][0], val(u.value))
            elif op is Ops.BARRIER:
                self.intrinsic(
                    "barrier",
                    [],
                    execution_scope=SCOPE_WORKGROUP,
                    memory_scope=SCOPE_WORKGROUP,
                    memory_semantics=NIR_MEMORY_ACQ_REL,
                    memory_modes=NIR_VAR_MEM_SHARED,
                )
            elif op is Ops.VECTORIZE:
                vals[u] = self.lanes([(val(s), 0) for s in u.src])
            elif op is Ops.GEP:
                lanes = u.arg if isinstance(u.arg, tuple) else (u.arg,)
                vals[u] = self.lanes([(val(u.src[0]), i) for i in lanes])
            elif op is Ops.CAST:
                vals[u] = self.cast(val(u.source), u.source.dtype.scalar, u.dtype.scalar)
            elif op is Ops.BITCAST:
                if u.dtype.itemsize * u.dtype.count != u.source.dtype.itemsize * u.source.dtype.count:
                    raise NotImplementedError(f"NIR renderer: BITCAST {u.source.dtype!r} -> {u.dtype!r} changes size")
                vals[u] = val(u.source)  # (NIR's values are bits: the ops that read them say how)
            elif op in GroupOp.ALU:
                vals[u] = self.alu_op(u, [val(s) for s in u.src])
            else:
                raise NotImplementedError(f"the NIR renderer cannot render {op.name}")

    def special(self, u: UOp) -> Any:
        name: str = u.arg[0]
        intrinsic = "load_local_invocation_id" if name.startswith("lidx") else "load_workgroup_id"
        ids = self.intrinsic(intrinsic, [], 3, 32)
        return self.cast(self.lanes([(ids, int(name[-1]))]), dtypes.uint32, u.dtype)

    # ---------------------------------------------------------------- memory

    def address(self, u: UOp, val: Callable[[UOp], Any]) -> Any:
        """A global buffer's byte address (64 bits) or a local buffer's byte offset (32 bits) of the INDEX."""
        ptr = u.pointer
        assert isinstance(ptr.dtype, PtrDType) and ptr.dtype.base is not None
        size = ptr.dtype.base.itemsize
        if ptr.op is Ops.DEFINE_LOCAL:
            off = self.cast(val(u.offset), u.offset.dtype, dtypes.uint32)
            return self.alu("iadd", val(ptr), self.alu("imul", off, self.const(size, dtypes.uint32)))
        off = self.cast(val(u.offset), u.offset.dtype, dtypes.int64)
        return self.alu("iadd", val(ptr), self.alu("imul", off, self.const(size, dtypes.int64)))

    def _memory(self, index: UOp) -> tuple[str, DType, int]:
        ptr = index.pointer
        assert isinstance(ptr.dtype, PtrDType) and ptr.dtype.base is not None
        space = "shared" if ptr.op is Ops.DEFINE_LOCAL else "global"
        return space, ptr.dtype.base, ptr.dtype.base.itemsize

    def load(self, u: UOp, val: Callable[[UOp], Any]) -> Any:
        index = u.address
        space, _, _ = self._memory(index)
        dt, lanes = u.dtype.scalar, u.dtype.count
        mem_bits = 8 if dt == dtypes.bool else _bits(dt)
        extra = {"access": 0} if space == "global" else {"base": 0}  # (a kernel may write what it reads)

        def read() -> Any:
            raw = self.intrinsic(
                f"load_{space}", [vals_addr], lanes, mem_bits, align_mul=mem_bits // 8, align_offset=0, **extra
            )
            return self.alu("ine", raw, self.const(0, dtypes.uint8, lanes)) if dt == dtypes.bool else raw

        vals_addr = val(index)
        if index.gate is None:
            return read()
        out = self.reg(dt, lanes)
        alt = u.alternative
        self.if_(
            val(index.gate),
            lambda: self.store_reg(out, read()),
            lambda: self.store_reg(out, val(alt) if alt is not None else self.undef(dt, lanes)),
        )
        return self.load_reg(out, dt, lanes)

    def store(self, u: UOp, val: Callable[[UOp], Any]) -> None:
        index = u.address
        space, _, _ = self._memory(index)
        value = val(u.value)
        dt, lanes = u.value.dtype.scalar, u.value.dtype.count
        if dt == dtypes.bool:
            value = self.alu("b2i8", value)
        size = 1 if dt == dtypes.bool else dt.itemsize
        extra = {} if space == "global" else {"base": 0}
        addr = val(index)

        def write() -> None:
            self.intrinsic(
                f"store_{space}",
                [value, addr],
                write_mask=(1 << lanes) - 1,
                align_mul=size,
                align_offset=0,
                **extra,
            )

        if index.gate is None:
            write()
        else:
            self.if_(val(index.gate), write)

    def undef(self, dt: DType, lanes: int) -> Any:
        instr = self.m.nir_undef_instr_create(self.shader, lanes, _bits(dt)).contents
        self.m.nir_builder_instr_insert(self.bp, ctypes.addressof(instr))
        return ctypes.pointer(instr.def_)

    # ---------------------------------------------------------------- numbers

    def cast(self, x: Any, frm: DType, to: DType) -> Any:
        """x converted from dtype frm to dtype to (per lane), as tiny.ir.alu converts."""
        f, t = _kind(frm), _kind(to)
        if frm == to or (f in "iu" and t in "iu" and frm.itemsize == to.itemsize):
            return x
        if t == "b":
            zero = self.const(0, frm, x.contents.num_components)
            return self.alu("fneu" if f == "f" else "ine", x, zero)
        bits = _bits(to)
        if f == "b":
            return self.alu(f"b2{'f' if t == 'f' else 'i'}{bits}", x)
        if f in "iu" and t in "iu":
            return self.alu(f"{f}2{f}{bits}", x)
        return self.alu(f"{f}2{t}{bits}", x)

    def alu_op(self, u: UOp, srcs: list[Any]) -> Any:
        op, dt = u.op, u.src[0].dtype.scalar
        k = _kind(dt)
        if op in _FLOAT_MATH:
            return self.alu(_FLOAT_MATH[op], srcs[0])
        if op is Ops.RECIP:
            return self.alu("fdiv", self.const(1.0, dt, srcs[0].contents.num_components), srcs[0])
        if op is Ops.WHERE:
            return self.alu("bcsel", *srcs)
        if op in _BITWISE:
            return self.alu(_BITWISE[op], *srcs)
        if op is Ops.MAX and k == "f":  # NaN wins (fmax takes the number)
            a, b = srcs
            return self.alu(
                "bcsel", self.alu("fneu", a, a), a, self.alu("bcsel", self.alu("fneu", b, b), b, self.alu("fmax", a, b))
            )
        if op is Ops.CMPLT and k == "b":  # a < b: !a & b
            return self.alu("iand", self.alu("inot", srcs[0]), srcs[1])
        if op in (Ops.IDIV, Ops.MOD) and k in "iu":
            return self.division(op, k, dt, *srcs)
        if op in (Ops.SHL, Ops.SHR) and k in "iu":
            return self.shift(op, k, dt, *srcs)
        if (name := _ALU[k].get(op)) is not None:
            return self.alu(name, *srcs)
        raise NotImplementedError(f"the NIR renderer cannot render {op.name} on {dt!r}")

    def division(self, op: Ops, k: str, dt: DType, a: Any, b: Any) -> Any:
        """Truncating division or remainder; 0 for a zero divisor."""
        lanes = a.contents.num_components
        zero, one = self.const(0, dt, lanes), self.const(1, dt, lanes)
        by_zero = self.alu("ieq", b, zero)
        safe = self.alu("bcsel", by_zero, one, b)
        name = {("i", Ops.IDIV): "idiv", ("u", Ops.IDIV): "udiv", ("i", Ops.MOD): "irem", ("u", Ops.MOD): "umod"}
        return self.alu("bcsel", by_zero, zero, self.alu(name[(k, op)], a, safe))

    def shift(self, op: Ops, k: str, dt: DType, a: Any, b: Any) -> Any:
        """a << b or a >> b (arithmetic for signed a); a shift by the width or more gives 0 (or the sign)."""
        lanes, width = a.contents.num_components, _bits(dt)
        amount = self.cast(b, dt, dtypes.uint32)
        too_far = self.alu("uge", amount, self.const(width, dtypes.uint32, lanes))
        name = "ishl" if op is Ops.SHL else ("ishr" if k == "i" else "ushr")
        shifted = self.alu(name, a, amount)
        if name == "ishr":
            return self.alu("bcsel", too_far, self.alu("ishr", a, self.const(width - 1, dtypes.uint32, lanes)), shifted)
        return self.alu("bcsel", too_far, self.const(0, dt, lanes), shifted)
