"""The neural-network functions against torch.nn.functional: values and the gradient of every float input.

Shapes are small (PYTHON is an interpreter) and reused across tests, so that few distinct kernels compile.
Functions with integer targets use a local comparison: the targets are data, only the floats get gradients.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from torch_compare import compare

from tiny.codegen.lower import kernel_name
from tiny.ir.dtypes import dtypes
from tiny.ir.schedule import layout
from tiny.ir.uop import Ops
from tiny.tensor import Tensor

torch = pytest.importorskip("torch")
F = torch.nn.functional


def fn(name: str, *args, **kwargs):
    """Call name as a Tensor method on tiny tensors and as torch.nn.functional.name on torch tensors; `args` go
    right after the first input (normalized_shape, num_groups ...), the other inputs after them."""

    def run(first, *inputs):
        if isinstance(first, Tensor):
            return getattr(first, name)(*args, *inputs, **kwargs)
        return getattr(F, name)(first, *args, *inputs, **kwargs)

    return run


def kernels(t: Tensor) -> int:
    return len([i for i in t.schedule() if i.ast.op is Ops.SINK])


def rand(*shape: int, seed: int = 0, low: float = -2.0, high: float = 2.0) -> np.ndarray:
    return np.random.default_rng(seed).uniform(low, high, size=shape).astype(np.float32)


def compare_with_fixed(device, tiny_fn, torch_fn, floats, fixed, atol=1e-5, rtol=1e-4):
    """Like compare, with `fixed` arrays (integer targets, masks) passed after the floats and given no gradient."""
    ours = [Tensor(a, device=device, requires_grad=True) for a in floats]
    theirs = [torch.tensor(a, requires_grad=True) for a in floats]
    out = tiny_fn(*ours, *(Tensor(a, device=device) for a in fixed))
    ref = torch_fn(*theirs, *(torch.tensor(a) for a in fixed))
    np.testing.assert_allclose(out.numpy(), ref.detach().numpy(), atol=atol, rtol=rtol)
    seed = np.random.default_rng(1).uniform(-1, 1, size=ref.shape).astype(np.float32)
    out.backward(Tensor(seed, device=device))
    ref.backward(torch.tensor(seed))
    for i, (t, r) in enumerate(zip(ours, theirs)):
        assert t.grad is not None, f"input {i} got no gradient"
        np.testing.assert_allclose(t.grad.numpy(), r.grad.numpy(), atol=atol, rtol=rtol, err_msg=f"gradient {i}")


# ---------------------------------------------------------------- linear and einsum


def test_linear(device):
    compare(device, fn("linear"), (2, 3, 4), (5, 4), (5,))
    compare(device, fn("linear"), (3, 4), (4,))


EINSUMS = [
    ("ij,jk->ik", [(3, 4), (4, 5)]),
    ("...ij,jk->...ik", [(2, 3, 4), (4, 5)]),
    ("ij->", [(3, 4)]),
    ("ii->i", [(4, 4)]),
    ("iij->j", [(3, 3, 2)]),
    ("ij,jk,kl->il", [(2, 3), (3, 4), (4, 2)]),
    ("b...,b...->b", [(2, 3, 4), (1, 3, 4)]),
]


@pytest.mark.parametrize("formula,shapes", EINSUMS, ids=[e[0] for e in EINSUMS])
def test_einsum(device, formula, shapes):
    def run(*ops):
        return Tensor.einsum(formula, *ops) if isinstance(ops[0], Tensor) else torch.einsum(formula, *ops)

    compare(device, run, *shapes, atol=1e-4)


def test_einsum_errors():
    a = Tensor.ones(2, 3)
    with pytest.raises(ValueError, match="names 2 operand"):
        Tensor.einsum("ij,jk", a)
    with pytest.raises(ValueError, match="subscript 'j' has size"):
        Tensor.einsum("ij,jk", a, Tensor.ones(2, 2))
    with pytest.raises(ValueError, match="do not fit"):
        Tensor.einsum("ijk", a)
    with pytest.raises(ValueError, match="no operand has"):
        Tensor.einsum("ij->k", a)
    with pytest.raises(ValueError, match="repeats in operand 0"):
        Tensor.einsum("ii", a)


# ---------------------------------------------------------------- convolutions

CONV2D = [
    dict(padding=1),
    dict(stride=2, padding=1),
    dict(stride=2, padding=(0, 1), dilation=2, groups=2),
    dict(padding="same", dilation=(1, 2)),
]


@pytest.mark.parametrize("kw", CONV2D, ids=str)
def test_conv2d(device, kw):
    w = (4, 2 // kw.get("groups", 1), 3, 3)
    compare(device, fn("conv2d", **kw), (2, 2, 6, 5), w, (4,), atol=1e-4)


def test_conv2d_odd_size_stride(device):  # a stride that does not divide the input: views per kernel offset
    compare(device, fn("conv2d", stride=2, padding=1), (1, 2, 5, 5), (3, 2, 3, 3), atol=1e-4)


def test_conv1d_and_conv3d(device):
    compare(device, fn("conv1d", stride=2, padding=2, dilation=2), (2, 2, 7), (3, 2, 3), (3,), atol=1e-4)
    compare(device, fn("conv3d", padding=1, stride=(2, 1, 1)), (1, 2, 4, 3, 3), (2, 2, 2, 2, 2), atol=1e-4)


def test_conv_unbatched(device):
    x, w = Tensor(rand(2, 6, 5), device=device), Tensor(rand(4, 2, 3, 3, seed=1), device=device)
    np.testing.assert_allclose(x.conv2d(w).numpy(), x.unsqueeze(0).conv2d(w).numpy()[0])


CONV_T = [
    dict(stride=2, padding=1, output_padding=1),  # an output that is a whole number of stride phases
    dict(stride=2, padding=1),  # one that is not
    dict(stride=3, padding=2, output_padding=1, groups=2, dilation=2),
]


@pytest.mark.parametrize("kw", CONV_T, ids=str)
def test_conv_transpose2d(device, kw):
    compare(device, fn("conv_transpose2d", **kw), (2, 2, 3, 4), (2, 4 // kw.get("groups", 1), 3, 3), (4,), atol=1e-4)


def test_conv_transpose1d(device):
    compare(device, fn("conv_transpose1d", stride=2, dilation=2), (2, 2, 4), (2, 3, 3), (3,), atol=1e-4)


def test_conv_is_one_kernel_without_im2col(device):
    x, w, b = (Tensor(rand(*s, seed=i), device=device) for i, s in enumerate([(2, 3, 8, 8), (4, 3, 3, 3), (4,)]))
    y = x.conv2d(w, b, stride=2)
    assert kernels(y) == 1
    # the one kernel reads the input, the weight and the bias, and writes the output: no window buffer
    (item,) = y.schedule()
    assert sorted(buf.size for buf in item.buffers) == sorted([y.numel(), 2 * 3 * 64, 4 * 27, 4])
    for kw in (dict(padding=1), dict(stride=2, padding=1), dict(stride=2, padding=1, dilation=2)):
        y = x.conv2d(w, b, **kw)
        # padding: the zero-padded input is written once, and the convolution reads it without masks
        pad, item = y.schedule()
        assert [buf.size for buf in pad.buffers] == [2 * 3 * 10 * 10, 2 * 3 * 64], kw
        assert sorted(buf.size for buf in item.buffers) == sorted([y.numel(), 2 * 3 * 100, 4 * 27, 4]), kw
    assert kernels(x.conv_transpose2d(Tensor(rand(3, 2, 4, 4), device=device), stride=2, padding=1)) == 1
    assert kernels(x.max_pool2d(3, stride=2, padding=1)) == 1
    assert kernels(x.interpolate(scale_factor=2)) == 1


def test_a_big_padded_max_pool_writes_its_padding_once(device):
    """A max pool with padding over many channels (ResNet's first, after its 7 x 7 convolution): where convolutions
    keep channels innermost, the input is copied channels innermost with the padding as the lowest value, and the
    pool reads it without masks (a gate on each of 9 reads: 6.9 -> 2.5 ms); torch's values and gradients."""
    big = layout.channels_last(device, dtypes.float32, 32, 4 * 32 * 32 * 32 * 9)
    shape = (4, 32, 64, 64) if big else (1, 4, 9, 9)  # (elsewhere the pool gates its reads: a small one shows it)
    compare(device, fn("max_pool2d", 3, stride=2, padding=1), shape)
    items = Tensor(rand(*shape), device=device).max_pool2d(3, stride=2, padding=1).schedule()
    if not big:
        assert len(items) == 1
        return
    copy, reduce = (item.ast for item in items)
    assert copy.src[0].view.shape == (4, 66, 66, 32)  # (padded, channels innermost)
    for u in (u for u in reduce.toposort if u.op is Ops.READ):  # masks pick a window's cell, never padding
        assert u.view.mask is None or all(m == (0, n) for m, n in zip(u.view.mask[:4], u.view.shape)), u.view


def test_conv_errors():
    x = Tensor.ones(1, 4, 5, 5)
    with pytest.raises(ValueError, match="input has 4 channels"):
        x.conv2d(Tensor.ones(2, 3, 3, 3))
    with pytest.raises(ValueError, match="groups=3 must divide"):
        x.conv2d(Tensor.ones(3, 2, 3, 3), groups=3)
    with pytest.raises(ValueError, match="does not fit"):
        x.conv2d(Tensor.ones(2, 4, 7, 7))
    with pytest.raises(ValueError, match="weight must be"):
        x.conv2d(Tensor.ones(2, 4, 3))
    with pytest.raises(ValueError, match="bias must have shape"):
        x.conv2d(Tensor.ones(2, 4, 3, 3), Tensor.ones(3))
    with pytest.raises(ValueError, match="'same' needs stride 1"):
        x.conv2d(Tensor.ones(2, 4, 3, 3), stride=2, padding="same")
    with pytest.raises(ValueError, match="stride takes"):
        x.conv2d(Tensor.ones(2, 4, 3, 3), stride=(1, 2, 3))
    with pytest.raises(ValueError, match="needs input"):
        Tensor.ones(5, 5).conv2d(Tensor.ones(2, 4, 3, 3))
    with pytest.raises(ValueError, match="output_padding"):
        x.conv_transpose2d(Tensor.ones(4, 2, 3, 3), stride=2, output_padding=2)
    with pytest.raises(ValueError, match="expects 3"):
        x.conv_transpose2d(Tensor.ones(3, 2, 3, 3))


# ---------------------------------------------------------------- pooling

POOLS = [
    ("avg_pool2d", dict(kernel_size=2)),
    ("avg_pool2d", dict(kernel_size=3, stride=2, padding=1, ceil_mode=True, count_include_pad=False)),
    ("avg_pool2d", dict(kernel_size=(3, 2), stride=2, padding=1, ceil_mode=True)),
    ("max_pool2d", dict(kernel_size=2)),
    ("max_pool2d", dict(kernel_size=3, stride=2, padding=1, dilation=(1, 2), ceil_mode=True)),
    ("adaptive_avg_pool2d", dict(output_size=(4, None))),  # windows of different sizes along H
]


@pytest.mark.parametrize("name,kw", POOLS, ids=[f"{n}-{kw}" for n, kw in POOLS])
def test_pool2d(device, name, kw):
    compare(device, fn(name, **kw), (2, 2, 6, 5))


def test_pool1d(device):
    compare(device, fn("max_pool1d", 3, stride=2, padding=1), (2, 2, 7))
    compare(device, fn("avg_pool1d", 3, stride=2, padding=1, count_include_pad=False), (2, 2, 7))
    compare(device, fn("adaptive_avg_pool1d", 3), (2, 2, 7))


def test_pool_errors():
    x = Tensor.ones(1, 1, 4, 4)
    with pytest.raises(ValueError, match="at most half"):
        x.max_pool2d(2, padding=2)
    with pytest.raises(ValueError, match="kernel_size takes"):
        x.avg_pool2d((2, 2, 2))
    with pytest.raises(ValueError, match="does not fit"):
        x.max_pool2d(5)


# ---------------------------------------------------------------- interpolate

RESIZES = [
    dict(scale_factor=2, mode="nearest"),
    dict(size=(3, 7), mode="nearest"),
    dict(size=(5, 3), mode="nearest-exact"),
    dict(size=(3, 7), mode="bilinear", align_corners=False),
    dict(scale_factor=(2, 1.5), mode="bilinear", align_corners=True),
]


@pytest.mark.parametrize("kw", RESIZES, ids=str)
def test_interpolate(device, kw):
    compare(device, fn("interpolate", **kw), (1, 2, 4, 5))


def test_interpolate_linear(device):
    compare(device, fn("interpolate", size=7, mode="linear"), (1, 2, 4))
    with pytest.raises(ValueError, match="needs a 4-d input"):
        Tensor.ones(1, 2, 4).interpolate(size=3, mode="bilinear")


# ---------------------------------------------------------------- normalization


def test_layer_norm(device):
    compare(device, fn("layer_norm", (3, 4), eps=1e-3), (2, 3, 4), (3, 4), (3, 4), atol=1e-4)


def test_layer_norm_is_at_most_three_kernels(device):
    x, w, b = Tensor(rand(4, 8), device=device), Tensor(rand(8), device=device), Tensor(rand(8), device=device)
    assert kernels(x.layer_norm(8, w, b)) <= 3


def test_group_and_rms_norm(device):
    compare(device, fn("group_norm", 2), (2, 4, 3), (4,), (4,), atol=1e-4)
    compare(device, fn("rms_norm", (4,)), (2, 3, 4), (4,), atol=1e-4)


@pytest.mark.parametrize("training", [True, False])
def test_batch_norm(device, training):
    stats = [rand(3, seed=5), rand(3, seed=6, low=0.5, high=2.0)]
    mine = [Tensor(a, device=device) for a in stats]
    theirs = [torch.tensor(a) for a in stats]

    def run(x, w, b):
        rm, rv = mine if isinstance(x, Tensor) else theirs
        return fn("batch_norm", rm, rv, w, b, training=training, momentum=0.2)(x)

    compare(device, run, (4, 3, 2), (3,), (3,), atol=1e-4)
    for ours, ref in zip(mine, theirs):  # training updated the running statistics in place, as torch did
        np.testing.assert_allclose(ours.numpy(), ref.numpy(), atol=1e-5, rtol=1e-4)


def test_batch_norm_follows_train_mode():
    x = Tensor(rand(4, 3))
    rm, rv = Tensor.zeros(3), Tensor.ones(3)
    assert np.allclose(x.batch_norm(rm, rv, eps=0).numpy(), x.numpy())  # eval: running stats 0 and 1
    with Tensor.train():
        y = x.batch_norm(rm, rv).numpy()
    np.testing.assert_allclose(y.mean(axis=0), 0, atol=1e-5)
    assert not np.allclose(rm.numpy(), 0)


def test_norm_errors():
    with pytest.raises(ValueError, match="last dims"):
        Tensor.ones(2, 3).layer_norm(4)
    with pytest.raises(ValueError, match="num_groups=3 must divide"):
        Tensor.ones(2, 4, 3).group_norm(3)
    with pytest.raises(ValueError, match=r"shape \(3,\)"):
        Tensor.ones(2, 3).batch_norm(Tensor.zeros(4), Tensor.ones(3))


# ---------------------------------------------------------------- dropout and attention


def test_dropout(device):
    Tensor.manual_seed(3)
    x = Tensor(np.ones((64, 16), np.float32), device=device, requires_grad=True)
    y = x.dropout(0.25, training=True)
    got = y.numpy()
    kept = got != 0
    np.testing.assert_allclose(got[kept], 1 / 0.75, rtol=1e-6)
    assert 0.6 < kept.mean() < 0.9
    y.sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), got, rtol=1e-6)  # the same mask scales the gradient
    assert x.dropout(0.25).numpy().tolist() == x.numpy().tolist()  # not training: the identity
    assert not x.dropout(1.0, training=True).numpy().any()
    with pytest.raises(ValueError, match="between 0 and 1"):
        x.dropout(1.5)


