"""The UOp graph: one immutable, hash-consed node type from the tensor level down to the kernel."""

from __future__ import annotations

import enum
import math
import weakref
from collections.abc import Callable, Hashable
from typing import TYPE_CHECKING, Any, Generic, TypeVar, overload

from tiny.ir.dtypes import DType, dtypes, truncate

if TYPE_CHECKING:
    from tiny.ir.views import View


class Ops(enum.Enum):
    # graph roots and devices
    SINK = enum.auto()  # groups several outputs; src = the outputs
    DEVICE = enum.auto()  # arg = canonical device name
    # tensor level
    BUFFER = enum.auto()  # a flat device buffer; arg = BufferRef
    CONTIGUOUS = enum.auto()  # realize the source into a buffer of its own
    DETACH = enum.auto()  # the source's value, through which no gradient flows
    COPY = enum.auto()  # src = (value, DEVICE): the value on another device
    REDUCE_AXIS = enum.auto()  # arg = (alu op, axes); keeps reduced axes as size 1
    RESHAPE = enum.auto()  # movement ops: arg is the new shape / order / padding ...
    PERMUTE = enum.auto()
    EXPAND = enum.auto()
    PAD = enum.auto()
    SHRINK = enum.auto()
    FLIP = enum.auto()
    MULTI = enum.auto()  # one tensor on several devices: src = a node per device, arg = the axis they split, or None
    # kernel AST (what the scheduler hands the code generator): memory is read and written through VIEWs (READ and
    # WRITE, listed last), constants have one
    VIEW = enum.auto()  # arg = View; how a kernel indexes a buffer or a constant
    # kernel level (READ and WRITE lowered: LOAD and STORE through an INDEX)
    DEFINE_GLOBAL = enum.auto()  # arg = argument index; dtype is a pointer
    DEFINE_VAR = enum.auto()  # an integer kernel argument; arg = (name, min, max)
    BIND = enum.auto()  # tensor level: src = (DEFINE_VAR, CONST value), a variable bound to a value
    DEFINE_LOCAL = enum.auto()  # workgroup memory; arg = (name, elements); dtype is a local pointer
    DEFINE_ACC = enum.auto()  # a register accumulator; src = (initial value,), arg = id
    CONST = enum.auto()  # arg = the value; in a kernel AST src = (VIEW,), the value where the view's mask holds, else 0
    # the integers 0 .. n-1 (an arange): tensor level src = (DEVICE,), arg = n; in a kernel AST src = (VIEW,) over the
    # (n,) range: at each point the index in the range the view reaches there where its mask holds, else 0 (no memory)
    ARANGE = enum.auto()
    INDEX = enum.auto()  # src = (pointer, index[, gate]): an address
    LOAD = enum.auto()  # src = (INDEX[, alternative when the gate is false])
    STORE = enum.auto()  # src = (INDEX, value)
    ASSIGN = enum.auto()  # kernel: src = (DEFINE_ACC, value), update it; tensor: src = (target view, value), write it
    REDUCE = enum.auto()  # src = (value, *ranges), arg = alu op; lowered into DEFINE_ACC/ASSIGN
    RANGE = enum.auto()  # a loop counter from 0 to src[0]; arg = loop id
    ENDRANGE = enum.auto()  # src = (RANGE,)
    SPECIAL = enum.auto()  # a hardware index; arg = (name, size) e.g. ("gidx0", 64)
    # workgroup barrier; src = the stores it orders; arg ("async", n): first waits for the thread's COPY_ASYNCs, all but
    # its n latest groups of them (a group: the copies since its last such barrier)
    BARRIER = enum.auto()
    # a copy from global into local memory that lands by a BARRIER ("async", n) (NVIDIA's cp.async); src =
    # (local INDEX, global INDEX[, what it comes after]); dtype: the values copied (4, 8 or 16 bytes)
    COPY_ASYNC = enum.auto()
    IF = enum.auto()  # src = (condition,)
    ENDIF = enum.auto()  # src = (IF,)
    VECTORIZE = enum.auto()  # build a vector from scalars
    GEP = enum.auto()  # arg = lane: one lane of a vector
    WMMA = enum.auto()  # a matrix-multiply-accumulate; arg describes the shape
    CAST = enum.auto()
    BITCAST = enum.auto()
    # ALU
    NEG = enum.auto()
    RECIP = enum.auto()
    SQRT = enum.auto()
    EXP2 = enum.auto()
    LOG2 = enum.auto()
    SIN = enum.auto()
    TRUNC = enum.auto()  # float toward zero
    ADD = enum.auto()
    MUL = enum.auto()
    FDIV = enum.auto()  # float division, correctly rounded
    IDIV = enum.auto()  # integer division, toward zero as in C
    MOD = enum.auto()  # remainder with the sign of the dividend, as C's % and fmod
    MAX = enum.auto()
    CMPLT = enum.auto()
    CMPNE = enum.auto()
    AND = enum.auto()
    OR = enum.auto()
    XOR = enum.auto()
    SHL = enum.auto()
    SHR = enum.auto()
    WHERE = enum.auto()
    # kernel AST memory ops (after the others: a pickle made before they were added names the ops by number)
    READ = enum.auto()  # src = (DEFINE_GLOBAL, VIEW): the buffer's element the view maps each point of the kernel to
    WRITE = enum.auto()  # src = (DEFINE_GLOBAL, VIEW, value): store the value there; a kernel AST is a SINK of WRITEs
    # int32 (a, b) -> int32: the sum of the products of a's four bytes, unsigned, and b's, signed (x86's vpdpbusd,
    # CUDA's __dp4a): a quantized product's int8 arithmetic, four products an op. The code generator writes it out
    # in shifts, products and sums for a renderer whose RendererCaps.dot4 is off.
    DOT4 = enum.auto()
    # int32 (a, b) -> int32: the sum of the products of a's four bytes and b's, both signed (ARM's sdot), where no
    # byte of b is -128 (what a renderer may assume: x86's AVX2 multiplies |a| by b with a's sign, in pmaddubsw, and
    # -128 has no positive); a quantized product's rounded input (-127 .. 127) is such a b. Written out as DOT4 is.
    SDOT4 = enum.auto()

    __hash__ = object.__hash__  # members are singletons; Enum's own hash (of the name) is a Python call

    def __reduce_ex__(self, protocol: Any) -> str:
        """Pickled by name (Enum's own pickles the number, which an op added before it changes)."""
        return f"Ops.{self.name}"

    def __repr__(self) -> str:
        return f"Ops.{self.name}"


