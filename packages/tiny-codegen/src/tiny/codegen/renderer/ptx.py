"""The PTX renderer: a linearized kernel as NVIDIA's PTX assembly, which the CUDA driver assembles (`CUDA:PTX`).

Every value gets registers of its size (.pred, .b16, .b32, .b64: a bit-size register serves any instruction type
of that size); a vector is a list of scalar registers, one per lane, so vector math is lane by lane and only loads
and stores are vector instructions (ld.global.v4.f32 where the address is aligned, lane by lane where not: both
are emitted, under complementary predicates). Registers are mutable, so a loop is a counter and two branches and an
accumulator is one register that ASSIGN overwrites; an IF branches around its body; a gated load or store is an
instruction under a predicate.

Numbers follow tiny.ir.alu as the C and LLVM IR renderers do: integer division and remainder truncate toward zero
and give 0 for a zero divisor; shifts by the width or more give 0 (or the sign); MAX lets NaN win; float -> integer
casts give the minimum where the value does not fit. 8- and 16-bit integers live in 32-bit registers, sign- or
zero-extended, brought back to their width after each op that can leave it. float16 uses PTX's f16 instructions
for add, mul, neg, compares and selects and float32 for the rest; bfloat16 computes in float32, rounded to bfloat16
after each op (16 bits in memory), as the other renderers emulate it. sqrt, division and reciprocal are the
correctly rounded .rn forms; exp2 and log2 are ex2.approx/lg2.approx (about 2 ulp in float32), sin is sin.approx
after reducing the argument to [-pi, pi] in float64; float64 exp2, log2 and sin are written out (ptx_math.py).

The renderer target is the device's: 'arch=sm_90;local_max=1024,1024,64;local_total_max=1024;shared_max=49152'.
"""

from __future__ import annotations

import math
import re
import struct
from collections.abc import Callable

from tiny.codegen.renderer.cstyle import target_fields
from tiny.codegen.renderer.ldmatrix import LANES, LDMATRIX, MatrixLoad, matrix_loads
from tiny.codegen.renderer.ptx_math import exp2_f64, fmod_f64, log2_f64, sin_f64
from tiny.codegen.renderer.shared import DYNAMIC_NAME, dynamic_shared, size_line
from tiny.codegen.renderer.walker import ONE_METHOD_PER_OP, Walk, WalkingRenderer, use_counts
from tiny.ir.device import RendererCaps, fold_grid
from tiny.ir.dtypes import DType, PtrDType, dtypes, truncate
from tiny.ir.symbolic import known_multiple
from tiny.ir.tensorcore import tensor_core, tensor_cores_for
from tiny.ir.uop import GroupOp, Ops, UOp

# the lowest PTX ISA that knows each architecture (and every instruction used here)
_PTX_VERSION = {70: "6.0", 72: "6.1", 75: "6.3", 80: "7.0", 86: "7.1", 87: "7.4", 89: "7.8", 90: "7.8"}
_PTX_VERSION |= {100: "8.6", 101: "8.6", 103: "8.8", 110: "9.0", 120: "8.7", 121: "8.8"}

_ARITH = {  # the instruction type a register value of each dtype computes with
    "int8": "s32",
    "int16": "s32",
    "int32": "s32",
    "int64": "s64",
    "uint8": "u32",
    "uint16": "u32",
    "uint32": "u32",
    "uint64": "u64",
    "float16": "f16",
    "bfloat16": "f32",  # emulated: float32 registers, rounded after each op
    "float32": "f32",
    "float64": "f64",
}
_MEMORY = {  # the type of loads and stores of each dtype
    "bool": "u8",
    "int8": "s8",
    "int16": "s16",
    "int32": "s32",
    "int64": "s64",
    "uint8": "u8",
    "uint16": "u16",
    "uint32": "u32",
    "uint64": "u64",
    "float16": "b16",
    "bfloat16": "u16",
    "float32": "f32",
    "float64": "f64",
}
_EXACT = frozenset({Ops.WHERE, Ops.MAX, Ops.NEG, Ops.TRUNC, Ops.BITCAST})  # no bfloat16 rounding after these
# The ALU ops that are one instruction, as (float, integer, bool) forms: {t} the instruction type (_ARITH), {b} the
# register's bits, {rn} .rn on float32/64 sums and products (ptxas never fuses those into an fma, so a value computed
# again in another kernel rounds the same: x * x - y is exactly 0 where y holds x * x). None: written out (_arith).
_INSTRUCTIONS: dict[Ops, tuple[str | None, str | None, str | None]] = {
    Ops.ADD: ("add{rn}.{t}", "add.{t}", "or.pred"),
    Ops.MUL: ("mul{rn}.{t}", "mul.lo.{t}", "and.pred"),
    Ops.NEG: ("neg.{t}", "neg.s{b}", "not.pred"),
    Ops.FDIV: ("div.rn.{t}", None, None),
    Ops.RECIP: ("rcp.rn.{t}", None, None),
    Ops.SQRT: ("sqrt.rn.{t}", None, None),
    Ops.TRUNC: ("cvt.rzi.{t}.{t}", None, None),
    Ops.MAX: (None, "max.{t}", "or.pred"),
    Ops.AND: (None, "and.b{b}", "and.pred"),
    Ops.OR: (None, "or.b{b}", "or.pred"),
    Ops.XOR: (None, "xor.b{b}", "xor.pred"),
}
_WRAPS = frozenset({Ops.ADD, Ops.MUL, Ops.NEG})  # integer instructions whose result can leave an 8- or 16-bit range
# float16 math that PTX has no f16 instruction for: computed in float32
_F16_VIA_F32 = frozenset({Ops.FDIV, Ops.RECIP, Ops.SQRT, Ops.EXP2, Ops.LOG2, Ops.SIN, Ops.MOD})
_NARROW = {dtypes.int8: "s8", dtypes.int16: "s16", dtypes.uint8: "u8", dtypes.uint16: "u16"}
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")

Reg = str | list[str]  # one register, or one per lane of a vector


def reg_class(dt: DType) -> str:
    """The register kind of a scalar dtype: .pred, .b16, .b32 or .b64."""
    if dt.scalar == dtypes.bool:
        return "pred"
    if dt.scalar == dtypes.float16:
        return "b16"
    return "b64" if dt.scalar.itemsize == 8 else "b32"


def _bits(dt: DType) -> int:
    return {"pred": 1, "b16": 16, "b32": 32, "b64": 64}[reg_class(dt)]