SDPA = [dict(), dict(scale=0.3, is_causal=True)]


@pytest.mark.parametrize("kw", SDPA, ids=str)
def test_scaled_dot_product_attention(device, kw):
    compare(device, fn("scaled_dot_product_attention", **kw), (2, 3, 4), (2, 5, 4), (2, 5, 3), atol=1e-4)


def test_attention_masks_and_gqa(device):
    compare(device, fn("scaled_dot_product_attention"), (2, 3, 4), (2, 5, 4), (2, 5, 3), (3, 5), atol=1e-4)
    mask = np.random.default_rng(2).random((2, 3, 5)) < 0.7
    mask[..., 0] = True  # every query keeps a key
    run = fn("scaled_dot_product_attention")
    compare_with_fixed(device, run, run, [rand(2, 3, 4), rand(2, 5, 4, seed=1), rand(2, 5, 3, seed=2)], [mask])
    gqa = fn("scaled_dot_product_attention", enable_gqa=True, is_causal=True)
    compare(device, gqa, (1, 4, 3, 2), (1, 2, 3, 2), (1, 2, 3, 2), atol=1e-4)


def test_attention_over_keys_padded_to_whole_vectors(device):
    """Many queries over a number of keys that is no whole number of vectors (77 text tokens): the keys and values
    padded with zeros, the padding's scores masked out, whatever mask the call gives; torch's values."""
    shapes = (1, 2, 20, 8), (1, 2, 15, 8), (1, 2, 15, 8)
    for kw in (dict(), dict(is_causal=True)):
        compare(device, fn("scaled_dot_product_attention", **kw), *shapes, atol=1e-4)
    compare(device, fn("scaled_dot_product_attention"), *shapes, (20, 15), atol=1e-4)  # a float mask
    gqa = fn("scaled_dot_product_attention", enable_gqa=True)
    compare(device, gqa, (1, 4, 20, 8), (1, 2, 15, 8), (1, 2, 15, 8), atol=1e-4)
    run = fn("scaled_dot_product_attention")
    inputs = [rand(*shapes[0]), rand(*shapes[1], seed=1), rand(*shapes[2], seed=2)]
    rng = np.random.default_rng(3)
    for mask in (rng.random((20, 15)) < 0.7, rng.random((2, 20, 1)) < 0.7):  # (one broadcast along the keys)
        mask[..., 0] = True  # every query keeps a key
        compare_with_fixed(device, run, run, inputs, [mask])
    q, k, v = (Tensor(x, device=device) for x in inputs)
    names = [kernel_name(i.ast) for i in q.scaled_dot_product_attention(k, v).schedule()]
    keys = layout.whole_vectors(device, dtypes.float32, 15)  # (16 on the CPU; 15 where workgroups tile)
    assert f"r_2_20_{keys}_8" in names, names  # the scores over the padded keys


