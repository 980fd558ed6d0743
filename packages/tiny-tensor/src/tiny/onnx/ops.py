"""ONNX's elementwise, movement, indexing and reduction operators as tiny tensor ops (ONNX semantics: numpy-style
broadcasting, negative axes, the opset differences named at each op)."""

from __future__ import annotations

import math
from functools import reduce

import numpy as np

from tiny.ir.dtypes import dtypes
from tiny.onnx.model import NodeCall, onnx_dtype, register
from tiny.tensor import Tensor
from tiny.tensor.shapes import broadcast_shape


def _axis(axis: int, ndim: int, c: NodeCall) -> int:
    if not -ndim <= axis < max(ndim, 1):
        raise ValueError(f"{c.where}: axis {axis} is out of range for a tensor of {ndim} dims")
    return axis % max(ndim, 1)


def _same_dtype(c: NodeCall, *ts: Tensor) -> None:
    if len({t.dtype for t in ts}) > 1:
        raise ValueError(f"{c.where}: inputs must share one dtype, got {[t.dtype.name for t in ts]}")


# ---------------------------------------------------------------- elementwise


def _binary(fn):
    def op(c: NodeCall) -> Tensor:
        a, b = c.tensor(0), c.tensor(1)
        _same_dtype(c, a, b)
        return fn(a, b)

    return op


register("Add")(_binary(lambda a, b: a + b))
register("Sub")(_binary(lambda a, b: a - b))
register("Mul")(_binary(lambda a, b: a * b))
register("Equal")(_binary(lambda a, b: a == b))
register("Less")(_binary(lambda a, b: a < b))
register("LessOrEqual")(_binary(lambda a, b: a <= b))
register("Greater")(_binary(lambda a, b: a > b))
register("GreaterOrEqual")(_binary(lambda a, b: a >= b))
register("And")(_binary(lambda a, b: a.logical_and(b)))
register("Or")(_binary(lambda a, b: a.logical_or(b)))
register("Xor")(_binary(lambda a, b: a.logical_xor(b)))
register("BitwiseAnd")(_binary(lambda a, b: a.bitwise_and(b)))
register("BitwiseOr")(_binary(lambda a, b: a.bitwise_or(b)))
register("BitwiseXor")(_binary(lambda a, b: a.bitwise_xor(b)))


@register("Div")
def div(c: NodeCall) -> Tensor:
    a, b = c.tensor(0), c.tensor(1)
    _same_dtype(c, a, b)
    return a / b if a.dtype.is_float else a.div(b, rounding_mode="trunc")  # integers: C's division, toward zero


@register("Mod")
def mod(c: NodeCall) -> Tensor:
    a, b = c.tensor(0), c.tensor(1)
    _same_dtype(c, a, b)
    if c.attr("fmod", 0):
        return a.fmod(b)  # the sign of the dividend, as C's fmod
    return a.mod(b)  # the sign of the divisor, as Python's %


@register("Pow")
def pow_(c: NodeCall) -> Tensor:
    a, b = c.tensor(0), c.tensor(1)  # the result has the base's dtype
    if a.dtype.is_float:
        return a.pow(b.cast(a.dtype))
    if b.dtype.is_float:
        return a.cast(b.dtype).pow(b).cast(a.dtype)
    return a.pow(b.cast(a.dtype))


@register("BitShift")
def bitshift(c: NodeCall) -> Tensor:
    a, b = c.tensor(0), c.tensor(1)
    direction = c.attr("direction")
    if direction not in ("LEFT", "RIGHT"):
        raise ValueError(f"{c.where}: direction must be 'LEFT' or 'RIGHT', got {direction!r}")
    return a.bitwise_left_shift(b) if direction == "LEFT" else a.bitwise_right_shift(b)


def _unary(fn):
    return lambda c: fn(c.tensor(0))


for _name, _fn in {
    "Abs": Tensor.abs,
    "Neg": Tensor.neg,
    "Exp": Tensor.exp,
    "Log": Tensor.log,
    "Sqrt": Tensor.sqrt,
    "Reciprocal": Tensor.reciprocal,
    "Floor": Tensor.floor,
    "Ceil": Tensor.ceil,
    "Round": Tensor.round,  # halves to even, as ONNX
    "Sign": Tensor.sign,
    "Sin": Tensor.sin,
    "Cos": Tensor.cos,
    "Tan": Tensor.tan,
    "Asin": Tensor.asin,
    "Acos": Tensor.acos,
    "Atan": Tensor.atan,
    "Sinh": Tensor.sinh,
    "Cosh": Tensor.cosh,
    "Asinh": Tensor.asinh,
    "Acosh": Tensor.acosh,
    "Atanh": Tensor.atanh,
    "Erf": Tensor.erf,
    "IsNaN": Tensor.isnan,
    "Not": Tensor.logical_not,
    "BitwiseNot": Tensor.bitwise_not,
    "Identity": lambda x: x,
}.items():
    register(_name)(_unary(_fn))