class GroupOp:
    Unary = frozenset({Ops.NEG, Ops.RECIP, Ops.SQRT, Ops.EXP2, Ops.LOG2, Ops.SIN, Ops.TRUNC})
    Binary = frozenset(
        {
            Ops.ADD,
            Ops.MUL,
            Ops.FDIV,
            Ops.IDIV,
            Ops.MOD,
            Ops.MAX,
            Ops.CMPLT,
            Ops.CMPNE,
            Ops.AND,
            Ops.OR,
            Ops.XOR,
            Ops.SHL,
            Ops.SHR,
            Ops.DOT4,
            Ops.SDOT4,
        }
    )
    Ternary = frozenset({Ops.WHERE})
    ALU = Unary | Binary | Ternary
    Elementwise = ALU | {Ops.CAST, Ops.BITCAST}
    Movement = frozenset({Ops.RESHAPE, Ops.PERMUTE, Ops.EXPAND, Ops.PAD, Ops.SHRINK, Ops.FLIP})
    Commutative = frozenset({Ops.ADD, Ops.MUL, Ops.MAX, Ops.CMPNE, Ops.AND, Ops.OR, Ops.XOR})
    Comparison = frozenset({Ops.CMPLT, Ops.CMPNE})
    # ops that keep 0 at 0: padding can be pushed through them without a mask
    ZeroPreserving = frozenset({Ops.ADD, Ops.MUL, Ops.NEG, Ops.AND, Ops.OR, Ops.XOR, Ops.CAST, Ops.BITCAST})
    Reduce = frozenset({Ops.ADD, Ops.MUL, Ops.MAX})
    ByteDots = frozenset({Ops.DOT4, Ops.SDOT4})  # four byte products summed: a renderer's own where caps.dot4


_ONE_INPUT = (
    GroupOp.Movement
    | GroupOp.Unary
    | {
        Ops.REDUCE_AXIS,
        Ops.CAST,
        Ops.BITCAST,
        Ops.CONTIGUOUS,
        Ops.DETACH,
        Ops.COPY,
        Ops.REDUCE,
        Ops.ENDRANGE,
    }
)


_TUPLE = object()  # marks the key of a tuple that is not all plain ints (a tuple of the elements' keys)


def arg_key(arg: Any) -> Any:
    """A hashing key that tells apart what == confuses: -0.0 and 0.0, NaNs, 1 and True and 1.0."""
    kind = type(arg)  # the exact types first (one test each); subclasses (NumPy scalars, enums) below
    if arg is None or kind is str:
        return arg
    if kind is tuple:
        for x in arg:
            if type(x) is not int:
                return (_TUPLE, tuple(map(arg_key, arg)))
        # a tuple of plain ints (shapes, axes, a buffer's number and size) is its own key, made for every such node:
        # no other key equals it (the others are not tuples, or start with a type, "f" or _TUPLE)
        return arg
    if kind is float:
        return ("f", arg.hex())
    if kind is int or kind is bool:
        return (kind, arg)
    if isinstance(arg, float):
        return ("f", arg.hex())
    if isinstance(arg, (bool, int)):
        return (kind, arg)
    if isinstance(arg, tuple):
        return (_TUPLE, tuple(map(arg_key, arg)))
    return arg