def test_attention_over_many_queries_reads_each_row_of_scores_along_memory(device):
    """With many queries (a prompt, an encoder) the keys are transposed once, so the kernel of the scores reads both
    operands along its output row (or broadcast), where it read the keys a row apart, and the probabilities are a
    buffer of their own (one kernel: each row's max and sum in it); one query (a decode step) reads the keys in place,
    as a product with one row does, and its few exps stay fused (a kernel more would cost more)."""
    for length, copies in ((32, 1), (1, 0)):
        q = Tensor(rand(1, 2, length, 40), device=device)
        k, v = (Tensor(rand(1, 2, 24, 40, seed=i), device=device) for i in (1, 2))
        kernels = [i.ast for i in q.scaled_dot_product_attention(k, v).schedule() if i.ast.op is Ops.SINK]
        plain = [ast for ast in kernels if not any(u.op is Ops.REDUCE_AXIS for u in ast.toposort)]
        scores = next(ast for ast in kernels if any(u.op is Ops.REDUCE_AXIS for u in ast.toposort))
        inner = scores.src[0].view.strides.index(1)
        reads = [u.view.strides[inner] for u in scores.toposort if u.op is Ops.READ]
        assert len(plain) == copies  # (the keys' transpose)
        if copies:
            assert len(kernels) == 4  # the transpose, the scores, the probabilities, their product with the values
            assert all(s in (0, 1) for s in reads), reads