@register("IsInf")
def isinf(c: NodeCall) -> Tensor:
    x = c.tensor(0)
    pos, neg = c.attr("detect_positive", 1), c.attr("detect_negative", 1)
    return (x == math.inf) * bool(pos) | (x == -math.inf) * bool(neg) if x.dtype.is_float else x != x


def _variadic(fn):
    def op(c: NodeCall) -> Tensor:
        ts = [c.tensor(i) for i in range(len(c.inputs))]
        _same_dtype(c, *ts)
        return fn(ts)

    return op


register("Sum")(_variadic(lambda ts: reduce(lambda a, b: a + b, ts)))
register("Mean")(_variadic(lambda ts: reduce(lambda a, b: a + b, ts) / len(ts)))
register("Max")(_variadic(lambda ts: reduce(Tensor.maximum, ts)))
register("Min")(_variadic(lambda ts: reduce(Tensor.minimum, ts)))


@register("Where")
def where(c: NodeCall) -> Tensor:
    cond, a, b = c.tensor(0), c.tensor(1), c.tensor(2)
    _same_dtype(c, a, b)
    return cond.cast(dtypes.bool).where(a, b)


@register("Clip")
def clip(c: NodeCall) -> Tensor:
    x = c.tensor(0)
    if c.opset < 11:
        lo, hi = c.attr("min"), c.attr("max")
    else:
        lo, hi = c.scalar(1), c.scalar(2)
    if lo is not None:
        x = x.maximum(Tensor(lo, device=c.device, dtype=x.dtype))
    if hi is not None:
        x = x.minimum(Tensor(hi, device=c.device, dtype=x.dtype))
    return x


@register("Cast")
def cast(c: NodeCall) -> Tensor:
    return c.tensor(0).cast(onnx_dtype(c.attr("to"), c.where))


@register("CastLike")
def cast_like(c: NodeCall) -> Tensor:
    return c.tensor(0).cast(c.tensor(1).dtype)


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
    axes = {_axis(a, x.ndim, c) for a in axes}
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
    axes = {_axis(a, n, c) for a in axes}
    rest = iter(dims)
    return tuple(1 if i in axes else next(rest) for i in range(n))


register("Unsqueeze")(lambda c: c.tensor(0).reshape(_unsqueezed(c, c.tensor(0).shape)))
register("Unsqueeze", host=True)(lambda c: c.host(0).reshape(_unsqueezed(c, c.host(0).shape)))


@register("Transpose")
def transpose(c: NodeCall) -> Tensor:
    x = c.tensor(0)
    perm = c.attr("perm", list(range(x.ndim))[::-1])
    return x.permute([_axis(p, x.ndim, c) for p in perm])


@register("Concat")
def concat(c: NodeCall) -> Tensor:
    ts = [c.tensor(i) for i in range(len(c.inputs)) if c.has(i)]
    axis = _axis(c.attr("axis"), ts[0].ndim, c)
    ts = [t for t in ts if t.shape[axis] != 0] or ts[:1]
    return ts[0].cat(*ts[1:], dim=axis) if len(ts) > 1 else ts[0]


@register("Concat", host=True)
def concat_host(c: NodeCall) -> np.ndarray:
    arrays = [c.host(i) for i in range(len(c.inputs)) if c.has(i)]
    return np.concatenate(arrays, axis=c.attr("axis"))


@register("Split")
def split(c: NodeCall) -> tuple[Tensor, ...]:
    x = c.tensor(0)
    axis = _axis(c.attr("axis", 0), x.ndim, c)
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
        axis = _axis(axis, len(dims), c)
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


def _wrapped(index: Tensor, n: int) -> Tensor:
    return (index < 0).where(index + n, index).cast(dtypes.int64)


@register("Gather")
def gather(c: NodeCall) -> Tensor:
    x, index = c.tensor(0), c.tensor(1)
    axis = _axis(c.attr("axis", 0), x.ndim, c)
    if index.numel() == 0:
        return Tensor.zeros(*x.shape[:axis], *index.shape, *x.shape[axis + 1 :], dtype=x.dtype, device=c.device)
    if index.ndim == 0:
        return x[(slice(None),) * axis + (_wrapped(index.reshape(1), x.shape[axis]),)].squeeze(axis)
    return x[(slice(None),) * axis + (_wrapped(index, x.shape[axis]),)]


