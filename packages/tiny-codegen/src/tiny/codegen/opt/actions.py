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
  tc       a tile piece of a matrix product's M, N or K dim on a tensor core: the warp's lanes and their fragment
           elements index it, each operand by its own layout (tiny.ir.tensorcore)

ROWS (on a GPU, a kernel whose reductions do not vary along one of its output dims: a softmax's or a norm's rows, each
element reading its row's max and sum) cuts that output part and the reduce part by the same number of threads, a
local piece and a group piece that are one hardware index: the workgroup's threads share each reduction of the row
(each reduces every n-th value, the partials combined through local memory), then each computes every n-th value of
the row's output.

STAGE (on a kernel mapped onto tensor cores) cuts nothing: each iteration of the K loop, the workgroup's threads
together copy the A and B tiles the iteration reads into local memory, and the warps read their fragments there.
Its arg says how: 0, through registers (each value loaded, then stored); n >= 1, with asynchronous copies of 16
bytes (RendererCaps.async_copy) n K steps ahead, in n + 1 buffers: the next n iterations' tiles are on their way while
this one's are read.

A dim's index is the sum of its parts' indices times their strides. `Opt(op, axis, arg)` names the part by
its place among the global and reduce parts (globals first), as `Kernel.axes` lists them.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Collection
from dataclasses import dataclass, field, replace

from tiny.ir.device import RendererCaps
from tiny.ir.dtypes import DType
from tiny.ir.sint import sadd, sfloordiv, sint, smul
from tiny.ir.symbolic import known_multiple
from tiny.ir.tensorcore import TensorCore
from tiny.ir.uop import Ops, UOp
from tiny.ir.views import Band, Mask, View

MAX_LANES = 1024  # upcast x unroll: values computed side by side in one thread
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
    ROWS = "rows"  # share arg threads between an output part the reductions do not vary along and the reduce part
    STAGE = "stage"  # copy the tensor-core operands' tiles of each iteration of the K loop (axis) to local memory
    # (arg 0: through registers; 1: asynchronously, a K step ahead)


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
    TC = "tc"


LANES = (Kind.UPCAST, Kind.UNROLL)
IN_BLOCK = (Kind.TC, Kind.UPCAST, Kind.UNROLL, Kind.LOCAL)  # the pieces one workgroup covers in one iteration
STAGE_AHEAD_MAX = 4  # STAGE's furthest asynchronous copies: 4 K steps ahead (5 buffers)
ASYNC_BYTES = 16  # what one asynchronous staged copy moves (cp.async.cg's one size)


@dataclass(frozen=True)
class Part:
    dim: int  # the dim of the full shape this part indexes
    size: int
    stride: int  # the part's index counts this much in the dim's index
    kind: Kind


@dataclass(frozen=True)
class TensorCoreUse:
    """A matrix product mapped onto a tensor core: which dims are its M, N and K, and the AST pieces whose values
    are the A and B operands (in the tensor core's dtype_in)."""

    core: TensorCore
    m: int
    n: int
    k: int
    a: UOp
    b: UOp


def _dim(size: int | UOp) -> bool:
    """Whether a dim of the kernel's shape is a loop (more than one element, or a symbolic size)."""
    return type(size) is not int or size > 1


def merge_dims(ast: UOp) -> UOp:
    """The kernel with each pair of neighbouring dims that every view reads and writes as one run of memory merged
    into one dim (both outputs or both reduced): a 128 x 32 x 20 x 20 elementwise kernel over contiguous buffers is
    128 x 32 x 400, whose rows take whole 8-float vectors where 20 takes halves at most."""
    views = [u for u in ast.toposort if u.op is Ops.VIEW]
    reductions = [u for u in ast.toposort if u.op is Ops.REDUCE_AXIS]
    if not views or len({len(u.arg.shape) for u in views}) != 1:
        return ast
    if any(r.source.shape != reductions[0].source.shape or r.arg[1] != reductions[0].arg[1] for r in reductions):
        return ast
    reduced = set(reductions[0].arg[1]) if reductions else set()
    merged = {u: u.arg for u in views}
    ndim = len(views[0].arg.shape)
    for d in reversed(range(ndim - 1)):
        if (d in reduced) != (d + 1 in reduced):
            continue
        tried = {}
        for u, v in merged.items():
            shape = v.shape[:d] + (smul(v.shape[d], v.shape[d + 1]),) + v.shape[d + 2 :]
            if (w := v.reshape(shape)) is None:
                break
            tried[u] = w
        else:
            merged = tried
            reduced = {a - 1 if a > d else a for a in reduced}
    if all(merged[u] is u.arg for u in views):
        return ast
    done: dict[UOp, UOp] = {}
    for u in ast.toposort:
        src = tuple(done[s] for s in u.src)
        if u.op is Ops.VIEW:
            done[u] = UOp(Ops.VIEW, u.dtype, src, merged[u])
        elif u.op is Ops.REDUCE_AXIS:
            done[u] = UOp(u.op, u.dtype, src, (u.arg[0], tuple(sorted(reduced))))
        else:
            done[u] = u if src == u.src else u.replace(src=src)
    return done[ast]


def merge_windows(ast: UOp) -> UOp:
    """The kernel with each sum of loads that together walk a window read as one load.

    A convolution's or pool's window is a sum of views of one buffer, one per kernel offset, each padded into its
    slot of the kernel-sized dims: every load but one reads padding at any point of those dims. Where the slots
    cover the kernel dims exactly once and each offset's start moves by a fixed stride per slot, the sum is the
    buffer read through one view that walks those dims with those strides: one load instead of k*k gated ones,
    and the kernel dims are free to be tiled or looped over like any other. Where the input is padded along a dim
    the window slides over (its rows), the offsets' masks on the output dim differ by the offset: the one view
    keeps that as a band (the rows read lie inside the input), which tiny.codegen.narrow turns into loop bounds."""
    adds = [u for u in ast.toposort if u.op is Ops.ADD]
    inner = {s for u in adds for s in u.src if s.op is Ops.ADD}
    done: dict[UOp, UOp] = {}
    for u in ast.toposort:
        src = tuple(done[s] for s in u.src)
        new = u if src == u.src else u.replace(src=src)
        if u.op is Ops.ADD and u not in inner and (one := _window_load(_summands(new))) is not None:
            new = one
        done[u] = new
    return done[ast]


def _summands(u: UOp) -> list[UOp]:
    """The terms of a tree of ADDs (walked with a stack: a sum of 1000 tensors is a chain 1000 deep)."""
    terms, todo = [], [u]
    while todo:
        x = todo.pop()
        if x.op is Ops.ADD:
            todo.extend(reversed(x.src))
        else:
            terms.append(x)
    return terms


def _window_load(terms: list[UOp]) -> UOp | None:
    """One READ equal to the sum of `terms`, if they are reads of one buffer that walk a window (merge_windows)."""
    if len(terms) < 2 or any(t.op is not Ops.READ for t in terms):
        return None
    buf, views = terms[0].buffer, [t.view for t in terms]
    shape = views[0].shape
    if any(t.buffer is not buf or v.shape != shape for t, v in zip(terms, views)):
        return None
    masks = [v.mask or tuple((0, s) for s in shape) for v in views]
    walked, strides, banded = [], list(views[0].strides), []
    for d in range(len(shape)):
        alike = len({v.strides[d] for v in views}) == 1
        if alike and len({m[d] for m in masks}) == 1:
            continue  # every term reads this dim alike
        if all(v.strides[d] == 0 and hi - lo == 1 for v, (lo, hi) in zip(views, (m[d] for m in masks))):
            walked.append(d)
        elif alike:
            banded.append(d)  # read alike, masked by the slot
        else:
            return None  # neither alike nor one slot per term
    slots = [tuple(m[d][0] for d in walked) for m in masks]
    if not walked or len(set(slots)) != len(slots) or len(slots) != math.prod(shape[d] for d in walked):
        return None  # (each slot lies inside its dim: a view's mask does; distinct and as many as slots: all of them)
    offset = {slot: v.offset for slot, v in zip(slots, views)}
    base = offset[(0,) * len(walked)]
    for j, d in enumerate(walked):
        strides[d] = offset[tuple(int(i == j) for i in range(len(walked)))] - base
    if any(o != base + sum(i * strides[d] for i, d in zip(slot, walked)) for slot, o in offset.items()):
        return None
    bands = []
    for e in banded:
        band = next((b for j, d in enumerate(walked) if (b := _band(e, d, j, strides, shape, slots, masks))), None)
        if band is None:
            return None
        bands.append(band)
    mask = tuple((0, shape[d]) if d in walked or d in banded else masks[0][d] for d in range(len(shape)))
    view = View.create(shape, strides, base, mask)
    view = View(view.shape, view.strides, view.offset, view.mask, tuple(bands))
    return UOp(Ops.READ, terms[0].dtype, (buf, UOp(Ops.VIEW, arg=view)))


def _band(
    e: int, d: int, j: int, strides: list[int], shape: tuple[int, ...], slots: list[tuple[int, ...]], masks: list[Mask]
) -> Band | None:
    """The band lo <= i_e + k * i_d < hi that each term's mask along output dim e is (cut to the dim), where walked
    dim d (the j-th walked) moves k rows of e per slot; None where the masks are not that."""
    if strides[e] <= 0 or strides[d] <= 0 or strides[d] % strides[e]:
        return None
    k, size = strides[d] // strides[e], shape[e]
    shifts = [slot[j] * k for slot in slots]
    along = [m[e] for m in masks]
    los = {lo + s for (lo, _), s in zip(along, shifts) if 0 < lo < size}
    his = {hi + s for (_, hi), s in zip(along, shifts) if 0 < hi < size}
    if len(los) > 1 or len(his) > 1:
        return None
    lo = los.pop() if los else 0
    hi = his.pop() if his else size + k * (shape[d] - 1)
    for (mlo, mhi), s in zip(along, shifts):
        if (min(max(lo - s, 0), size), min(max(hi - s, 0), size)) != (mlo, mhi):
            return None
    return (e, d, k, lo, hi)


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
    tc: TensorCoreUse | None = None
    staged: bool = False  # the tensor-core operands go through local memory (STAGE)
    staged_ahead: int = 0  # ... copied asynchronously, this many K steps ahead (STAGE n); 0: through registers
    rows: Part | None = None  # ROWS's local piece: the group piece is the same hardware index

    def __post_init__(self) -> None:
        self.scheduled = self.ast  # the AST as the scheduler made it (its shape names the kernel)
        # a window one load on every device (on a GPU, where a weight gradient's window dims are output dims, each
        # value was a sum of 25 gated loads); on GPUs the dims say how workgroups are laid out: kept as scheduled
        self.ast = merge_windows(self.ast)
        if not self.caps.has_local:
            self.ast = merge_dims(self.ast)
        elif _has_rows(self.ast):  # (but a softmax's rows over attention's 4 dims take 2: ROWS needs 3 global at most)
            self.ast = merge_dims(self.ast)
        self.out_shape: tuple[int, ...] = self.write.view.shape
        self.reductions = [u for u in self.ast.toposort if u.op is Ops.REDUCE_AXIS]
        signatures = {(r.source.shape, tuple(a for a in r.arg[1] if r.source.shape[a] != 1)) for r in self.reductions}
        if len(signatures) == 1 and all(type(s) is not int or s > 0 for s in next(iter(signatures))[0]):
            shape, axes = signatures.pop()
            self.full_shape, self.reduce_dims = shape, frozenset(axes)
        else:  # several kinds of reduction (or none): only the output dims are planned
            self.full_shape, self.reduce_dims = self.out_shape, frozenset()
        shape = self.full_shape
        globals_ = [Part(d, s, 1, Kind.GLOBAL) for d, s in enumerate(shape) if _dim(s) and d not in self.reduce_dims]
        reduces = [Part(d, s, 1, Kind.REDUCE) for d, s in enumerate(shape) if _dim(s) and d in self.reduce_dims]
        self.parts = globals_ + reduces

    @property
    def write(self) -> UOp:
        """The kernel's WRITE (a scheduled kernel has one output)."""
        write, *_ = self.ast.src
        return write

    @property
    def empty(self) -> bool:
        return any(s == 0 for s in self.out_shape)

    @property
    def symbolic(self) -> bool:
        """Whether a size is a Variable's (cut only by GROUP, or by an amount it is known to be a multiple of)."""
        return any(type(p.size) is not int for p in self.parts)

    @property
    def axes(self) -> list[Part]:
        """The parts an action can still cut: global parts first, then reduce parts."""
        return self.of_kind(Kind.GLOBAL) + self.of_kind(Kind.REDUCE)

    def of_kind(self, kind: Kind) -> list[Part]:
        return [p for p in self.parts if p.kind is kind]

    def lanes(self) -> int:
        return math.prod(p.size for p in self.parts if p.kind in LANES)

    def copy(self) -> Kernel:
        k = Kernel(self.ast, self.caps)  # (merged already: merging again changes nothing)
        k.scheduled, k.parts, k.padded = self.scheduled, list(self.parts), dict(self.padded)
        k.applied, k.tc, k.staged, k.staged_ahead = list(self.applied), self.tc, self.staged, self.staged_ahead
        k.rows = self.rows
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
        if self.staged:  # (a later cut would change the tiles it copies, or remove the loop it copies in)
            raise KernelOptError(f"{opt}: STAGE is the last action on a kernel")
        axes = self.axes
        if not 0 <= opt.axis < len(axes):
            raise KernelOptError(f"{opt}: axis {opt.axis} does not exist; this kernel has {len(axes)} axes")
        part = axes[opt.axis]
        if type(part.size) is not int and opt.op not in (OptOps.GROUP, OptOps.GROUPTOP, OptOps.UPCAST, OptOps.UNROLL):
            raise KernelOptError(
                f"{opt}: axis {opt.axis} has a symbolic size ({part.size!r}), which only GROUP cuts (padded to a "
                "multiple of its threads), and UPCAST and UNROLL by an amount it is known to be a multiple of"
            )
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
            OptOps.STAGE: self._stage,
            OptOps.ROWS: self._rows,
        }[opt.op]
        handler(opt, part)
        self.applied.append(opt)

    def _amount(self, opt: Opt, part: Part) -> int:
        if type(part.size) is not int:  # (a Variable's: cut by an amount that divides it for every value it takes)
            if opt.arg <= 1 or known_multiple(part.size) % opt.arg != 0:
                raise KernelOptError(f"{opt}: {opt.arg} does not split the symbolic size {part.size!r} for every value")
            return opt.arg
        amt = part.size if opt.arg == 0 else opt.arg
        if amt <= 1 or part.size % amt != 0:
            raise KernelOptError(f"{opt}: {amt} does not split a part of size {part.size}")
        return amt

    def _need(self, opt: Opt, part: Part, kind: Kind) -> None:
        if part.kind is not kind:
            raise KernelOptError(f"{opt}: needs a {kind.value} axis, axis {opt.axis} is {part.kind.value}")

    def _split(self, part: Part, amt: int, kind: Kind, top: bool, first: bool = False) -> Part:
        """Cut `amt` off `part` (the inner piece, or the outer one if top) as a new part of `kind`."""
        rest_size = part.size // amt if type(part.size) is int else sfloordiv(part.size, amt)  # (a multiple of amt)
        if top:
            new, rest = Part(part.dim, amt, part.stride * rest_size, kind), replace(part, size=rest_size)
        else:
            new, rest = Part(part.dim, amt, part.stride, kind), replace(part, size=rest_size, stride=part.stride * amt)
        i = self.parts.index(part)
        self.parts[i : i + 1] = [rest] if type(rest_size) is not int or rest_size > 1 else []
        if first:
            self.parts.insert(0, new)
        else:
            self.parts.append(new)
        return new

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
        workgroup = self.workgroup() + self._warp()
        total = math.prod(p.size for p in workgroup) * amt
        if len(workgroup) >= 3 or (self.caps.local_total_max and total > self.caps.local_total_max):
            raise KernelOptError(f"{opt}: a workgroup of {total} threads in {len(workgroup) + 1} dims is too big")
        self._check_local_max(opt, amt)
        self._split(part, amt, Kind.LOCAL, top=False)

    def _check_local_max(self, opt: Opt, amt: int) -> None:
        """A new workgroup part of amt threads becomes lidx0 (the others move out by one): each dim within its limit."""
        sizes = [amt] + [p.size for p in reversed(self.workgroup())]
        if self.tc is not None:  # the warp's lanes are lidx0
            sizes = [self.tc.core.threads] + sizes
        limits = self.caps.local_max or ()
        if any(size > limit for size, limit in zip(sizes, limits)):
            raise KernelOptError(f"{opt}: workgroup dims {sizes} exceed the renderer's limits {list(limits)}")

    def _group(self, opt: Opt, part: Part) -> None:
        if not self.caps.has_shared:
            raise KernelOptError(f"{opt}: the {self.caps.language} renderer has no local memory")
        self._after_tc(opt)
        self._need(opt, part, Kind.REDUCE)
        if self.of_kind(Kind.GROUP):
            raise KernelOptError(f"{opt}: the reduction is split across the workgroup already")
        if len(self.reductions) != 1:
            raise KernelOptError(f"{opt}: grouping needs exactly one reduction, this kernel has {len(self.reductions)}")
        if len(self.of_kind(Kind.LOCAL)) >= 3 or len(self.of_kind(Kind.GLOBAL)) > 3:
            # a third workgroup dim is not left, or output loops would reuse local memory without a second barrier
            raise KernelOptError(f"{opt}: grouping needs a free workgroup dim and at most 3 global dims")
        amt = self._amount(opt, part) if type(part.size) is int else self._symbolic_amount(opt, part)
        threads = math.prod(p.size for p in self.of_kind(Kind.LOCAL)) * amt
        if self.caps.local_total_max and threads > self.caps.local_total_max:
            raise KernelOptError(f"{opt}: a workgroup of {threads} threads is too big")
        self._check_local_max(opt, amt)
        itemsize = self.reductions[0].dtype.itemsize
        if threads * self.lanes() * itemsize > self.caps.shared_max:
            raise KernelOptError(f"{opt}: {threads * self.lanes() * itemsize} bytes of local memory is too much")
        if type(part.size) is not int:  # padded to a multiple of amt, as PADTO pads: the padding adds the identity
            padded = smul(sfloordiv(sadd(part.size, amt - 1), amt), amt)
            self.parts[self.parts.index(part)] = part = replace(part, size=padded)
            self.padded[part.dim] = padded
        self._split(part, amt, Kind.GROUP, top=opt.op is OptOps.GROUPTOP)

    def _rows(self, opt: Opt, part: Part) -> None:
        if not self.caps.has_shared:
            raise KernelOptError(f"{opt}: the {self.caps.language} renderer has no local memory")
        self._after_tc(opt)
        self._need(opt, part, Kind.GLOBAL)
        reduces = self.of_kind(Kind.REDUCE)
        if len(reduces) != 1 or self.of_kind(Kind.GROUP) or self.of_kind(Kind.UNROLL):
            raise KernelOptError(f"{opt}: shares the one reduce part of a kernel not grouped or unrolled yet")
        if part.dim not in self.row_dims():
            raise KernelOptError(f"{opt}: a reduction varies along dim {part.dim} (or there is none) to share")
        if len(self.of_kind(Kind.LOCAL)) >= 3 or len(self.of_kind(Kind.GLOBAL)) > 3:
            raise KernelOptError(f"{opt}: sharing needs a free workgroup dim and at most 3 global dims")
        amt, red = self._amount(opt, part), reduces[0]
        if type(red.size) is not int or red.size % amt:
            raise KernelOptError(f"{opt}: {amt} threads do not split the reduce part of size {red.size}")
        threads = self.workgroup_threads() * amt
        if self.caps.local_total_max and threads > self.caps.local_total_max:
            raise KernelOptError(f"{opt}: a workgroup of {threads} threads is too big")
        self._check_local_max(opt, amt)
        need = threads * self.lanes() * sum(r.dtype.itemsize for r in self.reductions)
        if need > self.caps.shared_max:
            raise KernelOptError(f"{opt}: {need} bytes of local memory is too much")
        self.rows = self._split(part, amt, Kind.LOCAL, top=False)
        self._split(red, amt, Kind.GROUP, top=False)

    def _symbolic_amount(self, opt: Opt, part: Part) -> int:
        """GROUP's threads over a symbolic reduce dim: a whole dim (symbolic ones are never cut) that is padded to a
        multiple of them."""
        if opt.arg <= 1:
            raise KernelOptError(f"{opt}: a symbolic size is shared by a given number (at least 2) of threads")
        if part.dim in self.padded or part.stride != 1 or part.size is not self.full_shape[part.dim]:
            raise KernelOptError(f"{opt}: only a whole symbolic dim that is not padded yet is grouped")
        return opt.arg

    def _padto(self, opt: Opt, part: Part) -> None:
        self._after_tc(opt)
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

    def _warp(self) -> list[Part]:
        """The warp of a tensor core as a workgroup part (lidx0), for counting workgroup dims and threads."""
        return [] if self.tc is None else [Part(-1, self.tc.core.threads, 1, Kind.LOCAL)]

    def _stage(self, opt: Opt, part: Part) -> None:
        if self.tc is None or not self.caps.has_shared:
            raise KernelOptError(f"{opt}: stages tensor-core operands, on a renderer with local memory, after TC")
        self._need(opt, part, Kind.REDUCE)
        if not 0 <= opt.arg <= STAGE_AHEAD_MAX:
            raise KernelOptError(f"{opt}: arg 0 copies through registers, 1 to {STAGE_AHEAD_MAX} asynchronously")
        if opt.arg >= 1 and len(self.of_kind(Kind.REDUCE)) != 1:  # (the next tile is the K loop's next iteration)
            raise KernelOptError(f"{opt}: asynchronous copies need the K loop to be the one reduce loop")
        threads = self.workgroup_threads()
        total = 0
        for label, operand in (("A", self.tc.a), ("B", self.tc.b)):
            size = math.prod(self.parts[i].size for i in self.stage_parts(operand))
            if not any(u.op is Ops.READ for u in operand.toposort) or size % threads:
                raise KernelOptError(f"{opt}: {label}'s tile of {size} values does not split over {threads} threads")
            total += stage_size(self, operand) * self.tc.core.dtype_in.itemsize * stage_buffers(opt.arg)
        if total > self.caps.shared_max:
            raise KernelOptError(f"{opt}: the tiles take {total} bytes of local memory, over {self.caps.shared_max}")
        if opt.arg >= 1:
            if not self.caps.async_copy:
                raise KernelOptError(f"{opt}: the {self.caps.language} renderer has no asynchronous copies")
            for label, operand in (("A", self.tc.a), ("B", self.tc.b)):
                if (why := self._not_async(operand)) is not None:
                    raise KernelOptError(f"{opt}: {label} cannot be copied {ASYNC_BYTES} bytes at a time: {why}")
        self.staged, self.staged_ahead = True, opt.arg

    def _not_async(self, operand: UOp) -> str | None:
        """Why a staged operand cannot be copied in runs of ASYNC_BYTES (each thread's runs lie whole along the
        tile's innermost part, in one run of memory and in one row of local memory), or None where it can."""
        if operand.op is not Ops.READ:
            return f"it is computed ({operand.op.name}), not read"
        view = operand.view
        assert view is not None
        chunk = ASYNC_BYTES // operand.dtype.itemsize
        order, strides, size = stage_layout(self, operand)
        inner = self.parts[order[-1]]
        if view.mask is not None or any(d in self.padded for d in range(len(self.full_shape)) if _varies(operand, d)):
            return "it is padded"
        if view.strides[inner.dim] * inner.stride != 1:
            return "its tile's rows do not run along memory"
        tile = math.prod(self.parts[i].size for i in order)
        if inner.size % chunk or tile % (self.workgroup_threads() * chunk):
            return f"its rows of {inner.size} or its tile of {tile} values do not split into runs of {chunk} a thread"
        if size % chunk or any(strides[i] % chunk for i in order[:-1]):
            return "its rows in local memory are not whole runs"
        return None

    def workgroup_threads(self) -> int:
        return math.prod(p.size for p in self.workgroup() + self._warp())

    def row_dims(self) -> list[int]:
        """The output dims along which no reduction varies (a row's elements, each reading the row's max and sum)."""
        return _row_dims(self.full_shape, self.reductions, self.reduce_dims)

    def workgroup(self) -> list[Part]:
        """The workgroup's parts, each a hardware local index, in plan order (ROWS's group piece shares its local
        piece's index: not a dim of its own)."""
        return [p for p in self.parts if p.kind is Kind.LOCAL or (p.kind is Kind.GROUP and self.rows is None)]

    def stage_parts(self, operand: UOp) -> list[int]:
        """The parts (indices) a staged operand's tile spans: the in-block pieces of the dims its value runs along."""
        return [i for i, p in enumerate(self.parts) if p.kind in IN_BLOCK and _varies(operand, p.dim)]

    def _after_tc(self, opt: Opt) -> None:
        if self.tc is not None:
            raise KernelOptError(f"{opt}: not on a kernel mapped onto tensor cores (only UPCAST, UNROLL, LOCAL, SWAP)")

    def _tc(self, opt: Opt, part: Part) -> None:
        """axis: the reduce axis to use as K; arg: which of the renderer's tensor cores."""
        cores = self.caps.tensor_cores
        if not cores:
            raise KernelOptError(f"{opt}: the {self.caps.language} renderer declares no tensor cores")
        if not 0 <= opt.arg < len(cores):
            raise KernelOptError(f"{opt}: arg picks one of the renderer's {len(cores)} tensor cores")
        if any(o.op is not OptOps.PADTO for o in self.applied):
            raise KernelOptError(f"{opt}: TC comes first (after PADTO only), on a kernel no other action has cut yet")
        if not self.caps.has_local:
            raise KernelOptError(f"{opt}: the {self.caps.language} renderer has no workgroups to hold a warp")
        self._need(opt, part, Kind.REDUCE)
        core = cores[opt.arg]
        use = self.matmul_on(core, part.dim, str(opt))
        for label, dim, size in (("M", use.m, core.dims[0]), ("N", use.n, core.dims[1]), ("K", use.k, core.dims[2])):
            if self.size_of(dim) % size:
                raise KernelOptError(
                    f"{opt}: {core.name} needs {label} a multiple of {size} (PADTO first), dim {dim} is"
                    f" {self.size_of(dim)}"
                )
        workgroup_max = self.caps.local_total_max or core.threads
        if core.threads > workgroup_max or core.threads > (self.caps.local_max or (core.threads,))[0]:
            raise KernelOptError(f"{opt}: a warp of {core.threads} threads does not fit the renderer's workgroups")
        for dim, size in ((use.m, core.dims[0]), (use.n, core.dims[1]), (use.k, core.dims[2])):
            whole = next(p for p in self.parts if p.dim == dim)
            self._split(whole, size, Kind.TC, top=False)
        self.tc = use

    def size_of(self, dim: int) -> int:
        """A dim's size in the plan: padded where PADTO padded it."""
        return self.padded.get(dim, self.full_shape[dim])

    def matmul_on(self, core: TensorCore, k: int, opt: str = "TC") -> TensorCoreUse:
        """The kernel as a matrix product on `core` with K = dim k (sizes not checked), or KernelOptError saying why
        it is not one."""
        if len(self.reductions) != 1 or self.reductions[0].arg[0] is not Ops.ADD:
            raise KernelOptError(f"{opt}: tensor cores need one sum, this kernel is not a matrix product")
        red = self.reductions[0]
        if red.dtype != core.dtype_out:
            raise KernelOptError(
                f"{opt}: {core.name} accumulates in {core.dtype_out.name}, the sum is {red.dtype.name}"
            )
        operands = _product_operands(red.source, core.dtype_in, core.dtype_out)
        if operands is None:
            raise KernelOptError(
                f"{opt}: {core.name} sums products of two {core.dtype_in.name} values, this sums a {red.source.op.name}"
            )
        a, b = operands
        if not (_varies(a, k) and _varies(b, k)):
            raise KernelOptError(f"{opt}: both factors of the product must run along the reduced dim {k}")
        outputs = [d for d, s in enumerate(self.full_shape) if s > 1 and d not in self.reduce_dims]
        only_a = [d for d in outputs if _varies(a, d) and not _varies(b, d)]
        only_b = [d for d in outputs if _varies(b, d) and not _varies(a, d)]
        if not only_a or not only_b:
            raise KernelOptError(f"{opt}: no output dims that only one factor runs along: not a matrix product")
        # M and N: the innermost such dims that the tile divides, else the innermost (to pad, or refused)
        m = next((d for d in reversed(only_a) if self.size_of(d) % core.dims[0] == 0), only_a[-1])
        n = next((d for d in reversed(only_b) if self.size_of(d) % core.dims[1] == 0), only_b[-1])
        return TensorCoreUse(core, m, n, k, a, b)

    # ---- what lowering reads

    def tc_part(self, dim: int) -> int:
        """The index among parts of the tensor-core tile piece of dim."""
        return next(i for i, p in enumerate(self.parts) if p.kind is Kind.TC and p.dim == dim)

    def describe(self) -> str:
        return " ".join(f"{p.kind.value}{p.size}@{p.dim}" for p in self.parts) + (
            f" padded {self.padded}" if self.padded else ""
        )