def test_attention_over_many_computed_queries_computes_each_once(device):
    """Many queries that are computed (a language model's rotated ones) are a buffer of their own before the scores:
    fused into the product with the keys, each query was computed again for every key, or every vector of keys."""
    x = Tensor(rand(1, 2, 32, 40), device=device)
    k, v = (Tensor(rand(1, 2, 24, 40, seed=i), device=device) for i in (1, 2))
    kernels = [i.ast for i in x.sin().scaled_dot_product_attention(k, v).schedule() if i.ast.op is Ops.SINK]
    computing = [ast for ast in kernels if any(u.op is Ops.SIN for u in ast.toposort)]
    assert len(computing) == 1 and not any(u.op is Ops.REDUCE_AXIS for u in computing[0].toposort)


def test_batch_norm_outside_training_computes_each_channels_factors_once(device):
    """With running statistics, each channel's scale and shift are computed once, into buffers of their own, as
    PyTorch computes them: the kernel that normalizes reads them and takes no square root (fused into it, every
    position took its channel's square root and division again)."""
    x = Tensor(rand(2, 3, 4, 4), device=device)
    stats = [Tensor(rand(3, seed=i, low=0.5, high=1.5), device=device) for i in range(4)]
    kernels = [i.ast for i in x.batch_norm(*stats, training=False).schedule() if i.ast.op is Ops.SINK]
    assert any(u.op is Ops.SQRT for ast in kernels for u in ast.toposort)
    assert not any(u.op is Ops.SQRT for u in kernels[-1].toposort)


