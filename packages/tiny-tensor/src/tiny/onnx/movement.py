"""ONNX's constants, shapes, movement and indexing operators as tiny tensor ops (Shape, Size, Constant, Range
and the like give host arrays, which feed the shape arguments of Reshape, Slice, Expand ... without a kernel)."""

from __future__ import annotations

import math

import numpy as np

from tiny.ir.dtypes import dtypes
from tiny.onnx.model import HOST_LIMIT, NodeCall, normalize_axis, onnx_dtype, register, wrapped_index
from tiny.tensor import Tensor
from tiny.tensor.shapes import broadcast_shape

# ---------------------------------------------------------------- constants and shapes (host values)


@register("Constant", host=True)
@register("Constant")
def constant(c: NodeCall) -> np.ndarray:
    given = [k for k in c.attrs if k.startswith("value") or k == "sparse_value"]
    if len(given) != 1:
        raise ValueError(f"{c.where}: exactly one value attribute is needed, got {given}")
    key = given[0]
    if key == "sparse_value":
        raise NotImplementedError(f"{c.where}: sparse_value constants are not implemented")
    value = c.attrs[key]
    kinds = {"value_float": np.float32, "value_floats": np.float32, "value_int": np.int64, "value_ints": np.int64}
    if key in kinds:
        return np.array(value, dtype=kinds[key])
    if isinstance(value, np.ndarray) and value.dtype.kind in "iubf":
        return value
    raise NotImplementedError(f"{c.where}: a constant of {key} ({type(value).__name__}) has no tiny dtype")


@register("Shape", host=True)
@register("Shape")
def shape(c: NodeCall) -> np.ndarray:
    dims = c.value(0).shape
    start, end = c.attr("start", 0), c.attr("end", len(dims))
    return np.array(dims[slice(start, end)], dtype=np.int64)


@register("Size", host=True)
@register("Size")
def size(c: NodeCall) -> np.ndarray:
    return np.array(math.prod(c.value(0).shape), dtype=np.int64)


@register("ConstantOfShape")
def constant_of_shape(c: NodeCall) -> Tensor:
    value = c.attr("value", np.zeros(1, np.float32))
    fill = Tensor(value.reshape(-1)[:1].copy(), device=c.device)  # (its dtype is the output's)
    return fill.reshape(()).expand(tuple(c.ints(0)))


@register("ConstantOfShape", host=True)
def constant_of_shape_host(c: NodeCall) -> np.ndarray | Tensor:
    dims = tuple(c.ints(0))
    if math.prod(dims) > HOST_LIMIT:  # a tensor, not a shape computation's value
        return constant_of_shape(c)
    value = c.attr("value", np.zeros(1, np.float32))
    return np.full(dims, value.reshape(-1)[0], dtype=value.dtype)


@register("Range", host=True)
def range_host(c: NodeCall) -> np.ndarray:
    start, limit, delta = c.host(0), c.host(1), c.host(2)
    n = max(int(np.ceil((limit.item() - start.item()) / delta.item())), 0)  # (its length depends on the values)
    return (start + np.arange(n, dtype=start.dtype) * delta).astype(start.dtype)


@register("Range")
def range_(c: NodeCall) -> Tensor:
    return Tensor(range_host(c), device=c.device).cast(c.tensor(0).dtype)  # (bfloat16 is read back as float32)


@register("NonZero")
def nonzero(c: NodeCall) -> np.ndarray:
    return np.array(np.nonzero(c.host(0)), dtype=np.int64).reshape(c.value(0).host.ndim, -1)


# ---------------------------------------------------------------- movement


def _target_shape(c: NodeCall, x_shape: tuple[int, ...], dims: list[int]) -> tuple[int, ...]:
    allowzero = c.attr("allowzero", 0)
    out = [x_shape[i] if d == 0 and not allowzero else d for i, d in enumerate(dims)]
    if out.count(-1) > 1:
        raise ValueError(f"{c.where}: at most one -1 in the shape, got {dims}")
    if -1 in out:
        known = math.prod(d for d in out if d != -1)
        out[out.index(-1)] = math.prod(x_shape) // known if known else 0
    if math.prod(out) != math.prod(x_shape):
        raise ValueError(f"{c.where}: cannot reshape {tuple(x_shape)} to {tuple(dims)}")
    return tuple(out)


@register("Reshape")
def reshape(c: NodeCall) -> Tensor:
    x = c.tensor(0)
    dims = c.attr("shape") if c.opset < 5 else c.ints(1)
    return x.reshape(_target_shape(c, x.shape, list(dims)))