def stage_buffers(ahead: int) -> int:
    """The local buffers of each staged tile: 2 through registers (iteration i fills buffer i % 2 while i - 1's may
    still be read), n + 1 for copies n K steps ahead (iteration i reads buffer i % (n + 1) while the next n fill)."""
    return max(2, ahead + 1)


def stage_layout(k: Kernel, operand: UOp) -> tuple[list[int], dict[int, int], int]:
    """Where a staged operand's tile lies in local memory: its parts outermost first (ordered as its first load
    walks memory, so the copy reads runs of memory), each part's stride there, and the elements one buffer holds.
    Rows (the innermost parts, at least 64 bytes) are padded by 16 bytes, which puts the rows a warp's fragment
    reads in different banks."""
    view = next(u.view for u in operand.toposort if u.op is Ops.READ)
    parts = k.stage_parts(operand)
    order = sorted(parts, key=lambda i: -abs(view.strides[k.parts[i].dim]) * k.parts[i].stride)
    itemsize = operand.dtype.itemsize
    strides, size, padded = {}, 1, False
    for i in reversed(order):
        strides[i] = size
        size *= k.parts[i].size
        if not padded and size * itemsize >= 64:
            size, padded = size + 16 // itemsize, True
    return order, strides, size


def stage_size(k: Kernel, operand: UOp) -> int:
    return stage_layout(k, operand)[2]