def test_attention_computes_each_probability_once(device):
    """The softmax's probabilities are a buffer of their own, read by the product with the values: that kernel
    computes no exp (fused into it, each exp was computed again for every block of output columns)."""
    q, k, v = (Tensor(rand(2, 3, 16, 8, seed=i), device=device) for i in range(3))
    kernels = [i.ast for i in q.scaled_dot_product_attention(k, v).schedule() if i.ast.op is Ops.SINK]
    assert any(u.op is Ops.EXP2 for ast in kernels for u in ast.toposort)
    assert not any(u.op is Ops.EXP2 for u in kernels[-1].toposort)


# ---------------------------------------------------------------- losses

LOGITS, TARGET = rand(4, 5), np.array([1, 0, 4, 2], dtype=np.int64)

CROSS_ENTROPY = [
    dict(),
    dict(reduction="none", ignore_index=4),
    dict(reduction="sum", label_smoothing=0.2),
    dict(ignore_index=0, label_smoothing=0.1),
]


@pytest.mark.parametrize("kw", CROSS_ENTROPY, ids=str)
def test_cross_entropy(device, kw):
    run = fn("cross_entropy", **kw)
    compare_with_fixed(device, run, run, [LOGITS], [TARGET])


def test_cross_entropy_class_weights(device):
    def run(x, t, w):
        return fn("cross_entropy", weight=w, ignore_index=0, label_smoothing=0.1)(x, t)

    compare_with_fixed(device, run, run, [LOGITS], [TARGET, rand(5, seed=3, low=0.1, high=1)])