T = TypeVar("T")


class cached_property(Generic[T]):  # noqa: N801  (named as the functools one it replaces)
    """functools.cached_property without the lock Python 3.11 takes on each first access: the value is computed
    once and stored in the instance's __dict__, where later lookups find it before this descriptor.

    A node's __dict__ belongs to this module: its cached properties, which only UOp's own methods set ahead of time
    (UOp.take_shape_of, UOp.set_shape). A module that keeps records of its own on nodes keeps them there too, under
    keys it defines and it alone reads and writes (tiny.ir.schedule.cache's "schedule_cache.shape", tiny.tensor's
    "autograd.*"): they live and die with the node, and a lookup is a dict's (a WeakKeyDictionary's is 2-3 times
    slower, and each dying node would call back into it)."""

    def __init__(self, fn: Callable[[Any], T]) -> None:
        self.fn, self.name = fn, fn.__name__
        self.__doc__ = fn.__doc__

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    @overload
    def __get__(self, obj: None, owner: type | None = None) -> cached_property[T]: ...
    @overload
    def __get__(self, obj: object, owner: type | None = None) -> T: ...
    def __get__(self, obj: object | None, owner: type | None = None) -> T | cached_property[T]:
        if obj is None:
            return self
        value = obj.__dict__[self.name] = self.fn(obj)
        return value


class _Entry(weakref.ref):
    """The hash-consing table's weak reference to a node, with the node's key (to drop the entry when it dies)."""

    __slots__ = ("key",)


def _forget(entry: _Entry) -> None:
    """Drop a dead node's entry from the hash-consing table (unless a new node took the key: then put that back)."""
    if (now := _CACHE.pop(entry.key, None)) is not entry and now is not None:
        _CACHE[entry.key] = now


class _Fields:
    """The slots of a node. A node is made as a _NewNode, whose slots take plain writes, and becomes a UOp, which
    refuses every write, once they are set: five plain writes and a change of class cost a third of what five calls of
    the slots' own setters do (and a UOp is made for nearly everything tiny does)."""

    __slots__ = ("op", "dtype", "src", "arg", "argkey", "__weakref__", "__dict__")


class _NewNode(_Fields):
    __slots__ = ()