def _product_operands(u: UOp, dtype_in: DType, dtype_out: DType) -> tuple[UOp, UOp] | None:
    """(x, y) of dtype_in where u is x*y computed into dtype_out: CAST(x*y), CAST(x)*CAST(y) or (same dtypes) x*y."""
    if u.op is Ops.CAST and u.dtype == dtype_out and u.source.op is Ops.MUL:
        x, y = u.source.src
        return (x, y) if x.dtype == y.dtype == dtype_in else None
    if u.op is not Ops.MUL or u.dtype != dtype_out:
        return None
    x, y = u.src
    if dtype_in == dtype_out:
        return x, y
    if x.op is Ops.CAST and y.op is Ops.CAST and x.source.dtype == y.source.dtype == dtype_in:
        return x.source, y.source
    return None


def _has_rows(ast: UOp) -> bool:
    """Whether a kernel's reductions do not vary along one of its output dims (Kernel.row_dims)."""
    reductions = [u for u in ast.toposort if u.op is Ops.REDUCE_AXIS]
    reduced = {a for r in reductions for a in r.arg[1]}
    return bool(_row_dims(ast.src[0].src[1].arg.shape, reductions, reduced))


def _row_dims(shape: tuple[sint, ...], reductions: list[UOp], reduced: Collection[int]) -> list[int]:
    """The output dims of a kernel's shape along which none of its reductions varies (none without reductions)."""
    if not reductions:
        return []
    outputs = [d for d, n in enumerate(shape) if _dim(n) and d not in reduced]
    return [d for d in outputs if not any(_varies(r.source, d) for r in reductions)]


def _varies(u: UOp, dim: int) -> bool:
    """Whether the value of AST piece u changes along dim of the kernel's full shape (some view it reads moves or
    is masked along it)."""
    for x in u.toposort:
        if x.op is Ops.VIEW:
            v = x.arg
            if _dim(v.shape[dim]) and (
                v.strides[dim] != 0 or (v.mask is not None and v.mask[dim] != (0, v.shape[dim]))
            ):
                return True
    return False