@register("Gather", host=True)
def gather_host(c: NodeCall) -> np.ndarray:
    return np.take(c.host(0), c.host(1), axis=c.attr("axis", 0))


@register("GatherElements")
def gather_elements(c: NodeCall) -> Tensor:
    x, index = c.tensor(0), c.tensor(1)
    axis = _axis(c.attr("axis", 0), x.ndim, c)
    return x.gather(axis, _wrapped(index, x.shape[axis]))


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
        part = _wrapped(idx[:, :, j], x.shape[b + j]) * math.prod(x.shape[b + j + 1 : b + k])
        flat = part if flat is None else flat + part
    batch_ids = Tensor.arange(batch, device=c.device).reshape(batch, 1).expand(flat.shape)
    out = rows[batch_ids, flat]
    return out.reshape(*index.shape[:-1], *x.shape[b + k :])


@register("ScatterElements", "Scatter")
def scatter_elements(c: NodeCall) -> Tensor:
    x, index, upd = c.tensor(0), c.tensor(1), c.tensor(2)
    axis = _axis(c.attr("axis", 0), x.ndim, c)
    index = _wrapped(index, x.shape[axis])
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
    axes = [_axis(a, x.ndim, c) for a in axes] if axes is not None else list(range(x.ndim))
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
    axis = _axis(c.attr("axis", -1), index.ndim + 1, c)
    index = index.cast(dtypes.int64)
    index = (index < 0).where(index + depth, index)
    classes = Tensor.arange(depth, device=c.device).reshape(*([1] * axis), depth, *([1] * (index.ndim - axis)))
    hot = index.unsqueeze(axis) == classes
    return hot.where(values[1], values[0])


# ---------------------------------------------------------------- host arithmetic of shape computations

for _name, _np in {
    "Add": np.add,
    "Sub": np.subtract,
    "Mul": np.multiply,
    "Equal": np.equal,
    "Less": np.less,
    "Greater": np.greater,
    "Max": np.maximum,
    "Min": np.minimum,
}.items():
    register(_name, host=True)(
        lambda c, f=_np: reduce(f, [c.host(i) for i in range(len(c.inputs))]).astype(
            bool if f in (np.equal, np.less, np.greater) else c.host(0).dtype
        )
    )
register("Identity", host=True)(lambda c: c.host(0))
register("Not", host=True)(lambda c: np.logical_not(c.host(0)))
register("Neg", host=True)(lambda c: -c.host(0))
register("Where", host=True)(lambda c: np.where(c.host(0), c.host(1), c.host(2)))
register("Cast", host=True)(lambda c: c.host(0).astype(_NP[onnx_dtype(c.attr("to"), c.where)]))
_NP = {dt: np.dtype(dt.fmt) for dt in dtypes.all() if dt.fmt is not None}


@register("Div", host=True)
def div_host(c: NodeCall) -> np.ndarray:
    a, b = c.host(0), c.host(1)
    if a.dtype.kind == "f":
        return (a / b).astype(a.dtype)
    return (np.trunc(a / b)).astype(a.dtype)


# ---------------------------------------------------------------- reductions


def _reduce_axes(c: NodeCall, x: Tensor, input_from: int) -> tuple[int, ...] | None:
    """The axes to reduce (None: all). From `input_from` on (13 for ReduceSum, 18 for the others) they are an
    optional input, and empty axes with noop_with_empty_axes=1 reduce nothing (an empty tuple here)."""
    axes = c.attr("axes") if c.opset < input_from else c.ints(1)
    if not axes:
        return () if c.opset >= input_from and c.attr("noop_with_empty_axes", 0) else None
    return tuple(sorted({_axis(a, x.ndim, c) for a in axes}))


def _reduction(fn, input_from: int = 18):
    def op(c: NodeCall) -> Tensor:
        x = c.tensor(0)
        axes = _reduce_axes(c, x, input_from)
        if axes == ():
            return fn(x, None, True, identity=True)
        axes = axes if axes is not None else tuple(range(x.ndim))
        return fn(x, axes, bool(c.attr("keepdims", 1)), identity=False)

    return op


def _sum(x: Tensor, axes, keep: bool, identity: bool) -> Tensor:
    return x if identity else x.sum(axis=axes, keepdim=keep, dtype=x.dtype)


def _extreme(method: str):
    def fn(x: Tensor, axes, keep: bool, identity: bool) -> Tensor:
        if identity:
            return x
        if any(x.shape[a] == 0 for a in axes):  # an empty set: the identity of max (-inf) or min (+inf)
            bound = x.dtype.min if method == "max" else x.dtype.max
            if x.dtype.is_float:
                bound = -math.inf if method == "max" else math.inf
            dims = (
                [1 if i in axes else d for i, d in enumerate(x.shape)]
                if keep
                else [d for i, d in enumerate(x.shape) if i not in axes]
            )
            return Tensor.full(tuple(dims), bound, dtype=x.dtype, device=x.device)
        return getattr(x, method)(axis=axes, keepdim=keep)

    return fn


