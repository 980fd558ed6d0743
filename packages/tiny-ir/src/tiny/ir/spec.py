"""The two forms a kernel takes, written down as data and checked: the kernel AST the scheduler hands the code
generator (`validate_ast`), and the device op set every backend must execute (`validate`).

A kernel AST is a SINK of WRITEs, one per output, over a tree of these (every VIEW of one kernel has the kernel's
number of dims, but a constant's may have none; a reduction keeps its reduced dims, as size 1, and its value is the
same along them, where another reduction's source reads it: a row's max inside its sum):

  WRITE          (DEFINE_GLOBAL, VIEW, value)  write value to the buffer, each point of the kernel's output shape where
                                the view maps it
  READ           (DEFINE_GLOBAL, VIEW)  the buffer's element the view maps each point to; 0 where its mask is false
  CONST          (VIEW,) arg=value  the value, 0 where the view's mask is false (a symbolic size's value is a UOp)
  ARANGE         (VIEW,) arg=n  an integer: where the view maps each point in the range 0 .. n-1 (the view's offset
                                there); 0 where its mask is false
  REDUCE_AXIS    (value,) arg=(ADD, MUL or MAX, axes)  the value reduced over the axes
  CAST, BITCAST and the ALU ops, elementwise

Lowering (tiny.codegen.lower) turns the views into index math: a READ becomes a LOAD of an INDEX, a WRITE a STORE.

A linearized kernel is a list of UOps using only DEVICE_OPS, in execution order; `validate` checks one.
The PYTHON runtime (tiny.runtime.python) executes exactly these semantics and is their reference:

  DEFINE_GLOBAL  arg=i          the i-th buffer argument (dtype: pointer to the element type)
  DEFINE_VAR     arg=(name, lo, hi)  an integer argument, passed after the buffers in order of appearance
  DEFINE_LOCAL   arg=(name, n)  workgroup memory of n elements (dtype: local pointer)
  SPECIAL        arg=(name, n)  a hardware index: gidx<d> is the workgroup index in dim d, lidx<d> the
                                index inside the workgroup; n is the size of that dimension
  CONST          arg=value
  INDEX          (pointer, offset[, gate])   an address; a false gate makes loads and stores not happen
  LOAD           (INDEX[, alt][, BARRIER])  the value at the address, or alt where the gate is false; a load
                                of local memory names the BARRIER (or the COPY_ASYNC) it must come after
  STORE          (INDEX, value)
  COPY_ASYNC     (local INDEX, global INDEX[, after])  copy dtype's 4, 8 or 16 bytes from global to local memory
                                (optional: RendererCaps.async_copy; NVIDIA's cp.async), zeros where the global
                                INDEX's gate is false; the copy lands by a BARRIER ("async", n) of the thread, and no
                                thread reads its target before that barrier. `after`: the BARRIER or COPY_ASYNC it
                                must come after (order only)
  DEFINE_ACC     (init,) arg=id  a register, set to init where it stands
  ASSIGN         (DEFINE_ACC, value)  set the register; the ASSIGN's own value is the register's value
  RANGE          (end,)          loop: run what follows, up to its ENDRANGE, for counter = 0 .. end-1
  ENDRANGE       (RANGE,)
  IF / ENDIF     (cond,) / (IF,) run what is between only where cond is true
  BARRIER        wait until every thread of the workgroup has reached it; arg ("async", n): first wait until
                                this thread's COPY_ASYNCs have landed, all but its n latest groups of them (a
                                group: the copies it issued since its last such barrier; n = 0: all of them)
  VECTORIZE / GEP  build a vector from scalars / take lane arg of a vector
  WMMA           (A, B, C) arg=name  a tensor-core multiply-accumulate (optional): the warp's lanes together
                                compute D = A @ B + C for the tile of tiny.ir.tensorcore.TENSOR_CORES[name]; each
                                lane gives its fragments of A, B and C (vectors) and gets its fragment of D
  CAST, BITCAST and the ALU ops, computing as tiny.ir.alu.exec_alu does.
"""

from __future__ import annotations

from tiny.ir.dtypes import PtrDType, dtypes
from tiny.ir.tensorcore import TENSOR_CORES
from tiny.ir.uop import GroupOp, Ops, UOp
from tiny.ir.views import View

