"""Lowering: a kernel AST (views over the kernel's shape) -> loops, index math, loads, stores and REDUCEs.

The kernel's plan (tiny.codegen.opt.Kernel) says how: each global part becomes a loop (RANGE) or, where the
renderer indexes with hardware ids, a SPECIAL; a thread part the CPU thread's number; local and group parts
workgroup ids; each reduce part a loop inside its REDUCE; upcast and unrolled parts are written out, one value
per lane, with the lanes of a vector gathered in a VECTORIZE (at the store, or in a vector accumulator) for
tiny.codegen.vectorize to turn into vector ops. First the index memory pass (tiny.codegen.memory) makes each READ a
LOAD and the WRITE a STORE of an INDEX whose offset and gate (where the View has padding, or a dim is padded) are
written in a variable per dim of the kernel's shape; the walk puts each lane's index in their place, and a load whose
gate is then always false reads padding: 0.

A matrix product mapped onto a tensor core (the plan's `tc`) lowers its sum as one WMMA per tile: the warp's lane
is lidx0, and each operand's tile pieces are indexed by the lane and the fragment element as that operand's layout
says. Each lane loads its A and B fragments, the WMMA adds their product to the accumulator (a vector, the C
fragment), and each element of it is stored (after the epilogue) where C's layout puts it.
"""

from __future__ import annotations

import functools
import itertools
import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from tiny.codegen.memory import Dims, index_memory, many
from tiny.codegen.opt.actions import ASYNC_BYTES, IN_BLOCK, Kernel, Kind, Opt, stage_buffers, stage_layout
from tiny.ir.device import RendererCaps
from tiny.ir.dtypes import DType, dtypes
from tiny.ir.pattern import graph_rewrite
from tiny.ir.sint import highest, sint, sym_str, variables
from tiny.ir.symbolic import symbolic
from tiny.ir.tensorcore import Fragment
from tiny.ir.uop import GroupOp, Ops, UOp, evaluate, substitute
from tiny.ir.views import View

# dtypes whose values the code generator packs into vectors, and the reductions that accumulate in one
VECTOR_REDUCE = frozenset({Ops.ADD, Ops.MUL, Ops.MAX})
COMBINE_LANES = 4  # a grouped reduction's partials read from local memory this many at a time (16-byte reads)
GRID_DIM_MOST = 65535  # workgroups in any grid dim of every GPU device (CUDA's y and z, WebGPU's and HIP's limits)

INT32_MAX = 2**31 - 1


@dataclass(frozen=True)
class LoweredKernel:
    sink: UOp  # SINK of STOREs, using RANGE/SPECIAL/REDUCE/INDEX/LOAD and ALU ops
    name: str
    global_size: tuple[sint, sint, sint]  # (a symbolic count is launched with its value: CompiledProgram.grid)
    local_size: tuple[int, int, int]
    # what the symbolic rules made of each node they simplified while lowering (gates, offsets): graph_rewrite's memo,
    # from which the later passes over the kernel start (a node's simplified form is a function of the node alone)
    simplified: dict[UOp, UOp] = field(default_factory=dict, compare=False, repr=False)


def _index_dtype(ast: UOp) -> DType:
    """int32 index math unless some buffer or view reaches past 2**31-1 elements. A view over more elements than
    that (a convolution's windows) whose offsets stay inside the range is indexed dim by dim in int32."""
    for u in ast.toposort:
        if u.op is Ops.VIEW:
            view: View = u.arg
            lo, hi = view.span()
            if hi > INT32_MAX or lo < -INT32_MAX or max(map(highest, view.shape), default=0) > INT32_MAX:
                return dtypes.int64
        if u.op is Ops.DEFINE_GLOBAL and u.dtype.size > INT32_MAX:
            return dtypes.int64
    return dtypes.int32


def kernel_name(ast: UOp) -> str:
    """E_<output dims> for elementwise kernels, r_<output dims>_<reduced dims> for reductions."""
    write, *_ = ast.src
    out = [s for s in write.shape if s != 1]
    reduces = [u for u in ast.toposort if u.op is Ops.REDUCE_AXIS]
    if not reduces:
        return "E_" + "_".join(map(_name_of, out or [1]))
    red = reduces[-1]
    red_dims = [red.source.shape[a] for a in red.arg[1] if red.source.shape[a] != 1]
    return "r_" + "_".join(map(_name_of, (out + red_dims) or [1]))


def _name_of(size: int | UOp) -> str:
    """A size in a kernel's name: the number, or a symbolic one written out as an identifier (pos, pos_1 for pos+1)."""
    return str(size) if type(size) is int else re.sub(r"\W+", "_", sym_str(size)).strip("_")