@register("Reshape", host=True)
def reshape_host(c: NodeCall) -> np.ndarray:
    x = c.host(0)
    dims = c.attr("shape") if c.opset < 5 else c.ints(1)
    return x.reshape(_target_shape(c, x.shape, list(dims)))


@register("Flatten")
def flatten(c: NodeCall) -> Tensor:
    x = c.tensor(0)
    axis = c.attr("axis", 1)
    if not -x.ndim <= axis <= x.ndim:
        raise ValueError(f"{c.where}: axis {axis} is out of range for a tensor of {x.ndim} dims")
    axis = axis + x.ndim if axis < 0 else axis
    return x.reshape(math.prod(x.shape[:axis]), math.prod(x.shape[axis:]))


def _axes_of(c: NodeCall, attr_until: int, index: int = 1) -> list[int] | None:
    """Axes: an attribute before opset `attr_until`, an optional input from then on."""
    return c.attr("axes") if c.opset < attr_until else c.ints(index)


@register("Squeeze")
def squeeze(c: NodeCall) -> Tensor:
    x = c.tensor(0)
    axes = _axes_of(c, 13)
    if axes is None:
        return x.reshape(tuple(d for d in x.shape if d != 1))
    axes = {normalize_axis(a, x.ndim, c) for a in axes}
    if any(x.shape[a] != 1 for a in axes):
        raise ValueError(f"{c.where}: cannot squeeze axes {sorted(axes)} of shape {x.shape}: not all are 1")
    return x.reshape(tuple(d for i, d in enumerate(x.shape) if i not in axes))


@register("Squeeze", host=True)
def squeeze_host(c: NodeCall) -> np.ndarray:
    axes = _axes_of(c, 13)
    return np.squeeze(c.host(0), axis=None if axes is None else tuple(axes))


def _unsqueezed(c: NodeCall, dims: tuple[int, ...]) -> tuple[int, ...]:
    axes = _axes_of(c, 13)
    if axes is None:
        raise ValueError(f"{c.where}: axes are required")
    n = len(dims) + len(axes)
    axes = {normalize_axis(a, n, c) for a in axes}
    rest = iter(dims)
    return tuple(1 if i in axes else next(rest) for i in range(n))


register("Unsqueeze")(lambda c: c.tensor(0).reshape(_unsqueezed(c, c.tensor(0).shape)))
register("Unsqueeze", host=True)(lambda c: c.host(0).reshape(_unsqueezed(c, c.host(0).shape)))


@register("Transpose")
def transpose(c: NodeCall) -> Tensor:
    x = c.tensor(0)
    perm = c.attr("perm", list(range(x.ndim))[::-1])
    return x.permute([normalize_axis(p, x.ndim, c) for p in perm])


@register("Concat")
def concat(c: NodeCall) -> Tensor:
    ts = [c.tensor(i) for i in range(len(c.inputs)) if c.has(i)]
    axis = normalize_axis(c.attr("axis"), ts[0].ndim, c)
    ts = [t for t in ts if t.shape[axis] != 0] or ts[:1]
    return ts[0].cat(*ts[1:], dim=axis) if len(ts) > 1 else ts[0]


@register("Concat", host=True)
def concat_host(c: NodeCall) -> np.ndarray:
    arrays = [c.host(i) for i in range(len(c.inputs)) if c.has(i)]
    return np.concatenate(arrays, axis=c.attr("axis"))