DEVICE_OPS: frozenset[Ops] = frozenset(
    {
        Ops.DEFINE_GLOBAL,
        Ops.DEFINE_VAR,
        Ops.DEFINE_LOCAL,
        Ops.DEFINE_ACC,
        Ops.SPECIAL,
        Ops.CONST,
        Ops.INDEX,
        Ops.LOAD,
        Ops.STORE,
        Ops.ASSIGN,
        Ops.RANGE,
        Ops.ENDRANGE,
        Ops.IF,
        Ops.ENDIF,
        Ops.BARRIER,
        Ops.COPY_ASYNC,
        Ops.VECTORIZE,
        Ops.GEP,
        Ops.WMMA,
        Ops.CAST,
        Ops.BITCAST,
    }
    | GroupOp.ALU
)


class SpecError(ValueError):
    """A linearized kernel that breaks the device op set's rules: a bug in the code generator."""


def _check(cond: bool, u: UOp, what: str) -> None:
    if not cond:
        raise SpecError(f"{u.op.name}: {what} (dtype {u.dtype!r}, arg {u.arg!r}, sources {[s.op.name for s in u.src]})")


def _check_alu(u: UOp) -> None:
    if u.op is Ops.WHERE:
        cond, a, b = u.src
        _check(cond.dtype.scalar == dtypes.bool, u, "condition must be bool")
        _check(a.dtype == b.dtype == u.dtype, u, "both branches must have the result's dtype")
        return
    if u.op in GroupOp.Comparison:
        _check(u.dtype.scalar == dtypes.bool, u, "a comparison gives bool")
        _check(u.src[0].dtype == u.src[1].dtype, u, "compared values must share a dtype")
        return
    _check(all(s.dtype == u.dtype for s in u.src), u, "operands must have the result's dtype")
    if u.op in (Ops.IDIV, Ops.SHL, Ops.SHR):
        _check(u.dtype.scalar.is_int, u, "integer op on a non-integer dtype")
    if u.op in GroupOp.ByteDots:
        _check(u.dtype.scalar == dtypes.int32, u, f"{u.op.name} takes and gives int32 (four bytes each)")
    if u.op in (Ops.FDIV, Ops.RECIP, Ops.SQRT, Ops.EXP2, Ops.LOG2, Ops.SIN, Ops.TRUNC):
        _check(u.dtype.scalar.is_float, u, "float op on a non-float dtype")


def _check_wmma(u: UOp) -> None:
    tc = TENSOR_CORES.get(u.arg) if isinstance(u.arg, str) else None
    _check(tc is not None, u, f"arg names a tensor core, one of {sorted(TENSOR_CORES)}")
    assert tc is not None
    _check(len(u.src) == 3, u, "takes the A, B and C fragments")
    want = (tc.a_dtype, tc.b_dtype, tc.c_dtype)
    _check(tuple(s.dtype for s in u.src) == want, u, f"fragments A, B, C of {tc.name} are {want}")
    _check(u.dtype == tc.c_dtype, u, f"gives the D fragment, {tc.c_dtype!r}")


def _check_copy_async(u: UOp) -> None:
    dst, src = u.address, u.copied_from
    _check(dst.op is Ops.INDEX and src.op is Ops.INDEX, u, "copies from an INDEX to an INDEX")
    local, glob = dst.pointer.dtype, src.pointer.dtype
    ok = isinstance(local, PtrDType) and local.local and isinstance(glob, PtrDType) and not glob.local
    _check(ok, u, "copies from global memory into local memory")
    _check(dst.gate is None, u, "its local INDEX has no gate (a false gate on the global one writes zeros)")
    _check(u.dtype.nbytes in (4, 8, 16), u, "copies 4, 8 or 16 bytes")
    _check(u.dtype.scalar == _element(dst) == _element(src), u, "copies the pointers' element type")
    _check(all(s.op in (Ops.BARRIER, Ops.COPY_ASYNC) for s in u.src[2:]), u, "comes after a BARRIER or COPY_ASYNC")