class _Lowerer:
    """Lowers a kernel's AST by its plan (tiny.codegen.opt.Kernel).

    A walker, not rewrite rules: what a node becomes depends on the index it is evaluated at, which is no node of the
    AST. The AST has one node per op; the lowered kernel has one per op and lane, each reading the loop counters,
    hardware indices and lane constants its planned dims map to (the env, extended per lane, per reduction and per
    tensor-core fragment element), and is made once per (node, index with the dims the node does not read set to 0:
    key). A rule sees a node and its sources, not that index; so whether a read is all padding (its gate false at
    that index: 0, and a sum drops it) is found per lane too. The walk's order is part of its output as well: loops
    are numbered as it first reaches them (linearize nests loops by number), and a grouped reduction's slot in local
    memory is its output lane's rank in the walk.

    What memory through a view becomes is a rule of one node, and the index memory pass makes it on the AST, in the
    dims' variables (tiny.codegen.memory); the walk puts each lane's index in their place (at). Run on the lanes'
    graph instead (the walk leaving each read at its index for the pass), it built again every node above each read:
    a fifth more CPU time to render bench.render's 162 kernels (5.0 s -> 6.2-6.6 s), for the same kernels."""

    def __init__(self, k: Kernel, dims: Dims, forms: dict[UOp, UOp]) -> None:
        self.k, self.idx_dtype = k, dims.dtype
        self.zero = UOp.const(dims.dtype, 0)
        self.next_range = 0
        self.env: dict[int, UOp] = {}  # part index -> its loop counter or hardware index (lanes are added per value)
        self.reduce_env: dict[UOp, dict[int, UOp]] = {}  # REDUCE_AXIS -> its reduce parts' loop counters
        self.plain_ranges: dict[UOp, list[UOp]] = {}  # REDUCE_AXIS outside the plan -> one loop per reduced dim
        self.global_size, self.local_size = [1, 1, 1], [1, 1, 1]
        self.vector_unroll: tuple[int, int] | None = None  # (unroll part, lanes): reduce into a vector register
        # grouped reductions: partials in local memory (each reduction its own), read after a barrier (made once every
        # partial of the reduction is stored: a row's sum stores its partials after reading its max's)
        self.group_slots: dict[UOp, dict[tuple[UOp, ...], int]] = {}
        self.temps: dict[UOp, UOp] = {}
        self.local_stores: dict[UOp, list[UOp]] = {}
        self.barriers: dict[UOp, UOp] = {}  # reduction -> the placeholder its loads name
        self.group_gate: UOp | None = None
        self.simplified: dict[UOp, UOp] = {}  # gates and offsets simplified so far (graph_rewrite's memo)
        # each READ, WRITE and masked CONST as the index memory pass made it, in the dims' variables (dims.index)
        self.dim_vars, self.forms = dims, forms
        self.indexed: dict[tuple[UOp, tuple[UOp, ...]], UOp] = {}  # (expression in the dims' variables, idxs) -> placed
        self.padding: set[tuple[UOp, tuple[UOp, ...]]] = set()  # (AST node, index) that reads padding only
        # each (AST node, index) lowered so far, for every lane: where a node does not depend on the dims a lane
        # differs in (a value broadcast along an upcast dim), the lanes share its lowering (see key)
        self.lowered: dict[tuple[UOp, tuple[UOp, ...]], UOp] = {}
        self.dims: dict[UOp, frozenset[int]] = {}  # AST node -> the dims its value depends on
        self.unread: dict[UOp, tuple[int, ...]] = {}  # AST node -> the other dims (0 in its key)
        # tensor cores: the warp's lane, and for each output index the C element there (with the env of its tile)
        self.lane: UOp | None = None
        self.tc_element: dict[tuple[UOp, ...], tuple[dict[int, UOp], int]] = {}
        # staged operands (STAGE): (reduction, operand) -> its local buffer, parts' strides there, this iteration's
        # offset; the copies' stores, and the barrier the fragment loads wait for (made once every copy is stored)
        self.stages: dict[tuple[UOp, UOp], tuple[UOp, dict[int, int], UOp]] = {}
        self.stage_stores: list[UOp] = []
        self.stage_barrier = UOp(Ops.BARRIER, arg="stage pending")
        # STAGE n: (local INDEX, global INDEX, dtype) of each copy of the first n iterations' tiles (before the K
        # loop, by iteration), and of each copy of the tiles n iterations ahead, made into COPY_ASYNCs after the
        # loop's barrier (async_stages)
        self.first_copies: dict[int, list[tuple[UOp, UOp, DType]]] = {}
        self.next_copies: list[tuple[UOp, UOp, DType]] = []
        self.k_loop: UOp | None = None

    def new_range(self, size: int | UOp) -> UOp:
        end = UOp.const(self.idx_dtype, size) if type(size) is int else size.cast(self.idx_dtype)
        r = UOp.range(end, self.next_range, self.idx_dtype)
        self.next_range += 1
        return r

    def special(self, name: str, size: sint) -> UOp:
        """A hardware index; one over a symbolic size counts to its largest value (the launch's grid has this call's
        value, so the index is always below it)."""
        return UOp(Ops.SPECIAL, self.idx_dtype, (), (name, size if type(size) is int else highest(size)))

    def place_outputs(self) -> None:
        """Loop counters and hardware indices for the output parts."""
        parts = self.k.parts
        globals_ = [i for i, p in enumerate(parts) if p.kind is Kind.GLOBAL]
        hw = self.grid_dims(globals_) if self.k.caps.has_local else []
        for i in globals_:
            if not any(i in dim for dim in hw):
                self.env[i] = self.new_range(parts[i].size)
        for n, dim in enumerate(hw):  # gidx0 is the innermost
            size = math.prod(parts[i].size for i in dim) if len(dim) > 1 else parts[dim[0]].size
            index, inner = self.special(f"gidx{n}", size), 1
            for i in dim:  # (several parts in one dim: the innermost varies fastest)
                whole = index if inner == 1 else index // inner
                self.env[i] = whole if i == dim[-1] else whole % parts[i].size
                inner *= parts[i].size
            self.global_size[n] = size
        for i, p in enumerate(parts):
            if p.kind is Kind.THREAD:  # loop devices: one call per thread, the thread's number as gidx0
                self.env[i] = self.special("gidx0", p.size)
                self.global_size[0] = p.size
        workgroup = self.workgroup()
        first = 0
        if self.k.tc is not None:  # the warp's lanes are the innermost workgroup dim
            self.lane = self.special("lidx0", self.k.tc.core.threads)
            self.local_size[0], first = self.k.tc.core.threads, 1
        for n, i in enumerate(reversed(workgroup), first):  # lidx0 is the innermost
            self.env[i] = self.special(f"lidx{n}", parts[i].size)
            self.local_size[n] = parts[i].size
        if self.k.rows is not None:  # (ROWS: the group piece counts with its local piece's index)
            self.env[self.group_part()] = self.env[self.k.parts.index(self.k.rows)]

    def grid_dims(self, globals_: list[int]) -> list[list[int]]:
        """The global parts of each of the grid's dims, innermost (gidx0) first: up to three dims, each within the
        renderer's limit for it (global_max: CUDA's x takes 2**31-1 workgroups, y and z 65535; a renderer that folds
        a bigger grid says so there). The innermost parts are a dim each; where more than three parts are left, the
        last dim takes as many of the outer ones as its limit allows (a batch of images' and channels' parts of an
        NCHW tensor: each workgroup finds its own from its index), and the rest are loops. A symbolic size is a dim
        of its own, its count computed at each launch from the Variables' values, where its largest value needs no
        folded grid (folding is decided when the kernel is built)."""
        limits = self.k.caps.global_max or (GRID_DIM_MOST,) * 3
        hw: list[list[int]] = []
        for at, i in enumerate(reversed(globals_)):
            size = self.k.parts[i].size
            if len(hw) == 3 or highest(size) > (limits[len(hw)] if type(size) is int else GRID_DIM_MOST):
                continue
            hw.append([i])
            if len(hw) == 3 and type(size) is int:  # (the last dim: the outer parts too, while they fit)
                for j in list(reversed(globals_))[at + 1 :]:
                    outer = self.k.parts[j].size
                    if type(outer) is not int or size * outer > limits[2]:
                        break
                    hw[-1].append(j)
                    size *= outer
        return hw

    def workgroup(self) -> list[int]:
        """The indices of the parts that are the workgroup's hardware local indices (Kernel.workgroup)."""
        return [i for i, p in enumerate(self.k.parts) if any(p is q for q in self.k.workgroup())]

    def group_part(self) -> int:
        return next(i for i, p in enumerate(self.k.parts) if p.kind is Kind.GROUP)

    def lane_combos(self, kind: Kind) -> list[dict[int, UOp]]:
        """Every combination of values of the parts of this kind, as constants by part index."""
        idx = [i for i, p in enumerate(self.k.parts) if p.kind is kind]
        sizes = [range(self.k.parts[i].size) for i in idx]
        return [{i: UOp.const(self.idx_dtype, v) for i, v in zip(idx, vals)} for vals in itertools.product(*sizes)]

    def tc_env(self, frag: Fragment, elem: int) -> dict[int, UOp]:
        """The tile pieces' indices for element `elem` of a fragment: each coordinate's lane bits and element bits
        (a coordinate the operand does not have is 0)."""
        assert self.k.tc is not None and self.lane is not None
        use, env = self.k.tc, {}
        for axis, dim in (("m", use.m), ("n", use.n), ("k", use.k)):
            value = UOp.const(self.idx_dtype, frag.coord(axis, 0, elem) if axis in (frag.rows, frag.cols) else 0)
            for first, bits, to in frag.lane_terms(axis) if axis in (frag.rows, frag.cols) else []:
                term = self.lane // 2**first if first else self.lane
                if first + bits < len(frag.lane_bits):
                    term = term % 2**bits
                value = value + term * 2**to
            env[self.k.tc_part(dim)] = value
        return env

    def tc_loops(self, u: UOp) -> dict[int, UOp]:
        """The loop counters of a tensor-core sum's reduce parts (made on first use)."""
        if u not in self.reduce_env:
            self.reduce_env[u] = {
                i: self.new_range(p.size) for i, p in enumerate(self.k.parts) if p.kind is Kind.REDUCE
            }
        return self.reduce_env[u]

    def tc_operands(self, u: UOp, idxs: tuple[UOp, ...]) -> list[tuple[UOp, tuple[UOp, ...]]]:
        """The A and B fragments' elements of the tile the output index idxs is in: (AST piece, index) each."""
        assert self.k.tc is not None
        use, core = self.k.tc, self.k.tc.core
        origin, _ = self.tc_element[idxs]
        env = origin | self.tc_loops(u)

        def at(lanes: dict[int, UOp], frag: Fragment, elem: int) -> tuple[UOp, ...]:
            full = env | lanes | self.tc_env(frag, elem)
            return tuple(self.dim_index(d, full) for d in range(len(self.k.full_shape)))

        out: list[tuple[UOp, tuple[UOp, ...]]] = []
        for lanes in self.lane_combos(Kind.UNROLL):  # one A and one B fragment per unrolled step
            out += [(use.a, at(lanes, core.a, e)) for e in range(core.a.elements)]
            out += [(use.b, at(lanes, core.b, e)) for e in range(core.b.elements)]
        return out

    def stage(self, u: UOp, operand: UOp) -> tuple[UOp, dict[int, int], UOp]:
        """The local buffer that holds operand's tile in this iteration of reduction u's K loop (tiny.codegen.opt
        stage_layout): every thread of the workgroup copies tile/threads values of it, consecutive threads
        consecutive values of memory. Buffers taken in turn (tiny.codegen.opt stage_buffers: two through registers,
        n + 1 for copies n steps ahead): one barrier an iteration suffices, as the buffer an iteration fills was last
        read at least one iteration before, ahead of the barrier in between. Where the reduction has loops around the
        K loop (a convolution's window), an iteration is counted through all of them: the turn does not start again
        with each window position."""
        if (u, operand) in self.stages:
            return self.stages[(u, operand)]
        k = self.k
        assert k.tc is not None and self.lane is not None
        order, strides, size = stage_layout(k, operand)
        name = f"stage{len(self.stages)}"
        buffers = stage_buffers(k.staged_ahead)
        total = size * buffers
        buf = UOp(Ops.DEFINE_LOCAL, operand.dtype.ptr(total, local=True), (), (name, total))
        count = self.zero  # the iteration's number among all of the reduction's loops (outermost first)
        for i, counter in self.reduce_env[u].items():
            count = count * k.parts[i].size + counter if count is not self.zero else counter
        base = (count % buffers) * size
        workgroup = [i for i, p in enumerate(k.parts) if p.kind is Kind.LOCAL]
        tid, threads = self.lane, k.tc.core.threads
        for i in reversed(workgroup):
            tid, threads = tid + self.env[i] * threads, threads * k.parts[i].size
        tile = math.prod(k.parts[i].size for i in order)
        outside = {i: self.zero for i, p in enumerate(k.parts) if p.kind in IN_BLOCK}
        if k.staged_ahead:
            self.copy_ahead(u, operand, buf, (order, strides, size), tid, threads)
            self.stages[(u, operand)] = (buf, strides, base)
            return self.stages[(u, operand)]
        for step in range(tile // threads):
            element, env, at = tid + step * threads, dict(self.env | outside | self.reduce_env[u]), base
            inner = 1
            for i in reversed(order):
                value = (element // inner) % k.parts[i].size if inner > 1 else element % k.parts[i].size
                env[i], at, inner = value, at + value * strides[i], inner * k.parts[i].size
            full = tuple(self.dim_index(d, env) for d in range(len(k.full_shape)))
            value = self._in_tile(self.lower(operand, full), full, (k.tc.m, k.tc.n, k.tc.k))
            self.stage_stores.append(UOp(Ops.STORE, dtypes.void, (UOp(Ops.INDEX, buf.dtype, (buf, at)), value)))
        self.stages[(u, operand)] = (buf, strides, base)
        return self.stages[(u, operand)]

    def copy_ahead(
        self, u: UOp, operand: UOp, buf: UOp, layout: tuple[list[int], dict[int, int], int], tid: UOp, threads: int
    ) -> None:
        """STAGE n: the operand's tiles of the first n iterations copied into buffers 0 to n - 1 before the K loop,
        and in each iteration r the tile of r + n into buffer (r + n) % (n + 1) (no copy past the last), each thread
        moving runs of ASYNC_BYTES along the tile's innermost part (tiny.codegen.opt checked that they lie whole in a
        run of memory and in a row of local memory). The copies are asynchronous: the loop's barrier waits for the
        ones of its own iteration (async_stages), so the next n iterations' are on their way while its fragments are
        read."""
        k = self.k
        order, strides, size = layout
        ((part, rng),) = self.reduce_env[u].items()
        self.k_loop = rng
        chunk, inner = ASYNC_BYTES // operand.dtype.itemsize, order[-1]
        tile = math.prod(k.parts[i].size for i in order)
        outside = {i: self.zero for i, p in enumerate(k.parts) if p.kind in IN_BLOCK}
        iterations = UOp.const(self.idx_dtype, k.parts[part].size)
        # (a loop of fewer iterations than that copies them all before it: the in-loop copies all past the last)
        n, buffers = min(k.staged_ahead, k.parts[part].size), stage_buffers(k.staged_ahead)
        for step in range(tile // (threads * chunk)):
            first, env, at, inner_size = (tid + step * threads) * chunk, dict(self.env | outside), self.zero, 1
            for i in reversed(order):
                value = (first // inner_size) % k.parts[i].size if inner_size > 1 else first % k.parts[i].size
                env[i], at, inner_size = value, at + value * strides[i], inner_size * k.parts[i].size
            first_ones = [(j, UOp.const(self.idx_dtype, j)) for j in range(n)]
            for j, it in first_ones + [(None, rng + n)]:
                lanes = []
                for lane in range(chunk):
                    lane_env = env | {part: it, inner: env[inner] + lane}
                    full = tuple(self.dim_index(d, lane_env) for d in range(len(k.full_shape)))
                    lanes.append(self.at(operand, full).address)
                src = lanes[0]
                assert src.gate is None and contiguous([a.offset for a in lanes], self.simplified), "runs of memory"
                dst = UOp(Ops.INDEX, buf.dtype, (buf, (it % buffers) * size + at))
                if j is None:  # past the last iteration no copy (zeros), from the buffer's start (every address valid)
                    valid = it.lt(iterations)
                    src = src.replace(src=(src.pointer, valid.where(src.offset, self.zero), valid))
                    self.next_copies.append((dst, src, operand.dtype.vec(chunk)))
                else:
                    self.first_copies.setdefault(j, []).append((dst, src, operand.dtype.vec(chunk)))

    def async_stages(self) -> UOp:
        """STAGE n's order in each iteration of the K loop: the barrier that waits for the copies of this iteration's
        tiles (made n iterations before, or before the loop) and for every thread to be done reading the buffer the
        next copies overwrite (read in the last iteration); then those copies, one after another; then the fragment
        loads, which name the last copy (all after the barrier, and none of this iteration's reads before the copies
        that overlap them). The node the fragment loads name.

        The barrier leaves the copies of n - 1 iterations in flight (BARRIER ("async", n - 1)): a group of copies is
        what a thread issued since its last such barrier, and each iteration's copies, before the loop too, are one
        group (the first n iterations' tiles: a barrier that waits for none, ("async", n), between each two), so the
        group an iteration needs has n - 1 newer ones."""
        assert self.k_loop is not None
        n, after = len(self.first_copies), ()  # (the copies ahead: fewer where the loop is shorter)
        for i, copies in sorted(self.first_copies.items()):
            made = tuple(UOp(Ops.COPY_ASYNC, dtype, (dst, src, *after)) for dst, src, dtype in copies)
            after = (UOp(Ops.BARRIER, dtypes.void, made, ("async", n)),) if i + 1 < len(self.first_copies) else made
        last = UOp(Ops.BARRIER, dtypes.void, (*after, self.k_loop), ("async", n - 1))
        for dst, src, dtype in self.next_copies:
            last = UOp(Ops.COPY_ASYNC, dtype, (dst, src, last))
        return last

    def staged_operands(self, u: UOp, idxs: tuple[UOp, ...]) -> list[UOp]:
        """tc_operands' values, read from the staged tiles in local memory after this iteration's barrier."""
        assert self.k.tc is not None
        use, core = self.k.tc, self.k.tc.core
        origin, _ = self.tc_element[idxs]
        self.tc_loops(u)
        (a, a_strides, a_base), (b, b_strides, b_base) = self.stage(u, use.a), self.stage(u, use.b)

        def read(buf: UOp, strides: dict[int, int], base: UOp, env: dict[int, UOp]) -> UOp:
            at = base
            for i, stride in strides.items():
                at = at + env[i] * stride
            return UOp(Ops.LOAD, core.dtype_in, (UOp(Ops.INDEX, buf.dtype, (buf, at)), self.stage_barrier))

        out: list[UOp] = []
        for lanes in self.lane_combos(Kind.UNROLL):
            env = origin | lanes
            out += [read(a, a_strides, a_base, env | self.tc_env(core.a, e)) for e in range(core.a.elements)]
            out += [read(b, b_strides, b_base, env | self.tc_env(core.b, e)) for e in range(core.b.elements)]
        return out

    def tc_reduce(self, u: UOp, idxs: tuple[UOp, ...], values: list[UOp]) -> UOp:
        """The sum at idxs: its element of the accumulated WMMAs of its tile."""
        assert self.k.tc is not None
        core = self.k.tc.core
        _, elem = self.tc_element[idxs]
        if self.k.staged:  # (the copies into local memory mask the padding)
            values = self.staged_operands(u, idxs)
        elif self.k.padded:  # elements in the padding are 0, whatever the factors compute there
            use = self.k.tc
            at = [i for _, i in self.tc_operands(u, idxs)]
            values = [self._in_tile(v, i, (use.m, use.n, use.k)) for v, i in zip(values, at)]
        na, nb = core.a.elements, core.b.elements
        wmma = UOp.const(core.c_dtype, 0.0)
        for step in range(0, len(values), na + nb):  # unrolled steps: a chain of WMMAs, each one's C the last's D
            a = UOp(Ops.VECTORIZE, core.a_dtype, tuple(values[step : step + na]))
            b = UOp(Ops.VECTORIZE, core.b_dtype, tuple(values[step + na : step + na + nb]))
            wmma = UOp(Ops.WMMA, core.c_dtype, (a, b, wmma), core.name)
        ranges = [self.reduce_env[u][i] for i, p in enumerate(self.k.parts) if p.kind is Kind.REDUCE]
        total = UOp(Ops.REDUCE, core.c_dtype, (wmma, *ranges), Ops.ADD) if ranges else wmma
        return UOp(Ops.GEP, core.dtype_out, (total,), elem)

    def _in_tile(self, value: UOp, idxs: tuple[UOp, ...], dims: tuple[int, ...]) -> UOp:
        valid = self.dim_vars.pad_valid(self.k.full_shape, idxs, dims)
        return value if valid is None else valid.where(value, UOp.const(value.dtype, 0))

    def dim_index(self, d: int, env: dict[int, UOp]) -> UOp:
        idx = self.zero
        for i, p in enumerate(self.k.parts):
            if p.dim == d:
                idx = idx + env[i] * p.stride if p.stride != 1 else idx + env[i]
        return idx

    def out_idxs(self, env: dict[int, UOp]) -> tuple[UOp, ...]:
        k = self.k
        return tuple(
            self.zero if d in k.reduce_dims or k.out_shape[d] == 1 else self.dim_index(d, env)
            for d in range(len(k.out_shape))
        )

    def at(self, u: UOp, idxs: tuple[UOp, ...]) -> UOp:
        """A READ or masked CONST as the index memory pass made it, with idxs in place of the dims' variables."""
        form = self.forms[u]
        if form.op is not Ops.LOAD:
            return self.placed(form, idxs)
        return form.replace(src=tuple(self.address(s, idxs) if s.op is Ops.INDEX else s for s in form.src))

    def address(self, form: UOp, idxs: tuple[UOp, ...]) -> UOp:
        """An INDEX the index memory pass made, at idxs."""
        return form.replace(src=tuple(self.placed(s, idxs) for s in form.src))

    def placed(self, form: UOp, idxs: tuple[UOp, ...]) -> UOp:
        """An expression in the dims' variables with idxs in their place, made once per kernel: reads of several
        buffers through one view, and lanes that share an index, ask again."""
        if (found := self.indexed.get((form, idxs))) is None:
            found = self.indexed[(form, idxs)] = substitute(form, dict(zip(self.dim_vars.index, idxs)))
        return found

    def lower(self, u: UOp, idxs: tuple[UOp, ...]) -> UOp:
        """Kernel AST node u at the index idxs, as device ops."""
        return evaluate(self.key(u, idxs), self._children, self._combine, self.lowered)

    def key(self, u: UOp, idxs: tuple[UOp, ...]) -> tuple[UOp, tuple[UOp, ...]]:
        """(u, idxs) with the index of every dim u's value does not depend on set to 0: the same device ops,
        lowered once for all the lanes that differ only there. (Not under tensor cores, whose reductions find
        their tile by the whole output index.)"""
        if self.k.tc is not None:
            return u, idxs
        if (unread := self.unread.get(u)) is None:
            dims = self._dims(u)
            unread = self.unread[u] = tuple(d for d in range(len(idxs)) if d not in dims)
        if not unread:
            return u, idxs
        masked = list(idxs)
        for d in unread:
            masked[d] = self.zero
        return u, tuple(masked)

    def _dims(self, root: UOp) -> frozenset[int]:
        """The dims whose index root's lowered value reads (found for every node below it, sources first): a
        load's or a masked constant's view (strides, mask, bands) and padded dims; a reduction's source's less the
        reduced ones; an elementwise op's sources'."""
        for u in root.toposort:
            if u in self.dims:
                continue
            dims: set[int] = set()
            if u.op is Ops.READ:  # (what its load reads: the view, and the padded dims Dims.pad_valid checks)
                view = u.view
                dims = set(view.index_dims()) | {d for d in self.k.padded if many(view.shape[d])}
            elif (u.op is Ops.CONST or u.op is Ops.ARANGE) and (view := u.view) is not None:
                dims = set(view.index_dims())
            elif u.op is Ops.REDUCE_AXIS:
                dims = set(self.dims[u.source]) - set(u.arg[1])
            elif u.op in GroupOp.Elementwise:
                for s in u.src:
                    dims |= self.dims[s]
            self.dims[u] = frozenset(dims)
        return self.dims[root]

    def reduce_inner(self, u: UOp, idxs: tuple[UOp, ...]) -> list[tuple[UOp, ...]]:
        """The indices a reduction reads at, one per combination of unrolled lanes."""
        in_shape = u.source.shape
        if not self.k.reduce_dims:  # outside the plan: a loop per reduced dim, shared by all output lanes
            if u not in self.plain_ranges:
                self.plain_ranges[u] = [self.new_range(in_shape[a]) for a in u.arg[1] if in_shape[a] != 1]
            ranges = iter(self.plain_ranges[u])
            inner = list(idxs)
            for a in u.arg[1]:
                inner[a] = self.zero if in_shape[a] == 1 else next(ranges)
            return [tuple(inner)]
        if u not in self.reduce_env:
            self.reduce_env[u] = {
                i: self.new_range(p.size) if p.kind is Kind.REDUCE else self.env[i]
                for i, p in enumerate(self.k.parts)
                if p.kind in (Kind.REDUCE, Kind.GROUP)
            }
        out = []
        for lanes in self.lane_combos(Kind.UNROLL):
            env = self.reduce_env[u] | lanes
            out.append(tuple(self.dim_index(d, env) if d in self.k.reduce_dims else i for d, i in enumerate(idxs)))
        return out

    def _children(self, key: tuple[UOp, tuple[UOp, ...]]) -> list[tuple[UOp, tuple[UOp, ...]]]:
        u, idxs = key
        if u.op in (Ops.READ, Ops.CONST, Ops.ARANGE):
            return []
        if u.op is Ops.REDUCE_AXIS:
            if any(u.source.shape[a] == 0 for a in u.arg[1]):  # nothing to reduce over: no loop, no value
                return []
            if self.k.tc is not None:
                return [] if self.k.staged else self.tc_operands(u, idxs)
            return [self.key(u.source, inner) for inner in self.reduce_inner(u, idxs)]
        if u.op in GroupOp.Elementwise:
            return [self.key(s, idxs) for s in u.src]
        raise NotImplementedError(f"cannot lower {u.op} in a kernel")

    def _combine(self, key: tuple[UOp, tuple[UOp, ...]], srcs: list[UOp]) -> UOp:
        u, idxs = key
        if u.op is Ops.READ:
            load = self.at(u, idxs)
            if (gate := load.address.gate) is None:
                return load
            gate = graph_rewrite(gate, symbolic, memo=self.simplified)
            if gate.op is Ops.CONST and not gate.arg:  # reads padding here: 0, and absent from a sum (below)
                self.padding.add(key)
                return UOp.const(u.dtype, 0)
            return load  # (a gate always true: symbolic drops it)
        if (
            u.op is Ops.ADD
            and self.padding
            and u.dtype.is_float
            and any(self.key(s, idxs) in self.padding for s in u.src)
        ):
            # a sum with padding in it (a window of a convolution or pool is a sum of padded views, one per offset,
            # of which one is real at each offset): x, not x + 0.0, which would cost an add and turn -0.0 into 0.0
            real = [v for s, v in zip(u.src, srcs) if self.key(s, idxs) not in self.padding]
            if not real:
                self.padding.add(key)
            return real[0] if real else srcs[0]  # (an ADD has two sources)
        if u.op is Ops.ARANGE:
            return self.at(u, idxs)
        if u.op is Ops.CONST:  # (a symbolic one's value is its expression: the Variables are kernel arguments)
            if u.view is not None:
                return self.at(u, idxs)
            return UOp.const(u.dtype, u.arg) if not isinstance(u.arg, UOp) else u.arg.cast(u.dtype)
        if u.op is Ops.REDUCE_AXIS:
            if self.k.tc is not None and (srcs or self.k.staged):
                return self.tc_reduce(u, idxs, srcs)
            return self.reduce(u, idxs, srcs)
        return UOp(u.op, u.dtype, tuple(srcs), u.arg)

    def reduce(self, u: UOp, idxs: tuple[UOp, ...], values: list[UOp]) -> UOp:
        op = u.arg[0]
        if not values:
            return UOp.const(u.dtype, identity(op, u.dtype))
        if not self.k.reduce_dims:
            ranges = self.plain_ranges[u]
            return UOp(Ops.REDUCE, u.dtype, (values[0], *ranges), op) if ranges else values[0]
        inners = self.reduce_inner(u, idxs)
        if self.k.padded.keys() & self.k.reduce_dims:  # padded iterations add the identity
            values = [self._unpadded(u, inner, v) for inner, v in zip(inners, values)]
        ranges = [self.reduce_env[u][i] for i, p in enumerate(self.k.parts) if p.kind is Kind.REDUCE]
        if self.vector_unroll is not None:
            partial = self._vector_reduce(u, values, ranges)
        else:
            total = functools.reduce(lambda a, b: a.alu(op, b), values)
            partial = UOp(Ops.REDUCE, u.dtype, (total, *ranges), op) if ranges else total
        return self._combine_group(u, idxs, partial) if self.k.of_kind(Kind.GROUP) else partial

    def _combine_group(self, u: UOp, idxs: tuple[UOp, ...], partial: UOp) -> UOp:
        """Each workgroup thread wrote its partial result to local memory; after the barrier, every thread adds
        up the partials of its group (the first of them stores; under ROWS each thread stores its own values)."""
        parts = self.k.parts
        slots = self.group_slots.setdefault(u, {})
        slot = slots.setdefault(idxs, len(slots))  # one slot per output lane
        group = self.group_part()
        # the threads in order: ROWS's local piece is the group piece (one index), read at the partial's thread below
        rows = self.k.parts.index(self.k.rows) if self.k.rows is not None else None
        workgroup = [group if i == rows else i for i in self.workgroup()]
        threads = math.prod(parts[i].size for i in workgroup)
        # every thread reads all the partials: a vector at a time where the group's threads are the innermost (their
        # partials side by side) and come in whole vectors, accumulated lane by lane (a quarter of the reads)
        lanes = min(COMBINE_LANES, self.k.caps.vector_lanes(u.dtype))
        if workgroup[-1] != group or parts[group].size % lanes or lanes & (lanes - 1) or u.arg[0] not in VECTOR_REDUCE:
            lanes = 1
        rg = self.new_range(parts[group].size // lanes)

        def thread_index(env: dict[int, UOp]) -> UOp:
            idx, mult = self.zero, 1
            for i in reversed(workgroup):
                idx = idx + env[i] * mult
                mult *= parts[i].size
            return idx

        if u not in self.temps:
            # a slot per output lane, but a row's reductions are the same along the row (its lanes share a slot)
            along_row = self.k.row_dims() if self.k.rows is not None else []
            size = threads * math.prod(p.size for p in parts if p.kind is Kind.UPCAST and p.dim not in along_row)
            name = f"temp{len(self.temps)}"
            self.temps[u] = UOp(Ops.DEFINE_LOCAL, u.dtype.ptr(size, local=True), (), (name, size))
            self.barriers[u] = UOp(Ops.BARRIER, arg=f"{name} pending")
        temp = self.temps[u]
        assert (slot + 1) * threads <= temp.arg[1], f"{u.arg[0]}'s partials past its local buffer"
        base = UOp.const(self.idx_dtype, slot * threads)
        mine = UOp(Ops.INDEX, temp.dtype, (temp, base + thread_index(self.env)))
        self.local_stores.setdefault(u, []).append(UOp(Ops.STORE, dtypes.void, (mine, partial)))
        loads = []
        for at in [rg * lanes + j for j in range(lanes)] if lanes > 1 else [rg]:
            addr = UOp(Ops.INDEX, temp.dtype, (temp, base + thread_index(self.env | {group: at})))
            loads.append(UOp(Ops.LOAD, u.dtype, (addr, self.barriers[u])))
        if self.k.rows is None:
            self.group_gate = self.env[group].lt(1)
        if lanes == 1:
            return UOp(Ops.REDUCE, u.dtype, (loads[0], rg), u.arg[0])
        vec = UOp(Ops.VECTORIZE, u.dtype.vec(lanes), tuple(loads))
        red = UOp(Ops.REDUCE, vec.dtype, (vec, rg), u.arg[0])
        lanes_of = [UOp(Ops.GEP, u.dtype, (red,), j) for j in range(lanes)]
        return functools.reduce(lambda a, b: a.alu(u.arg[0], b), lanes_of)

    def _unpadded(self, u: UOp, inner: tuple[UOp, ...], value: UOp) -> UOp:
        valid = self.dim_vars.pad_valid(self.k.full_shape, inner, self.k.reduce_dims)
        return value if valid is None else valid.where(value, UOp.const(u.dtype, identity(u.arg[0], u.dtype)))

    def _vector_reduce(self, u: UOp, values: list[UOp], ranges: list[UOp]) -> UOp:
        """Unrolled lanes of one part accumulate side by side in a vector register, combined after the loop."""
        assert self.vector_unroll is not None
        part, n = self.vector_unroll
        op = u.arg[0]
        groups: dict[tuple, list[UOp]] = {}
        for lanes, v in zip(self.lane_combos(Kind.UNROLL), values):  # in each group the part's lanes come in order
            key = tuple((i, c.arg // n if i == part else c.arg) for i, c in lanes.items())
            groups.setdefault(key, []).append(v)
        vectors = [UOp(Ops.VECTORIZE, u.dtype.vec(n), tuple(g)) for g in groups.values()]
        total = functools.reduce(lambda a, b: a.alu(op, b), vectors)
        red = UOp(Ops.REDUCE, total.dtype, (total, *ranges), op) if ranges else total
        return functools.reduce(lambda a, b: a.alu(op, b), [UOp(Ops.GEP, u.dtype, (red,), lane) for lane in range(n)])


def identity(op: Ops, dtype: DType) -> int | float | bool:
    """The value a reduction starts from: 0 for sums, 1 for products, the lowest value for max."""
    if op is Ops.ADD:
        return 0
    if op is Ops.MUL:
        return 1
    assert op is Ops.MAX, op
    return dtype.scalar.min


def contiguous(offsets: list[UOp], memo: dict[UOp, UOp] | None = None) -> bool:
    """Whether offsets are first, first+1, first+2 ... for every value of the loop counters. (memo: what the
    simplifier made of each expression so far, for a caller that asks about many offsets of one kernel.)"""
    first = offsets[0]
    return all(
        graph_rewrite(o - first, symbolic, memo=memo) is UOp.const(first.dtype, i) for i, o in enumerate(offsets)
    )


Address = Callable[[dict[int, UOp]], UOp]


def _paired_stores(addrs: list[UOp], values: list[UOp], memo: dict[UOp, UOp]) -> list[UOp]:
    """A tensor core's C fragment stored: elements 2i and 2i+1 as one 2-wide store where they lie side by side in
    memory under one gate (NVIDIA's: a lane's c0, c1 are neighbours along N), else one store each."""
    stores = []
    for i in range(0, len(addrs), 2):
        pair, vals = addrs[i : i + 2], values[i : i + 2]
        if len(pair) == 2 and pair[0].gate is pair[1].gate and contiguous([a.offset for a in pair], memo):
            stores.append(UOp(Ops.STORE, dtypes.void, (pair[0], UOp(Ops.VECTORIZE, vals[0].dtype.vec(2), tuple(vals)))))
        else:
            stores += [UOp(Ops.STORE, dtypes.void, (a, v)) for a, v in zip(pair, vals)]
    return stores


def _vector_part(lw: _Lowerer, parts_of: list[int], addr: Address, lanes: int) -> tuple[int, int] | None:
    """The lane part (and lanes per vector) whose consecutive values sit at consecutive addresses."""
    for i in reversed(parts_of):
        size = lw.k.parts[i].size
        n = min(size, lanes)
        if n < 2 or size % n or n & (n - 1):
            continue
        rest = {j: UOp.const(lw.idx_dtype, 0) for j in parts_of}
        offsets = [addr(lw.env | rest | {i: UOp.const(lw.idx_dtype, v)}).offset for v in range(n)]
        if contiguous(offsets, lw.simplified):
            return i, n
    return None


def _along_reduction(k: Kernel, reduce_dim: int, out_dim: int) -> bool:
    """Whether the inputs a reduction reads lie along its unrolled dim and none along the output vector's dim: a
    vector of outputs would gather its lanes (a matrix-vector product over rows of W), a vector of the reduction's
    lanes loads them whole (not where no reduction varies along the output's dim: a row's max or
    sum, the same for every element of the row, which a vector of outputs reads once)."""
    views = [u.view for u in k.ast.toposort if u.op is Ops.READ]
    summed = [v for v in views if any(v.strides[d] != 0 and v.shape[d] != 1 for d in k.reduce_dims)]

    def along(v: View, d: int) -> bool:
        return v.shape[d] != 1 and v.strides[d] == 1

    if not any(v.shape[out_dim] != 1 and v.strides[out_dim] != 0 for v in summed):
        return False
    return any(along(v, reduce_dim) for v in summed) and not any(along(v, out_dim) for v in summed)


def _gated(store: UOp, gate: UOp) -> UOp:
    addr = store.address
    both = gate if addr.gate is None else addr.gate & gate
    return store.replace(src=(addr.replace(src=(addr.pointer, addr.offset, both)), store.value))


def lower(ast: UOp, caps: RendererCaps, opts: Sequence[Opt] = ()) -> LoweredKernel:
    """Lower a scheduled kernel AST (SINK of one WRITE) for a renderer with these capabilities, after `opts`."""
    return lower_kernel(Kernel(ast, caps).apply_opts(list(opts)))


def lower_kernel(k: Kernel) -> LoweredKernel:
    """Lower a kernel by its plan: loops and hardware indices for its parts, lanes written out, vectors formed."""
    ast, write = k.ast, k.write
    # every buffer stays an argument, also one whose reads simplification removes: launches pass them by position
    buffers = sorted({u for u in ast.toposort if u.op is Ops.DEFINE_GLOBAL}, key=lambda u: u.arg)
    if k.empty:  # nothing to compute
        return LoweredKernel(UOp(Ops.SINK, dtypes.void, tuple(buffers)), kernel_name(k.scheduled), (1, 1, 1), (1, 1, 1))
    dims = Dims.of(k.full_shape, k.padded, _index_dtype(ast))
    forms: dict[UOp, UOp] = {}  # each node of the AST as the pass made it (graph_rewrite's memo)
    graph_rewrite(ast, index_memory, ctx=dims, memo=forms, name="index memory")  # loads and stores, in dims' variables
    lw = _Lowerer(k, dims, forms)  # the lanes: each dim's variable as the loops and lanes that make it
    lw.place_outputs()
    value = write.value
    upcasts = [i for i, p in enumerate(k.parts) if p.kind is Kind.UPCAST]
    lanes = k.caps.vector_lanes(value.dtype)

    def address(env: dict[int, UOp]) -> UOp:
        return lw.address(forms[write].address, lw.out_idxs(env))

    out_vec = None if k.tc is not None else _vector_part(lw, upcasts, address, lanes)
    unrolls = [i for i, p in enumerate(k.parts) if p.kind is Kind.UNROLL]
    if out_vec is not None and unrolls and _along_reduction(k, k.parts[unrolls[-1]].dim, k.parts[out_vec[0]].dim):
        out_vec = None  # (each output a vector accumulator along the rows: a tile of rows, tiny.codegen.opt.heuristic)
    if (out_vec is None or k.parts[out_vec[0]].dim in k.row_dims()) and unrolls and k.reductions and k.tc is None:
        # (every reduction of the kernel accumulates in vectors of the same lanes: gate and up projections of a
        # feed-forward read in one kernel; also beside a row's vector of outputs, along which no reduction varies)
        part, size = unrolls[-1], k.parts[unrolls[-1]].size
        n = min([size] + [k.caps.vector_lanes(red.dtype) for red in k.reductions])
        if n >= 2 and size % n == 0 and not n & (n - 1) and all(r.arg[0] in VECTOR_REDUCE for r in k.reductions):
            lw.vector_unroll = (part, n)
    stores: list[UOp] = []
    combos = lw.lane_combos(Kind.UPCAST)
    if k.tc is not None:  # one store per element of each tile's C fragment, a pair where two lie side by side
        frag = k.tc.core.c
        for lanes_env in combos:
            envs = [lw.env | lanes_env | lw.tc_env(frag, elem) for elem in range(frag.elements)]
            for elem, env in enumerate(envs):
                lw.tc_element[lw.out_idxs(env)] = (lw.env | lanes_env, elem)
            addrs = [address(env) for env in envs]
            values = [lw.lower(value, lw.out_idxs(env)) for env in envs]
            half = value.dtype.itemsize == 2 and value.dtype.is_float  # (a pair: one 32-bit store, where caps say)
            if k.caps.vector_lanes(value.dtype) >= 2 or (half and k.caps.half_pairs):
                stores += _paired_stores(addrs, values, lw.simplified)
            else:
                stores += [UOp(Ops.STORE, dtypes.void, (a, v)) for a, v in zip(addrs, values)]
    elif out_vec is None:
        for lanes_env in combos:
            env = lw.env | lanes_env
            stores.append(UOp(Ops.STORE, dtypes.void, (address(env), lw.lower(value, lw.out_idxs(env)))))
    else:
        part, n = out_vec
        for lanes_env in combos:
            if lanes_env[part].arg % n:
                continue  # the first lane of each vector stores the whole vector
            envs = [lw.env | lanes_env | {part: UOp.const(lw.idx_dtype, lanes_env[part].arg + j)} for j in range(n)]
            addrs = [address(e) for e in envs]
            values = [lw.lower(value, lw.out_idxs(e)) for e in envs]
            if len({a.gate for a in addrs}) == 1 and contiguous([a.offset for a in addrs], lw.simplified):
                vec = UOp(Ops.VECTORIZE, value.dtype.vec(n), tuple(values))
                stores.append(UOp(Ops.STORE, dtypes.void, (addrs[0], vec)))
            else:
                stores += [UOp(Ops.STORE, dtypes.void, (a, v)) for a, v in zip(addrs, values)]
    if lw.group_gate is not None:  # the first thread of each group writes its result
        stores = [_gated(s, lw.group_gate) for s in stores]
    # a Variable that only sizes the grid is still a kernel argument: the launch reads its value (CompiledProgram.grid)
    grid_vars = tuple(dict.fromkeys(v for g in lw.global_size if type(g) is not int for v in variables(g)))
    sink = UOp(Ops.SINK, dtypes.void, tuple(stores) + tuple(buffers) + grid_vars)
    if lw.local_stores:  # (in the order the reductions were lowered: a later one's partials may read an earlier one)
        barriers: dict[UOp, UOp] = {}
        for u, stores in lw.local_stores.items():
            made = tuple(substitute(s, barriers) for s in stores)
            barriers[lw.barriers[u]] = UOp(Ops.BARRIER, dtypes.void, made)
        sink = substitute(sink, barriers)
    if lw.stage_stores:
        sink = substitute(sink, {lw.stage_barrier: UOp(Ops.BARRIER, dtypes.void, tuple(lw.stage_stores))})
    if lw.next_copies:
        sink = substitute(sink, {lw.stage_barrier: lw.async_stages()})
    gs, ls = lw.global_size, lw.local_size
    return LoweredKernel(sink, kernel_name(k.scheduled), (gs[0], gs[1], gs[2]), (ls[0], ls[1], ls[2]), lw.simplified)
