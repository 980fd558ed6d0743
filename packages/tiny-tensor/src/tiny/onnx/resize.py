"""ONNX's Resize (and the older Upsample), GridSample, AffineGrid and RoiAlign as tiny tensor ops.

Resizing is separable: each resized axis is done on its own. Where each output position reads from is worked out on
the host (a coordinate transform, then neighbours and their weights). Nearest-neighbour resizing gathers along the
axis (exact for every dtype); linear and cubic resizing multiply by an (input, output) matrix of the weights.
"""

from __future__ import annotations

import itertools
import math

import numpy as np

from tiny.ir.dtypes import dtypes
from tiny.onnx.model import NodeCall, normalize_axis, register
from tiny.tensor import Tensor

TRANSFORMS = (
    "half_pixel",
    "half_pixel_symmetric",
    "pytorch_half_pixel",
    "align_corners",
    "asymmetric",
    "tf_crop_and_resize",
)


def _source(mode: str, n_in: int, n_out: int, scale: float, roi: tuple[float, float]) -> np.ndarray:
    """The input coordinate each output position maps to (ONNX's coordinate_transformation_mode)."""
    y = np.arange(n_out, dtype=np.float64)
    length = scale * n_in  # the output's length before rounding to an integer
    if mode == "half_pixel":
        return (y + 0.5) / scale - 0.5
    if mode == "half_pixel_symmetric":
        offset = n_in / 2 * (1 - n_out / length)
        return offset + (y + 0.5) / scale - 0.5
    if mode == "pytorch_half_pixel":
        return (y + 0.5) / scale - 0.5 if length != 1 else np.full(n_out, -0.5)
    if mode == "align_corners":
        return y * (n_in - 1) / (length - 1) if length != 1 else np.zeros(n_out)
    if mode == "asymmetric":
        return y / scale
    start, end = roi  # tf_crop_and_resize: a box of the input, as fractions of it
    if length == 1:
        return np.full(n_out, (end - start) * (n_in - 1) / 2 + start * (n_in - 1))
    return y * (end - start) * (n_in - 1) / (length - 1) + start * (n_in - 1)


def _nearest(x: np.ndarray, rounding: str) -> np.ndarray:
    if rounding == "round_prefer_floor":
        return np.ceil(x - 0.5)
    if rounding == "round_prefer_ceil":
        return np.floor(x + 0.5)
    if rounding == "floor":
        return np.floor(x)
    if rounding == "ceil":
        return np.ceil(x)
    raise ValueError(f"nearest_mode must be round_prefer_floor, round_prefer_ceil, floor or ceil, got {rounding!r}")


def _cubic_kernel(d: np.ndarray, a: float) -> np.ndarray:
    d = np.abs(d)
    inner = ((a + 2) * d - (a + 3)) * d * d + 1
    outer = ((a * d - 5 * a) * d + 8 * a) * d - 4 * a
    return np.where(d <= 1, inner, np.where(d < 2, outer, 0.0))


def _weights(c: NodeCall, x: np.ndarray, n_in: int, scale: float) -> np.ndarray:
    """The (output, input) matrix of linear or cubic interpolation weights for source coordinates x. Neighbours past
    the input's edges read the edge (or, with exclude_outside, are left out and the rest reweighted)."""
    mode = c.attr("mode", "nearest")
    support = 1.0 if mode == "linear" else 2.0
    squeeze = min(scale, 1.0) if c.attr("antialias", 0) else 1.0  # antialias widens the kernel when shrinking
    reach = math.ceil(support / squeeze)
    base = np.floor(x).astype(np.int64)
    idx = base[:, None] + np.arange(-reach, reach + 2)[None, :]
    dist = (idx - x[:, None]) * squeeze
    if mode == "linear":
        w = np.clip(1 - np.abs(dist), 0, None)
    else:
        w = _cubic_kernel(dist, c.attr("cubic_coeff_a", -0.75))
    if squeeze != 1.0:
        w = w / w.sum(axis=1, keepdims=True)
    if c.attr("exclude_outside", 0):
        w = np.where((idx < 0) | (idx >= n_in), 0.0, w)
        total = w.sum(axis=1, keepdims=True)
        w = w / np.where(total == 0, 1.0, total)
    matrix = np.zeros((len(x), n_in))
    rows = np.repeat(np.arange(len(x)), idx.shape[1])
    np.add.at(matrix, (rows, np.clip(idx, 0, n_in - 1).reshape(-1)), w.reshape(-1))
    return matrix


