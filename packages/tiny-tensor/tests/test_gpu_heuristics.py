"""The hand-written rules' choices for GPUs (what an H100 measured them against is in bench/RESULTS_GPU.md): kernels
scheduled on PYTHON (a device with workgroups and local memory, as a GPU's) and planned for the CUDA renderer."""

from __future__ import annotations

import math

import numpy as np
import pytest

from tiny import nn
from tiny.codegen import render_for
from tiny.codegen.lower import kernel_name
from tiny.codegen.opt import Kernel, Kind, OptOps
from tiny.codegen.opt.heuristic import hand_opts
from tiny.codegen.renderer.cuda import CUDARenderer
from tiny.ir.uop import Ops
from tiny.tensor import Tensor

CAPS = CUDARenderer("arch=sm_90").caps
DEV = "PYTHON"


def plans(t: Tensor) -> list[tuple[str, Kernel]]:
    out = []
    for item in t.schedule():
        k = Kernel(item.ast, CAPS)
        out.append((kernel_name(item.ast), k.apply_opts(hand_opts(k))))
    return out


def threads(k: Kernel) -> int:
    return k.workgroup_threads()


def test_a_big_elementwise_kernel_takes_256_threads_and_two_vectors_each() -> None:
    a, b = Tensor.empty(1 << 22, device=DEV).realize(), Tensor.empty(1 << 22, device=DEV).realize()
    ((_, k),) = plans((a * b + 1).exp2())
    assert threads(k) == 256 and math.prod(p.size for p in k.of_kind(Kind.UPCAST)) == 2 * CAPS.vector_width


def test_a_full_sum_splits_into_partials_that_workgroups_share() -> None:
    x = Tensor.empty(1 << 22, device=DEV).realize()
    (first, k1), (second, k2) = plans(x.sum())
    assert first == "r_1024_4096" and second == "r_1024", "1024 partials of 4096, then one sum of them"
    assert k1.of_kind(Kind.GROUP) and threads(k1) >= 128, "each partial shared by a workgroup, reading side by side"
    assert k2.of_kind(Kind.GROUP)


def test_rows_of_a_softmax_are_each_shared_by_a_workgroup() -> None:
    """One kernel: 256 threads share each row's max and sum (ROWS). A row of 8192 is 32 values a thread, all held
    (UPCAST and UNROLL 32: each loaded once, for both reductions and the output); a row of 32000 is 125 a thread:
    5 of them each, the rest of the row in 24 more workgroups, each reducing the row again."""
    x = Tensor.empty(64, 8192, device=DEV).realize()
    ((name, k),) = plans(x.softmax(-1))
    assert name == "r_64_8192_8192" and k.rows is not None and threads(k) == 256
    assert [p.size for p in k.of_kind(Kind.UPCAST)] == [32] and [p.size for p in k.of_kind(Kind.UNROLL)] == [32]
    assert k.of_kind(Kind.GROUP)[0].size == 256 and not k.of_kind(Kind.REDUCE)
    x = Tensor.empty(8, 32000, device=DEV).realize()
    ((name, k),) = plans(x.softmax(-1))
    assert [p.size for p in k.of_kind(Kind.UPCAST)] == [5] and not k.of_kind(Kind.UNROLL) and threads(k) == 256


def test_a_held_row_is_loaded_once() -> None:
    """A softmax row held in registers: each of a thread's values loaded once, though the max, the sum and the
    output all read it; the local buffers hold one partial a thread, not one for each value of the row, read back a
    vector at a time. A row of
    2048 takes 64 threads of 32 values (after the barrier each thread reads all the row's partials: the fewer the
    better, down to what the threads can hold)."""
    x = Tensor.empty(4, 2048, device=DEV).realize()
    (item,) = x.softmax(-1).schedule()
    r = render_for(item.ast, CUDARenderer("arch=sm_90"))
    assert r.kernel.local_size == (64, 1, 1)
    loads = [u for u in r.uops if u.op is Ops.LOAD and u.address.pointer.op is Ops.DEFINE_GLOBAL]
    assert sum(u.dtype.count for u in loads) == 32, r.src
    assert [u.arg[1] for u in r.uops if u.op is Ops.DEFINE_LOCAL] == [64, 64]
    # each partial stored, a barrier, then the partials read four at a time (16-byte reads of local memory)
    stores = [u for u in r.uops if u.op is Ops.STORE and u.address.pointer.op is Ops.DEFINE_LOCAL]
    reads = [u for u in r.uops if u.op is Ops.LOAD and u.address.pointer.op is Ops.DEFINE_LOCAL]
    assert len(stores) == 2 and [u.dtype.count for u in reads] == [4, 4], r.src
    assert r.src.count("__syncthreads();") == 2 and r.src.count("tiny_vload<float, 4>((temp") == 2