class UOp(_Fields):
    """A node of the graph. Structurally equal UOps are the same object, so `is` and `==` agree."""

    __slots__ = ()
    op: Ops
    dtype: DType
    src: tuple[UOp, ...]
    arg: Any
    argkey: Any  # arg_key(arg): the arg as the hash-consing key holds it
    # the hash-consing table: each live node by (op, dtype, src, arg_key(arg)), held weakly
    _cache: dict[tuple, weakref.ref[UOp]] = {}

    def __new__(cls, op: Ops, dtype: DType = dtypes.void, src: tuple[UOp, ...] = (), arg: Any = None) -> UOp:
        argkey = arg if arg is None else arg_key(arg)
        key = (op, dtype, src, argkey)
        if (entry := _CACHE.get(key)) is not None and (hit := entry()) is not None:
            return hit
        self = _new_object(_NewNode)  # (see _Fields)
        self.op, self.dtype, self.src, self.arg, self.argkey = op, dtype, src, arg, argkey
        self.__class__ = cls
        entry = _CACHE[key] = _Entry(self, _forget)
        entry.key = key
        return self

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("UOp is immutable")

    def __reduce__(self) -> tuple:
        """Pickle the whole graph flat (no recursion); unpickling hash-conses it back."""
        topo = self.toposort
        pos = {u: i for i, u in enumerate(topo)}
        return _unflatten, ([(u.op, u.dtype, tuple(pos[s] for s in u.src), u.arg) for u in topo],)

    def replace(self, **kwargs: Any) -> UOp:
        fields = {"op": self.op, "dtype": self.dtype, "src": self.src, "arg": self.arg} | kwargs
        return UOp(fields["op"], fields["dtype"], fields["src"], fields["arg"])

    # ---- printing

    def __repr__(self) -> str:
        if self.op is Ops.BIND or self.op is Ops.DEFINE_VAR or (self.op in GroupOp.ALU and _size_expr(self)):
            return self.expr + (f"={self.val}" if self.op is Ops.BIND else "")  # a symbolic size: pos, (pos+1), pos=5
        return pretty(self)

    # ---- graph walks

    @property
    def toposort(self) -> tuple[UOp, ...]:
        """Every node reachable from this one, each after its sources (this one last)."""
        return (*self._ancestors, self)

    @cached_property
    def _ancestors(self) -> tuple[UOp, ...]:
        """toposort without this node, cached: a cached tuple holding the node itself would make each node a cycle
        of references, which only Python's cycle collector frees, so a dropped graph (and the buffers it holds)
        would stay in memory until the collector ran."""
        return tuple(_post_order(self)[:-1])

    # ---- constructors

    @staticmethod
    def const(dtype: DType, value: Any) -> UOp:
        return UOp(Ops.CONST, dtype, (), truncate(dtype.scalar, value) if dtype.count == 1 else value)

    @staticmethod
    def range(end: int | UOp, loop_id: int, dtype: DType = dtypes.int32) -> UOp:
        end_uop = end if isinstance(end, UOp) else UOp.const(dtype, end)
        return UOp(Ops.RANGE, dtype, (end_uop,), loop_id)

    def const_like(self, value: Any) -> UOp:
        return UOp.const(self.dtype, value)

    def alu(self, op: Ops, *others: UOp) -> UOp:
        srcs = (self, *others)
        if op in GroupOp.Comparison:
            dtype = dtypes.bool.vec(self.dtype.count)
        elif op is Ops.WHERE:
            dtype = others[0].dtype
        else:
            dtype = self.dtype
        return UOp(op, dtype, srcs)

    def _other(self, x: UOp | int | float | bool) -> UOp:
        return x if isinstance(x, UOp) else self.const_like(x)

    def __add__(self, x: UOp | int | float) -> UOp:
        return self.alu(Ops.ADD, self._other(x))

    def __radd__(self, x: UOp | int | float) -> UOp:
        return self._other(x).alu(Ops.ADD, self)

    def __mul__(self, x: UOp | int | float) -> UOp:
        return self.alu(Ops.MUL, self._other(x))

    def __rmul__(self, x: UOp | int | float) -> UOp:
        return self._other(x).alu(Ops.MUL, self)

    def __neg__(self) -> UOp:
        return self.alu(Ops.NEG)

    def __sub__(self, x: UOp | int | float) -> UOp:
        return self + (-self._other(x))

    def __rsub__(self, x: UOp | int | float) -> UOp:
        return self._other(x) + (-self)

    def __floordiv__(self, x: UOp | int) -> UOp:
        return self.alu(Ops.IDIV, self._other(x))

    def __mod__(self, x: UOp | int) -> UOp:
        return self.alu(Ops.MOD, self._other(x))

    def __truediv__(self, x: UOp | float) -> UOp:
        return self.alu(Ops.FDIV, self._other(x))

    def __and__(self, x: UOp | int | bool) -> UOp:
        return self.alu(Ops.AND, self._other(x))

    def __or__(self, x: UOp | int | bool) -> UOp:
        return self.alu(Ops.OR, self._other(x))

    def __xor__(self, x: UOp | int | bool) -> UOp:
        return self.alu(Ops.XOR, self._other(x))

    def __lshift__(self, x: UOp | int) -> UOp:
        return self.alu(Ops.SHL, self._other(x))

    def __rshift__(self, x: UOp | int) -> UOp:
        return self.alu(Ops.SHR, self._other(x))

    def lt(self, x: UOp | int | float) -> UOp:
        return self.alu(Ops.CMPLT, self._other(x))

    def ne(self, x: UOp | int | float) -> UOp:
        return self.alu(Ops.CMPNE, self._other(x))

    def maximum(self, x: UOp | int | float) -> UOp:
        return self.alu(Ops.MAX, self._other(x))

    def where(self, a: UOp | int | float, b: UOp | int | float) -> UOp:
        a_uop = a if isinstance(a, UOp) else (b.const_like(a) if isinstance(b, UOp) else None)
        if a_uop is None:
            raise TypeError("where() needs at least one UOp branch to take its dtype from")
        b_uop = b if isinstance(b, UOp) else a_uop.const_like(b)
        return self.alu(Ops.WHERE, a_uop, b_uop)

    def cast(self, dtype: DType) -> UOp:
        return self if self.dtype == dtype else UOp(Ops.CAST, dtype, (self,))

    def bitcast(self, dtype: DType) -> UOp:
        return UOp(Ops.BITCAST, dtype, (self,))

    # ---- variables (tiny.ir.sint): symbolic sizes

    def bind(self, value: int) -> UOp:
        """A Variable (DEFINE_VAR) bound to a value in its range: what stands in a shape."""
        if self.op is not Ops.DEFINE_VAR:
            raise TypeError(f"only a Variable can be bound, not a {self.op.name} node")
        name, lo, hi = self.arg
        if type(value) is not int:
            if isinstance(value, bool) or not hasattr(value, "__index__"):
                raise TypeError(f"Variable {name!r} is bound to an int, got {type(value).__name__} {value!r}")
            value = int(value)
        if not lo <= value <= hi:
            raise ValueError(f"Variable {name!r} takes values from {lo} to {hi}, got {value}")
        _BINDS_MADE[0] = True  # (the scheduler looks for bound sizes from now on)
        return UOp(Ops.BIND, self.dtype, (self, UOp.const(self.dtype, value)))

    def unbind(self) -> tuple[UOp, int]:
        """A BIND's variable and value."""
        if self.op is not Ops.BIND:
            raise TypeError(f"only a bound Variable can be unbound, not a {self.op.name} node")
        return self.src[0], self.src[1].arg

    @property
    def val(self) -> int:
        """The value of a size expression of bound Variables (ValueError where one is not bound)."""
        from tiny.ir.sint import sym_eval

        return sym_eval(self)

    @property
    def expr(self) -> str:
        """A Variable's name, or a size expression written out."""
        from tiny.ir.sint import sym_str

        return sym_str(self)

    # ---- named slots

    @property
    def is_const(self) -> bool:
        return self.op is Ops.CONST

    @property
    def pointer(self) -> UOp:
        """INDEX: the buffer or local memory it addresses."""
        assert self.op is Ops.INDEX, self.op
        return self.src[0]

    @property
    def offset(self) -> UOp:
        """INDEX: the element offset."""
        assert self.op is Ops.INDEX, self.op
        return self.src[1]

    @property
    def gate(self) -> UOp | None:
        """INDEX: the condition under which the address is valid, if any."""
        assert self.op is Ops.INDEX, self.op
        return self.src[2] if len(self.src) > 2 else None

    @property
    def address(self) -> UOp:
        """LOAD/STORE: the INDEX it reads or writes; COPY_ASYNC: the INDEX of local memory it writes."""
        assert self.op in (Ops.LOAD, Ops.STORE, Ops.COPY_ASYNC), self.op
        return self.src[0]

    @property
    def copies_in_flight(self) -> int | None:
        """BARRIER: None where it waits for no asynchronous copy; for arg ("async", n), how many of the thread's
        latest groups of COPY_ASYNCs may still be in flight after it (0: every copy has landed)."""
        assert self.op is Ops.BARRIER, self.op
        return self.arg[1] if isinstance(self.arg, tuple) and self.arg[:1] == ("async",) else None

    @property
    def copied_from(self) -> UOp:
        """COPY_ASYNC: the INDEX of global memory it reads (where its gate is false, it writes zeros)."""
        assert self.op is Ops.COPY_ASYNC, self.op
        return self.src[1]

    @property
    def alternative(self) -> UOp | None:
        """LOAD: the value taken where the INDEX's gate is false."""
        assert self.op is Ops.LOAD, self.op
        alts = [s for s in self.src[1:] if s.op not in (Ops.BARRIER, Ops.COPY_ASYNC)]
        return alts[0] if alts else None

    @property
    def waits_for(self) -> tuple[UOp, ...]:
        """LOAD: the barriers and asynchronous copies it is ordered after."""
        assert self.op is Ops.LOAD, self.op
        return tuple(s for s in self.src[1:] if s.op in (Ops.BARRIER, Ops.COPY_ASYNC))

    @property
    def value(self) -> UOp:
        """STORE/ASSIGN/WRITE: the value written; REDUCE: the value reduced."""
        if self.op in (Ops.STORE, Ops.ASSIGN):
            return self.src[1]
        if self.op is Ops.WRITE:
            return self.src[2]
        assert self.op is Ops.REDUCE, self.op
        return self.src[0]

    @property
    def buffer(self) -> UOp:
        """READ/WRITE (kernel AST): the DEFINE_GLOBAL it reads or writes."""
        assert self.op in (Ops.READ, Ops.WRITE), self.op
        return self.src[0]

    @property
    def view(self) -> View | None:
        """READ/WRITE (kernel AST): the View through which it reads or writes its buffer; CONST and ARANGE: the View
        that masks and shapes it in a kernel AST (None at the tensor level, and for a plain constant)."""
        if self.op is Ops.CONST or self.op is Ops.ARANGE:
            return self.src[0].arg if self.src and self.src[0].op is Ops.VIEW else None
        assert self.op in (Ops.READ, Ops.WRITE), self.op
        return self.src[1].arg

    @property
    def source(self) -> UOp:
        """The one value a one-input op reads: movement and unary ALU ops, REDUCE_AXIS, CAST, BITCAST, CONTIGUOUS ..."""
        assert self.op in _ONE_INPUT, self.op
        return self.src[0]

    @property
    def target(self) -> UOp:
        """ASSIGN (tensor level): the view of memory it writes."""
        assert self.op is Ops.ASSIGN, self.op
        return self.src[0]

    @property
    def ranges(self) -> tuple[UOp, ...]:
        """REDUCE: the loops it reduces over."""
        assert self.op is Ops.REDUCE, self.op
        return self.src[1:]

    @property
    def end(self) -> UOp:
        """RANGE: the loop's bound."""
        assert self.op is Ops.RANGE, self.op
        return self.src[0]

    @property
    def condition(self) -> UOp:
        """IF: the bool under which its block runs."""
        assert self.op is Ops.IF, self.op
        return self.src[0]

    @property
    def opened(self) -> UOp:
        """ENDRANGE/ENDIF: the RANGE or IF whose block it closes."""
        assert self.op in (Ops.ENDRANGE, Ops.ENDIF), self.op
        return self.src[0]

    # ---- tensor-level graph: shape and device

    def _sources_know(self, name: str) -> None:
        """Make sure every source has cached property `name`, computing bottom-up (no deep recursion) below the
        sources that lack it alone (x + 1 over a long lazy chain: the constant's few nodes, not the chain)."""
        for s in self.src:
            if name not in s.__dict__:
                for x in _post_order(s, name):
                    getattr(x, name)

    @cached_property
    def shape(self) -> tuple[int, ...]:
        """The shape of a tensor-level node (or of a kernel AST's VIEW, READ, WRITE or CONST with a view)."""
        op = self.op
        if op is Ops.BUFFER:
            return (self.arg[1],)
        if op is Ops.VIEW:
            return self.arg.shape
        if op in (Ops.RESHAPE, Ops.EXPAND):
            return self.arg
        self._sources_know("shape")
        if op is Ops.CONST:
            return self.src[0].shape if self.src and self.src[0].op is Ops.VIEW else ()
        if op is Ops.ARANGE:
            return self.src[0].shape if self.src[0].op is Ops.VIEW else (self.arg,)
        if op is Ops.READ or op is Ops.WRITE:
            return self.src[1].shape
        if not self.src:
            return ()  # kernel-level leaves (DEFINE_GLOBAL, RANGE ...) have no tensor shape
        src = self.src[0].shape
        if op is Ops.PERMUTE:
            return tuple(src[i] for i in self.arg)
        if op is Ops.PAD:
            if _symbolic(self.arg) or any(type(x) is not int for x in src):
                return tuple(_size(s + b + a) for s, (b, a) in zip(src, self.arg))
            return tuple(s + b + a for s, (b, a) in zip(src, self.arg))
        if op is Ops.SHRINK:
            if _symbolic(self.arg) or any(type(x) is not int for x in src):
                return tuple(_size(hi - lo) for lo, hi in self.arg)
            return tuple(hi - lo for lo, hi in self.arg)
        if op is Ops.REDUCE_AXIS:
            return tuple(1 if i in self.arg[1] else s for i, s in enumerate(src))
        if op is Ops.SINK or op is Ops.DEVICE:
            return ()
        if op is Ops.MULTI and self.arg is not None:  # the shards side by side along the axis
            axis = self.arg
            return (*src[:axis], sum(s.shape[axis] for s in self.src), *src[axis + 1 :])
        for s in self.src[1:]:  # (in a kernel AST a reduction's value, size 1 along its reduced dims, is read along
            # them by another reduction's source: a row's mean inside its variance. Tensor-level sources are alike)
            if (other := s.shape) != src and len(other) == len(src) and op in GroupOp.Elementwise:
                src = tuple(b if type(a) is int and a == 1 else a for a, b in zip(src, other))
        return src

    def take_shape_of(self, src: UOp) -> None:
        """A new elementwise node's shape and device are its first source's (broadcast already): where src knows
        both, they are set here, so that the cached properties do not walk down the graph for them."""
        known, first = self.__dict__, src.__dict__
        if "shape" not in known and "shape" in first and "device" in first:
            known["shape"], known["device"] = first["shape"], first["device"]

    def set_shape(self, shape: tuple[int, ...], device: str | tuple[str, ...]) -> None:
        """Set the shape and device of a node whose maker knows them (a cached schedule's view of a buffer), ahead
        of the cached properties."""
        self.__dict__["shape"], self.__dict__["device"] = shape, device

    @cached_property
    def device(self) -> str:
        """The device a tensor-level node lives on: its first source's, down to a DEVICE, a COPY (to its DEVICE), or
        a BUFFER or CONST (on theirs); a MULTI's is the tuple of its sources' devices."""
        if (found := _own_device(self)) is not None:
            return found
        below: list[UOp] = []  # first sources that do not know theirs yet, walked without recursion
        u = self.src[0]
        while (found := u.__dict__.get("device")) is None and (found := _own_device(u)) is None:
            below.append(u)
            u = u.src[0]
        for v in below:  # each one's device is its first source's: the same one
            v.__dict__["device"] = found
        return found

    # ---- value bounds, for symbolic simplification

    @cached_property
    def vmin_vmax(self) -> tuple[int | float, int | float]:
        return _bounds(self)

    @property
    def vmin(self) -> int | float:
        return self.vmin_vmax[0]

    @property
    def vmax(self) -> int | float:
        return self.vmin_vmax[1]