def _resize_axis(c: NodeCall, t: Tensor, axis: int, n_out: int, scale: float, roi: tuple[float, float]) -> Tensor:
    n_in = t.shape[axis]
    transform = c.attr("coordinate_transformation_mode", "half_pixel")
    if transform not in TRANSFORMS:
        raise ValueError(f"{c.where}: coordinate_transformation_mode must be one of {TRANSFORMS}, got {transform!r}")
    x = _source(transform, n_in, n_out, scale, roi)
    if c.attr("mode", "nearest") == "nearest":
        rounding = c.attr("nearest_mode", "round_prefer_floor")
        idx = np.clip(_nearest(x, rounding), 0, n_in - 1).astype(np.int64)
        out = t[(slice(None),) * axis + (Tensor(idx, device=c.device),)]
    else:
        wide = t.dtype == dtypes.float64
        matrix = Tensor(_weights(c, x, n_in, scale).T.astype(np.float64 if wide else np.float32), device=c.device)
        moved = t.cast(dtypes.float64 if wide else dtypes.float32).transpose(axis, -1)
        out = (moved @ matrix).transpose(axis, -1)
    if transform == "tf_crop_and_resize":
        outside = (x < 0) | (x > n_in - 1)
        if outside.any():
            shape = [1] * t.ndim
            shape[axis] = n_out
            mask = Tensor(outside.reshape(shape), device=c.device)
            out = mask.where(c.attr("extrapolation_value", 0.0), out)
    return out


@register("Resize", "Upsample")
def resize(c: NodeCall) -> Tensor:
    x = c.tensor(0)
    mode = c.attr("mode", "nearest")
    if mode not in ("nearest", "linear", "cubic"):
        raise ValueError(f"{c.where}: mode must be nearest, linear or cubic, got {mode!r}")
    if c.node.op_type == "Upsample" or c.opset < 11:  # (X, scales), asymmetric coordinates, nearest rounds down
        if c.node.op_type == "Upsample" and c.opset < 9:
            scales_given = c.attr("scales")
        else:
            scales_given = c.host(1).tolist()
        c.attrs.setdefault("coordinate_transformation_mode", "asymmetric")
        c.attrs.setdefault("nearest_mode", "floor")
        roi, sizes = None, None
    else:
        roi = c.host(1).tolist() if c.has(1) and c.host(1).size else None
        scales_given = c.host(2).tolist() if c.has(2) and c.host(2).size else None
        sizes = c.ints(3) if c.has(3) else None
    if (scales_given is None) == (sizes is None):
        raise ValueError(f"{c.where}: exactly one of scales and sizes is needed")
    axes = [normalize_axis(a, x.ndim, c) for a in c.attr("axes", list(range(x.ndim)))]
    given = scales_given if scales_given is not None else sizes
    if len(given) != len(axes):
        raise ValueError(f"{c.where}: {len(given)} scales or sizes for {len(axes)} axes")
    if sizes is not None:
        scales = [s / x.shape[a] for s, a in zip(sizes, axes)]
        policy = c.attr("keep_aspect_ratio_policy", "stretch")
        if policy in ("not_larger", "not_smaller"):
            common = min(scales) if policy == "not_larger" else max(scales)
            scales = [common] * len(axes)
            sizes = [int(common * x.shape[a] + 0.5) for a in axes]
        elif policy != "stretch":
            raise ValueError(f"{c.where}: keep_aspect_ratio_policy must be stretch, not_larger or not_smaller")
    else:
        scales = [float(s) for s in scales_given]
        sizes = [int(s * x.shape[a]) for s, a in zip(scales, axes)]
    out = x
    for i, (axis, n_out, scale) in enumerate(zip(axes, sizes, scales)):
        box = (roi[i], roi[i + len(axes)]) if roi is not None else (0.0, 1.0)
        if n_out == x.shape[axis] and math.isclose(scale, 1.0) and box == (0.0, 1.0):
            continue  # this axis stays as it is
        out = _resize_axis(c, out, axis, n_out, scale, box)
    return out.cast(x.dtype)


# ---------------------------------------------------------------- GridSample


def _reflect(v: Tensor, lo: float, hi: float) -> Tensor:
    """v folded back and forth into [lo, hi], as a light beam between two mirrors."""
    span = hi - lo
    below, above = lo - v, v - hi  # how far past each mirror
    past = below.maximum(above).maximum(0.0)
    bounces = (past / span).floor()
    rest = past - bounces * span
    even = bounces - (bounces / 2).floor() * 2 == 0
    from_low = even.where(lo + rest, hi - rest)  # (below the range: back from the low mirror)
    from_high = even.where(hi - rest, lo + rest)
    return (below > 0).where(from_low, (above > 0).where(from_high, v))


