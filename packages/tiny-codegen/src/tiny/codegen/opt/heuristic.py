"""Hand-written choice of optimization actions: fast by default, without timing anything.

The rules read the kernel's views: which output dim is contiguous in memory (vectors go there), which dims
some input is broadcast along (values loaded once serve several outputs: register tiling pays there), and how
much work there is (enough to share across threads or workgroups).
"""

from __future__ import annotations

import math
from collections.abc import Callable

from tiny.codegen.opt.actions import MAX_THREADS, Kernel, KernelOptError, Kind, Opt, OptOps
from tiny.ir.dtypes import dtypes
from tiny.ir.sint import highest
from tiny.ir.uop import GroupOp, Ops, UOp
from tiny.ir.views import View

THREAD_MIN_WORK = 1 << 20  # iterations below which splitting across threads costs more than it saves
SMALL_DIM = 7  # dims this small are written out whole where that lets masks fold away
MASKED_LANES = 64  # ... up to this many values per thread
TILE_LANES = 64  # register tiles of a matrix product or convolution grow up to this many outputs (8 AVX2 vectors)
# ... or this many where vectors are 16 lanes: AVX-512's 32 registers hold 16 of them (64 lanes, 4 vectors, left half
# the registers idle; the suite on 2 cores: conv2d 211 -> 356 GFLOPS, matmul1024 262 -> 491, the MNIST step 48.8 ->
# 33.9 ms)
WIDE_TILE_LANES = 256
WIDE_TILE_NODES = 128  # ... in kernels of at most this many AST nodes: a product with a fused epilogue of 150 nodes
# (a convolution's input gradient and a max pool's) took 1.6 s to render with the wide tile, 0.7 s with the narrow;
# one with an exact GELU (99 nodes: BERT's feed-forward) 0.60 s against 0.26, and runs at 379 GFLOPS against 220
GPU_TILE_LANES = 32  # ... on a GPU, until they hold this many, 4 (or fewer) more per dim (registers per thread)
GPU_VALUES = 512  # ... and within this many values per thread (offsets of a window included)
GPU_WINDOW = 25  # ... and the innermost small reduce dims written out, up to this many steps (a 5 x 5 window)
GPU_ACCUMULATORS = 64  # ... and accumulators (a tile's outputs, each a vector of the steps of a reduction read along
# memory where it has no vector of outputs: a weight gradient's 100 outputs x 4 steps spilled 4.5 KB on sm_90)
TILE_STRETCH = 96  # ... or up to this many where the whole of a small dim that no smaller amount splits (a window's 5)
# is what makes the tile (12 of AVX2's 16 vector registers: a weight gradient's 16 output channels x 5 kernel columns)
ACC_VECTORS = 16  # ... or this many outputs where each accumulates in a vector of its own (along the reduction)
TILE_VALUES = 1024  # ... and to this many values per thread with the window's offsets (lowering time grows with it)
UNROLL_LANES = 512  # ... and the innermost reduce dim is unrolled too where values per thread stay within this
WEIGHT_CACHE = 1 << 24  # bytes of a tile's vector operand past which its blocks' loop goes outermost (past the L3)
ROW_TILE_VECTORS = 8  # vector accumulators of a tile of rows (a product over a row-major weight: A's rows x W's)
ROW_TILE_WIDE = 2  # ... times this with 16-lane vectors (AVX-512's 32 registers)
# a tile of byte products (Ops.DOT4: a quantized weight's words, a row a lane, times the input's words) up to this
# many vectors, 4 and then 2 a dim: 16 rows x 4 a step of a decode's 5632 x 2048 Q4_0 product on 2 AVX-512 cores,
# 16 x 16 (and 2 blocks a step, the rules' tile for products) 0.253 -> 0.196 ms from memory, 0.075 -> 0.060 from
# the L3; a prompt's 32 x 5632 x 2048, 4 tokens x 32 rows 0.91 -> 0.80 ms
DOT_TILE_VECTORS = 8
LINE = 64  # bytes of a cache line
_TRANSCENDENTAL = (Ops.EXP2, Ops.LOG2, Ops.SIN)  # (what _computed_across looks for)
LOWERED_NODES = 1 << 15  # a CPU kernel that is not a register tile lowers at most about this many nodes (AST nodes x
# values per thread): a max pool's backward upcast whole (6 x 6 positions x 16 channels of a 229-node body) built
# 130k nodes to simplify them to 1.8k, 2.0 s of a cold MNIST step's rendering, for the same speed as 72 values (0.15 ms)
TILE_NODES = 256  # ... in kernels of at most this many AST nodes: a matrix product's or a convolution's body (151 at
# most in the suite, a fused epilogue included); one of hundreds of ops (a fused LSTM cell's backward pass, 1600)
# gains little from reusing its loads, and its code grows by all of them with each value of the tile
WORKGROUP = 256  # threads per workgroup on GPUs
GROUP_THREADS = (256, 128, 64, 32, 16)  # threads that share one output of a reduction read along its memory
GPU_BIG = 1 << 22  # elements of an elementwise GPU kernel from which each thread takes two vectors
FEW_TILE = 48  # values per thread of such a shared reduction (outputs x unrolled steps), as BEAM chose on an H100
FEW_BLOCKS = 1024  # ... and workgroups it keeps at least (the H100 has 132 multiprocessors)
FEW_OUTPUTS = 1 << 16  # a GPU kernel with fewer outputs than this shares each one across a workgroup
ROW_VALUES = 16  # values of a row each thread computes (ROWS), at most
ROW_HELD = 32  # ... or its whole share of a row, held in registers from one load, where that is at most this many
# (MAX_LANES bounds it: UPCAST and UNROLL of 32 each count 32 * 32 lanes, though they share their loads)
ROW_THREADS = 64  # threads a row takes at least, where it is that long