_CACHE = UOp._cache
_BINDS_MADE = [False]  # whether any Variable was bound in this process (until then the scheduler looks for none)


def binds_made() -> bool:
    return _BINDS_MADE[0]


_new_object = object.__new__
# make_node(UOp, op, dtype, src, arg) is the node UOp(op, dtype, src, arg) is, without the class call, which enters
# __new__ from C (a quarter of a node's cost when it exists already): for the few places that make nodes for every op
make_node = UOp.__new__


def record_below(root: UOp, key: str, of: Callable[[UOp], Any]) -> Any:
    """A per-node record kept in each node's dict under `key`: root's, computed by `of` for root and every node below
    it that has none yet, each after its sources (so `of` reads its sources' records). A graph asked again costs a
    lookup; a new node over a big graph, the walk over its few new nodes."""
    d = root.__dict__
    if key in d:
        return d[key]
    for x in _post_order(root, key):
        x.__dict__[key] = of(x)
    return d[key]


def _post_order(root: UOp, lacking: str | None = None) -> list[UOp]:
    """root and the nodes below it, each after its sources (depth first, without recursion); with `lacking`, only
    those without that cached property: the walk stops at nodes that have it (a new node over a big graph whose
    nodes know their shapes walks the few new ones, not the graph)."""
    out: list[UOp] = []
    done: set[UOp] = set()
    stack: list[tuple[UOp, bool]] = [(root, False)]
    while stack:
        node, expanded = stack.pop()
        if node in done:
            continue
        if expanded:
            done.add(node)
            out.append(node)
            continue
        stack.append((node, True))
        stack.extend(
            (s, False) for s in reversed(node.src) if s not in done and (lacking is None or lacking not in s.__dict__)
        )
    return out