@pytest.mark.parametrize("size, channels, window, split", [(24, 32, 5, 64), (8, 64, 3, 32)])
def test_a_weight_gradient_over_the_batch_is_partial_products_tiled_in_registers(
    size: int, channels: int, window: int, split: int
) -> None:
    """32 x 32 x 5 x 5 = 25600 outputs, each a sum over 128 x 20 x 20 (the MNIST step's second convolution): with
    each output shared by a workgroup over the batch, a warp's threads read images 73 KB apart (an H200: 2.3 ms, 1.1
    TFLOPS). The scheduler splits the batch (64 partials of 2 images: a million outputs; 64 x 64 x 3 x 3's 32 of 4),
    and each thread tiles the partial products in registers, the window's offsets one view: 32 to 64 outputs, 128
    accumulator lanes at most (a tile of 100 outputs, each a vector of 4 steps, spilled 4.5 KB on sm_90), no
    workgroup sharing an output; then a short sum of the partials."""
    x = Tensor.empty(128, channels, size, size, device=DEV).realize()
    x.requires_grad = True
    conv = nn.Conv2d(channels, channels, window, device=DEV)
    conv(x).sum().backward()
    out = size - window + 1
    images = 128 // split
    named = dict(plans(conv.weight.grad))
    k = named[f"r_{split}_{channels}_{channels}_{window}_{window}_{images}_{out}_{out}"]
    assert f"r_{channels}_{channels}_{window}_{window}_{split}" in named
    tile = math.prod(p.size for p in k.of_kind(Kind.UPCAST))
    assert 32 <= tile <= 64 and not k.of_kind(Kind.GROUP) and threads(k) >= 128
    uops = render_for(k.ast, CUDARenderer("arch=sm_90"), k.applied).uops
    assert sum(u.dtype.count for u in uops if u.op is Ops.DEFINE_ACC) <= 128  # (registers, vector lanes counted)
    assert math.prod(p.size for p in k.of_kind(Kind.UNROLL)) <= 25  # (a window's steps at most)
    reads = [u for u in k.ast.toposort if u.op is Ops.READ]
    assert len(reads) == 2, "the layer's input through one view of its window (not a sum of a view per offset)"


def test_the_shared_reductions_compute_what_numpy_does() -> None:
    rng = np.random.default_rng(0)
    a = rng.standard_normal(1 << 16).astype(np.float32)
    m = rng.standard_normal((16, 4096)).astype(np.float32)
    np.testing.assert_allclose(Tensor(a, device=DEV).sum().item(), a.sum(dtype=np.float64), rtol=1e-4)
    np.testing.assert_allclose(Tensor(m, device=DEV).softmax(-1).numpy().sum(-1), np.ones(16), rtol=1e-5)


def test_a_convolutions_grid_keeps_its_scheduled_order() -> None:
    """The loop orders of a CPU's caches (a panel's rows innermost, a big weight's blocks outermost) are not a GPU's:
    its global dims are the grid. With the window read as one view, the input gradient of 32 -> 64 channels 3 x 3
    over 10 x 10 looked like a panel to them, and its grid was swapped."""
    x = Tensor.empty(128, 32, 10, 10, device=DEV).realize()
    w = Tensor.empty(64, 32, 3, 3, device=DEV).realize()
    x.requires_grad = True
    y = x.conv2d(w)
    (dx,) = y.gradient(x, gradient=Tensor.empty(*y.shape, device=DEV).realize())
    applied = [o.op for t in (y, dx) for _, k in plans(t) for o in k.applied]
    assert applied and OptOps.SWAP not in applied


def test_an_nchw_elementwise_kernel_has_a_workgroup_per_tile_not_a_loop_over_images() -> None:
    """Four output dims, three grid dims: the last takes the outer dims too (images and channels: each workgroup
    finds its own from its index), where they were a loop in each workgroup (the MNIST step's batch-norm backward
    on 128 x 32 x 24 x 24: 18 workgroups of 256 threads, each looping 128 times; now 2304). On PYTHON the merged
    indices compute what NumPy does."""
    rng = np.random.default_rng(0)
    xs, cs = (
        rng.standard_normal((8, 6, 12, 20)).astype(np.float32),
        rng.standard_normal((1, 6, 1, 1)).astype(np.float32),
    )
    x, c = Tensor(xs, device=DEV), Tensor(cs, device=DEV)
    out = (x * c + x.exp2()).relu()
    for name, k in plans(out) + plans(Tensor.empty(128, 32, 24, 24, device=DEV).realize().relu() * 2):
        rendered = render_for(k.ast, CUDARenderer("arch=sm_90"), k.applied)
        assert not any(u.op is Ops.RANGE for u in rendered.uops), name
        covered = math.prod(rendered.kernel.global_size) * math.prod(rendered.kernel.local_size) * k.lanes()
        assert covered == math.prod(k.full_shape), name
    np.testing.assert_allclose(out.numpy(), np.maximum(xs * cs + np.exp2(xs), 0), rtol=1e-5, atol=1e-5)