def _mean(x: Tensor, axes, keep: bool, identity: bool) -> Tensor:
    return x if identity else x.mean(axis=axes, keepdim=keep)


def _prod(x: Tensor, axes, keep: bool, identity: bool) -> Tensor:
    return x if identity else x.prod(axis=axes, keepdim=keep, dtype=x.dtype)


def _l1(x: Tensor, axes, keep: bool, identity: bool) -> Tensor:
    return x.abs() if identity else x.abs().sum(axis=axes, keepdim=keep, dtype=x.dtype)


def _l2(x: Tensor, axes, keep: bool, identity: bool) -> Tensor:
    sq = x * x
    s = sq if identity else sq.sum(axis=axes, keepdim=keep, dtype=x.dtype)
    return s.cast(dtypes.float32).sqrt().cast(x.dtype) if not x.dtype.is_float else s.sqrt()


def _sum_square(x: Tensor, axes, keep: bool, identity: bool) -> Tensor:
    return x * x if identity else (x * x).sum(axis=axes, keepdim=keep, dtype=x.dtype)


def _log_sum(x: Tensor, axes, keep: bool, identity: bool) -> Tensor:
    return x.log() if identity else x.sum(axis=axes, keepdim=keep).log()


def _log_sum_exp(x: Tensor, axes, keep: bool, identity: bool) -> Tensor:
    if identity:
        return x
    if any(x.shape[a] == 0 for a in axes):
        return _log_sum(x.exp(), axes, keep, identity)
    return x.logsumexp(axis=axes, keepdim=keep)


register("ReduceSum")(_reduction(_sum, input_from=13))
register("ReduceMax")(_reduction(_extreme("max")))
register("ReduceMin")(_reduction(_extreme("min")))
register("ReduceMean")(_reduction(_mean))
register("ReduceProd")(_reduction(_prod))
register("ReduceL1")(_reduction(_l1))
register("ReduceL2")(_reduction(_l2))
register("ReduceSumSquare")(_reduction(_sum_square))
register("ReduceLogSum")(_reduction(_log_sum))
register("ReduceLogSumExp")(_reduction(_log_sum_exp))


def _arg(method: str):
    def op(c: NodeCall) -> Tensor:
        x = c.tensor(0)
        axis = _axis(c.attr("axis", 0), x.ndim, c)
        keep = bool(c.attr("keepdims", 1))
        if c.attr("select_last_index", 0):  # the last of equal extremes: the first one of the flipped dim
            i = getattr(x.flip(axis), method)(axis=axis, keepdim=keep)
            return (x.shape[axis] - 1 - i).cast(dtypes.int64)
        return getattr(x, method)(axis=axis, keepdim=keep).cast(dtypes.int64)

    return op


register("ArgMax")(_arg("argmax"))
register("ArgMin")(_arg("argmin"))


def _cumulative(method: str, identity: int):
    def op(c: NodeCall) -> Tensor:
        x = c.tensor(0)
        axis = _axis(int(c.scalar(1)), x.ndim, c)
        if c.attr("reverse", 0):
            x = x.flip(axis)
        if c.attr("exclusive", 0):  # shifted one along: each element sees only the ones before it
            pairs = [(0, 0)] * x.ndim
            pairs[axis] = (1, -1)
            x = x.pad(pairs, value=identity)
        y = getattr(x, method)(axis).cast(x.dtype)
        return y.flip(axis) if c.attr("reverse", 0) else y

    return op


register("CumSum")(_cumulative("cumsum", 0))
register("CumProd")(_cumulative("cumprod", 1))


@register("TopK")
def topk(c: NodeCall) -> tuple[Tensor, Tensor]:
    x = c.tensor(0)
    k = int(c.attr("k")) if c.opset < 10 else int(c.scalar(1))
    axis = _axis(c.attr("axis", -1), x.ndim, c)
    values, indices = x.topk(k, axis=axis, largest=bool(c.attr("largest", 1)), sorted=True)
    return values, indices.cast(dtypes.int64)


@register("Einsum")
def einsum(c: NodeCall) -> Tensor:
    return Tensor.einsum(c.attr("equation"), *[c.tensor(i) for i in range(len(c.inputs))])


@register("CenterCropPad")
def center_crop_pad(c: NodeCall) -> Tensor:
    x = c.tensor(0)
    target = c.ints(1)
    axes = [_axis(a, x.ndim, c) for a in c.attr("axes", list(range(x.ndim)))]
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