def _own_device(u: UOp) -> str | None:
    """The device of a node that says it itself (a DEVICE, COPY, BUFFER or CONST, or a node without sources); None
    for a node on its first source's."""
    op = u.op
    if op is Ops.DEVICE:
        return u.arg
    if op is Ops.COPY:
        return u.src[1].arg
    if op is Ops.MULTI:
        return tuple(s.device for s in u.src)  # type: ignore[return-value]
    if not u.src:
        return ""
    if op is Ops.BUFFER or op is Ops.CONST or op is Ops.ARANGE:
        return u.src[0].arg
    return None


def _size_expr(u: UOp) -> bool:
    """Whether an int node is a size expression of bound Variables (what a tensor's shape holds)."""
    from tiny.ir.sint import is_size_expr

    return u.dtype is dtypes.int32 and any(x.op is Ops.BIND for x in u.toposort) and is_size_expr(u)


def _symbolic(arg: tuple) -> bool:
    """Whether a PAD or SHRINK's pairs hold a symbolic size."""
    return any(type(x) is not int for pair in arg for x in pair)


def _size(x: int | UOp) -> int | UOp:
    """A shape entry computed from symbolic ones, simplified (an int where it is one)."""
    if type(x) is int:
        return x
    from tiny.ir.sint import ssimplify

    return ssimplify(x)


