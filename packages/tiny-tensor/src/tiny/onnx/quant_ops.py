"""ONNX's linear quantization operators (8-, 16- and 32-bit integer types) as tiny tensor ops."""

from __future__ import annotations

from tiny.ir.dtypes import DType, dtypes
from tiny.onnx.model import NodeCall, Value, normalize_axis, onnx_dtype, register
from tiny.onnx.nn_ops import conv
from tiny.tensor import Tensor


def _spread(c: NodeCall, t: Tensor, x: Tensor) -> Tensor:
    """A scale or zero point shaped to broadcast over x: per tensor (a scalar), per axis (1-d along `axis`), or
    blocked (x's rank, each entry repeated block_size times along `axis`)."""
    if t.ndim == 0 or t.numel() == 1 and x.ndim <= 1:
        return t.reshape(())
    axis = normalize_axis(c.attr("axis", 1), x.ndim, c)
    if t.ndim == 1:
        shape = [1] * x.ndim
        shape[axis] = t.shape[0]
        return t.reshape(shape)
    block = c.attr("block_size", 0)
    if block <= 0:
        raise ValueError(f"{c.where}: a scale of rank {t.ndim} (blocked quantization) needs block_size")
    return t.repeat_interleave(block, dim=axis)[(slice(None),) * axis + (slice(0, x.shape[axis]),)]


def _saturated(c: NodeCall, y: Tensor, dt: DType) -> Tensor:
    if not dt.is_int:
        raise NotImplementedError(f"{c.where}: quantizing to {dt.name} (tiny quantizes to integer types)")
    return y.clip(dt.min, dt.max).cast(dt)


@register("DequantizeLinear")
def dequantize_linear(c: NodeCall) -> Tensor:
    x, scale = c.tensor(0), c.tensor(1)
    out = onnx_dtype(c.attr("output_dtype"), c.where) if c.attr("output_dtype") else scale.dtype
    wide = dtypes.float64 if out == dtypes.float64 else dtypes.float32
    xs = x.cast(wide)
    if c.has(2):
        xs = xs - _spread(c, c.tensor(2), x).cast(wide)
    return (xs * _spread(c, scale, x).cast(wide)).cast(out)


@register("QuantizeLinear")
def quantize_linear(c: NodeCall) -> Tensor:
    x, scale = c.tensor(0), c.tensor(1)
    if c.attr("output_dtype"):
        out = onnx_dtype(c.attr("output_dtype"), c.where)
    else:
        out = c.tensor(2).dtype if c.has(2) else dtypes.uint8
    precision = onnx_dtype(c.attr("precision"), c.where) if c.attr("precision") else scale.dtype
    wide = dtypes.float64 if precision == dtypes.float64 else dtypes.float32
    y = (x.cast(wide) / _spread(c, scale, x).cast(precision).cast(wide)).round()  # halves to even
    if c.has(2):
        y = y + _spread(c, c.tensor(2), x).cast(wide)
    return _saturated(c, y, out)


@register("DynamicQuantizeLinear")
def dynamic_quantize_linear(c: NodeCall) -> tuple[Tensor, Tensor, Tensor]:
    x = c.tensor(0).cast(dtypes.float32)
    lo, hi = x.min().minimum(0.0), x.max().maximum(0.0)  # the range always holds zero
    scale = (hi - lo) / 255.0
    zero = (-lo / scale).round().clip(0, 255)
    y = ((x / scale).round() + zero).clip(0, 255).cast(dtypes.uint8)
    return y, scale, zero.cast(dtypes.uint8)


def _centered(c: NodeCall, i: int, zp: int, x: Tensor, per_row: bool) -> Tensor:
    """An integer input minus its zero point (per tensor, or per row of A / per column of B), as int32."""
    v = x.cast(dtypes.int32)
    if not c.has(zp):
        return v
    z = c.tensor(zp).cast(dtypes.int32)
    if z.ndim == 1 and z.shape[0] > 1:
        z = z.reshape(-1, 1) if per_row else z
    return v - z


@register("MatMulInteger")
def matmul_integer(c: NodeCall) -> Tensor:
    a, b = c.tensor(0), c.tensor(1)
    return _centered(c, 0, 2, a, True) @ _centered(c, 1, 3, b, False)


@register("QLinearMatMul")
def qlinear_matmul(c: NodeCall) -> Tensor:
    a, b = c.tensor(0), c.tensor(3)
    a_scale, a_zp, b_scale, b_zp, y_scale, y_zp = (c.tensor(i) for i in (1, 2, 4, 5, 6, 7))
    acc = (a.cast(dtypes.int32) - a_zp.cast(dtypes.int32)) @ (b.cast(dtypes.int32) - b_zp.cast(dtypes.int32))
    wide = dtypes.float64 if y_scale.dtype == dtypes.float64 else dtypes.float32
    factor = a_scale.cast(wide) * b_scale.cast(wide) / y_scale.cast(wide)
    y = (acc.cast(wide) * factor).round() + y_zp.cast(wide)
    return _saturated(c, y, y_zp.dtype)


@register("ConvInteger")
def conv_integer(c: NodeCall) -> Tensor:
    x, w = c.tensor(0), c.tensor(1)
    xs = x.cast(dtypes.float64) - (c.tensor(2).cast(dtypes.float64) if c.has(2) else 0.0)
    ws = w.cast(dtypes.float64) - (_per_channel(c.tensor(3), w.ndim, 0) if c.has(3) else 0.0)
    # (exact: sums of products of 8-bit integers in float64; the padding is zero after the zero point)
    return _conv_on(c, xs, ws, None).cast(dtypes.int32)


@register("QLinearConv")
def qlinear_conv(c: NodeCall) -> Tensor:
    x, x_scale, x_zp, w, w_scale, w_zp, y_scale, y_zp = (c.tensor(i) for i in range(8))
    xs = x.cast(dtypes.float64) - x_zp.cast(dtypes.float64)
    ws = w.cast(dtypes.float64) - _per_channel(w_zp, w.ndim, 0)
    bias = c.tensor(8).cast(dtypes.float64) if c.has(8) else None
    acc = _conv_on(c, xs, ws, bias)  # (exact: sums of products of 8-bit integers in float64)
    factor = x_scale.cast(dtypes.float64) * _per_channel(w_scale, w.ndim, 1) / y_scale.cast(dtypes.float64)
    y = (acc * factor).round() + y_zp.cast(dtypes.float64)
    return _saturated(c, y, y_zp.dtype)


def _per_channel(t: Tensor, ndim: int, channel_dim: int) -> Tensor:
    """A per-output-channel (1-d) or per-tensor value as float64, placed on `channel_dim` of an ndim tensor."""
    t = t.cast(dtypes.float64)
    if t.ndim == 1 and t.shape[0] > 1:
        shape = [1] * ndim
        shape[channel_dim] = t.shape[0]
        return t.reshape(shape)
    return t.reshape(())


def _conv_on(c: NodeCall, x: Tensor, w: Tensor, bias: Tensor | None) -> Tensor:
    """Conv's attributes (pads, strides, groups ...) applied to other operands than the node's own."""
    operands = [Value(tensor=x), Value(tensor=w)] + ([Value(tensor=bias)] if bias is not None else [])
    return conv(NodeCall(c.node, c.attrs, operands, c.opset, c.device, 1))
