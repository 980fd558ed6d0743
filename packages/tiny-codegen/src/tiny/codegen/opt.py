"""Optimization actions on a kernel's iteration space, each checked for legality before it applies.

A kernel iterates over its full shape: the output dims, plus the reduced dims when every reduction in it
reduces the same shape over the same axes. Each dim of size > 1 starts as one part; an action cuts a part
in two and gives one piece a kind that says how lowering walks it:

  global   a loop over outputs (on GPUs the innermost three are hardware group ids)
  thread   the outermost piece of one output dim, split across CPU cores (a hardware group id on the CPU)
  local    a workgroup dim (hardware local ids)
  reduce   a loop inside the reduction
  group    a reduce piece split across the threads of a workgroup, combined through local memory
  upcast   an output piece computed as separate values in registers (register tiling, vectors)
  unroll   a reduce piece written out in full inside the loop

A dim's index is the sum of its parts' indices times their strides. `Opt(op, axis, arg)` names the part by
its place among the global and reduce parts (globals first), as `Kernel.axes` lists them.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass, field, replace

from tiny.ir.device import RendererCaps
from tiny.ir.uop import Ops, UOp

MAX_LANES = 512  # upcast x unroll: values computed side by side in one thread
MAX_THREADS = 64


class OptOps(enum.Enum):
    UPCAST = "upcast"  # register-tile an output part by arg (0: all of it)
    UNROLL = "unroll"  # write out arg iterations of a reduce part
    LOCAL = "local"  # move arg of an output part into the workgroup
    GROUP = "group"  # split arg of a reduce part across workgroup threads (the inner piece)
    GROUPTOP = "grouptop"  # the same with the outer piece
    PADTO = "padto"  # pad a whole dim up to a multiple of arg, masking the extra
    SWAP = "swap"  # exchange the loop order of two output parts (arg: the other part)
    THREAD = "thread"  # split an output part across arg CPU threads (the outer piece)
    TC = "tc"  # map a matrix product onto the renderer's tensor cores (arg: which one)


@dataclass(frozen=True)
class Opt:
    op: OptOps
    axis: int
    arg: int = 0

    def __repr__(self) -> str:
        return f"Opt({self.op.name}, {self.axis}, {self.arg})"


class KernelOptError(ValueError):
    """An action that is not legal on this kernel, with the reason."""


class Kind(enum.Enum):
    GLOBAL = "global"
    THREAD = "thread"
    LOCAL = "local"
    REDUCE = "reduce"
    GROUP = "group"
    UPCAST = "upcast"
    UNROLL = "unroll"


LANES = (Kind.UPCAST, Kind.UNROLL)


@dataclass(frozen=True)
class Part:
    dim: int  # the dim of the full shape this part indexes
    size: int
    stride: int  # the part's index counts this much in the dim's index
    kind: Kind


@dataclass
class Kernel:
    """A kernel AST with the plan of how its iteration space is cut into parts."""

    ast: UOp
    caps: RendererCaps
    full_shape: tuple[int, ...] = ()
    reduce_dims: frozenset[int] = frozenset()
    parts: list[Part] = field(default_factory=list)
    padded: dict[int, int] = field(default_factory=dict)  # dim -> its size after padding
    applied: list[Opt] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.out_shape: tuple[int, ...] = self.store.src[1].arg.shape
        self.reductions = [u for u in self.ast.toposort if u.op is Ops.REDUCE_AXIS]
        signatures = {(r.src[0].shape, tuple(a for a in r.arg[1] if r.src[0].shape[a] != 1)) for r in self.reductions}
        if len(signatures) == 1 and all(s > 0 for s in next(iter(signatures))[0]):
            shape, axes = signatures.pop()
            self.full_shape, self.reduce_dims = shape, frozenset(axes)
        else:  # several kinds of reduction (or none): only the output dims are planned
            self.full_shape, self.reduce_dims = self.out_shape, frozenset()
        globals_ = [
            Part(d, s, 1, Kind.GLOBAL) for d, s in enumerate(self.full_shape) if s > 1 and d not in self.reduce_dims
        ]
        reduces = [Part(d, s, 1, Kind.REDUCE) for d, s in enumerate(self.full_shape) if s > 1 and d in self.reduce_dims]
        self.parts = globals_ + reduces

    @property
    def store(self) -> UOp:
        return self.ast.src[0]

    @property
    def empty(self) -> bool:
        return any(s == 0 for s in self.out_shape)

    @property
    def axes(self) -> list[Part]:
        """The parts an action can still cut: global parts first, then reduce parts."""
        return self.of_kind(Kind.GLOBAL) + self.of_kind(Kind.REDUCE)

    def of_kind(self, kind: Kind) -> list[Part]:
        return [p for p in self.parts if p.kind is kind]

    def lanes(self) -> int:
        return math.prod(p.size for p in self.parts if p.kind in LANES)

    def copy(self) -> Kernel:
        k = Kernel(self.ast, self.caps)
        k.parts, k.padded, k.applied = list(self.parts), dict(self.padded), list(self.applied)
        return k

    # ---- actions

    def apply_opts(self, opts: list[Opt] | tuple[Opt, ...]) -> Kernel:
        for opt in opts:
            self.apply(opt)
        return self

    def apply(self, opt: Opt) -> None:
        """Apply one action, or raise KernelOptError (leaving the kernel as it was) if it is not legal here."""
        if self.empty:
            raise KernelOptError("an empty kernel has nothing to optimize")
        axes = self.axes
        if not 0 <= opt.axis < len(axes):
            raise KernelOptError(f"{opt}: axis {opt.axis} does not exist; this kernel has {len(axes)} axes")
        part = axes[opt.axis]
        handler = {
            OptOps.UPCAST: self._upcast,
            OptOps.UNROLL: self._unroll,
            OptOps.LOCAL: self._local,
            OptOps.GROUP: self._group,
            OptOps.GROUPTOP: self._group,
            OptOps.PADTO: self._padto,
            OptOps.SWAP: self._swap,
            OptOps.THREAD: self._thread,
            OptOps.TC: self._tc,
        }[opt.op]
        handler(opt, part)
        self.applied.append(opt)

    def _amount(self, opt: Opt, part: Part) -> int:
        amt = part.size if opt.arg == 0 else opt.arg
        if amt <= 1 or part.size % amt != 0:
            raise KernelOptError(f"{opt}: {amt} does not split a part of size {part.size}")
        return amt

    def _need(self, opt: Opt, part: Part, kind: Kind) -> None:
        if part.kind is not kind:
            raise KernelOptError(f"{opt}: needs a {kind.value} axis, axis {opt.axis} is {part.kind.value}")

    def _split(self, part: Part, amt: int, kind: Kind, top: bool, first: bool = False) -> None:
        """Cut `amt` off `part` (the inner piece, or the outer one if top) as a new part of `kind`."""
        rest_size = part.size // amt
        if top:
            new, rest = Part(part.dim, amt, part.stride * rest_size, kind), replace(part, size=rest_size)
        else:
            new, rest = Part(part.dim, amt, part.stride, kind), replace(part, size=rest_size, stride=part.stride * amt)
        i = self.parts.index(part)
        self.parts[i : i + 1] = [rest] if rest_size > 1 else []
        if first:
            self.parts.insert(0, new)
        else:
            self.parts.append(new)

    def _check_lanes(self, opt: Opt, amt: int) -> None:
        if self.lanes() * amt > MAX_LANES:
            raise KernelOptError(f"{opt}: {self.lanes() * amt} values per thread is more than {MAX_LANES}")

    def _upcast(self, opt: Opt, part: Part) -> None:
        self._need(opt, part, Kind.GLOBAL)
        amt = self._amount(opt, part)
        self._check_lanes(opt, amt)
        self._split(part, amt, Kind.UPCAST, top=False)

    def _unroll(self, opt: Opt, part: Part) -> None:
        self._need(opt, part, Kind.REDUCE)
        amt = self._amount(opt, part)
        self._check_lanes(opt, amt)
        self._split(part, amt, Kind.UNROLL, top=False)

    def _local(self, opt: Opt, part: Part) -> None:
        if not self.caps.has_local:
            raise KernelOptError(f"{opt}: the {self.caps.language} renderer has no workgroups")
        self._need(opt, part, Kind.GLOBAL)
        amt = self._amount(opt, part)
        workgroup = self.of_kind(Kind.LOCAL) + self.of_kind(Kind.GROUP)
        total = math.prod(p.size for p in workgroup) * amt
        if len(workgroup) >= 3 or (self.caps.local_total_max and total > self.caps.local_total_max):
            raise KernelOptError(f"{opt}: a workgroup of {total} threads in {len(workgroup) + 1} dims is too big")
        self._check_local_max(opt, amt)
        self._split(part, amt, Kind.LOCAL, top=False)

    def _check_local_max(self, opt: Opt, amt: int) -> None:
        """A new workgroup part of amt threads becomes lidx0 (the others move out by one): each dim within its limit."""
        sizes = [amt] + [p.size for p in reversed(self.parts) if p.kind in (Kind.LOCAL, Kind.GROUP)]
        limits = self.caps.local_max or ()
        if any(size > limit for size, limit in zip(sizes, limits)):
            raise KernelOptError(f"{opt}: workgroup dims {sizes} exceed the renderer's limits {list(limits)}")

    def _group(self, opt: Opt, part: Part) -> None:
        if not self.caps.has_shared:
            raise KernelOptError(f"{opt}: the {self.caps.language} renderer has no local memory")
        self._need(opt, part, Kind.REDUCE)
        if self.of_kind(Kind.GROUP):
            raise KernelOptError(f"{opt}: the reduction is split across the workgroup already")
        if len(self.reductions) != 1:
            raise KernelOptError(f"{opt}: grouping needs exactly one reduction, this kernel has {len(self.reductions)}")
        if len(self.of_kind(Kind.LOCAL)) >= 3 or len(self.of_kind(Kind.GLOBAL)) > 3:
            # a third workgroup dim is not left, or output loops would reuse local memory without a second barrier
            raise KernelOptError(f"{opt}: grouping needs a free workgroup dim and at most 3 global dims")
        amt = self._amount(opt, part)
        threads = math.prod(p.size for p in self.of_kind(Kind.LOCAL)) * amt
        if self.caps.local_total_max and threads > self.caps.local_total_max:
            raise KernelOptError(f"{opt}: a workgroup of {threads} threads is too big")
        self._check_local_max(opt, amt)
        itemsize = self.reductions[0].dtype.itemsize
        if threads * self.lanes() * itemsize > self.caps.shared_max:
            raise KernelOptError(f"{opt}: {threads * self.lanes() * itemsize} bytes of local memory is too much")
        self._split(part, amt, Kind.GROUP, top=opt.op is OptOps.GROUPTOP)

    def _padto(self, opt: Opt, part: Part) -> None:
        size = self.full_shape[part.dim]
        if part.dim in self.padded or part.size != size or part.stride != 1:
            raise KernelOptError(f"{opt}: only a whole dim that is not cut or padded yet can be padded")
        if opt.arg <= 1:
            raise KernelOptError(f"{opt}: pad to a multiple of at least 2")
        padded = -(-size // opt.arg) * opt.arg
        if padded == size or padded > 2 * size:
            raise KernelOptError(
                f"{opt}: padding {size} to {padded} {'changes nothing' if padded == size else 'doubles it'}"
            )
        self.parts[self.parts.index(part)] = replace(part, size=padded)
        self.padded[part.dim] = padded

    def _swap(self, opt: Opt, part: Part) -> None:
        self._need(opt, part, Kind.GLOBAL)
        axes = self.axes
        if not 0 <= opt.arg < len(axes) or opt.arg == opt.axis or axes[opt.arg].kind is not Kind.GLOBAL:
            raise KernelOptError(f"{opt}: swaps two different global axes")
        other = axes[opt.arg]
        i, j = self.parts.index(part), self.parts.index(other)
        self.parts[i], self.parts[j] = other, part

    def _thread(self, opt: Opt, part: Part) -> None:
        if self.caps.threads <= 1:
            raise KernelOptError(f"{opt}: the {self.caps.language} renderer runs a kernel on one thread")
        self._need(opt, part, Kind.GLOBAL)
        if self.of_kind(Kind.THREAD):
            raise KernelOptError(f"{opt}: the kernel is split across threads already")
        amt = self._amount(opt, part)
        if amt > MAX_THREADS:
            raise KernelOptError(f"{opt}: {amt} threads is more than {MAX_THREADS}")
        self._split(part, amt, Kind.THREAD, top=True, first=True)

    def _tc(self, opt: Opt, part: Part) -> None:
        if not self.caps.tensor_cores:
            raise KernelOptError(f"{opt}: the {self.caps.language} renderer declares no tensor cores")
        raise KernelOptError(f"{opt}: the {self.caps.language} renderer has no tensor-core lowering")

    # ---- what lowering reads

    def describe(self) -> str:
        return " ".join(f"{p.kind.value}{p.size}@{p.dim}" for p in self.parts) + (
            f" padded {self.padded}" if self.padded else ""
        )