def _unflatten(flat: list[tuple[Ops, DType, tuple[int, ...], Any]]) -> UOp:
    built: list[UOp] = []
    for op, dtype, src, arg in flat:
        built.append(UOp(op, dtype, tuple(built[i] for i in src), arg))
    return built[-1]


def _dtype_bounds(dtype: DType) -> tuple[int | float, int | float]:
    return (dtype.min, dtype.max) if dtype.count == 1 else (-math.inf, math.inf)


def _bounds(u: UOp) -> tuple[int | float, int | float]:
    """Conservative [min, max] of an integer or bool UOp's value; the dtype's range when unknown."""
    if _bounds_are_dtype_range(u):
        return _dtype_bounds(u.dtype)
    if any("vmin_vmax" not in s.__dict__ for s in u.src):
        _fill_bounds_below(u)
    if u.op is Ops.CONST:
        return (u.arg, u.arg)
    if u.op is Ops.RANGE:
        return (0, u.end.vmax - 1)
    if u.op is Ops.SPECIAL:
        return (0, u.arg[1] - 1)
    if u.op is Ops.DEFINE_VAR:
        return (u.arg[1], u.arg[2])
    if u.op is Ops.BIND:  # (its variable's range, not its value: a bound size is any size of the range)
        return (u.src[0].arg[1], u.src[0].arg[2])
    lo, hi = _dtype_bounds(u.dtype)
    if u.op in GroupOp.ALU and u.op is not Ops.WHERE:
        vs = [s.vmin_vmax for s in u.src]
        r = _alu_bounds(u.op, vs)
        if r is not None and lo <= r[0] and r[1] <= hi:
            return r
    if u.op is Ops.WHERE:
        (a0, a1), (b0, b1) = u.src[1].vmin_vmax, u.src[2].vmin_vmax
        return (min(a0, b0), max(a1, b1))
    if u.op is Ops.CAST and not u.src[0].dtype.is_float:
        s0, s1 = u.src[0].vmin_vmax
        if lo <= s0 and s1 <= hi:
            return (s0, s1)
    return (lo, hi)