@register("Split")
def split(c: NodeCall) -> tuple[Tensor, ...]:
    x = c.tensor(0)
    axis = normalize_axis(c.attr("axis", 0), x.ndim, c)
    sizes = c.attr("split") if c.opset < 13 else c.ints(1)
    if sizes is None:
        parts = c.attr("num_outputs", c.n_outputs)
        step = -(-x.shape[axis] // parts)  # ceil: the last part is the smaller (opset 18)
        sizes = [min(step, x.shape[axis] - i * step) for i in range(parts)]
    if sum(sizes) != x.shape[axis]:
        raise ValueError(f"{c.where}: split sizes {sizes} do not add up to dim {axis} of shape {x.shape}")
    return x.split(list(sizes), dim=axis)


def _slice_args(c: NodeCall, dims: tuple[int, ...]) -> list[slice]:
    if c.opset < 10:
        starts, ends, axes, steps = c.attr("starts"), c.attr("ends"), c.attr("axes"), None
    else:
        starts, ends, axes, steps = c.ints(1), c.ints(2), c.ints(3), c.ints(4)
    axes = axes if axes is not None else list(range(len(starts)))
    steps = steps if steps is not None else [1] * len(starts)
    out = [slice(None)] * len(dims)
    for start, end, axis, step in zip(starts, ends, axes, steps):
        if step == 0:
            raise ValueError(f"{c.where}: a step of 0")
        axis = normalize_axis(axis, len(dims), c)
        n = dims[axis]
        # clamp as ONNX says (ends past the dim, INT64_MIN for "to the front" with negative steps)
        start = start + n if start < 0 else start
        end = end + n if end < 0 else end
        if step > 0:
            start, end = min(max(start, 0), n), min(max(end, 0), n)
        else:
            start, end = min(max(start, -1), n - 1), min(max(end, -1), n - 1)
        out[axis] = slice(start, end if end >= 0 else None, step)
    return out


@register("Slice")
def slice_(c: NodeCall) -> Tensor:
    x = c.tensor(0)
    slices = _slice_args(c, x.shape)
    for axis, s in enumerate(slices):
        if s.step is not None and s.step < 0:  # reversed: flip the dim, and walk it forward
            n = x.shape[axis]
            stop = -1 if s.stop is None else s.stop
            x = x.flip(axis)
            slices[axis] = slice(n - 1 - s.start, n - 1 - stop, -s.step)
    lengths = [len(range(*s.indices(d))) for s, d in zip(slices, x.shape)]
    if 0 in lengths:
        return Tensor.zeros(*lengths, dtype=x.dtype, device=c.device)
    return x[tuple(slices)]


@register("Slice", host=True)
def slice_host(c: NodeCall) -> np.ndarray:
    x = c.host(0)
    return x[tuple(_slice_args(c, x.shape))]


@register("Gather")
def gather(c: NodeCall) -> Tensor:
    x, index = c.tensor(0), c.tensor(1)
    axis = normalize_axis(c.attr("axis", 0), x.ndim, c)
    if index.numel() == 0:
        return Tensor.zeros(*x.shape[:axis], *index.shape, *x.shape[axis + 1 :], dtype=x.dtype, device=c.device)
    if index.ndim == 0:
        return x[(slice(None),) * axis + (wrapped_index(index.reshape(1), x.shape[axis]),)].squeeze(axis)
    return x[(slice(None),) * axis + (wrapped_index(index, x.shape[axis]),)]


@register("Gather", host=True)
def gather_host(c: NodeCall) -> np.ndarray:
    return np.take(c.host(0), c.host(1), axis=c.attr("axis", 0))


@register("GatherElements")
def gather_elements(c: NodeCall) -> Tensor:
    x, index = c.tensor(0), c.tensor(1)
    axis = normalize_axis(c.attr("axis", 0), x.ndim, c)
    return x.gather(axis, wrapped_index(index, x.shape[axis]))


@register("GatherND")
def gather_nd(c: NodeCall) -> Tensor:
    x, index = c.tensor(0), c.tensor(1)
    b = c.attr("batch_dims", 0)
    k = index.shape[-1]
    batch = math.prod(x.shape[:b])
    rows = x.reshape(batch, math.prod(x.shape[b : b + k]), *x.shape[b + k :])
    idx = index.reshape(batch, -1, k)
    flat = None
    for j in range(k):
        part = wrapped_index(idx[:, :, j], x.shape[b + j]) * math.prod(x.shape[b + j + 1 : b + k])
        flat = part if flat is None else flat + part
    batch_ids = Tensor.arange(batch, device=c.device).reshape(batch, 1).expand(flat.shape)
    out = rows[batch_ids, flat]
    return out.reshape(*index.shape[:-1], *x.shape[b + k :])


@register("ScatterElements", "Scatter")
def scatter_elements(c: NodeCall) -> Tensor:
    x, index, upd = c.tensor(0), c.tensor(1), c.tensor(2)
    axis = normalize_axis(c.attr("axis", 0), x.ndim, c)
    index = wrapped_index(index, x.shape[axis])
    red = c.attr("reduction", "none")
    if red == "none":
        return x.scatter(axis, index, upd)
    names = {"add": "sum", "mul": "prod", "max": "amax", "min": "amin"}
    if red not in names:
        raise ValueError(f"{c.where}: reduction must be one of none, add, mul, max, min, got {red!r}")
    return x.scatter_reduce(axis, index, upd, names[red], include_self=True)


@register("Expand")
def expand(c: NodeCall) -> Tensor:
    x = c.tensor(0)
    return x.expand(broadcast_shape(x.shape, tuple(c.ints(1))))


@register("Expand", host=True)
def expand_host(c: NodeCall) -> np.ndarray | Tensor:
    x = c.host(0)
    shape = broadcast_shape(x.shape, tuple(c.ints(1)))
    return np.broadcast_to(x, shape).copy() if math.prod(shape) <= HOST_LIMIT else expand(c)


@register("Tile")
def tile(c: NodeCall) -> Tensor:
    x = c.tensor(0)
    repeats = c.ints(1)
    if len(repeats) != x.ndim:
        raise ValueError(f"{c.where}: repeats {repeats} must have one entry per dim of shape {x.shape}")
    if 0 in repeats or 0 in x.shape:
        return Tensor.zeros(*(d * r for d, r in zip(x.shape, repeats)), dtype=x.dtype, device=c.device)
    return x.repeat(repeats)


@register("Pad")
def pad(c: NodeCall) -> Tensor:
    x = c.tensor(0)
    mode = c.attr("mode", "constant")
    if c.opset < 11:
        pads, value, axes = c.attr("pads", c.attr("paddings")), c.attr("value", 0.0), None
    else:
        pads, value, axes = c.ints(1), c.scalar(2, 0), c.ints(3)
    axes = [normalize_axis(a, x.ndim, c) for a in axes] if axes is not None else list(range(x.ndim))
    if len(pads) != 2 * len(axes):
        raise ValueError(f"{c.where}: pads {pads} must have two entries per padded axis ({len(axes)} axes)")
    pairs = [(0, 0)] * x.ndim
    for i, a in enumerate(axes):
        pairs[a] = (pads[i], pads[i + len(axes)])
    modes = {"constant": "constant", "reflect": "reflect", "edge": "replicate", "wrap": "circular"}
    if mode not in modes:
        raise ValueError(f"{c.where}: mode must be one of {list(modes)}, got {mode!r}")
    if mode != "constant" and any(b < 0 or a < 0 for b, a in pairs):  # a crop first, then the edge modes
        x = x.pad([(min(b, 0), min(a, 0)) for b, a in pairs])
        pairs = [(max(b, 0), max(a, 0)) for b, a in pairs]
    return x.pad(pairs, value=value if value is not None else 0, mode=modes[mode])


@register("Trilu")
def trilu(c: NodeCall) -> Tensor:
    x = c.tensor(0)
    k = c.scalar(1, 0)
    if 0 in x.shape:
        return x
    return x.triu(k) if c.attr("upper", 1) else x.tril(k)


@register("EyeLike")
def eye_like(c: NodeCall) -> Tensor:
    x = c.tensor(0)
    dt = onnx_dtype(c.attr("dtype"), c.where) if c.attr("dtype") is not None else x.dtype
    n, m = x.shape
    rows = Tensor.arange(n, device=c.device).reshape(n, 1)
    cols = Tensor.arange(m, device=c.device).reshape(1, m)
    return (cols - rows == c.attr("k", 0)).cast(dt)


@register("DepthToSpace")
def depth_to_space(c: NodeCall) -> Tensor:
    x = c.tensor(0)
    b = c.attr("blocksize")
    n, ch, h, w = x.shape
    if c.attr("mode", "DCR") == "DCR":
        y = x.reshape(n, b, b, ch // (b * b), h, w).permute(0, 3, 4, 1, 5, 2)
    else:
        y = x.reshape(n, ch // (b * b), b, b, h, w).permute(0, 1, 4, 2, 5, 3)
    return y.reshape(n, ch // (b * b), h * b, w * b)


@register("SpaceToDepth")
def space_to_depth(c: NodeCall) -> Tensor:
    x = c.tensor(0)
    b = c.attr("blocksize")
    n, ch, h, w = x.shape
    y = x.reshape(n, ch, h // b, b, w // b, b)
    y = y.permute(0, 3, 5, 1, 2, 4) if c.attr("mode", "DCR") == "DCR" else y.permute(0, 1, 3, 5, 2, 4)
    return y.reshape(n, ch * b * b, h // b, w // b)


@register("OneHot")
def one_hot(c: NodeCall) -> Tensor:
    index, values = c.tensor(0), c.tensor(2)
    depth = int(c.scalar(1))
    axis = normalize_axis(c.attr("axis", -1), index.ndim + 1, c)
    index = index.cast(dtypes.int64)
    index = (index < 0).where(index + depth, index)
    classes = Tensor.arange(depth, device=c.device).reshape(*([1] * axis), depth, *([1] * (index.ndim - axis)))
    hot = index.unsqueeze(axis) == classes
    return hot.where(values[1], values[0])


@register("CenterCropPad")
def center_crop_pad(c: NodeCall) -> Tensor:
    x = c.tensor(0)
    target = c.ints(1)
    axes = [normalize_axis(a, x.ndim, c) for a in c.attr("axes", list(range(x.ndim)))]
    if len(target) != len(axes):
        raise ValueError(f"{c.where}: {len(target)} sizes for {len(axes)} axes")
    pairs = [(0, 0)] * x.ndim
    for a, size in zip(axes, target):
        diff = size - x.shape[a]  # > 0: pad (the odd one after), < 0: crop (the window starts rounded down)
        pairs[a] = (diff // 2, diff - diff // 2) if diff >= 0 else (-(-diff // 2), -(-diff - (-diff // 2)))
    return x.pad(pairs)


@register("MaxUnpool")
def max_unpool(c: NodeCall) -> Tensor:
    x, index = c.tensor(0), c.tensor(1).cast(dtypes.int64)
    kernel = c.attr("kernel_shape")
    nd = len(kernel)
    strides = c.attr("strides", [1] * nd)
    pads = c.attr("pads", [0] * (2 * nd))
    begins, ends = pads[:nd], pads[nd:]
    spatial = [(s - 1) * st + k - b - e for s, st, k, b, e in zip(x.shape[2:], strides, kernel, begins, ends)]
    shape = [*x.shape[:2], *spatial]
    flat = Tensor.zeros(math.prod(shape), dtype=x.dtype, device=c.device)  # the indices count over the whole output
    y = flat.scatter(0, index.reshape(-1), x.reshape(-1)).reshape(shape)
    if c.has(2):  # a larger output_shape: the unpooled values in its first rows and columns (as ONNX's reference)
        y = y.pad([(0, o - s) for o, s in zip(c.ints(2), shape)])
    return y


# ---------------------------------------------------------------- data-dependent selections


@register("Compress")
def compress(c: NodeCall) -> Tensor:
    x = c.tensor(0)
    keep = np.nonzero(c.host(1).reshape(-1))[0]  # (the output's size depends on the condition's values)
    axis = c.attr("axis")
    if axis is None:
        x, axis = x.reshape(-1), 0
    axis = normalize_axis(axis, x.ndim, c)
    keep = keep[keep < x.shape[axis]]
    if keep.size == 0:
        return Tensor.zeros(*x.shape[:axis], 0, *x.shape[axis + 1 :], dtype=x.dtype, device=c.device)
    index = Tensor(keep.astype(np.int64), device=c.device)
    return x[(slice(None),) * axis + (index,)]


@register("ScatterND")
def scatter_nd(c: NodeCall) -> Tensor:
    x, index, upd = c.tensor(0), c.tensor(1), c.tensor(2)
    k = index.shape[-1]
    rest = x.shape[k:]
    # the data as (places, *rest) and each update's place in it: its k indices in row-major order
    flat = None
    for j in range(k):
        part = wrapped_index(index[..., j], x.shape[j]) * math.prod(x.shape[j + 1 : k])
        flat = part if flat is None else flat + part
    rows = x.reshape(math.prod(x.shape[:k]), *rest)
    n = math.prod(index.shape[:-1])
    where = flat.reshape(n, *([1] * len(rest))).expand(n, *rest)
    upd = upd.reshape(n, *rest)
    red = c.attr("reduction", "none")
    if red == "none":
        return rows.scatter(0, where, upd).reshape(x.shape)
    names = {"add": "sum", "mul": "prod", "max": "amax", "min": "amin"}
    if red not in names:
        raise ValueError(f"{c.where}: reduction must be one of none, add, mul, max, min, got {red!r}")
    return rows.scatter_reduce(0, where, upd, names[red], include_self=True).reshape(x.shape)


@register("ReverseSequence")
def reverse_sequence(c: NodeCall) -> Tensor:
    x, lengths = c.tensor(0), c.tensor(1).cast(dtypes.int64)
    batch_axis, time_axis = c.attr("batch_axis", 1), c.attr("time_axis", 0)
    steps = x.shape[time_axis]
    shape = [1] * x.ndim
    shape[time_axis] = steps
    t = Tensor.arange(steps, device=c.device).reshape(shape)
    shape = [1] * x.ndim
    shape[batch_axis] = x.shape[batch_axis]
    n = lengths.reshape(shape)
    source = (t < n).where(n - 1 - t, t).expand(x.shape)  # the first n steps reversed, the rest in place
    return x.gather(time_axis, source)


@register("Unique")
def unique(c: NodeCall) -> tuple[Tensor | np.ndarray, ...]:
    x = c.host(0)  # (the outputs' sizes depend on the values: computed on the host)
    axis = c.attr("axis")
    axis = normalize_axis(axis, x.ndim, c) if axis is not None else None
    values, first, inverse, counts = np.unique(x, return_index=True, return_inverse=True, return_counts=True, axis=axis)
    if not c.attr("sorted", 1):  # in the order of first occurrence
        order = np.argsort(first, kind="stable")
        rank = np.empty_like(order)
        rank[order] = np.arange(len(order))
        values = np.take(values, order, axis=0 if axis is None else axis)
        first, counts, inverse = first[order], counts[order], rank[inverse.reshape(-1)]
    as_int64 = (first.astype(np.int64), inverse.reshape(-1).astype(np.int64), counts.astype(np.int64))
    given = c.value(0).tensor
    if given is not None and given.dtype == dtypes.bfloat16:  # (read back as float32: the values are exact)
        return (Tensor(values, device=c.device).cast(dtypes.bfloat16), *as_int64)
    return (values, *as_int64)


def _corners(box: np.ndarray, center_point: int) -> tuple[float, float, float, float]:
    """(low0, low1, high0, high1) of a box given as two corners in any order, or as centre and size."""
    if center_point:
        x, y, w, h = box
        return x - w / 2, y - h / 2, x + w / 2, y + h / 2
    a0, a1, b0, b1 = box
    return min(a0, b0), min(a1, b1), max(a0, b0), max(a1, b1)


def _overlaps(a: tuple, b: tuple, threshold: float) -> bool:
    """Whether the boxes' intersection over union is strictly above the threshold."""
    inter = max(min(a[2], b[2]) - max(a[0], b[0]), 0) * max(min(a[3], b[3]) - max(a[1], b[1]), 0)
    union = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter
    return inter > 0 and union > 0 and inter / union > threshold


@register("NonMaxSuppression")
def non_max_suppression(c: NodeCall) -> np.ndarray:
    boxes, scores = c.host(0), c.host(1)  # (which boxes survive decides the output's size: on the host)
    limit = int(c.scalar(2, 0))
    iou = float(c.scalar(3, 0.0))
    floor = c.scalar(4)
    center_point = c.attr("center_point_box", 0)
    chosen = []
    for b in range(scores.shape[0]):
        corners = [_corners(box, center_point) for box in boxes[b]]
        for k in range(scores.shape[1]):
            s = scores[b, k]
            order = [i for i in np.argsort(-s, kind="stable") if floor is None or s[i] > floor]
            kept: list[int] = []
            for i in order:
                if len(kept) >= limit:
                    break
                if not any(_overlaps(corners[i], corners[j], iou) for j in kept):
                    kept.append(int(i))
            chosen += [(b, k, i) for i in kept]
    return np.array(chosen, dtype=np.int64).reshape(-1, 3)


@register("TensorScatter")
def tensor_scatter(c: NodeCall) -> Tensor:
    cache, update = c.tensor(0), c.tensor(1)
    axis = normalize_axis(c.attr("axis", -2), cache.ndim, c)
    if axis == 0:
        raise ValueError(f"{c.where}: axis must not be 0 (the batch dimension)")
    mode = c.attr("mode", "linear")
    if mode not in ("linear", "circular"):
        raise ValueError(f"{c.where}: mode must be linear or circular, got {mode!r}")
    batch, length, steps = cache.shape[0], cache.shape[axis], update.shape[axis]
    starts = c.tensor(2).cast(dtypes.int64) if c.has(2) else Tensor.zeros(batch, dtype=dtypes.int64, device=c.device)
    step = [1] * cache.ndim
    step[axis] = steps
    where = starts.reshape(batch, *([1] * (cache.ndim - 1))) + Tensor.arange(steps, device=c.device).reshape(step)
    if mode == "circular":
        where = where % length
    return cache.scatter(axis, where.expand(update.shape), update)