AST_OPS: frozenset[Ops] = frozenset(
    {Ops.SINK, Ops.WRITE, Ops.READ, Ops.VIEW, Ops.DEFINE_GLOBAL, Ops.CONST, Ops.ARANGE, Ops.REDUCE_AXIS, Ops.CAST}
    | {Ops.BITCAST}
    | GroupOp.ALU
)
_NOT_AST = "not a kernel AST op (LOAD and STORE are the lowered kernel's: a kernel AST has READ and WRITE)"


def _check_memory(u: UOp, ndim: int) -> None:
    """A READ or WRITE: a buffer argument and a VIEW of the kernel's dims, of the buffer's element type."""
    slots = "(DEFINE_GLOBAL, VIEW)" if u.op is Ops.READ else "(DEFINE_GLOBAL, VIEW, value)"
    _check(len(u.src) == (2 if u.op is Ops.READ else 3), u, f"takes {slots}")
    buf, view = u.src[0], u.src[1]
    _check(buf.op is Ops.DEFINE_GLOBAL and isinstance(buf.dtype, PtrDType), u, f"takes {slots}")
    _check(view.op is Ops.VIEW, u, f"takes {slots}")
    _check(len(view.arg.shape) == ndim, u, f"its view has the kernel's {ndim} dims")
    dtype = u.dtype if u.op is Ops.READ else u.value.dtype
    _check(dtype == buf.dtype.base, u, f"the buffer holds {buf.dtype.base!r}, not {dtype!r}")


def validate_ast(ast: UOp) -> None:
    """Raise SpecError unless `ast` is a well-formed kernel AST: what the scheduler makes and the code generator
    lowers (see the module's docstring)."""
    if ast.op is not Ops.SINK or not ast.src or any(w.op is not Ops.WRITE for w in ast.src):
        got = f"{ast.op.name} of {[s.op.name for s in ast.src]}"
        raise SpecError(f"{ast.op.name}: a kernel AST is a SINK of WRITEs, got {got}")
    for w in ast.src:  # (first: the output's view gives the kernel's dims)
        _check(len(w.src) == 3 and w.src[1].op is Ops.VIEW, w, "takes (DEFINE_GLOBAL, VIEW, value)")
    ndim = len(ast.src[0].view.shape)
    buffers: set[int] = set()
    for u in ast.toposort:
        _check(u.op in AST_OPS, u, _NOT_AST)
        if u.op in (Ops.READ, Ops.WRITE):
            _check_memory(u, ndim)
        elif u.op is Ops.VIEW:
            _check(not u.src and isinstance(u.arg, View), u, "a VIEW holds a View and has no sources")
        elif u.op is Ops.DEFINE_GLOBAL:
            _check(isinstance(u.dtype, PtrDType) and isinstance(u.arg, int), u, "a buffer is a pointer and a number")
            buffers.add(u.arg)
        elif u.op is Ops.CONST:
            _check(len(u.src) == 1 and u.src[0].op is Ops.VIEW, u, "a kernel AST's constant has a VIEW")
            _check(len(u.src[0].arg.shape) in (0, ndim), u, f"its view has the kernel's {ndim} dims (or none)")
        elif u.op is Ops.ARANGE:
            _check(len(u.src) == 1 and u.src[0].op is Ops.VIEW, u, "a kernel AST's arange has a VIEW")
            _check(len(u.src[0].arg.shape) == ndim, u, f"its view has the kernel's {ndim} dims")
            _check(u.dtype.is_int and isinstance(u.arg, int) and u.arg >= 0, u, "is integers 0 .. n-1, arg=n")
        elif u.op is Ops.REDUCE_AXIS:
            ok = isinstance(u.arg, tuple) and len(u.arg) == 2 and u.arg[0] in GroupOp.Reduce
            _check(ok and all(0 <= a < ndim for a in u.arg[1]), u, f"arg is (ADD, MUL or MAX, axes among {ndim} dims)")
            _check(len(u.src) == 1 and u.dtype == u.source.dtype, u, "reduces one value of its dtype")
        elif u.op in GroupOp.ALU:
            _check_alu(u)
    numbers = f"0 .. {len(buffers) - 1}, got {sorted(buffers)}"
    _check(buffers == set(range(len(buffers))), ast, f"the buffers are arguments {numbers}")


def _element(index: UOp) -> object:
    ptr = index.pointer.dtype
    return ptr.base.scalar if isinstance(ptr, PtrDType) and ptr.base is not None else None