def _bounds_are_dtype_range(u: UOp) -> bool:
    """Floats, vectors and void get the whole range of their dtype, without looking at their sources."""
    return u.dtype.is_float or u.dtype.count != 1 or u.dtype.kind == "v"


def _fill_bounds_below(u: UOp) -> None:
    """Compute (and cache) the bounds of u's sources deepest first, so that a deep graph never recurses."""
    stack: list[tuple[UOp, bool]] = [(s, False) for s in u.src]
    while stack:
        node, ready = stack.pop()
        if "vmin_vmax" in node.__dict__:
            continue
        if ready or _bounds_are_dtype_range(node):
            node.vmin_vmax  # noqa: B018  (its sources are known now: this does not recurse)
            continue
        stack.append((node, True))
        stack.extend((s, False) for s in node.src if "vmin_vmax" not in s.__dict__)


def _alu_bounds(op: Ops, vs: list[tuple[Any, Any]]) -> tuple[Any, Any] | None:
    if op is Ops.NEG:
        return (-vs[0][1], -vs[0][0])
    (a0, a1), (b0, b1) = vs[0], vs[1] if len(vs) > 1 else (0, 0)
    if op is Ops.ADD:
        return (a0 + b0, a1 + b1)
    if op is Ops.MUL:
        c = (a0 * b0, a0 * b1, a1 * b0, a1 * b1)
        return (min(c), max(c))
    if op is Ops.MAX:
        return (max(a0, b0), max(a1, b1))
    if op is Ops.IDIV and b0 == b1 and b0 > 0 and a0 >= 0:
        return (a0 // b0, a1 // b0)
    if op is Ops.IDIV and b0 > 0 and a0 >= 0:
        return (a0 // b1, a1 // b0)
    if op is Ops.MOD and b0 > 0 and a0 >= 0:
        return (0, min(a1, b1 - 1))
    if op is Ops.MOD and b0 > 0:
        return (-(b1 - 1), b1 - 1) if a1 > 0 else (-(b1 - 1), 0)
    if op is Ops.CMPLT:
        return (a1 < b0, a0 < b1)
    if op is Ops.CMPNE:
        if a1 < b0 or b1 < a0:
            return (True, True)
        return (False, False) if a0 == a1 == b0 == b1 else (False, True)
    if op is Ops.AND and a0 >= 0 and b0 >= 0:
        return (0, min(a1, b1)) if not isinstance(a1, bool) else (a0 and b0, a1 and b1)
    if op is Ops.OR and isinstance(a1, bool):
        return (a0 or b0, a1 or b1)
    return None


def pretty(root: UOp, max_nodes: int = 400) -> str:
    """A readable, indented printout; a node seen before prints as its number."""
    names: dict[UOp, int] = {}
    lines: list[str] = []

    def walk(u: UOp, depth: int) -> None:
        pad = "  " * depth
        if u in names:
            lines.append(f"{pad}%{names[u]}")
            return
        if len(names) >= max_nodes:
            lines.append(f"{pad}...")
            return
        names[u] = len(names)
        arg = "" if u.arg is None else f", arg={u.arg!r}"
        dtype = "" if u.dtype is dtypes.void else f", {u.dtype!r}"
        head = f"{pad}%{names[u]} = {u.op!r}{dtype}{arg}"
        lines.append(head + (")" if not u.src else ", src=("))
        for s in u.src:
            walk(s, depth + 1)
        if u.src:
            lines.append(f"{pad})")

    walk(root, 0)
    return "\n".join(lines)


def substitute(root: UOp, mapping: dict[UOp, UOp], done: dict[UOp, UOp] | None = None) -> UOp:
    """Replace nodes by the mapping, rebuilding everything above them. `done`: what earlier calls with the same
    mapping made of their nodes (graphs that share nodes are rebuilt once), and where this call's are added."""
    if not mapping:
        return root
    if done is None:
        done = {}
    for u in root.toposort:
        if u in done:
            continue
        if u in mapping:
            done[u] = mapping[u]
            continue
        src = tuple(done[s] for s in u.src)
        done[u] = u if src == u.src else u.replace(src=src)
    return done[root]


K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


def evaluate(
    root: K, children: Callable[[K], list[K]], combine: Callable[[K, list[V]], V], done: dict[K, V] | None = None
) -> V:
    """Compute combine(key, values of its children) for root and everything below it, each key once,
    without recursion (graphs thousands of nodes deep are fine). children is asked once per key. `done`: the
    values computed by earlier calls (their keys are not computed again), and where this call's are added."""
    if done is None:
        done = {}
    kids: dict[K, list[K]] = {}
    stack = [root]
    while stack:
        key = stack[-1]
        if key in done:
            stack.pop()
        elif key not in kids:
            kids[key] = children(key)
            stack.extend(c for c in reversed(kids[key]) if c not in done)  # first child first
        else:
            stack.pop()
            done[key] = combine(key, [done[c] for c in kids[key]])
    return done[root]