def test_a_few_outputs_reduction_groups_a_reduce_dim_that_threads_split() -> None:
    """Few outputs over several reduce dims: the workgroup's threads share each output along the longest reduce dim
    they split (the 16 images of 16 x 20 x 20), where the longest (20, which 16 threads do not split) left each
    output to one thread; the sums still what NumPy gives."""
    xs = np.random.default_rng(0).standard_normal((8, 16, 32, 20, 20)).astype(np.float32)
    total = Tensor(xs, device=DEV).sum((1, 3, 4))
    ((_, k),) = plans(total)
    assert [p.size for p in k.of_kind(Kind.GROUP)] == [16] and threads(k) >= 64
    np.testing.assert_allclose(total.numpy(), xs.sum((1, 3, 4)), rtol=1e-4, atol=1e-3)


def test_a_sum_whose_biggest_read_runs_along_an_output_takes_neighbouring_outputs_in_a_warp() -> None:
    """A decode step's attention weights times the cached values, summed over the positions: the values (the big
    read) run along the head's dim, an output dim. Neighbouring threads take neighbouring outputs (a warp reads whole
    rows) and the rest of a 256-thread workgroup shares each sum, where a workgroup per output read the rows' values a
    row apart; the products still what NumPy gives."""
    rng = np.random.default_rng(0)
    ws, vs = rng.standard_normal((16, 1, 96)).astype(np.float32), rng.standard_normal((16, 96, 64)).astype(np.float32)
    out = Tensor(ws, device=DEV) @ Tensor(vs, device=DEV)
    ((_, k),) = plans(out)
    along = [p for p in k.of_kind(Kind.LOCAL) if p.dim == len(k.full_shape) - 2]  # (the head's dim, before the sum)
    assert [p.size for p in along] == [64] and k.of_kind(Kind.GROUP) and threads(k) == 256
    np.testing.assert_allclose(out.numpy(), ws @ vs, rtol=1e-4, atol=1e-4)


def test_a_symbolic_output_dim_leaves_the_workgroup_to_the_others() -> None:
    """A decode step's scores over the cache (heads x positions so far): the positions' dim is symbolic and takes no
    LOCAL, so the heads' dim takes the workgroup's threads, where each had 16 (half a warp)."""
    from tiny.ir.sint import Variable

    pos = Variable("pos", 1, 256).bind(20)
    q, keys = Tensor.empty(128, 1, 64, device=DEV).realize(), Tensor.empty(128, 256, 64, device=DEV).realize()
    ((_, k),) = plans(q @ keys[:, :pos].transpose(1, 2))
    assert threads(k) == 128 and all(type(p.size) is int for p in k.of_kind(Kind.LOCAL))


def test_a_short_sum_along_an_outputs_read_is_planned_with_no_reduce_part_left() -> None:
    """A small training step's gradients (a 3 x 3 convolution, batch norm, a linear layer of 144 -> 3, a batch of 8):
    the linear weight's sum of 8 is unrolled whole before the workgroup is chosen, so no reduce part is left to
    group (the rules once failed on it: max() of none). Every gradient is planned, and computes on PYTHON what it
    does on the CPU."""
    x = np.random.default_rng(1).standard_normal((8, 1, 8, 8)).astype(np.float32)

    def grads(device: str) -> list[Tensor]:
        Tensor.manual_seed(0)
        model = [nn.Conv2d(1, 4, 3, device=device), nn.BatchNorm2d(4, device=device), nn.Linear(144, 3, device=device)]
        with Tensor.train():
            h = model[1](model[0](Tensor(x, device=device)).relu()).flatten(1)
            model[2](h).cross_entropy(Tensor(np.zeros(8, np.int32), device=device)).backward()
        return [p.grad for m in model for p in (m.weight, m.bias) if p.grad is not None]

    on_gpu = grads(DEV)
    for g in on_gpu:
        plans(g)
    for g, want in zip(on_gpu, grads("CPU")):
        np.testing.assert_allclose(g.numpy(), want.numpy(), rtol=1e-4, atol=1e-5)