class _Kernel(Walk):
    """One kernel being written: the walk (each value's registers in `names`), registers numbered per kind from 1,
    labels by one count; the loops and ifs open, workgroup memory, and the grid it is launched on."""

    _PREFIX = {"pred": "%p", "b16": "%h", "b32": "%r", "b64": "%rd"}

    def __init__(self, uops: list[UOp], max_grid: int) -> None:
        super().__init__(uops, first=1)
        self.shared: list[str] = []  # .shared declarations
        # local buffers over 48 KiB in all: pieces of the dynamic shared array (tiny.codegen.renderer.shared)
        self.dynamic = dynamic_shared(uops, lambda u: u.arg[1] * u.dtype.base.count * _memory_bytes(u.dtype.base))
        # (buffer, bytes) -> predicates: its start is aligned to them, or not (COPY_ASYNC's, found at the top level)
        self.aligned_buffers: dict[tuple[UOp, int], tuple[str, str]] = {}
        self.loops: dict[UOp, tuple[str, str]] = {}  # each RANGE open: its head and exit labels
        self.ifs: dict[UOp, str] = {}  # each IF open: its end label
        self.block = [1, 1, 1]  # the workgroup's size, as the hardware indices say
        self.grid = [1, 1, 1]
        for u in uops:
            if u.op is Ops.SPECIAL and u.arg[0].startswith("gidx"):
                self.grid[int(u.arg[0][4:])] = u.arg[1]
        grid = (self.grid[0], self.grid[1], self.grid[2])
        self.fold = fold_grid(grid, max_grid) if max(grid) > max_grid else None
        self.flat: str | None = None  # the folded grid's block number, once read
        # tensor-core fragments read by ldmatrix (tiny.codegen.renderer.ldmatrix), whose only readers are WMMAs (which
        # take its registers as they come: two values each, the lower in the lower half), and the loads they stand
        # for that no other op reads (left out); the module's tables of each lane's row shifts
        users, wmma = use_counts(uops), [u for u in uops if u.op is Ops.WMMA]
        fed = {f: sum(f in w.src[:2] for w in wmma) for f in {s for w in wmma for s in w.src[:2]}}
        found = matrix_loads(uops) if LDMATRIX else {}
        self.matrices: dict[UOp, MatrixLoad] = {f: m for f, m in found.items() if users.get(f) == fed.get(f)}
        self.read_by_matrices = {x for f in self.matrices for x in f.src if users[x] == 1}
        shifts = dict.fromkeys(m.shift for m in self.matrices.values())
        self.tables = {shift: f"tiny_rows{i}" for i, shift in enumerate(shifts)}
        self.lane = next((u for u in uops if u.op is Ops.SPECIAL and u.arg == ("lidx0", LANES)), None)
        self.lane_shifts: dict[str, str] = {}  # table -> this lane's shift in elements (read once, where the lane is)

    def reg(self, kind: str) -> str:
        return self.fresh(self._PREFIX[kind])

    def new(self, dt: DType) -> str:
        return self.reg(reg_class(dt))

    def label(self, prefix: str) -> str:
        return self.fresh(f"$L_{prefix}", "$L")

    def emit(self, text: str) -> None:
        self.lines.append("\t" + text + ";")

    def put(self, label: str) -> None:
        self.lines.append(label + ":")

    def declarations(self) -> list[str]:
        return [f"\t.reg .{k} {p}<{self.given(p) + 1}>;" for k, p in self._PREFIX.items() if self.given(p)]


def _whole_runs(offset: UOp, elements: int) -> bool:
    """Whether an offset is a multiple of elements for every value of what it reads (through a WHERE: both sides)."""
    if offset.op is Ops.WHERE:
        _, a, b = offset.src
        return _whole_runs(a, elements) and _whole_runs(b, elements)
    return known_multiple(offset) % elements == 0