def validate(uops: list[UOp]) -> None:
    """Raise SpecError unless `uops` is a well-formed linearized kernel of the device op set."""
    seen: set[UOp] = set()
    open_blocks: list[UOp] = []
    made_in: dict[UOp, tuple[UOp, ...]] = {}  # the loops and ifs open where each value was made
    for u in uops:
        _check(u.op in DEVICE_OPS, u, "not in the device op set")
        _check(u not in seen, u, "appears twice in the kernel")
        for s in u.src:
            _check(s in seen, u, f"uses a {s.op.name} that comes later or not at all")
            inside = made_in[s]  # an accumulator's ASSIGN is read after its loops: the register outlives them
            ok = s.op is Ops.ASSIGN or tuple(open_blocks[: len(inside)]) == inside
            _check(ok, u, f"uses a {s.op.name} made inside a loop or if that has ended")
        if u.op in GroupOp.ALU:
            _check_alu(u)
        elif u.op is Ops.DEFINE_GLOBAL:
            _check(isinstance(u.dtype, PtrDType) and not u.dtype.local and isinstance(u.arg, int), u, "bad global")
        elif u.op is Ops.DEFINE_LOCAL:
            _check(isinstance(u.dtype, PtrDType) and u.dtype.local, u, "a local buffer has a local pointer dtype")
        elif u.op is Ops.SPECIAL:
            ok = isinstance(u.arg, tuple) and len(u.arg) == 2 and isinstance(u.arg[1], int) and u.arg[1] > 0
            _check(ok and u.arg[0][:4] in ("gidx", "lidx") and u.arg[0][4:] in ("0", "1", "2"), u, "bad index")
        elif u.op is Ops.DEFINE_VAR:
            _check(isinstance(u.arg, tuple) and len(u.arg) == 3 and u.dtype.is_int, u, "a variable is (name, lo, hi)")
        elif u.op is Ops.WMMA:
            _check_wmma(u)
        elif u.op is Ops.BITCAST:
            _check(u.dtype.nbytes == u.src[0].dtype.nbytes, u, "a bitcast keeps the size")
        elif u.op is Ops.INDEX:
            _check(isinstance(u.pointer.dtype, PtrDType), u, "indexes a non-pointer")
            _check(u.offset.dtype.is_int, u, "offset must be an integer")
            _check(u.gate is None or u.gate.dtype == dtypes.bool, u, "gate must be bool")
        elif u.op is Ops.LOAD:
            _check(u.address.op is Ops.INDEX, u, "loads from an INDEX")
            _check(u.dtype.scalar == _element(u.address), u, "loads the pointer's element type")
            _check((u.address.gate is None) == (u.alternative is None), u, "a gated load needs an alternative")
        elif u.op is Ops.COPY_ASYNC:
            _check_copy_async(u)
        elif u.op is Ops.BARRIER:
            n = u.copies_in_flight
            _check(u.arg is None or (type(n) is int and n >= 0), u, 'arg: None or ("async", n) with n >= 0')
        elif u.op is Ops.STORE:
            _check(u.address.op is Ops.INDEX, u, "stores to an INDEX")
            _check(u.value.dtype.scalar == _element(u.address), u, "stores the pointer's element type")
        elif u.op is Ops.ASSIGN:
            _check(u.src[0].op is Ops.DEFINE_ACC and u.src[0].dtype == u.value.dtype, u, "assigns an accumulator")
        elif u.op is Ops.RANGE:
            _check(u.end.dtype.is_int and u.dtype == u.end.dtype, u, "a loop counts with an integer")
            open_blocks.append(u)
        elif u.op is Ops.IF:
            open_blocks.append(u)
        elif u.op in (Ops.ENDRANGE, Ops.ENDIF):
            opener = Ops.RANGE if u.op is Ops.ENDRANGE else Ops.IF
            _check(u.src[0].op is opener, u, f"closes a {u.src[0].op.name}, not a {opener.name}")
            _check(bool(open_blocks) and open_blocks[-1] is u.src[0], u, "closes a block that is not innermost")
            open_blocks.pop()
        seen.add(u)
        made_in[u] = tuple(open_blocks)  # a loop counter belongs to its own loop
    if open_blocks:
        raise SpecError(f"{len(open_blocks)} loop(s) or if(s) never closed")