def test_cross_entropy_probabilities_and_spatial(device):
    probs = np.random.default_rng(4).dirichlet(np.ones(5), size=4).astype(np.float32)
    compare(device, fn("cross_entropy", label_smoothing=0.3), (4, 5), data=[LOGITS, probs])
    spatial_probs = np.ascontiguousarray(np.random.default_rng(6).dirichlet(np.ones(5), size=(2, 3)).transpose(0, 2, 1))
    compare(device, fn("cross_entropy", reduction="none"), data=[rand(2, 5, 3), spatial_probs.astype(np.float32)])
    spatial = np.random.default_rng(5).integers(0, 5, size=(2, 3)).astype(np.int64)
    run = fn("cross_entropy", reduction="none")
    compare_with_fixed(device, run, run, [rand(2, 5, 3)], [spatial])
    unbatched = fn("cross_entropy")
    compare_with_fixed(device, unbatched, unbatched, [rand(5)], [np.array(3, dtype=np.int64)])


@pytest.mark.parametrize("reduction", ["mean", "none"])
def test_nll_loss(device, reduction):
    def run(x, t, w):
        return fn("nll_loss", weight=w, ignore_index=2, reduction=reduction)(x, t)

    compare_with_fixed(device, run, run, [LOGITS], [TARGET, rand(5, seed=3, low=0.1, high=1)])