def _cubic_coefficients(t: Tensor) -> list[Tensor]:
    """Keys' cubic convolution weights (a = -0.75) of the neighbours at -1, 0, 1, 2 for a fraction t."""
    a = -0.75
    u, w = t + 1, 2 - t
    return [
        ((a * u - 5 * a) * u + 8 * a) * u - 4 * a,
        ((a + 2) * t - (a + 3)) * t * t + 1,
        ((a + 2) * (1 - t) - (a + 3)) * (1 - t) * (1 - t) + 1,
        ((a * w - 5 * a) * w + 8 * a) * w - 4 * a,
    ]


@register("GridSample")
def grid_sample(c: NodeCall) -> Tensor:
    x, grid = c.tensor(0), c.tensor(1)
    n, ch, *dims = x.shape
    out = grid.shape[1:-1]
    mode = {"bilinear": "linear", "bicubic": "cubic"}.get(c.attr("mode", "linear"), c.attr("mode", "linear"))
    padding = c.attr("padding_mode", "zeros")
    if mode not in ("linear", "nearest", "cubic") or padding not in ("zeros", "border", "reflection"):
        raise ValueError(f"{c.where}: mode {mode!r} or padding_mode {padding!r} is not one ONNX defines")
    align = c.attr("align_corners", 0)
    lows = [0.0 if align else -0.5 for _ in dims]
    highs = [d - 1.0 if align else d - 0.5 for d in dims]
    coords = []  # per spatial dim (the grid lists them last dim first): (N, *out) positions in pixels
    for i, d in enumerate(dims):
        g = grid[..., len(dims) - 1 - i]
        v = (g + 1) / 2 * (d - 1) if align else ((g + 1) * d - 1) / 2
        if mode == "nearest":
            v = v.round()  # halves to even
        outside = (v < lows[i]) | (v > highs[i])
        if padding == "border":
            v = outside.where(v.clip(0, d - 1), v)
        elif padding == "reflection":
            v = _reflect(v, lows[i], highs[i])
        coords.append(v)
    flat_x = x.reshape(n, ch, -1)

    def pixels(index: list[Tensor]) -> Tensor:
        """x at integer positions (N, *out) per dim, with the padding mode's value where they fall outside."""
        flat, valid = None, None
        for i, (idx, d) in enumerate(zip(index, dims)):
            if padding == "reflection":
                idx = _reflect(idx, lows[i], highs[i]).trunc()
            inside = (idx >= 0) & (idx <= d - 1)
            valid = inside if valid is None else valid & inside
            idx = idx.clip(0, d - 1).cast(dtypes.int64)
            flat = idx if flat is None else flat * d + idx
        picked = flat_x.gather(2, flat.reshape(n, 1, -1).expand(n, ch, flat.numel() // n))
        picked = picked.reshape(n, ch, *out)
        if padding == "zeros":
            picked = valid.reshape(n, 1, *out).where(picked, 0.0).cast(x.dtype)
        return picked

    if mode == "nearest":
        return pixels(coords)
    offsets = [0, 1] if mode == "linear" else [-1, 0, 1, 2]
    bases = [v.floor() for v in coords]
    fractions = [v - b for v, b in zip(coords, bases)]
    if mode == "linear":
        weights = [[1 - t, t] for t in fractions]
    else:
        weights = [_cubic_coefficients(t) for t in fractions]
    total = None
    for corner in itertools.product(range(len(offsets)), repeat=len(dims)):
        index = [b + offsets[k] for b, k in zip(bases, corner)]
        w = None
        for i, k in enumerate(corner):
            w = weights[i][k] if w is None else w * weights[i][k]
        term = pixels(index) * w.reshape(n, 1, *out)
        total = term if total is None else total + term
    return total.cast(x.dtype)


@register("AffineGrid")
def affine_grid(c: NodeCall) -> Tensor:
    theta = c.tensor(0)
    size = c.ints(1)
    spatial = size[2:]  # (H, W) or (D, H, W)
    if len(spatial) not in (2, 3):
        raise ValueError(f"{c.where}: size must be (N, C, H, W) or (N, C, D, H, W), got {size}")
    align = c.attr("align_corners", 0)

    def positions(n: int) -> np.ndarray:
        if align:
            return np.linspace(-1.0, 1.0, n) if n > 1 else np.zeros(1)
        return (np.arange(n) * 2 + 1) / n - 1

    # homogeneous positions (x, y[, z], 1), x along the last dim: (prod(spatial), nd + 1)
    axes = np.meshgrid(*(positions(n) for n in spatial), indexing="ij")
    base = np.stack([*(a.reshape(-1) for a in reversed(axes)), np.ones(axes[0].size)], axis=-1)
    grid = Tensor(base.astype(np.float32), device=c.device).cast(theta.dtype) @ theta.transpose(1, 2)
    return grid.reshape(size[0], *spatial, len(spatial))


def _roi_samples(box: np.ndarray, size: tuple[int, int], out: tuple[int, int], ratio: int, half: bool) -> tuple:
    """Each output bin's bilinear samples of one region: (positions, weights), both (bins, samples * 4), the four
    corners of each sample with their weights (a sample outside the map: weight 0), and the samples per bin."""
    (height, width), (out_h, out_w) = size, out
    offset = 0.5 if half else 0.0
    x0, y0, x1, y1 = (float(v) - offset for v in box)
    roi_w, roi_h = x1 - x0, y1 - y0
    if not half:
        roi_w, roi_h = max(roi_w, 1.0), max(roi_h, 1.0)
    bin_h, bin_w = roi_h / out_h, roi_w / out_w
    grid_h = ratio if ratio > 0 else math.ceil(roi_h / out_h)
    grid_w = ratio if ratio > 0 else math.ceil(roi_w / out_w)
    positions = np.zeros((out_h * out_w, grid_h * grid_w * 4), dtype=np.int64)
    weights = np.zeros((out_h * out_w, grid_h * grid_w * 4))
    for ph, pw, iy, ix in itertools.product(range(out_h), range(out_w), range(grid_h), range(grid_w)):
        y = y0 + ph * bin_h + (iy + 0.5) * bin_h / grid_h
        x = x0 + pw * bin_w + (ix + 0.5) * bin_w / grid_w
        if y < -1.0 or y > height or x < -1.0 or x > width:  # a sample outside the map: weights 0
            continue
        y, x = max(y, 0.0), max(x, 0.0)
        y_lo, x_lo = min(int(y), height - 1), min(int(x), width - 1)
        y_hi, x_hi = min(y_lo + 1, height - 1), min(x_lo + 1, width - 1)
        ly, lx = (y - y_lo if y_lo < height - 1 else 0.0), (x - x_lo if x_lo < width - 1 else 0.0)
        corners = [(y_lo, x_lo, (1 - ly) * (1 - lx)), (y_lo, x_hi, (1 - ly) * lx)]
        corners += [(y_hi, x_lo, ly * (1 - lx)), (y_hi, x_hi, ly * lx)]
        row, col = ph * out_w + pw, (iy * grid_w + ix) * 4
        for j, (yy, xx, w) in enumerate(corners):
            positions[row, col + j], weights[row, col + j] = yy * width + xx, w
    return positions, weights, max(grid_h * grid_w, 1)


@register("RoiAlign")
def roi_align(c: NodeCall) -> Tensor:
    x = c.tensor(0)
    rois, batch_of = c.host(1), c.host(2)  # (how many samples a region takes depends on its size: on the host)
    mode = c.attr("mode", "avg")
    if mode not in ("avg", "max"):
        raise ValueError(f"{c.where}: mode must be avg or max, got {mode!r}")
    half = c.attr("coordinate_transformation_mode", "half_pixel" if c.opset >= 16 else "output_half_pixel")
    if half not in ("half_pixel", "output_half_pixel"):
        raise ValueError(f"{c.where}: coordinate_transformation_mode must be half_pixel or output_half_pixel")
    n, ch, height, width = x.shape
    out = (c.attr("output_height", 1), c.attr("output_width", 1))
    scale, ratio = c.attr("spatial_scale", 1.0), c.attr("sampling_ratio", 0)
    wide = dtypes.float64 if x.dtype == dtypes.float64 else dtypes.float32
    planes = x.cast(wide).reshape(n, ch, height * width)
    results = []
    for box, b in zip(rois, batch_of.reshape(-1)):
        pos, w, count = _roi_samples(box * scale, (height, width), out, ratio, half == "half_pixel")
        weighted = planes[int(b)][:, Tensor(pos, device=c.device)] * Tensor(w, device=c.device).cast(wide)
        # avg: the samples' bilinear values averaged; max: the largest weighted corner of any sample (as ONNX's)
        results.append(weighted.sum(axis=-1) / count if mode == "avg" else weighted.max(axis=-1))
    return Tensor.stack(*results).reshape(len(results), ch, *out).cast(x.dtype)