class PTXRenderer(WalkingRenderer):
    """PTX for the CUDA driver to assemble; `target` is the device's 'arch=sm_XY;...' (sm_90 when empty)."""

    caps = RendererCaps(language="PTX")
    default_limits = {
        "vector_width": "4",
        "local_max": "1024,1024,64",
        "local_total_max": "1024",
        "shared_max": "49152",
        "arch": "sm_90",
        "max_grid": "65535",  # blocks in each grid dimension; a bigger grid is launched folded (fold_grid)
    }

    def __init__(self, target: str = "") -> None:
        super().__init__(target)
        fields = self.default_limits | target_fields(target)
        arch = fields["arch"]
        cc = int(arch[3:].rstrip("af")) if re.fullmatch(r"sm_\d+[af]?", arch) else -1
        if cc not in _PTX_VERSION:
            raise ValueError(f"the PTX renderer knows the architectures {sorted(_PTX_VERSION)} (sm_XY), got {arch!r}")
        local_max = tuple(int(x) for x in fields["local_max"].split(","))
        if len(local_max) != 3:
            raise ValueError(f"local_max in the renderer target has 3 sizes, got {fields['local_max']!r}")
        self.arch, self.cc = arch, cc
        self.max_grid = int(fields["max_grid"])
        self.caps = RendererCaps(
            language="PTX",
            has_local=True,
            has_shared=True,
            global_max=(2**31 - 1,) * 3,
            local_max=local_max,
            local_total_max=int(fields["local_total_max"]),
            shared_max=int(fields["shared_max"]),
            vector_width=int(fields["vector_width"]),
            tensor_cores=tensor_cores_for(arch, fields.get("tf32") == "1"),  # mma.sync on sm_80 and newer
            async_copy=cc >= 80,  # cp.async
            half_pairs=True,  # st.global.v2.b16
        )

    # ---------------------------------------------------------------- the kernel

    rules = ONE_METHOD_PER_OP | {Ops.COPY_ASYNC: "write_copy_async"}

    def render(self, name: str, uops: list[UOp]) -> str:
        if not _NAME.fullmatch(name):
            raise ValueError(f"{name!r} cannot name a PTX kernel; expected letters, digits and '_'")
        k = self.walk(_Kernel(uops, self.max_grid))
        head = [
            f"//\n// {name}: generated by tiny.codegen.ptx\n//",  # (as before the move to renderer/)
            *([size_line(k.dynamic[1]).rstrip()] if k.dynamic is not None else []),
            f".version {_PTX_VERSION[self.cc]}",
            f".target {self.arch}",
            ".address_size 64",
            "",
            *([f".extern .shared .align 16 .b8 {DYNAMIC_NAME}[];"] if k.dynamic is not None else []),
            *(f".const .align 4 .b32 {t}[{LANES}] = {{{', '.join(map(str, d))}}};" for d, t in k.tables.items()),
            f".visible .entry {name}(",
            ",\n".join(k.params()),
            f")\n.maxntid {k.block[0]}, {k.block[1]}, {k.block[2]}\n{{",
        ]
        body = k.declarations() + k.shared + k.lines + ["\tret;", "}"]
        return "\n".join(head + body) + "\n"

    def write_buffer(self, k: _Kernel, u: UOp) -> str:
        param = f"data{u.arg}"
        k.buffers.append((u.arg, f"\t.param .u64 {param}"))
        r = k.reg("b64")
        k.emit(f"ld.param.u64 {r}, [{param}]")
        k.emit(f"cvta.to.global.u64 {r}, {r}")
        return r

    def write_variable(self, k: _Kernel, u: UOp) -> str:
        var = _name(u.arg[0])
        k.variables.append(f"\t.param .u32 var_{var}")
        r = k.reg("b32")
        k.emit(f"ld.param.u32 {r}, [var_{var}]")
        return self._int_from_s32(k, r, u.dtype)

    def write_local(self, k: _Kernel, u: UOp) -> str:
        assert isinstance(u.dtype, PtrDType) and u.dtype.base is not None
        r = k.reg("b64")
        if k.dynamic is not None:  # (a piece of the dynamic array)
            k.emit(f"mov.u64 {r}, {DYNAMIC_NAME}")
            k.emit(f"add.u64 {r}, {r}, {k.dynamic[0][u]}")
            return r
        size = u.arg[1] * u.dtype.base.count * _memory_bytes(u.dtype.base)
        k.shared.append(f"\t.shared .align 16 .b8 {_name(u.arg[0])}[{max(size, 16)}];")
        k.emit(f"mov.u64 {r}, {_name(u.arg[0])}")
        return r

    def write_special(self, k: _Kernel, u: UOp) -> str:
        sname, size = u.arg
        dim = int(sname[4:])
        source = f"%tid.{'xyz'[dim]}" if sname.startswith("lidx") else f"%ctaid.{'xyz'[dim]}"
        if sname.startswith("lidx"):
            k.block[dim] = size
        r = k.reg("b32")
        if k.fold is not None and sname.startswith("gidx"):
            if k.flat is None:
                k.flat = self._folded_block(k, k.fold, math.prod(k.grid))
            k.emit(f"div.u32 {r}, {k.flat}, {math.prod(k.grid[:dim])}")
            k.emit(f"rem.u32 {r}, {r}, {size}")
        else:
            k.emit(f"mov.u32 {r}, {source}")
        if u is k.lane:  # (ldmatrix's row shifts for this lane, in elements)
            for table in k.tables.values():
                at, shift = k.reg("b64"), k.reg("b32")
                k.emit(f"mov.u64 {at}, {table}")
                k.emit(f"mad.wide.u32 {at}, {r}, 4, {at}")
                k.emit(f"ld.const.b32 {shift}, [{at}]")
                k.lane_shifts[table] = shift
        return self._int_from_s32(k, r, u.dtype)

    def write_const(self, k: _Kernel, u: UOp) -> Reg:
        return self._const(k, u.arg, u.dtype)

    def write_range(self, k: _Kernel, u: UOp) -> str:
        counter = k.new(u.dtype)
        head, done = k.label("loop"), k.label("done")
        t = _ARITH[u.dtype.scalar.name]
        k.emit(f"mov.{t} {counter}, 0")
        k.put(head)
        stop = k.reg("pred")
        k.emit(f"setp.ge.{t} {stop}, {counter}, {k.names[u.end]}")
        k.emit(f"@{stop} bra {done}")
        k.loops[u] = (head, done)
        return counter

    def write_endrange(self, k: _Kernel, u: UOp) -> None:
        rng = u.opened
        (head, done), counter = k.loops.pop(rng), k.names[rng]
        k.emit(f"add.{_ARITH[rng.dtype.scalar.name]} {counter}, {counter}, 1")
        k.emit(f"bra {head}")
        k.put(done)

    def write_if(self, k: _Kernel, u: UOp) -> None:
        k.ifs[u] = end = k.label("endif")
        k.emit(f"@!{k.names[u.condition]} bra {end}")

    def write_endif(self, k: _Kernel, u: UOp) -> None:
        k.put(k.ifs.pop(u.opened))

    def write_acc(self, k: _Kernel, u: UOp) -> Reg:
        init = k.names[u.src[0]]
        acc = _lanes(init, u.dtype, lambda x, dt=u.dtype.scalar: k.new(dt))
        for a, x in zip(_as_list(acc), _as_list(init)):
            k.emit(f"mov.{reg_class(u.dtype)} {a}, {x}")
        return acc

    def write_assign(self, k: _Kernel, u: UOp) -> Reg:
        acc, value = k.names[u.src[0]], k.names[u.value]
        for a, x in zip(_as_list(acc), _as_list(value)):
            k.emit(f"mov.{reg_class(u.dtype)} {a}, {x}")
        return acc

    def write_barrier(self, k: _Kernel, u: UOp) -> None:
        n = u.copies_in_flight  # this thread's copies have landed (all but its n latest groups), then every thread's
        if n == 0:
            k.emit("cp.async.wait_all")
        elif n is not None:
            k.emit("cp.async.commit_group")
            k.emit(f"cp.async.wait_group {n}")
        k.emit("bar.sync 0")

    def write_copy_async(self, k: _Kernel, u: UOp) -> None:
        """cp.async of the op's bytes where the source is aligned to them (buffers from cuMemAlloc, offsets a whole
        number of runs: every copy of a staged tile), else value by value through a register; zeros where the gate
        is false (cp.async's source size 0). The value-by-value path is branched around, not predicated off: each
        instruction of it would take an issue slot every iteration of a K loop, copied or not."""
        dst, src, n = k.names[u.address], k.names[u.copied_from], u.dtype.nbytes
        gate = k.names[u.copied_from.gate] if u.copied_from.gate is not None else None
        base = u.copied_from.pointer
        if _whole_runs(u.copied_from.offset, n // u.dtype.scalar.itemsize):  # aligned where the buffer's start is
            if (found := k.aligned_buffers.get((base, n))) is None:
                found = self._alignment(k, k.names[base], n, None)
                if k.depth == 0:  # (found once at the top level: it holds for the whole kernel)
                    k.aligned_buffers[(base, n)] = found
            aligned, unaligned = found
        else:
            aligned, unaligned = self._alignment(k, src, n, None)
        size = str(n)  # the bytes read of the source (0: none, zeros written)
        if gate is not None:
            size = k.reg("b32")
            k.emit(f"selp.u32 {size}, {n}, 0, {gate}")
        kind = "cg" if n == 16 else "ca"
        by_value, done = k.label("by_value"), k.label("copied")
        k.emit(f"@{unaligned} bra {by_value}")
        k.emit(f"cp.async.{kind}.shared.global [{dst}], [{src}], {n}, {size}")
        k.emit(f"bra {done}")
        k.put(by_value)
        item = u.dtype.scalar.itemsize
        value, mt = k.reg("b32"), f"b{8 * item}"
        for i in range(0, n, item):
            k.emit(f"mov.b32 {value}, 0")
            k.emit(f"{f'@{gate} ' if gate else ''}ld.global.{mt} {value}, [{src}+{i}]")
            k.emit(f"st.shared.{mt} [{dst}+{i}], {value}")
        k.put(done)

    def write_vectorize(self, k: _Kernel, u: UOp) -> Reg:
        if (m := k.matrices.get(u)) is not None:
            return self._ldmatrix(k, m)
        return [_scalar(k.names[s]) for s in u.src]

    def _ldmatrix(self, k: _Kernel, m: MatrixLoad) -> list[str]:
        """A fragment by one ldmatrix: each lane's address is the fragment's first element's plus its row's shift (a
        table of 32 in constant memory, read where the lane is); the registers hold two 16-bit values each, as
        mma.sync takes them."""
        at, regs = k.reg("b64"), [k.reg("b32") for _ in range(m.matrices)]
        k.emit(f"mad.wide.s32 {at}, {k.lane_shifts[k.tables[m.shift]]}, 2, {_scalar(k.names[m.first])}")
        kind = f"x{m.matrices}{'.trans' if m.trans else ''}"
        k.emit(f"ldmatrix.sync.aligned.m8n8.{kind}.shared.b16 {{{', '.join(regs)}}}, [{at}]")
        return regs

    def write_gep(self, k: _Kernel, u: UOp) -> Reg:
        lanes = _as_list(k.names[u.src[0]])
        picks = u.arg if isinstance(u.arg, tuple) else (u.arg,)
        return lanes[picks[0]] if u.dtype.count == 1 else [lanes[i] for i in picks]

    def write_cast(self, k: _Kernel, u: UOp) -> Reg:
        frm, to = u.source.dtype.scalar, u.dtype.scalar
        return self._per_lane(k, u, lambda xs: self._cast(k, frm, to, xs[0]))

    def write_bitcast(self, k: _Kernel, u: UOp) -> Reg:
        return self._bitcast(k, u, k.names[u.source])

    def write_alu(self, k: _Kernel, u: UOp) -> Reg:
        return self._per_lane(k, u, lambda xs: self._alu(k, u, xs))

    def write_wmma(self, k: _Kernel, u: UOp) -> Reg:
        """mma.sync.aligned.m16n8k16: the A and B fragments packed two to a b32 register (the lower element in the
        lower half; float16 lanes are f16 registers, bfloat16 lanes float32 ones whose upper half is the value)."""
        tc = tensor_core(u.arg)
        if tc not in self.caps.tensor_cores:
            raise NotImplementedError(f"{self.arch} has no tensor core {tc.name}")
        if tc.mantissa is not None:  # TF32's m16n8k8: each float rounded to TF32 in a b32 register of its own
            a, b = ([self._tf32(k, x) for x in _as_list(k.names[f])] for f in (u.src[0], u.src[1]))
            c = _as_list(k.names[u.src[2]])
            d = [k.reg("b32") for _ in range(tc.c.elements)]
            operands = ", ".join("{" + ", ".join(x) + "}" for x in (d, a, b, c))
            k.emit(f"mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {operands}")
            return d
        tag = "f16" if tc.dtype_in == dtypes.float16 else "bf16"

        def packed(frag: UOp) -> list[str]:
            if frag in k.matrices:  # (ldmatrix's registers: packed already)
                return _as_list(k.names[frag])
            lanes, out = _as_list(k.names[frag]), []
            for lo, hi in zip(lanes[::2], lanes[1::2]):
                r = k.reg("b32")
                k.emit(f"mov.b32 {r}, {{{lo}, {hi}}}" if tag == "f16" else f"prmt.b32 {r}, {lo}, {hi}, 0x7632")
                out.append(r)
            return out

        a, b = packed(u.src[0]), packed(u.src[1])
        c = _as_list(k.names[u.src[2]])
        d = [k.reg("b32") for _ in range(tc.c.elements)]
        operands = ", ".join("{" + ", ".join(x) + "}" for x in (d, a, b, c))
        k.emit(f"mma.sync.aligned.m16n8k16.row.col.f32.{tag}.{tag}.f32 {operands}")
        return d

    def _tf32(self, k: _Kernel, x: str) -> str:
        r = k.reg("b32")
        k.emit(f"cvt.rna.tf32.f32 {r}, {x}")
        return r

    def _folded_block(self, k: _Kernel, fold: tuple[int, int, int], total: int) -> str:
        """A grid launched folded (tiny.ir.device.fold_grid): the block's number in the whole grid; the blocks past
        its end return at once."""
        flat, part = k.reg("b32"), k.reg("b32")
        past = k.reg("pred")
        k.emit(f"mov.u32 {flat}, %ctaid.x")
        k.emit(f"mov.u32 {part}, %ctaid.y")
        k.emit(f"mad.lo.u32 {flat}, {part}, {fold[0]}, {flat}")
        k.emit(f"mov.u32 {part}, %ctaid.z")
        k.emit(f"mad.lo.u32 {flat}, {part}, {fold[0] * fold[1]}, {flat}")
        k.emit(f"setp.ge.u32 {past}, {flat}, {total}")
        k.emit(f"@{past} ret")
        return flat

    def _per_lane(self, k: _Kernel, u: UOp, one: Callable[[list[str]], str]) -> Reg:
        """Apply a scalar emitter to each lane of u's sources (a vector op is its lanes' ops)."""
        if u.dtype.count == 1:
            return one([_scalar(k.names[s]) for s in u.src])
        srcs = [_as_list(k.names[s]) if s.dtype.count > 1 else [_scalar(k.names[s])] * u.dtype.count for s in u.src]
        return [one([lanes[i] for lanes in srcs]) for i in range(u.dtype.count)]

    # ---------------------------------------------------------------- constants and integer widths

    def _const(self, k: _Kernel, value: object, dt: DType) -> Reg:
        if not isinstance(value, (int, float, bool)):
            raise TypeError(f"a constant of {dt!r} must be a number, got {value!r}")
        lane = self._scalar_const(k, value, dt.scalar)
        return [lane] * dt.count if dt.count > 1 else lane

    def _scalar_const(self, k: _Kernel, value: int | float | bool, dt: DType) -> str:
        r = k.new(dt)
        v = truncate(dt, value)
        if dt == dtypes.bool:
            k.emit(f"setp.ne.u32 {r}, {int(bool(v))}, 0")
        else:
            k.emit(f"mov.{reg_class(dt)} {r}, {_immediate(v, dt)}")
        return r

    def _int_from_s32(self, k: _Kernel, r: str, dt: DType) -> str:
        """A 32-bit register holding a non-negative int as a register of dt (a 64-bit index widens)."""
        if reg_class(dt) == "b64":
            wide = k.reg("b64")
            k.emit(f"cvt.s64.s32 {wide}, {r}")
            return wide
        return r

    def _narrow(self, k: _Kernel, r: str, dt: DType) -> str:
        """An 8- or 16-bit integer in a 32-bit register, sign- or zero-extended again after an op."""
        if dt.scalar in _NARROW:
            t = _NARROW[dt.scalar]
            k.emit(f"cvt.{'s' if t[0] == 's' else 'u'}32.{t} {r}, {r}")
        return r

    # ---------------------------------------------------------------- memory

    def write_index(self, k: _Kernel, u: UOp) -> str:
        ptr, off = u.pointer, u.offset
        assert isinstance(ptr.dtype, PtrDType) and ptr.dtype.base is not None
        size = _memory_bytes(ptr.dtype.base) * ptr.dtype.base.count
        wide = k.reg("b64")
        if reg_class(off.dtype) == "b64":
            k.emit(f"mul.lo.s64 {wide}, {k.names[off]}, {size}")
        else:
            k.emit(f"mul.wide.{_ARITH[off.dtype.scalar.name]} {wide}, {k.names[off]}, {size}")
        k.emit(f"add.s64 {wide}, {k.names[ptr]}, {wide}")
        return wide

    def _space(self, u: UOp) -> str:
        ptr = u.address.pointer
        return "shared" if isinstance(ptr.dtype, PtrDType) and ptr.dtype.local else "global"

    def write_load(self, k: _Kernel, u: UOp) -> Reg | None:
        if u in k.read_by_matrices:  # (its fragment's ldmatrix reads it)
            return None
        addr = u.address
        gate = k.names[addr.gate] if addr.gate is not None else None
        on = f"@{gate} " if gate is not None else ""
        space, dt = self._space(u), u.dtype.scalar
        n = u.dtype.count
        raw = [k.reg("b32") if dt in (dtypes.bool, dtypes.bfloat16) else k.new(dt) for _ in range(n)]
        mt = _MEMORY[dt.name]
        if n == 1:
            k.emit(f"{on}ld.{space}.{mt} {raw[0]}, [{k.names[addr]}]")
        else:
            aligned, unaligned = self._alignment(k, _scalar(k.names[addr]), n * dt.itemsize, gate)
            k.emit(f"@{aligned} ld.{space}.v{n}.{mt} {{{', '.join(raw)}}}, [{k.names[addr]}]")
            for i, r in enumerate(raw):
                k.emit(f"@{unaligned} ld.{space}.{mt} {r}, [{k.names[addr]}+{i * dt.itemsize}]")
        out = []
        for r in raw:  # the loaded bits as a register value, where they were loaded
            if dt == dtypes.bool:
                p = k.reg("pred")
                k.emit(f"{on}setp.ne.u32 {p}, {r}, 0")
                r = p
            elif dt == dtypes.bfloat16:
                k.emit(f"{on}shl.b32 {r}, {r}, 16")
            out.append(r)
        if gate is not None and u.alternative is not None:
            for r, alt in zip(out, _as_list(k.names[u.alternative]) if n > 1 else [_scalar(k.names[u.alternative])]):
                k.emit(f"@!{gate} mov.{reg_class(dt)} {r}, {alt}")
        return out if n > 1 else out[0]

    def _alignment(self, k: _Kernel, addr: str, nbytes: int, gate: str | None) -> tuple[str, str]:
        """Predicates: the vector access is aligned (one vector instruction), or not (lane by lane); both false
        where the gate is."""
        low, aligned, unaligned = k.reg("b64"), k.reg("pred"), k.reg("pred")
        k.emit(f"and.b64 {low}, {addr}, {nbytes - 1}")
        k.emit(f"setp.eq.u64 {aligned}, {low}, 0")
        k.emit(f"not.pred {unaligned}, {aligned}")
        if gate is not None:
            k.emit(f"and.pred {aligned}, {aligned}, {gate}")
            k.emit(f"and.pred {unaligned}, {unaligned}, {gate}")
        return aligned, unaligned

    def write_store(self, k: _Kernel, u: UOp) -> None:
        addr, value = u.address, u.value
        gate = k.names[addr.gate] if addr.gate is not None else None
        dt, n = value.dtype.scalar, value.dtype.count
        space, mt = self._space(u), _MEMORY[dt.name]
        lanes = _as_list(k.names[value]) if n > 1 else [_scalar(k.names[value])]
        out = []
        for x in lanes:
            if dt == dtypes.bool:
                b = k.reg("b32")
                k.emit(f"selp.u32 {b}, 1, 0, {x}")
                x = b
            elif dt == dtypes.bfloat16:
                x = self._bf16_bits(k, x)
            out.append(x)
        if n == 1:
            k.emit(f"{f'@{gate} ' if gate else ''}st.{space}.{mt} [{k.names[addr]}], {out[0]}")
            return
        aligned, unaligned = self._alignment(k, _scalar(k.names[addr]), n * dt.itemsize, gate)
        k.emit(f"@{aligned} st.{space}.v{n}.{mt} [{k.names[addr]}], {{{', '.join(out)}}}")
        for i, x in enumerate(out):
            k.emit(f"@{unaligned} st.{space}.{mt} [{k.names[addr]}+{i * dt.itemsize}], {x}")

    # ---------------------------------------------------------------- bfloat16 and float16 helpers

    def _bf16_bits(self, k: _Kernel, x: str) -> str:
        """A float32 register rounded to bfloat16 for memory: its 16 bits in a b32, a NaN 0x7fc0 (as the CPU stores
        it; sm_80's cvt gives 0x7fff)."""
        r = self._bf16_rn(k, x)
        if self.cc >= 80:
            nan = k.reg("pred")
            k.emit(f"setp.nan.f32 {nan}, {x}, {x}")
            k.emit(f"selp.b32 {r}, 0x7fc0, {r}, {nan}")
        return r

    def _bf16_rn(self, k: _Kernel, x: str) -> str:
        """A float32 register rounded to bfloat16 (to nearest even): its 16 bits, in a b32. One cvt on sm_80 and
        newer; integer arithmetic before (a NaN 0x7fc0)."""
        r = k.reg("b32")
        if self.cc >= 80:
            h = k.reg("b16")
            k.emit(f"cvt.rn.bf16.f32 {h}, {x}")
            k.emit(f"cvt.u32.u16 {r}, {h}")
            return r
        mag, odd, nan = k.reg("b32"), k.reg("b32"), k.reg("pred")
        k.emit(f"and.b32 {mag}, {x}, 0x7fffffff")
        k.emit(f"setp.gt.u32 {nan}, {mag}, 0x7f800000")
        k.emit(f"bfe.u32 {odd}, {x}, 16, 1")
        k.emit(f"add.u32 {r}, {x}, {odd}")
        k.emit(f"add.u32 {r}, {r}, 0x7fff")
        k.emit(f"shr.u32 {r}, {r}, 16")
        k.emit(f"selp.b32 {r}, 0x7fc0, {r}, {nan}")
        return r

    def _bf16_round(self, k: _Kernel, x: str) -> str:
        """A float32 register rounded to bfloat16's precision, as a float32 register (a NaN stays one)."""
        r = self._bf16_rn(k, x)
        k.emit(f"shl.b32 {r}, {r}, 16")
        return r

    def _f32(self, k: _Kernel, x: str, dt: DType) -> str:
        """A float register of dt as a float32 register (float16 widens; the others already are)."""
        if dt.scalar != dtypes.float16:
            return x
        r = k.reg("b32")
        k.emit(f"cvt.f32.f16 {r}, {x}")
        return r

    def _to_half(self, k: _Kernel, x: str) -> str:
        h = k.reg("b16")
        k.emit(f"cvt.rn.f16.f32 {h}, {x}")
        return h

    # ---------------------------------------------------------------- arithmetic

    def _alu(self, k: _Kernel, u: UOp, xs: list[str]) -> str:
        op, dt = u.op, u.dtype.scalar
        if dt == dtypes.float16 and op in _F16_VIA_F32:
            wide = [self._f32(k, x, dtypes.float16) for x in xs]
            return self._to_half(k, self._arith(k, u, dtypes.float32, wide))
        if op in GroupOp.Comparison:
            return self._compare(k, op, u.src[0].dtype.scalar, xs)
        if op is Ops.WHERE:
            return self._where(k, dt, *xs)
        r = self._arith(k, u, dt, xs)
        return self._bf16_round(k, r) if dt == dtypes.bfloat16 and op not in _EXACT else r

    def _compare(self, k: _Kernel, op: Ops, src: DType, xs: list[str]) -> str:
        p = k.new(dtypes.bool)
        a, b = xs
        if src == dtypes.bool:
            t = k.reg("pred")
            if op is Ops.CMPLT:  # a < b: !a & b
                k.emit(f"not.pred {t}, {a}")
                k.emit(f"and.pred {p}, {t}, {b}")
            else:
                k.emit(f"xor.pred {p}, {a}, {b}")
            return p
        t = _ARITH[src.name]
        if src.is_float:  # ordered less-than; not-equal is unordered (NaN != NaN)
            k.emit(f"setp.{'lt' if op is Ops.CMPLT else 'neu'}.{t} {p}, {a}, {b}")
        else:
            k.emit(f"setp.{'lt' if op is Ops.CMPLT else 'ne'}.{t} {p}, {a}, {b}")
        return p

    def _where(self, k: _Kernel, dt: DType, c: str, a: str, b: str) -> str:
        r = k.new(dt)
        if dt == dtypes.bool:  # (c & a) | (!c & b)
            t, nc = k.reg("pred"), k.reg("pred")
            k.emit(f"and.pred {t}, {c}, {a}")
            k.emit(f"not.pred {nc}, {c}")
            k.emit(f"and.pred {r}, {nc}, {b}")
            k.emit(f"or.pred {r}, {r}, {t}")
        else:
            k.emit(f"selp.{reg_class(dt)} {r}, {a}, {b}, {c}")
        return r

    def _arith(self, k: _Kernel, u: UOp, dt: DType, xs: list[str]) -> str:
        """An ALU op (not a comparison or WHERE) on registers of dt: one instruction where _INSTRUCTIONS has its form
        for dt's kind, written out otherwise."""
        op, kind = u.op, 2 if dt == dtypes.bool else 0 if dt.is_float else 1
        r = k.new(dt)
        form = _INSTRUCTIONS.get(op, (None, None, None))[kind]
        if form is not None:
            rn = ".rn" if dt.name in ("float32", "float64") else ""
            k.emit(f"{form.format(t=_ARITH.get(dt.name), b=reg_class(dt)[1:], rn=rn)} {r}, {', '.join(xs)}")
            return self._narrow(k, r, dt) if kind == 1 and op in _WRAPS else r
        if kind == 0 and op is Ops.MAX:  # NaN wins, as torch.maximum: a where a is NaN or a >= b, else b
            t, nan, ge = _ARITH[dt.name], k.reg("pred"), k.reg("pred")
            k.emit(f"setp.nan.{t} {nan}, {xs[0]}, {xs[0]}")
            k.emit(f"setp.ge.{t} {ge}, {xs[0]}, {xs[1]}")
            k.emit(f"or.pred {nan}, {nan}, {ge}")
            k.emit(f"selp.{reg_class(dt)} {r}, {xs[0]}, {xs[1]}, {nan}")
            return r
        if kind == 0 and op is Ops.MOD:  # fmod, exactly, in float64 (where every float32 remainder is exact too)
            if dt == dtypes.float64:
                return fmod_f64(k, xs[0], xs[1])
            wide = [k.reg("b64"), k.reg("b64")]
            for w, x in zip(wide, xs):
                k.emit(f"cvt.f64.f32 {w}, {x}")
            k.emit(f"cvt.rn.f32.f64 {r}, {fmod_f64(k, *wide)}")
            return r
        if kind == 0 and op in (Ops.EXP2, Ops.LOG2, Ops.SIN):
            return self._transcendental(k, op, dt, xs[0])
        if kind == 1 and op in (Ops.SHL, Ops.SHR):
            return self._shift(k, u, dt, xs, r)
        if kind == 1 and op in (Ops.IDIV, Ops.MOD):
            return self._int_div(k, u, dt, xs, r)
        raise NotImplementedError(f"{type(self).__name__} has no {op.name} of {dt.name}")

    def _transcendental(self, k: _Kernel, op: Ops, dt: DType, x: str) -> str:
        """float32: exp2 and log2 by the approximate instructions (about 2 ulp); sin by sin.approx after reducing the
        argument to [-pi, pi] in float64 (sin.approx is accurate to 2^-20.5 there, not beyond). float64: written out
        in tiny.codegen.renderer.ptx_math, within a few ulp."""
        if dt == dtypes.float64:
            return {Ops.EXP2: exp2_f64, Ops.LOG2: log2_f64, Ops.SIN: sin_f64}[op](k, x)
        r = k.reg("b32")
        if op is Ops.SIN:
            wide, turns = k.reg("b64"), k.reg("b64")
            k.emit(f"cvt.f64.f32 {wide}, {x}")
            k.emit(f"mul.rn.f64 {turns}, {wide}, {_immediate(1 / (2 * math.pi), dtypes.float64)}")
            k.emit(f"cvt.rni.f64.f64 {turns}, {turns}")
            k.emit(f"fma.rn.f64 {wide}, {turns}, {_immediate(-2 * math.pi, dtypes.float64)}, {wide}")
            k.emit(f"cvt.rn.f32.f64 {r}, {wide}")
            k.emit(f"sin.approx.f32 {r}, {r}")
        else:
            k.emit(f"{'ex2' if op is Ops.EXP2 else 'lg2'}.approx.f32 {r}, {x}")
        return r

    def _shift(self, k: _Kernel, u: UOp, dt: DType, xs: list[str], r: str) -> str:
        """PTX clamps shift amounts to the register's width: a shift by the width or more gives 0 (or the sign in
        every bit), as tiny.ir.alu wants. The amount is an unsigned 32-bit register; a 64-bit one is clamped first."""
        amount = xs[1]  # a negative amount is a huge unsigned one: the width or more
        if reg_class(u.src[1].dtype) == "b64":
            clamped, small = k.reg("b64"), k.reg("b32")
            k.emit(f"min.u64 {clamped}, {amount}, 64")
            k.emit(f"cvt.u32.u64 {small}, {clamped}")
            amount = small
        bits = reg_class(dt)[1:]
        if u.op is Ops.SHL:
            k.emit(f"shl.b{bits} {r}, {xs[0]}, {amount}")
            return self._narrow(k, r, dt)
        signed = dt.scalar.kind == "i"
        k.emit(f"shr.{'s' if signed else 'u'}{bits} {r}, {xs[0]}, {amount}")
        return r

    def _int_div(self, k: _Kernel, u: UOp, dt: DType, xs: list[str], r: str) -> str:
        """C's / and %, toward zero; a zero divisor gives 0; MIN / -1 wraps to MIN and MIN % -1 is 0."""
        t, cls = _ARITH[dt.name], reg_class(dt)
        name = "div" if u.op is Ops.IDIV else "rem"
        signed = dt.scalar.kind == "i"
        dividend, divisor = u.src
        if divisor.op is Ops.CONST and divisor.arg > 0 and divisor.arg & (divisor.arg - 1) == 0 and dividend.vmin >= 0:
            # a power of two into what is never negative (index math): a shift or a mask (ptxas keeps a signed rem.s32
            # by 2 a division through the reciprocal)
            shift, bits = int(divisor.arg).bit_length() - 1, cls[1:]
            if u.op is Ops.IDIV:
                k.emit(f"shr.{'s' if signed else 'u'}{bits} {r}, {xs[0]}, {shift}")
            else:
                k.emit(f"and.b{bits} {r}, {xs[0]}, {divisor.arg - 1}")
            return self._narrow(k, r, dt)
        if divisor.op is Ops.CONST and divisor.arg != 0 and not (signed and divisor.arg == -1):
            k.emit(f"{name}.{t} {r}, {xs[0]}, {divisor.arg}")  # (an immediate: ptxas divides by it as a constant)
            return self._narrow(k, r, dt)
        a, b = xs
        zero, safe = k.reg("pred"), k.new(dt)
        k.emit(f"setp.eq.{t} {zero}, {b}, 0")
        bad = zero
        if signed:
            minus, bad = k.reg("pred"), k.reg("pred")
            k.emit(f"setp.eq.{t} {minus}, {b}, -1")
            k.emit(f"or.pred {bad}, {zero}, {minus}")
        k.emit(f"selp.{cls} {safe}, 1, {b}, {bad}")
        k.emit(f"{name}.{t} {r}, {a}, {safe}")
        if signed:
            if u.op is Ops.IDIV:
                k.emit(f"@{minus} neg.{t} {r}, {a}")
            else:
                k.emit(f"@{minus} mov.{cls} {r}, 0")
        k.emit(f"@{zero} mov.{cls} {r}, 0")
        return self._narrow(k, r, dt)

    # ---------------------------------------------------------------- casts

    def _cast(self, k: _Kernel, frm: DType, to: DType, x: str) -> str:
        """CAST as tiny.ir.dtypes.truncate defines it."""
        if frm == to:
            return x
        if to == dtypes.bool:
            p = k.reg("pred")
            if frm == dtypes.float64:
                k.emit(f"setp.neu.f64 {p}, {x}, 0d0000000000000000")
            elif frm.is_float:
                k.emit(f"setp.neu.f32 {p}, {self._f32(k, x, frm)}, 0f00000000")
            else:
                k.emit(f"setp.ne.{_ARITH[frm.name]} {p}, {x}, 0")
            return p
        if frm == dtypes.bool:
            if to.is_int:
                r = k.new(to)
                k.emit(f"selp.{reg_class(to)} {r}, 1, 0, {x}")
                return r
            one = k.reg("b32")
            k.emit(f"selp.f32 {one}, 0f3F800000, 0f00000000, {x}")
            return self._cast(k, dtypes.float32, to, one)
        if frm.is_int and to.is_int:
            return self._int_cast(k, frm, to, x)
        if frm.is_int:
            r = k.new(to)
            via = "f32" if to == dtypes.bfloat16 else _ARITH[to.name]
            k.emit(f"cvt.rn.{via}.{_ARITH[frm.name]} {r}, {x}")
            return self._bf16_round(k, r) if to == dtypes.bfloat16 else r
        if to.is_int:
            return self._float_to_int(k, frm, to, x)
        return self._float_cast(k, frm, to, x)

    def _int_cast(self, k: _Kernel, frm: DType, to: DType, x: str) -> str:
        r = k.new(to)
        if reg_class(frm) == "b64" and reg_class(to) == "b64":
            k.emit(f"mov.b64 {r}, {x}")
            return r
        if reg_class(to) == "b64":  # the 32-bit register is already sign- or zero-extended as frm is
            k.emit(f"cvt.{'s64.s32' if frm.kind == 'i' else 'u64.u32'} {r}, {x}")
            return r
        if reg_class(frm) == "b64":
            k.emit(f"cvt.u32.u64 {r}, {x}")
        else:
            k.emit(f"mov.b32 {r}, {x}")
        return self._narrow(k, r, to)

    def _float_to_int(self, k: _Kernel, frm: DType, to: DType, x: str) -> str:
        """Toward zero; where the value does not fit (NaN, infinities) int32 gives its minimum and every other
        integer type int64's minimum, cut to its bits."""
        if frm == dtypes.float16:
            x, frm = self._f32(k, x, frm), dtypes.float32
        t = "f64" if frm == dtypes.float64 else "f32"
        narrow = to.kind == "i" and to.itemsize == 4
        lo = -(2**31) if narrow else -(2**63)
        fits, above = k.reg("pred"), k.reg("pred")
        fdt = dtypes.float64 if t == "f64" else dtypes.float32
        k.emit(f"setp.ge.{t} {above}, {x}, {_immediate(float(lo), fdt)}")
        k.emit(f"setp.lt.{t} {fits}, {x}, {_immediate(float(-lo), fdt)}")
        k.emit(f"and.pred {fits}, {fits}, {above}")
        if narrow:
            r = k.reg("b32")
            k.emit(f"cvt.rzi.s32.{t} {r}, {x}")
            k.emit(f"selp.b32 {r}, {r}, {_immediate(lo, dtypes.int32)}, {fits}")
            return r
        n = k.reg("b64")
        k.emit(f"cvt.rzi.s64.{t} {n}, {x}")
        k.emit(f"selp.b64 {n}, {n}, {_immediate(lo, dtypes.int64)}, {fits}")
        return n if reg_class(to) == "b64" else self._int_cast(k, dtypes.int64, to, n)

    def _float_cast(self, k: _Kernel, frm: DType, to: DType, x: str) -> str:
        if to == dtypes.bfloat16:  # from float32 registers, or float64 rounded to float32 first
            if frm == dtypes.float64:
                f = k.reg("b32")
                k.emit(f"cvt.rn.f32.f64 {f}, {x}")
                x = f
            return self._bf16_round(k, self._f32(k, x, frm))
        src = "f32" if frm == dtypes.bfloat16 else _ARITH[frm.name]
        dst = "f32" if to == dtypes.bfloat16 else _ARITH[to.name]
        if src == dst:
            return x
        r = k.new(to)
        narrowing = _bits(to) < _bits(frm) or (to == dtypes.float16)
        k.emit(f"cvt{'.rn' if narrowing else ''}.{dst}.{src} {r}, {x}")
        return r

    def _bitcast(self, k: _Kernel, u: UOp, x: Reg) -> Reg:
        """The same bits as another type: registers of one size move; a vector packs into a wider scalar; bools and
        bfloat16s are taken in their memory form."""
        frm, to = u.source.dtype, u.dtype
        if frm.count > 1 or to.count > 1:
            if frm.count > 1 and to.count == 1 and frm.itemsize == to.itemsize and reg_class(to) == "b64":
                r = k.new(to)
                k.emit(f"mov.b64 {r}, {{{', '.join(_as_list(x))}}}")
                return r
            raise NotImplementedError(f"{type(self).__name__} cannot bitcast {frm!r} to {to!r}")
        src = _scalar(x)
        if frm == dtypes.bfloat16:
            src = self._bf16_bits(k, src)
        elif frm == dtypes.bool:
            b = k.reg("b32")
            k.emit(f"selp.u32 {b}, 1, 0, {src}")
            src = b
        src_cls = "b32" if frm in (dtypes.bfloat16, dtypes.bool) else reg_class(frm)
        dst_cls = "b32" if to in (dtypes.bfloat16, dtypes.bool) else reg_class(to)
        r = k.reg(dst_cls)
        if src_cls == dst_cls:
            k.emit(f"mov.{dst_cls} {r}, {src}")
        elif src_cls == "b16":  # float16 bits into a 32-bit register
            k.emit(f"cvt.u32.u16 {r}, {src}")
        elif dst_cls == "b16":
            k.emit(f"cvt.u16.u32 {r}, {src}")
        else:
            raise NotImplementedError(f"{type(self).__name__} cannot bitcast {frm!r} to {to!r}")
        if to == dtypes.bfloat16:
            k.emit(f"shl.b32 {r}, {r}, 16")
        elif to == dtypes.bool:
            p = k.reg("pred")
            k.emit(f"setp.ne.u32 {p}, {r}, 0")
            return p
        elif dst_cls == "b32":
            self._narrow(k, r, to)
        return r


def _immediate(v: int | float | bool, dt: DType) -> str:
    """A constant as a PTX immediate operand of dt's register size."""
    if dt.is_float and dt != dtypes.float16:
        if dt == dtypes.float64:
            return "0d" + struct.pack(">d", float(v)).hex().upper()
        return "0f" + struct.pack(">f", float(v)).hex().upper()
    if dt == dtypes.float16:
        return "0x" + struct.pack(">e", float(v)).hex().upper()
    bits = 64 if reg_class(dt) == "b64" else 32
    return f"0x{int(v) & ((1 << bits) - 1):X}"


def _memory_bytes(dt: DType) -> int:
    return dt.scalar.itemsize


def _scalar(r: Reg) -> str:
    assert isinstance(r, str), f"expected one register, got the lanes {r}"
    return r


def _as_list(r: Reg) -> list[str]:
    return r if isinstance(r, list) else [r]


def _lanes(r: Reg, dt: DType, new: Callable[[str], str]) -> Reg:
    if isinstance(r, list):
        return [new(x) for x in r]
    return new(r) if dt.count == 1 else [new(r) for _ in range(dt.count)]


def _name(name: str) -> str:
    if not _NAME.fullmatch(name):
        raise ValueError(f"{name!r} cannot name a PTX value; expected letters, digits and '_'")
    return name