def test_binary_cross_entropy(device):
    compare(device, fn("binary_cross_entropy"), (3, 4), (3, 4), low=0.05, high=0.95)
    run = fn("binary_cross_entropy", reduction="sum")
    probs, target, weight = rand(3, 4, low=0.05, high=0.95), rand(3, 4, seed=1, low=0, high=1), rand(4, seed=2)

    def weighted(x, t, w):
        return fn("binary_cross_entropy", weight=w, reduction="none")(x, t)

    compare_with_fixed(device, weighted, weighted, [probs, target], [weight])
    compare(device, run, data=[probs, target])


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_binary_cross_entropy_with_logits(device, reduction):
    def run(x, t, w, pw):
        return fn("binary_cross_entropy_with_logits", weight=w, pos_weight=pw, reduction=reduction)(x, t)

    floats = [rand(3, 4, low=-6, high=6), rand(3, 4, seed=1, low=0, high=1)]
    compare_with_fixed(device, run, run, floats, [rand(3, 4, seed=2), rand(4, seed=3, low=0.5)])


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_mse_and_l1(device, reduction):
    compare(device, fn("mse_loss", reduction=reduction), (3, 4), (3, 4))
    compare(device, fn("l1_loss", reduction=reduction), (3, 4), (3, 4))


def test_loss_errors():
    x = Tensor.ones(4, 5)
    with pytest.raises(ValueError, match="reduction must be"):
        x.mse_loss(x, reduction="avg")
    with pytest.raises(ValueError, match="needs target of shape"):
        x.cross_entropy(Tensor([1, 2]))
    with pytest.raises(TypeError, match="integer class indices"):
        x.nll_loss(Tensor([True, False, True, False]))
    with pytest.raises(ValueError, match="one value per class"):
        x.cross_entropy(Tensor([1, 2, 3, 4]), weight=Tensor.ones(4))
    with pytest.raises(ValueError, match="must equal input shape"):
        x.binary_cross_entropy(Tensor.ones(5))
    assert math.isclose(x.cross_entropy(Tensor([0, 1, 2, 3])).item(), math.log(5), rel_tol=1e-6)