def hand_opts(kernel: Kernel, max_lanes: int | None = None) -> list[Opt]:
    """Actions for this kernel on its renderer, chosen by the rules of this module; with max_lanes, no upcast or
    unroll takes the values each thread computes at once past that many (a kernel whose code grew too big)."""
    if kernel.empty:
        return []
    k = kernel.copy()
    chosen: list[Opt] = []
    caps = k.caps
    reads = [u for u in k.ast.toposort if u.op is Ops.READ]
    loads = [u.view for u in reads]
    outputs = [d for d in range(len(k.full_shape)) if d not in k.reduce_dims]
    # on a GPU, a reduction with few outputs (a weight's gradient: a long reduction over the batch) needs its threads
    # for the reduction, not for register tiles: there it is a plain reduction shared by workgroups
    few = caps.has_shared and bool(k.reduce_dims) and math.prod(_n(k.full_shape[d]) for d in outputs) < FEW_OUTPUTS
    reuse = {d for d in outputs if any(_broadcast(v, d) for v in loads) and k.reduce_dims}
    # a softmax's or a norm's row on a CPU: its reductions read broadcast along the row's own dim, which is no tile's
    row_dims = [] if caps.has_local else k.row_dims()
    tiled = k.reduce_dims and reuse and not few and not row_dims and len(k.ast.toposort) <= TILE_NODES
    dots = sum(u.op in GroupOp.ByteDots for u in k.ast.toposort)  # (each four multiply-adds of bytes)
    if not tiled and not caps.has_local:  # (GPU kernels keep their plans: not measured there)
        held = max(1, LOWERED_NODES // len(k.ast.toposort))
        max_lanes = held if max_lanes is None else min(max_lanes, held)

    def attempt(op: OptOps, axis: int | None, amounts: tuple[int, ...]) -> bool:
        if axis is None:
            return False
        for amt in amounts:
            lanes_op = op in (OptOps.UPCAST, OptOps.UNROLL)
            if max_lanes is not None and lanes_op and k.lanes() * (amt or _n(k.axes[axis].size)) > max_lanes:
                continue
            try:
                k.apply(Opt(op, axis, amt))
            except KernelOptError:
                continue
            chosen.append(Opt(op, axis, amt))
            return True
        return False

    if caps.tensor_cores and k.reduce_dims and _tensor_cores(k, attempt):
        return chosen
    if caps.has_shared and _rows(k, attempt):
        return chosen
    lanes = max(2, caps.vector_width)
    store_view: View = k.write.view
    out_dim = _contiguous_dim(store_view, k)
    masked = {d for v in loads if v.mask for d, (lo, hi) in enumerate(v.mask) if (lo, hi) != (0, v.shape[d])}
    for p in list(k.axes):  # small dims that masks depend on (a window's offsets): written out, the masks fold away
        if few:
            break
        if p.dim in masked and _n(p.size) <= SMALL_DIM and k.lanes() * _n(p.size) <= MASKED_LANES:
            attempt(OptOps.UPCAST if p.kind is Kind.GLOBAL else OptOps.UNROLL, k.axes.index(p), (0,))
    if tiled:  # a matrix product or a convolution: tile outputs in registers
        # small reduce dims (a convolution's window) written out in full; on a CPU, whose windows are one view each
        # (opt.merge_windows), only the innermost: the values a thread holds go to a bigger tile instead
        reduce_parts = k.of_kind(Kind.REDUCE)
        small = [p for p in reduce_parts if _n(p.size) <= SMALL_DIM] if len(reduce_parts) > 1 else []
        # (on a CPU the innermost only where it is the innermost reduction: a window's last dim, not a weight
        # gradient's two images of a group, whose unrolling halves the unroll of the long row after it)
        # (on a GPU the innermost within a window's GPU_WINDOW steps: a split weight gradient's partial over 4 x 6 x 6
        # positions unrolled whole left room in a thread's values for 3 outputs, and loaded 4 values for each 3 FMAs)
        written = [p for p in small[-1:] if p is reduce_parts[-1]]
        if caps.has_local:
            written = [p for i, p in enumerate(small) if math.prod(_n(q.size) for q in small[i:]) <= GPU_WINDOW]
        for p in written:
            attempt(OptOps.UNROLL, k.axes.index(p), (0,))
        vector_loads = [v for v in loads if out_dim is not None and _stride(v, out_dim) == 1]
        last_reduce = max(p.dim for p in k.of_kind(Kind.REDUCE)) if k.of_kind(Kind.REDUCE) else None
        along_reduce = last_reduce is not None and any(_stride(v, last_reduce) == 1 for v in loads)
        # no input is read along the output dim but one is along the reduction (a matrix-vector product over a
        # row-major weight: each output a dot product of a row): no vector of outputs, which would gather its
        # values a row apart; each output accumulates in a vector of its own along its row (a few rows of the
        # vector's side at once, where there are several, each sharing the loads of the row)
        # (loads after the reduction, a residual added to the product, read along the outputs but not the rows)
        summed = [v for v in vector_loads if any(_stride(v, d) for d in k.reduce_dims)]
        rows = out_dim is not None and not summed and along_reduce and not caps.has_local
        if out_dim is not None and not rows:
            # (8: half an AVX-512 vector where whole ones do not divide the outputs: an attention head of 40, whose
            # product with the values took vectors of 4: 2 x 8 x 1024 x 40, 64 -> 10 ms)
            # an exp (log, sin) the output dim does not index, computed in the kernel (a decode step's probabilities
            # fused into their product with the values: one a key, shared by the head dim) is computed again for
            # each tile along that dim: on a CPU the whole dim in one tile where it fits (8 heads x 4 queries x 64
            # float16 values over 96 keys on 2 AVX2 cores, 4 x 16 a tile: 48 -> 26 us)
            axis = _axis(k, out_dim)
            whole = axis is not None and not caps.has_local and _n(k.axes[axis].size) <= TILE_LANES
            if not (whole and _computed_across(k, out_dim) and attempt(OptOps.UPCAST, axis, (0,))):
                attempt(OptOps.UPCAST, axis, (2 * lanes, lanes, 8, 4, 2) + _whole(k, out_dim))
        # more outputs per loaded value: first along dims the vectors are broadcast along (each row of the tile
        # reuses the vectors and costs one scalar), innermost first
        tile_dims = sorted(reuse - {out_dim}, key=lambda d: (not any(_broadcast(v, d) for v in vector_loads), -d))
        if rows:  # (the rows of W too: a tile of rows x columns shares each vector of either side)
            tile_dims.append(out_dim)
        # (each dim takes the most that keeps the tile within TILE_LANES: a convolution's 8-wide row vector serves 8
        # output channels, 64 x 64 x 3 x 3 over 56 x 56 on 2 AVX2 cores: 23.5 -> 15 ms against 4)
        # where no output vector forms (a weight gradient's 5 x 5 window) but the innermost reduction is read along
        # memory, each output accumulates in a vector of its own: then the tile is counted in vectors (registers)
        out_lanes = math.prod(p.size for p in k.of_kind(Kind.UPCAST) if p.dim == out_dim)
        no_vector = out_lanes < 4 or out_lanes & (out_lanes - 1) != 0  # (vectors are 4, 8 or 16 lanes)
        in_vectors = no_vector and along_reduce
        for d in tile_dims:
            tile, axis = math.prod(p.size for p in k.of_kind(Kind.UPCAST)), _axis(k, d)
            if caps.has_local:  # (up to twice GPU_TILE_LANES: a weight gradient's 5 x 5 window x 4 channels took 100)
                if tile < GPU_TILE_LANES:
                    room = min(GPU_VALUES // k.lanes(), 2 * GPU_TILE_LANES // tile)
                    attempt(OptOps.UPCAST, axis, _within(k, axis, (4, 3, 2), room))
                continue
            values = TILE_VALUES // k.lanes()
            # (the wide tile along one dim beside the output vector's: a convolution's input gradient tiled 2 x 2 x 2
            # positions took 1.0 s to render, 0.1 s narrow)
            grown = any(p.dim != out_dim for p in k.of_kind(Kind.UPCAST))
            wide = lanes >= 16 and len(k.ast.toposort) <= WIDE_TILE_NODES and not grown
            tile_lanes = WIDE_TILE_LANES if wide else TILE_LANES
            room = min(tile_lanes // tile, values, ACC_VECTORS // tile if in_vectors else tile_lanes)
            stretch = room if in_vectors else min((tile_lanes if wide else TILE_STRETCH) // tile, values)
            # (rows: at most 4 a dim and 8 vectors in all, 4 rows of A x 2 of W: the accumulators and a step's loaded
            # vectors, 14, fit AVX2's 16 registers, where 4 x 4 spilled; 32 x 2048 x 2048 float32 6.0 -> 4.7 ms, Q4_0
            # blocks 7.9 -> 5.3, 256 rows of Q4_K 89 -> 49. AVX-512's 32 registers take 4 x 4, 24: a float16 1B
            # model's prompt of 32 tokens, 32 x 2048 @ 5632 x 2048 4.0 -> 2.5 ms, its prefill 346-351 -> 276-279 ms)
            # (7: the rows of 7, 14 and 28 positions of a convolution's last stages, which 8 and 4 leave at 2 or none;
            # and within the wide tile the whole of a small dim may fill it: 3 x 3 over 14 x 14 x 256 on 2 AVX-512
            # cores 141 -> 303 GFLOPS, over 7 x 7 x 512 87 -> 221)
            most = ROW_TILE_VECTORS * (ROW_TILE_WIDE if lanes >= 16 else 1)
            if dots:
                most = DOT_TILE_VECTORS * caps.vector_lanes(dtypes.int32)
            sizes = tuple(s for s in (4, 2) if s * tile <= most) if rows or dots else (16, 8, 7, 4, 3, 2)
            attempt(OptOps.UPCAST, axis, _within(k, axis, sizes, room, stretch))
        if not caps.has_local:  # (orders of a CPU's loops for its caches: a GPU's global dims are its grid)
            _panel_order(k, out_dim, vector_loads, attempt)
            _weight_order(k, out_dim, vector_loads, attempt)
        if rows:  # the loop over the other side's rows innermost: the weight's rows of a tile stay in cache for them
            globals_ = [p for p in k.axes if p.kind is Kind.GLOBAL]
            weight = [v for v in loads if _stride(v, last_reduce) == 1 and _stride(v, out_dim) not in (0, None)]
            inner = [p for p in globals_ if any(_broadcast(v, p.dim) for v in weight)]
            if inner and globals_[-1] is not inner[-1]:
                attempt(OptOps.SWAP, k.axes.index(inner[-1]), (k.axes.index(globals_[-1]),))
        if last_reduce is not None and k.lanes() * 2 <= UNROLL_LANES and not dots:
            # no tile at all (its output dims symbolic: a decode step's scores over the cache) but the reduction read
            # along memory: a whole vector of it a step, where 4 lanes of an AVX-512 vector were scalars
            # (a tile of rows: one vector of each row a step)
            one_vector = (in_vectors and not k.of_kind(Kind.UPCAST)) or rows
            whole = (lanes,) if one_vector and not caps.has_local else ()
            if rows and all(p.dim == out_dim for p in k.of_kind(Kind.UPCAST)) and whole:
                # a matrix-vector product (a decode step's): a whole cache line of each row a step, where a float16
                # row's vector was half of one (its line prefetched twice, each stream read 32 bytes at a time): a
                # 1B model's float16 products from memory on 2 AVX-512 cores 2-6% faster (2048 x 5632 46.0 -> 48.6
                # GB/s, gate and up 45.1 -> 47.5; its decode 5.9%), its float32 ones in vectors of 8 lanes 6-13%; a
                # prompt's tile of rows x rows keeps one vector a step (its registers: gate and up 7% slower)
                narrowest = min(r.dtype.itemsize for r in reads if _stride(r.view, last_reduce) == 1)
                whole = (max(lanes, LINE // narrowest),) + whole
            steps = (4, 2) if k.lanes() * 4 <= UNROLL_LANES else (2,)
            if caps.has_local and in_vectors:  # (each output's accumulator a vector of the steps: registers)
                tile = math.prod(p.size for p in k.of_kind(Kind.UPCAST))
                steps = tuple(s for s in steps if tile * s <= GPU_ACCUMULATORS)
            attempt(OptOps.UNROLL, _axis(k, last_reduce), whole + steps)
    elif k.reduce_dims:  # a plain reduction (or one whose body is too big to tile)
        red_dim = next((d for d in sorted(k.reduce_dims) if any(_stride(v, d) == 1 for v in loads)), None)
        if red_dim is not None:  # reading along the reduction: accumulate lanes in a vector register
            if not attempt(OptOps.UNROLL, _axis(k, red_dim), (2 * lanes, lanes, 4, 2)) and not caps.has_local:
                _beside_symbolic(k, red_dim, lanes, attempt)
            if out_dim in row_dims:  # ... and the row's values computed in vectors along it too
                attempt(OptOps.UPCAST, _axis(k, out_dim), (2 * lanes, lanes, 4, 2))
        elif out_dim is not None:  # reading across the outputs: vectors of outputs
            # on a CPU up to 4 vectors, two whole cache lines a step: threads then split lines between them, not
            # each line (a batch norm's sums over 128 x 20 x 20 of 32 channels-last channels: 0.87 -> 0.27 ms)
            wide = () if caps.has_local else (4 * lanes, 2 * lanes)
            axis = _axis(k, out_dim)
            if not attempt(OptOps.UPCAST, axis, (*wide, lanes, 4, 2)) and wide:
                # an odd number of outputs: padded to whole tiles (to a multiple of the threads' shares of them where
                # that is at most double), the last tile's lanes past the end masked; else each column alone walks
                # down its memory a cache line per value (a sum over 4096 x 4099: 137 -> 11 ms). The lanes are then
                # scalar: each has a gate of its own
                tile = wide[0]
                if attempt(OptOps.PADTO, axis, (tile * caps.threads, tile)):
                    attempt(OptOps.UPCAST, axis, (tile,))
        if caps.has_shared:
            _group(k, red_dim, few, reuse, attempt)
    elif out_dim is not None:  # elementwise: vector loads and stores along the contiguous dim
        # a big one on a GPU: two vectors per thread, more bytes in flight (64M floats on an H100: 3.0 TB/s, 2.8
        # with one)
        big = caps.has_local and math.prod(map(_n, k.full_shape)) >= GPU_BIG
        attempt(OptOps.UPCAST, _axis(k, out_dim), ((2 * lanes,) if big else ()) + (lanes, 4, 2))
        # a transpose (an input read along another dim, a weight copied to another layout): a square of lanes x
        # lanes values, each input row a vector load and each output row a vector store, where each output vector
        # gathered its lanes a row apart (ResNet-50's weights into channels last: 2048 x 1024 2.7 GB/s). Not for a
        # value the output dim does not index (a softmax's row maxima and sums): one load serves a whole vector
        across = {
            d
            for v in loads
            for d in range(len(v.shape))
            if d != out_dim and _stride(v, d) == 1 and not _broadcast(v, out_dim)
        }
        if not caps.has_local and len(across) == 1 and k.lanes() == lanes:
            attempt(OptOps.UPCAST, _axis(k, across.pop()), (lanes,))
    work = math.prod(map(_n, k.full_shape)) * max(1, 4 * dots)
    if row_dims:  # (a row's values are read by each of its reductions once and by the output once, not once per value)
        work = work // math.prod(_n(k.full_shape[d]) for d in row_dims) * (len(k.reductions) + 1)
    if caps.threads > 1 and work >= THREAD_MIN_WORK:
        counts = [t for t in range(caps.threads, 1, -1)]
        outputs = [i for i, p in enumerate(k.axes) if p.kind is Kind.GLOBAL]
        if not any(attempt(OptOps.THREAD, i, tuple(t for t in counts if k.axes[i].size % t == 0)) for i in outputs):
            # no count divides an output dim (a prime one): the biggest whole one padded to a multiple of the
            # threads, each thread's share stopping where the dim ends (tiny.codegen.narrow), so no lane is masked
            threads = min(caps.threads, MAX_THREADS)
            for i in sorted(outputs, key=lambda i: -_n(k.axes[i].size)):
                if attempt(OptOps.PADTO, i, (threads,)):
                    attempt(OptOps.THREAD, i, (threads,))
                    break
    if caps.has_local:
        _local_opts(k, attempt)
    return chosen


def _tensor_cores(k: Kernel, attempt: Callable[[OptOps, int | None, tuple[int, ...]], bool]) -> bool:
    """A matrix product on the first of the renderer's tensor cores that takes it (K: the innermost reduce dim that
    fits; M, N or K padded to the tile where that is needed and allowed), then two steps of K per loop iteration,
    several tiles per warp (4 x 8 of NVIDIA's 16 x 8, else two along M: B's fragment serves both) and up to four
    warps per workgroup."""
    for core in range(len(k.caps.tensor_cores)):
        for axis in reversed(range(len(k.axes))):
            if k.axes[axis].kind is not Kind.REDUCE or not _tc_plan(k, core, axis):
                continue
            for opt in _tc_plan(k, core, axis):
                attempt(opt.op, opt.axis, (opt.arg,))
            assert k.tc is not None
            attempt(OptOps.UNROLL, _axis(k, k.tc.k), (2,))  # two steps of K per loop iteration
            m, n, _ = k.tc.core.dims
            if n == 8:  # NVIDIA's m16n8k16: a warp's tile of 64 x 64 where M and N allow (4096^2 fp16 on an H100:
                # 75 TFLOPS, against 14 with 32 x 8); each fragment loaded serves 4 or 8 products
                attempt(OptOps.UPCAST, _axis(k, k.tc.m), (64 // m, 32 // m, 2))
                attempt(OptOps.UPCAST, _axis(k, k.tc.n), (64 // n, 32 // n, 2))
            else:
                attempt(OptOps.UPCAST, _axis(k, k.tc.m), (2,))
            for dim in (k.tc.n, k.tc.m):
                attempt(OptOps.LOCAL, _axis(k, dim), (2,))
            if n == 8:  # the warps' tiles of A and B through local memory: each warp's fragments read in whole rows;
                # copied asynchronously a K step ahead where K is the one reduce loop (STAGE 1: on an H200, 4096^2
                # and 8192^2 fp16/bf16 products 221-238 TFLOPS in CUDA C against 163-170 through registers), else
                # through registers (STAGE 0)
                attempt(OptOps.STAGE, _axis(k, k.tc.k), (1, 0))
            return True
    return False


def _tc_plan(k: Kernel, core: int, axis: int) -> list[Opt]:
    """The PADTOs that make the tile divide M, N and K, and the TC action; [] where the kernel does not take it."""
    try:
        use = k.matmul_on(k.caps.tensor_cores[core], k.axes[axis].dim)
    except KernelOptError:
        return []
    tile = use.core.dims
    trial, plan = k.copy(), []
    try:
        for dim, size in ((use.m, tile[0]), (use.n, tile[1]), (use.k, tile[2])):
            if trial.size_of(dim) % size:
                pad_axis = _axis(trial, dim)
                if pad_axis is None:
                    return []
                plan.append(Opt(OptOps.PADTO, pad_axis, size))
                trial.apply(plan[-1])
        plan.append(Opt(OptOps.TC, axis, core))
        trial.apply(plan[-1])
    except KernelOptError:
        return []
    return plan


def _panel_order(
    k: Kernel,
    out_dim: int | None,
    vector_loads: list[View],
    attempt: Callable[[OptOps, int | None, tuple[int, ...]], bool],
) -> None:
    """Where the vectors come from a panel (a block of the tile's width by the whole reduction, contiguous: B copied
    into panels for a matrix product), the loop over the dim the panel is broadcast along (A's rows) goes innermost:
    one panel stays in cache while every row block passes it, instead of all of B streaming past each row block."""
    reduce_parts = k.of_kind(Kind.REDUCE) + k.of_kind(Kind.UNROLL)
    if out_dim is None or not reduce_parts:
        return
    inner_reduce = max(p.dim for p in reduce_parts)
    width = math.prod(p.size for p in k.of_kind(Kind.UPCAST) if p.dim == out_dim)
    globals_ = [p for p in k.axes if p.kind is Kind.GLOBAL]
    for v in vector_loads:
        if width != k.full_shape[out_dim] or _stride(v, inner_reduce) != width:
            continue  # the tile's columns of this operand are not one contiguous block
        rows = [p for p in globals_ if _broadcast(v, p.dim)]
        if rows and globals_[-1] is not rows[-1]:
            attempt(OptOps.SWAP, k.axes.index(rows[-1]), (k.axes.index(globals_[-1]),))
        return


def _weight_order(
    k: Kernel,
    out_dim: int | None,
    vector_loads: list[View],
    attempt: Callable[[OptOps, int | None, tuple[int, ...]], bool],
) -> None:
    """Where the vectors come from an operand bigger than WEIGHT_CACHE that is broadcast along other output dims (a
    convolution's weight over few positions: 1280 x 3 x 3 x 1280 floats, 59 MB, over 8 x 8), the loop over blocks
    of the output vector's dim goes outermost: each block's slice of the operand is read once while every position
    passes it, where all of it streamed past each tile of positions."""
    globals_ = [p for p in k.axes if p.kind is Kind.GLOBAL]
    blocks = [p for p in globals_ if p.dim == out_dim]
    if not blocks or globals_[0] is blocks[0]:
        return
    for v in vector_loads:
        held = math.prod(_n(s) for s, st in zip(v.shape, v.strides) if st != 0) * 4  # (its elements, as float32)
        if held > WEIGHT_CACHE and any(_broadcast(v, p.dim) for p in globals_):
            attempt(OptOps.SWAP, k.axes.index(blocks[0]), (k.axes.index(globals_[0]),))
            return


def _group(
    k: Kernel,
    red_dim: int | None,
    few: bool,
    reuse: set[int],
    attempt: Callable[[OptOps, int | None, tuple[int, ...]], bool],
) -> None:
    """A workgroup's threads share each output of a reduction: along memory where the reduction reads a long
    contiguous stretch (side by side: coalesced), else, where outputs are few, along the longest reduce dim, each
    thread then computing a few outputs along the outermost dim an input is broadcast along (a weight gradient's
    output channels: one load of the layer's input serves several; on an H100 BEAM found this, 0.88 -> 0.33 ms for
    a 64x64x3x3 one)."""
    views = [u.view for u in k.ast.toposort if u.op is Ops.READ]
    big = max(views, key=lambda v: math.prod(_n(n) for n, st in zip(v.shape, v.strides) if st != 0), default=None)
    across = [i for i, p in enumerate(k.axes) if p.kind is Kind.GLOBAL and big is not None and _stride(big, p.dim) == 1]
    if few and across and (red_dim is None or _stride(big, red_dim) != 1):
        # the biggest read runs along an output dim, not along the reduction (a decode step's cached values times
        # the weights over the positions: each value row read across the head's dim): neighbouring threads take
        # neighbouring outputs, so a warp reads whole rows, and the rest of the workgroup shares each sum; a
        # workgroup per output read the rows' values a row apart, a 32-byte sector for every 4 bytes
        size = _n(k.axes[across[-1]].size)
        if attempt(OptOps.LOCAL, across[-1], tuple(a for a in (64, 32, 16) if size % a == 0)):
            room = WORKGROUP // k.workgroup_threads()
            reduce_axes = [i for i, p in enumerate(k.axes) if p.kind is Kind.REDUCE]  # (none: a short one unrolled)
            longest = max(reduce_axes, key=lambda i: _n(k.axes[i].size), default=None)
            attempt(OptOps.GROUP, longest, tuple(g for g in (*GROUP_THREADS, 8, 4, 2) if g <= room))
            return
    axis = _axis(k, red_dim) if red_dim is not None else None
    if axis is not None and _n(k.axes[axis].size) >= 4 * GROUP_THREADS[-1]:
        size = _n(k.axes[axis].size)
        attempt(OptOps.GROUP, axis, tuple(g for g in GROUP_THREADS if size >= 4 * g))
    elif few:
        # a workgroup shares an output only where at most 3 output dims are left (the hardware's): small ones
        # (a convolution window's, in its weight's gradient) are written out
        while len(outer := [p for p in k.axes if p.kind is Kind.GLOBAL and _n(p.size) > 1]) > 3:
            if not attempt(OptOps.UPCAST, k.axes.index(min(outer, key=lambda p: _n(p.size))), (0,)):
                return
        tile = [p for p in k.axes if p.kind is Kind.GLOBAL and _n(p.size) > 1 and p.dim in reuse]
        if tile:  # registers (with the unrolled ones) within FEW_TILE; at least FEW_BLOCKS workgroups left
            lanes, outs = k.lanes(), math.prod(_n(p.size) for p in k.axes if p.kind is Kind.GLOBAL)
            fits = tuple(a for a in (8, 4, 2) if lanes * a <= FEW_TILE and outs // a >= FEW_BLOCKS)
            attempt(OptOps.UPCAST, k.axes.index(tile[0]), fits)
        # the longest reduce dim that a number of threads splits (a batch norm's partial sums over 16 images x 20 x
        # 20: the 16, where 20 took none and each output was one thread's)
        reduce_axes = [i for i, p in enumerate(k.axes) if p.kind is Kind.REDUCE]
        for axis in sorted(reduce_axes, key=lambda i: -_n(k.axes[i].size)):
            if attempt(OptOps.GROUP, axis, tuple(g for g in GROUP_THREADS if _n(k.axes[axis].size) >= g)):
                break


def _rows(k: Kernel, attempt: Callable[[OptOps, int | None, tuple[int, ...]], bool]) -> bool:
    """A softmax's or a norm's rows on a GPU (a kernel whose reductions do not vary along an output dim): a
    workgroup a row, its threads sharing the row's reductions (ROWS) and then each computing every n-th value of the
    row. Where a thread's share of the row is ROW_HELD values or fewer, it holds them all: its output values
    (UPCAST) and its steps of each reduction (UNROLL) are the same loads, read once from memory (a softmax of 8192 x
    2048 read its rows three times before). A longer row: a few values each, the rest of the row in more workgroups,
    each reducing it again."""
    dims = [d for d in k.row_dims() if type(k.full_shape[d]) is int]
    reduces = k.of_kind(Kind.REDUCE)
    if not dims or len(reduces) != 1 or type(reduces[0].size) is not int:
        return False
    dim = max(dims, key=lambda d: k.full_shape[d])
    common = math.gcd(k.full_shape[dim], reduces[0].size)
    divisors = [t for t in range(min(common, WORKGROUP), 1, -1) if common % t == 0]
    # the fewest threads (two warps at least) that hold the row: after the barrier each of t threads reads all t
    # partials, t*t reads of local memory a reduction, which bound the kernel where t is large (a softmax of 262144
    # rows of 2048 ran 4.4 ms with 256 threads a row on an H200: about the local memory's rate for those reads)
    held = [t for t in divisors if t >= min(ROW_THREADS, common) and common // t <= ROW_HELD]
    threads = (min(held), *divisors) if held else tuple(divisors)
    if not attempt(OptOps.ROWS, _axis(k, dim), threads):
        return False
    if (axis := _axis(k, dim)) is not None:
        rest = _n(k.axes[axis].size)
        # (the threads may take the whole reduction: a sum's gradient through a product, x @ w's rows all alike)
        red = next((i for i, p in enumerate(k.axes) if p.kind is Kind.REDUCE), None)
        if red is not None and rest == _n(k.axes[red].size) <= ROW_HELD and attempt(OptOps.UPCAST, axis, (rest,)):
            attempt(OptOps.UNROLL, _reduce_axis(k), (rest,))
        else:
            attempt(OptOps.UPCAST, axis, tuple(u for u in range(min(rest, ROW_VALUES), 1, -1) if rest % u == 0))
    return True


def _local_opts(k: Kernel, attempt: Callable[[OptOps, int | None, tuple[int, ...]], bool]) -> None:
    """Workgroups on GPUs: up to 256 threads (with those the plan has already), 16 x 16 from the two
    innermost global dims, or all from the one where the output has only one dim of any size."""
    budget = WORKGROUP // k.workgroup_threads()
    # (a symbolic dim takes no LOCAL: the others then share the budget; a decode step's scores over the cache, heads
    # x positions, had workgroups of 16 threads)
    globals_ = [p for p in k.axes if p.kind is Kind.GLOBAL and type(p.size) is int and p.size > 1]
    widest = budget if len(globals_) == 1 else 16
    for i in reversed(range(len(k.axes))):
        p = k.axes[i]
        if p.kind is not Kind.GLOBAL or budget < 2:
            continue
        for amt in (a for a in (256, 128, 64, 32, 16, 8, 4, 2) if a <= widest):
            if amt <= budget and p.size % amt == 0 and attempt(OptOps.LOCAL, i, (amt,)):
                budget //= amt
                break


def _within(
    k: Kernel, axis: int | None, amounts: tuple[int, ...], room: int, whole_room: int | None = None
) -> tuple[int, ...]:
    """The amounts that multiply the tile by at most `room`, then the whole of a small dim (as _whole says) where it
    does so by at most `whole_room` (room if not given)."""
    if axis is None:
        return ()
    limit = room if whole_room is None else whole_room
    whole = (0,) if _n(k.axes[axis].size) <= min(SMALL_DIM, limit) and _whole(k, k.axes[axis].dim) else ()
    return tuple(a for a in amounts if a <= room) + whole


def _computed_across(k: Kernel, dim: int) -> bool:
    """Whether the kernel computes an exp, log or sine of values that do not vary along `dim` (its reads all
    broadcast along it)."""
    for u in k.ast.toposort:
        if u.op in _TRANSCENDENTAL:
            reads = [r for r in u.toposort if r.op is Ops.READ]
            if reads and all(_broadcast(r.view, dim) for r in reads):
                return True
    return False


def _whole(k: Kernel, dim: int) -> tuple[int, ...]:
    """(0,): upcast all of a small dim whose size no power of two divides well; () otherwise."""
    axis = _axis(k, dim)
    return (0,) if axis is not None and _n(k.axes[axis].size) <= SMALL_DIM else ()


def _beside_symbolic(
    k: Kernel, dim: int, lanes: int, attempt: Callable[[OptOps, int | None, tuple[int, ...]], bool]
) -> None:
    """The reduction `dim`, read along memory, is symbolic and not known to be a multiple of a vector's lanes (so no
    action cuts it): instead a vector of the innermost whole output dim (rows side by side, each its own lanes: their
    loads a row apart, but the reductions' chains a vector at a time, where each row's was a scalar's one after
    another). A 1B model's prompt of 512 tokens in chunks of 256, before such a dim's multiples were known: the
    softmax's maxima and sums 401 -> 89 ms. (An elementwise kernel over such a dim gains nothing so: its gathers and
    scatters cost what the vector math saves.)"""
    if type(k.full_shape[dim]) is int:
        return
    static = [p for p in k.axes if p.kind is Kind.GLOBAL and type(p.size) is int and p.size > 1]
    if static:
        attempt(OptOps.UPCAST, k.axes.index(static[-1]), (lanes, 4, 2))


def _n(size: int | UOp) -> int:
    """A size as the rules weigh it: a symbolic one at its largest value."""
    return size if type(size) is int else highest(size)


def _axis(k: Kernel, dim: int) -> int | None:
    """The place among k.axes of the (still whole) part of `dim`."""
    for i, p in enumerate(k.axes):
        if p.dim == dim:
            return i
    return None


def _reduce_axis(k: Kernel) -> int:
    """The place among k.axes of the (first) reduce part."""
    return next(i for i, p in enumerate(k.axes) if p.kind is Kind.REDUCE)


def _stride(view: View, dim: int) -> int | None:
    return view.strides[dim] if dim < len(view.shape) and _n(view.shape[dim]) > 1 else None


def _broadcast(view: View, dim: int) -> bool:
    return dim < len(view.shape) and _n(view.shape[dim]) > 1 and view.strides[dim] == 0


def _contiguous_dim(store: View, k: Kernel) -> int | None:
    """The output dim the stored buffer is contiguous along, if any."""
    for d, (s, st) in enumerate(zip(store.shape, store.strides)):
        if _n(s) > 1 and st == 1 and d not in k.reduce_dims:
            return d
    return None
