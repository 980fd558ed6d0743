"""Neural-network functions with torch.nn.functional's meaning: linear and einsum, convolutions, pooling,
resizing, normalization, dropout, attention and losses, all composed from existing Tensor ops (autograd needs
no rules of its own here).

Convolutions and pools read their input through windows made of views. For each kernel offset the input is
shrunk (and, for a stride, split and sliced) so that element o reads x[o*stride + k*dilation - pad]; the
places that fall in the padding are the view's mask, so they read 0. Each offset's view is padded into its
slot of a kernel-sized axis, and the slots add into one (N, C, *out, *kernel) tensor that a single reduction
consumes: no im2col buffer is written, and the whole convolution is one kernel.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from tiny.ir.dtypes import dtypes
from tiny.tensor.base import TensorBase
from tiny.tensor.shapes import prod

if TYPE_CHECKING:
    from tiny.tensor.tensor import Tensor

IntOrSeq = int | Sequence[int]
REDUCTIONS = ("none", "mean", "sum")
# the gap between 1 and the next float (torch.finfo(dtype).eps): rms_norm's default eps
_MACHINE_EPS = {dtypes.float16: 2.0**-10, dtypes.bfloat16: 2.0**-7, dtypes.float32: 2.0**-23, dtypes.float64: 2.0**-52}


class FunctionalOps(TensorBase):
    __slots__ = ()

    # ---------------------------------------------------------------- linear and einsum

    def linear(self, weight: Tensor, bias: Tensor | None = None) -> Tensor:
        """self @ weight.T + bias, as torch.nn.functional.linear; weight is (out, in) or (in,).

        >>> Tensor([[1.0, 2.0]]).linear(Tensor([[1.0, 1.0], [0.0, 1.0]]), Tensor([0.5, 0.0])).tolist()
        [[3.5, 2.0]]
        """
        if weight.ndim not in (1, 2):
            raise ValueError(f"linear() weight must be (out_features, in_features) or (in,), got {weight.shape}")
        if not self.ndim or self.shape[-1] != weight.shape[-1]:
            raise ValueError(
                f"linear() input's last dimension must be in_features={weight.shape[-1]}, got shape {self.shape}"
            )
        out = self.matmul(weight.T if weight.ndim == 2 else weight)
        return out if bias is None else out + bias

    @staticmethod
    def einsum(formula: str, *operands: Tensor | Sequence[Tensor]) -> Tensor:
        """Sum of products over the subscripts named in `formula`, as torch.einsum: '...' broadcasts, a label
        repeated in one operand takes its diagonal, and without '->' the output is the labels used once, sorted.

        >>> a, b = Tensor([[1.0, 2.0], [3.0, 4.0]]), Tensor([[1.0, 0.0], [0.0, 1.0]])
        >>> Tensor.einsum("ij,jk->ik", a, b).tolist(), Tensor.einsum("ii", a).item()
        ([[1.0, 2.0], [3.0, 4.0]], 5.0)
        """
        ops = list(operands[0]) if len(operands) == 1 and isinstance(operands[0], (list, tuple)) else list(operands)
        if not ops or not all(isinstance(t, TensorBase) for t in ops):
            raise TypeError("einsum() takes a formula and one or more Tensors")
        terms, out_labels = _parse_einsum(formula.replace(" ", ""), [t.ndim for t in ops])
        sizes: dict[str, int] = {}
        labelled: list[tuple[Tensor, list[str]]] = []
        for i, (t, labels) in enumerate(zip(ops, terms)):
            t, labels = _einsum_diagonals(t, labels, i)
            for lab, s in zip(labels, t.shape):
                if sizes.get(lab, 1) not in (1, s) and s != 1:
                    raise ValueError(
                        f"einsum(): subscript {_label_name(lab)} has size {s} in operand {i} but {sizes[lab]} "
                        f"elsewhere ('{formula}' with shapes {[o.shape for o in ops]})"
                    )
                sizes[lab] = max(sizes.get(lab, 1), s)
            labelled.append((t, labels))
        # contract left to right, summing a label as soon as no later operand and not the output needs it
        acc, acc_labels = labelled[0]
        for i in range(len(labelled)):
            if i:
                acc, acc_labels = _aligned_product(acc, acc_labels, *labelled[i])
            later = set(out_labels).union(*(labs for _, labs in labelled[i + 1 :]))
            done = [a for a, lab in enumerate(acc_labels) if lab not in later]
            if done:
                acc = acc.sum(axis=tuple(done))
                acc_labels = [lab for lab in acc_labels if lab in later]
        acc = acc.permute([acc_labels.index(lab) for lab in out_labels])
        return acc.expand(tuple(sizes[lab] for lab in out_labels))

    # ---------------------------------------------------------------- convolutions

    def conv1d(
        self,
        weight: Tensor,
        bias: Tensor | None = None,
        stride: IntOrSeq = 1,
        padding: IntOrSeq | str = 0,
        dilation: IntOrSeq = 1,
        groups: int = 1,
    ) -> Tensor:
        """1-d convolution (cross-correlation) of (N, C_in, L) with weight (C_out, C_in/groups, K).

        >>> Tensor([[[1.0, 2.0, 3.0, 4.0]]]).conv1d(Tensor([[[1.0, -1.0]]])).tolist()
        [[[-1.0, -1.0, -1.0]]]
        """
        return self._conv(weight, bias, stride, padding, dilation, groups, 1, "conv1d")

    def conv2d(
        self,
        weight: Tensor,
        bias: Tensor | None = None,
        stride: IntOrSeq = 1,
        padding: IntOrSeq | str = 0,
        dilation: IntOrSeq = 1,
        groups: int = 1,
    ) -> Tensor:
        """2-d convolution of (N, C_in, H, W) with weight (C_out, C_in/groups, kH, kW), as torch's conv2d.
        padding is an int, a pair, 'valid' or 'same' (stride 1); zeros are read outside the input.

        >>> Tensor.ones(1, 1, 3, 3).conv2d(Tensor.ones(1, 1, 2, 2), padding=1).tolist()[0][0][0]
        [1.0, 2.0, 2.0, 1.0]
        """
        return self._conv(weight, bias, stride, padding, dilation, groups, 2, "conv2d")

    def conv3d(
        self,
        weight: Tensor,
        bias: Tensor | None = None,
        stride: IntOrSeq = 1,
        padding: IntOrSeq | str = 0,
        dilation: IntOrSeq = 1,
        groups: int = 1,
    ) -> Tensor:
        """3-d convolution of (N, C_in, D, H, W) with weight (C_out, C_in/groups, kD, kH, kW).

        >>> Tensor.ones(1, 1, 2, 2, 2).conv3d(Tensor.ones(1, 1, 2, 2, 2)).item()
        8.0
        """
        return self._conv(weight, bias, stride, padding, dilation, groups, 3, "conv3d")

    def _conv(
        self,
        weight: Tensor,
        bias: Tensor | None,
        stride: IntOrSeq,
        padding: IntOrSeq | str,
        dilation: IntOrSeq,
        groups: int,
        nd: int,
        name: str,
    ) -> Tensor:
        x, batched = self._with_batch(nd, name)
        if weight.ndim != nd + 2:
            raise ValueError(
                f"{name}() weight must be (C_out, C_in/groups, *kernel) with {nd + 2} dims, got {weight.shape}"
            )
        n, c, *spatial = x.shape
        cout, cin_g, *kernel = weight.shape
        _check_groups(name, groups, c, cout, "input channels", "output channels")
        if c != cin_g * groups:
            raise ValueError(
                f"{name}(): input has {c} channels but weight {weight.shape} with groups={groups} expects "
                f"{cin_g * groups} (weight.shape[1] * groups)"
            )
        _check_bias(name, bias, cout)
        strides, dils = _ints(stride, nd, "stride", name), _ints(dilation, nd, "dilation", name)
        pads = _conv_padding(padding, kernel, dils, strides, name)
        out = [
            (s + lo + hi - d * (k - 1) - 1) // st + 1
            for s, (lo, hi), d, k, st in zip(spatial, pads, dils, kernel, strides)
        ]
        if any(o <= 0 for o in out):
            raise ValueError(
                f"{name}(): kernel {tuple(kernel)} with dilation {dils} does not fit input {tuple(spatial)} padded by "
                f"{pads}: output size would be {tuple(out)}"
            )
        starts = [[k * d - lo for k in range(ks)] for ks, d, (lo, _) in zip(kernel, dils, pads)]
        win = _windows(x, starts, strides, out)  # (N, C, *out, *kernel)
        win = win.reshape(n, groups, 1, c // groups, *out, *kernel)
        w = weight.reshape(1, groups, cout // groups, cin_g, *([1] * nd), *kernel)
        y = (win * w).sum(axis=(3, *range(4 + nd, 4 + 2 * nd)), keepdim=True).reshape(n, cout, *out)
        if bias is not None:
            y = y + bias.reshape(1, cout, *([1] * nd))
        return y if batched else y.reshape(y.shape[1:])

    def conv_transpose1d(
        self,
        weight: Tensor,
        bias: Tensor | None = None,
        stride: IntOrSeq = 1,
        padding: IntOrSeq = 0,
        output_padding: IntOrSeq = 0,
        groups: int = 1,
        dilation: IntOrSeq = 1,
    ) -> Tensor:
        """Transposed 1-d convolution of (N, C_in, L) with weight (C_in, C_out/groups, K), as torch's.

        >>> Tensor([[[1.0, 2.0]]]).conv_transpose1d(Tensor([[[1.0, 1.0]]]), stride=2).tolist()
        [[[1.0, 1.0, 2.0, 2.0]]]
        """
        return self._conv_transpose(
            weight, bias, stride, padding, output_padding, groups, dilation, 1, "conv_transpose1d"
        )

    def conv_transpose2d(
        self,
        weight: Tensor,
        bias: Tensor | None = None,
        stride: IntOrSeq = 1,
        padding: IntOrSeq = 0,
        output_padding: IntOrSeq = 0,
        groups: int = 1,
        dilation: IntOrSeq = 1,
    ) -> Tensor:
        """Transposed 2-d convolution of (N, C_in, H, W) with weight (C_in, C_out/groups, kH, kW): the gradient
        of conv2d with respect to its input. Output size (H-1)*stride - 2*padding + dilation*(k-1) + output_padding + 1.

        >>> Tensor.ones(1, 1, 2, 2).conv_transpose2d(Tensor.ones(1, 1, 2, 2)).tolist()[0][0]
        [[1.0, 2.0, 1.0], [2.0, 4.0, 2.0], [1.0, 2.0, 1.0]]
        """
        return self._conv_transpose(
            weight, bias, stride, padding, output_padding, groups, dilation, 2, "conv_transpose2d"
        )

    def _conv_transpose(
        self,
        weight: Tensor,
        bias: Tensor | None,
        stride: IntOrSeq,
        padding: IntOrSeq,
        output_padding: IntOrSeq,
        groups: int,
        dilation: IntOrSeq,
        nd: int,
        name: str,
    ) -> Tensor:
        x, batched = self._with_batch(nd, name)
        if weight.ndim != nd + 2:
            raise ValueError(
                f"{name}() weight must be (C_in, C_out/groups, *kernel) with {nd + 2} dims, got {weight.shape}"
            )
        n, c, *spatial = x.shape
        cin, cout_g, *kernel = weight.shape
        if c != cin:
            raise ValueError(
                f"{name}(): input has {c} channels but weight {weight.shape} expects {cin} (weight.shape[0])"
            )
        _check_groups(name, groups, c, cout_g * groups, "input channels", "output channels")
        cout = cout_g * groups
        _check_bias(name, bias, cout)
        strides, dils = _ints(stride, nd, "stride", name), _ints(dilation, nd, "dilation", name)
        pads, opads = _ints(padding, nd, "padding", name, 0), _ints(output_padding, nd, "output_padding", name, 0)
        for op, st, d in zip(opads, strides, dils):
            if op >= st and op >= d:
                raise ValueError(
                    f"{name}(): output_padding {opads} must be smaller than stride {strides} or dilation {dils}"
                )
        out = [
            (s - 1) * st - 2 * p + d * (k - 1) + op + 1
            for s, st, p, d, k, op in zip(spatial, strides, pads, dils, kernel, opads)
        ]
        if any(o <= 0 for o in out):
            raise ValueError(f"{name}(): output size would be {tuple(out)} for input {tuple(spatial)}")
        # output position o = q*stride + r. Input i with kernel offset k lands on o = i*stride + k*dilation - pad,
        # so with k*dilation - pad = a*stride + b it is phase r = b, row q = i + a: a shifted view of x per phase.
        rows = [-(-o // st) for o, st in zip(out, strides)]
        terms = []
        for ks in itertools.product(*(range(k) for k in kernel)):
            shifts = [divmod(k * d - p, st) for k, d, p, st in zip(ks, dils, pads, strides)]
            t = x
            for j, (a, _) in enumerate(shifts):
                t = _select(t, 2 + j, -a, 1, rows[j])
            t = t.reshape(n, c, *itertools.chain(*((q, 1) for q in rows)), *([1] * nd))
            slots = [(b, st - 1 - b) for (_, b), st in zip(shifts, strides)]
            t = t.pad([(0, 0), (0, 0), *itertools.chain(*(((0, 0), sl) for sl in slots)), *_slot(ks, kernel)])
            terms.append(t)
        win = _tree_sum(terms)  # (N, C, q1, s1, q2, s2, ..., *kernel)
        phased = list(itertools.chain(*zip(rows, strides)))
        win = win.reshape(n, groups, 1, c // groups, *phased, *kernel)
        w = weight.reshape(groups, c // groups, cout_g, *kernel).transpose(1, 2)
        w = w.reshape(1, groups, cout_g, c // groups, *([1] * (2 * nd)), *kernel)
        y = (win * w).sum(axis=(3, *range(4 + 2 * nd, 4 + 3 * nd)), keepdim=True)
        y = y.reshape(n, cout, *(q * st for q, st in zip(rows, strides)))
        if list(y.shape[2:]) != out:  # the last row of phases runs past the output (a shrink: one more kernel)
            y = y.shrink([None, None, *((0, o) for o in out)])
        if bias is not None:
            y = y + bias.reshape(1, cout, *([1] * nd))
        return y if batched else y.reshape(y.shape[1:])

    # ---------------------------------------------------------------- pooling

    def avg_pool2d(
        self,
        kernel_size: IntOrSeq,
        stride: IntOrSeq | None = None,
        padding: IntOrSeq = 0,
        ceil_mode: bool = False,
        count_include_pad: bool = True,
        divisor_override: int | None = None,
    ) -> Tensor:
        """Mean over kernel_size windows of (N, C, H, W) (stride defaults to kernel_size), as torch's avg_pool2d.

        >>> Tensor([[[[1.0, 2.0], [3.0, 4.0]]]]).avg_pool2d(2).tolist()
        [[[[2.5]]]]
        """
        return self._avg_pool(kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override, 2)

    def avg_pool1d(
        self,
        kernel_size: IntOrSeq,
        stride: IntOrSeq | None = None,
        padding: IntOrSeq = 0,
        ceil_mode: bool = False,
        count_include_pad: bool = True,
    ) -> Tensor:
        """Mean over windows of (N, C, L), as torch's avg_pool1d.

        >>> Tensor([[[1.0, 3.0, 5.0, 7.0]]]).avg_pool1d(2).tolist()
        [[[2.0, 6.0]]]
        """
        return self._avg_pool(kernel_size, stride, padding, ceil_mode, count_include_pad, None, 1)

    def _avg_pool(
        self,
        kernel_size: IntOrSeq,
        stride: IntOrSeq | None,
        padding: IntOrSeq,
        ceil_mode: bool,
        count_include_pad: bool,
        divisor_override: int | None,
        nd: int,
    ) -> Tensor:
        name = f"avg_pool{nd}d"
        x, batched = self._with_batch(nd, name)
        if not x.dtype.is_float:
            raise TypeError(f"{name}() needs a float tensor, got {x.dtype.name}")
        kernel, strides, pads, dils = _pool_args(kernel_size, stride, padding, 1, nd, name)
        spatial = x.shape[2:]
        out = [_pool_out(s, k, st, p, 1, ceil_mode) for s, k, st, p in zip(spatial, kernel, strides, pads)]
        _check_pool(name, spatial, kernel, pads, dils, out)
        win = _windows(x, [[k - p for k in range(ks)] for ks, p in zip(kernel, pads)], strides, out)
        total = win.sum(axis=tuple(range(2 + nd, 2 + 2 * nd)))
        if divisor_override is not None:
            if divisor_override == 0:
                raise ValueError(f"{name}(): divisor_override must not be zero")
            y = total / divisor_override
        else:
            counts = [
                _window_counts(s, k, st, p, o, count_include_pad)
                for s, k, st, p, o in zip(spatial, kernel, strides, pads, out)
            ]
            divisor = counts[0]
            for cnt in counts[1:]:
                divisor = np.multiply.outer(divisor, cnt)
            if (divisor == divisor.flat[0]).all():
                y = total / float(divisor.flat[0])
            else:
                y = total / type(self)(divisor.astype(np.float32), device=x.device).cast(x.dtype)
        return y if batched else y.reshape(y.shape[1:])

    def max_pool2d(
        self,
        kernel_size: IntOrSeq,
        stride: IntOrSeq | None = None,
        padding: IntOrSeq = 0,
        dilation: IntOrSeq = 1,
        ceil_mode: bool = False,
    ) -> Tensor:
        """Maximum over kernel_size windows of (N, C, H, W) (stride defaults to kernel_size), as torch's
        max_pool2d; padding is never the maximum.

        >>> Tensor([[[[1.0, 2.0], [3.0, 4.0]]]]).max_pool2d(2).tolist()
        [[[[4.0]]]]
        """
        return self._max_pool(kernel_size, stride, padding, dilation, ceil_mode, 2)

    def max_pool1d(
        self,
        kernel_size: IntOrSeq,
        stride: IntOrSeq | None = None,
        padding: IntOrSeq = 0,
        dilation: IntOrSeq = 1,
        ceil_mode: bool = False,
    ) -> Tensor:
        """Maximum over windows of (N, C, L), as torch's max_pool1d.

        >>> Tensor([[[1.0, 3.0, 5.0, 2.0]]]).max_pool1d(2).tolist()
        [[[3.0, 5.0]]]
        """
        return self._max_pool(kernel_size, stride, padding, dilation, ceil_mode, 1)

    def _max_pool(
        self,
        kernel_size: IntOrSeq,
        stride: IntOrSeq | None,
        padding: IntOrSeq,
        dilation: IntOrSeq,
        ceil_mode: bool,
        nd: int,
    ) -> Tensor:
        name = f"max_pool{nd}d"
        x, batched = self._with_batch(nd, name)
        kernel, strides, pads, dils = _pool_args(kernel_size, stride, padding, dilation, nd, name)
        spatial = x.shape[2:]
        out = [_pool_out(s, k, st, p, d, ceil_mode) for s, k, st, p, d in zip(spatial, kernel, strides, pads, dils)]
        _check_pool(name, spatial, kernel, pads, dils, out)
        starts = [[k * d - p for k in range(ks)] for ks, d, p in zip(kernel, dils, pads)]
        win = _windows(x, starts, strides, out)
        inside = [_window_inside(s, st_k, st, o) for s, st_k, st, o in zip(spatial, starts, strides, out)]
        if not all(m.all() for m in inside):  # some windows reach into the padding: it must never be the max
            mask = inside[0]
            for m in inside[1:]:
                mask = _outer_and(mask, m)
            valid = type(self)(mask, device=x.device)  # (*out, *kernel)
            win = valid.where(win, x.dtype.min)
        y = win.max(axis=tuple(range(2 + nd, 2 + 2 * nd)))
        return y if batched else y.reshape(y.shape[1:])

    def adaptive_avg_pool2d(self, output_size: IntOrSeq | Sequence[int | None]) -> Tensor:
        """Mean over the windows that split (N, C, H, W) into output_size cells, as torch's adaptive_avg_pool2d.

        >>> Tensor([[[[1.0, 2.0], [3.0, 4.0]]]]).adaptive_avg_pool2d(1).tolist()
        [[[[2.5]]]]
        """
        return self._adaptive_avg_pool(output_size, 2)

    def adaptive_avg_pool1d(self, output_size: IntOrSeq) -> Tensor:
        """Mean over the windows that split (N, C, L) into output_size cells, as torch's adaptive_avg_pool1d.

        >>> Tensor([[[1.0, 2.0, 3.0]]]).adaptive_avg_pool1d(2).tolist()
        [[[1.5, 2.5]]]
        """
        return self._adaptive_avg_pool(output_size, 1)

    def _adaptive_avg_pool(self, output_size: IntOrSeq | Sequence[int | None], nd: int) -> Tensor:
        name = f"adaptive_avg_pool{nd}d"
        x, batched = self._with_batch(nd, name)
        if not x.dtype.is_float:
            raise TypeError(f"{name}() needs a float tensor, got {x.dtype.name}")
        spatial = x.shape[2:]
        sizes = [output_size] * nd if isinstance(output_size, int) or output_size is None else list(output_size)
        if len(sizes) != nd:
            raise ValueError(f"{name}() output_size takes an int or {nd} sizes, got {output_size}")
        out = [s if o is None else o for o, s in zip(sizes, spatial)]
        if any(not isinstance(o, int) or o <= 0 for o in out):
            raise ValueError(f"{name}() output_size must be positive, got {output_size}")
        if all(s % o == 0 for s, o in zip(spatial, out)):  # equal windows: a plain average pool
            k = [s // o for s, o in zip(spatial, out)]
            y = x._avg_pool(k, k, 0, False, True, None, nd)
        else:  # windows of different sizes: each dim times its averaging matrix (a kernel per dim)
            y = x
            for j, (s, o) in enumerate(zip(spatial, out)):
                y = y._apply_matrix(2 + j, _adaptive_matrix(s, o))
        return y if batched else y.reshape(y.shape[1:])

    # ---------------------------------------------------------------- resizing

    def interpolate(
        self,
        size: IntOrSeq | None = None,
        scale_factor: float | Sequence[float] | None = None,
        mode: str = "nearest",
        align_corners: bool | None = None,
    ) -> Tensor:
        """Resize the spatial dims of (N, C, *spatial) to `size` or by `scale_factor`, as torch's interpolate.
        mode: 'nearest', 'nearest-exact', 'linear' (3-d input), 'bilinear' (4-d) or 'trilinear' (5-d).

        >>> Tensor([[[1.0, 2.0]]]).interpolate(scale_factor=2).tolist()
        [[[1.0, 1.0, 2.0, 2.0]]]
        >>> Tensor([[[0.0, 1.0]]]).interpolate(size=3, mode="linear", align_corners=True).tolist()
        [[[0.0, 0.5, 1.0]]]
        """
        linear_modes = {"linear": 3, "bilinear": 4, "trilinear": 5}
        if mode not in ("nearest", "nearest-exact", *linear_modes):
            raise ValueError(
                f"interpolate() mode must be nearest, nearest-exact, linear, bilinear or trilinear, got {mode!r}"
            )
        if mode in linear_modes and self.ndim != linear_modes[mode]:
            raise ValueError(
                f"interpolate() mode {mode!r} needs a {linear_modes[mode]}-d input, got shape {self.shape}"
            )
        if mode not in linear_modes and align_corners is not None:
            raise ValueError("interpolate(): align_corners only goes with the linear modes")
        if self.ndim < 3:
            raise ValueError(f"interpolate() needs (N, C, *spatial), got shape {self.shape}")
        if (size is None) == (scale_factor is None):
            raise ValueError("interpolate() takes exactly one of size and scale_factor")
        nd = self.ndim - 2
        spatial = self.shape[2:]
        if size is not None:
            out = list(_ints(size, nd, "size", "interpolate"))
            scales = [s / o for s, o in zip(spatial, out)]
        else:
            factors = [float(scale_factor)] * nd if isinstance(scale_factor, (int, float)) else list(scale_factor)
            if len(factors) != nd or any(f <= 0 for f in factors):
                raise ValueError(
                    f"interpolate() scale_factor takes a positive number or {nd} of them, got {scale_factor}"
                )
            out = [math.floor(s * f) for s, f in zip(spatial, factors)]
            scales = [1 / f for f in factors]
        if any(o <= 0 for o in out):
            raise ValueError(f"interpolate(): output size {tuple(out)} must be positive")
        nearest = mode in ("nearest", "nearest-exact")
        y = self if self.dtype.is_float or nearest else self.cast(dtypes.default_float)
        repeats = [1] * nd
        for j, (s, o, sc) in enumerate(zip(spatial, out, scales)):
            if not nearest:
                y = y._apply_matrix(2 + j, _linear_matrix(s, o, sc, bool(align_corners), size is not None))
                continue
            src = _nearest_sources(s, o, sc, mode)
            if o % s == 0 and (src == np.arange(o) // (o // s)).all():  # each element repeated: views below
                repeats[j] = o // s
            elif s % o == 0 and (src == np.arange(o) * (s // o)).all():  # every (s/o)-th element: a view
                y = _select(y, 2 + j, 0, s // o, o)
            else:  # any other choice: a one-hot matrix, in float (integers below 2**24 come back exactly)
                picked = np.zeros((o, s))
                picked[np.arange(o), src] = 1
                y = y.cast(dtypes.default_float)._apply_matrix(2 + j, picked).cast(y.dtype)
        if any(r > 1 for r in repeats):  # all repeats in one expand, merged at the end (free at a kernel's output)
            n, c, *sp = y.shape
            y = y.reshape(n, c, *itertools.chain(*((v, 1) for v in sp)))
            y = y.expand(n, c, *itertools.chain(*zip(sp, repeats)))
            y = y.reshape(n, c, *(v * r for v, r in zip(sp, repeats)))
        return y

    def _apply_matrix(self, dim: int, matrix: np.ndarray) -> Tensor:
        """Apply an (out, in) matrix along one dim: y[.., o, ..] = sum_i matrix[o, i] * x[.., i, ..]."""
        m = type(self)(matrix.astype(np.float32), device=self.device).cast(self.dtype)
        return self.transpose(dim, -1).matmul(m.T).transpose(dim, -1)

    # ---------------------------------------------------------------- normalization

    def batch_norm(
        self,
        running_mean: Tensor | None,
        running_var: Tensor | None,
        weight: Tensor | None = None,
        bias: Tensor | None = None,
        training: bool | None = None,
        momentum: float = 0.1,
        eps: float = 1e-5,
    ) -> Tensor:
        """Normalize each channel of (N, C, ...) as torch's batch_norm. Training (by default Tensor.train()'s mode)
        uses the batch's statistics and updates the running ones in place; otherwise the running ones are used.

        >>> [round(v, 4) for v in Tensor([[1.0], [3.0]]).batch_norm(None, None, training=True).reshape(2).tolist()]
        [-1.0, 1.0]
        """
        if self.ndim < 2:
            raise ValueError(f"batch_norm() needs (N, C, ...), got shape {self.shape}")
        c = self.shape[1]
        for what, t in (
            ("running_mean", running_mean),
            ("running_var", running_var),
            ("weight", weight),
            ("bias", bias),
        ):
            if t is not None and t.shape != (c,):
                raise ValueError(f"batch_norm(): {what} must have shape ({c},) for {c} channels, got {t.shape}")
        train = self.is_training() if training is None else training
        axes = (0, *range(2, self.ndim))
        bshape = (1, c, *([1] * (self.ndim - 2)))
        if train:
            n = prod(self.shape[a] for a in axes)
            if n <= 1:
                raise ValueError(
                    f"batch_norm() in training needs more than one value per channel, got shape {self.shape}"
                )
            mean = self.mean(axis=axes, keepdim=True)
            var = (self - mean).square().mean(axis=axes, keepdim=True)
            if running_mean is not None:
                running_mean.assign((1 - momentum) * running_mean + momentum * mean.detach().reshape(c))
            if running_var is not None:
                unbiased = var.detach().reshape(c) * (n / (n - 1))
                running_var.assign((1 - momentum) * running_var + momentum * unbiased)
        else:
            if running_mean is None or running_var is None:
                raise ValueError("batch_norm() outside training needs running_mean and running_var")
            mean, var = running_mean.reshape(bshape), running_var.reshape(bshape)
        y = (self - mean) * (var + eps).rsqrt()
        if weight is not None:
            y = y * weight.reshape(bshape)
        return y if bias is None else y + bias.reshape(bshape)

    def layer_norm(
        self,
        normalized_shape: IntOrSeq,
        weight: Tensor | None = None,
        bias: Tensor | None = None,
        eps: float = 1e-5,
    ) -> Tensor:
        """Normalize over the last dims (their sizes are normalized_shape), then scale and shift, as torch's.

        >>> Tensor([[1.0, 3.0]]).layer_norm(2, eps=0.0).tolist()
        [[-1.0, 1.0]]
        """
        axes = self._trailing_axes(normalized_shape, "layer_norm", weight, bias)
        mean = self.mean(axis=axes, keepdim=True)
        centered = self - mean
        y = centered * (centered.square().mean(axis=axes, keepdim=True) + eps).rsqrt()
        if weight is not None:
            y = y * weight
        return y if bias is None else y + bias

    def rms_norm(self, normalized_shape: IntOrSeq, weight: Tensor | None = None, eps: float | None = None) -> Tensor:
        """x / sqrt(mean(x^2) + eps) over the last dims, times weight, as torch's rms_norm (eps defaults to the
        dtype's machine epsilon).

        >>> [round(v, 4) for v in Tensor([[3.0, 4.0]]).rms_norm(2, eps=0.0).tolist()[0]]
        [0.8485, 1.1314]
        """
        axes = self._trailing_axes(normalized_shape, "rms_norm", weight, None)
        if eps is None:
            eps = _MACHINE_EPS.get(self.dtype, _MACHINE_EPS[dtypes.float32])
        y = self * (self.square().mean(axis=axes, keepdim=True) + eps).rsqrt()
        return y if weight is None else y * weight

    def group_norm(
        self, num_groups: int, weight: Tensor | None = None, bias: Tensor | None = None, eps: float = 1e-5
    ) -> Tensor:
        """Normalize (N, C, ...) over each group of C/num_groups channels and the other dims, then scale and
        shift per channel, as torch's group_norm.

        >>> Tensor([[[1.0], [3.0]]]).group_norm(1, eps=0.0).tolist()
        [[[-1.0], [1.0]]]
        """
        if self.ndim < 2:
            raise ValueError(f"group_norm() needs (N, C, ...), got shape {self.shape}")
        n, c = self.shape[:2]
        if num_groups <= 0 or c % num_groups:
            raise ValueError(f"group_norm(): num_groups={num_groups} must divide the {c} channels")
        for what, t in (("weight", weight), ("bias", bias)):
            if t is not None and t.shape != (c,):
                raise ValueError(f"group_norm(): {what} must have shape ({c},), got {t.shape}")
        g = self.reshape(n, num_groups, -1)
        mean = g.mean(axis=2, keepdim=True)
        centered = g - mean
        y = (centered * (centered.square().mean(axis=2, keepdim=True) + eps).rsqrt()).reshape(self.shape)
        bshape = (1, c, *([1] * (self.ndim - 2)))
        if weight is not None:
            y = y * weight.reshape(bshape)
        return y if bias is None else y + bias.reshape(bshape)

    def _trailing_axes(
        self, normalized_shape: IntOrSeq, name: str, weight: Tensor | None, bias: Tensor | None
    ) -> tuple[int, ...]:
        shape = (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)
        if not shape or len(shape) > self.ndim or self.shape[self.ndim - len(shape) :] != shape:
            raise ValueError(f"{name}(): normalized_shape {shape} must be the last dims of the input, got {self.shape}")
        for what, t in (("weight", weight), ("bias", bias)):
            if t is not None and t.shape != shape:
                raise ValueError(f"{name}(): {what} must have normalized_shape {shape}, got {t.shape}")
        return tuple(range(self.ndim - len(shape), self.ndim))

    # ---------------------------------------------------------------- dropout and attention

    def dropout(self, p: float = 0.5, training: bool | None = None) -> Tensor:
        """Zero each element with probability p and scale the rest by 1/(1-p) (from Tensor.rand); the identity
        outside training, which by default is Tensor.train()'s mode.

        >>> Tensor([1.0, 2.0]).dropout(0.5, training=False).tolist()
        [1.0, 2.0]
        """
        if not 0 <= p <= 1:
            raise ValueError(f"dropout() probability must be between 0 and 1, got {p}")
        if not (self.is_training() if training is None else training) or p == 0:
            return self
        if p == 1:
            return self * 0
        keep = type(self).rand(*self.shape, device=self.device) >= p
        return keep.where(self * (1 / (1 - p)), 0)

    def scaled_dot_product_attention(
        self,
        key: Tensor,
        value: Tensor,
        attn_mask: Tensor | None = None,
        dropout_p: float = 0.0,
        is_causal: bool = False,
        scale: float | None = None,
        enable_gqa: bool = False,
    ) -> Tensor:
        """softmax(self @ key^T * scale + mask) @ value for query self (..., L, E), key (..., S, E) and value
        (..., S, Ev), as torch's scaled_dot_product_attention. A bool attn_mask keeps where True, a float one is
        added; is_causal keeps key j <= query i. enable_gqa shares each key/value head among query heads.

        >>> q = Tensor([[[1.0, 0.0]]]); kv = Tensor([[[1.0, 0.0], [0.0, 1.0]]])
        >>> q.scaled_dot_product_attention(kv, kv, is_causal=True).tolist()
        [[[1.0, 0.0]]]
        """
        if self.ndim < 2 or key.ndim < 2 or value.ndim < 2:
            raise ValueError(f"attention needs (..., L, E) tensors, got {self.shape}, {key.shape}, {value.shape}")
        length, emb = self.shape[-2:]
        if key.shape[-1] != emb or value.shape[-2] != key.shape[-2]:
            raise ValueError(
                f"attention: query {self.shape}, key {key.shape} and value {value.shape} must be (..., L, E), "
                f"(..., S, E) and (..., S, Ev)"
            )
        if is_causal and attn_mask is not None:
            raise ValueError("attention takes is_causal or attn_mask, not both")
        q, k, v, heads = self, key, value, None
        if enable_gqa and self.ndim >= 3 and key.shape[-3] != self.shape[-3]:
            hq, hk = self.shape[-3], key.shape[-3]
            if hq % hk or value.shape[-3] != hk:
                raise ValueError(
                    f"attention with enable_gqa: query heads {hq} must be a multiple of key/value heads {hk}"
                )
            heads = (hk, hq // hk)
            q = self.reshape(*self.shape[:-3], hk, hq // hk, length, emb)
            k, v = key.unsqueeze(-3), value.unsqueeze(-3)
        scores = q.matmul(k.transpose(-1, -2)) * (1 / math.sqrt(emb) if scale is None else scale)
        if is_causal:
            rows = type(self).arange(length, device=self.device).reshape(length, 1)
            attn_mask = rows >= type(self).arange(k.shape[-2], device=self.device).reshape(1, k.shape[-2])
        if attn_mask is not None:
            if heads is not None and attn_mask.ndim >= 3 and attn_mask.shape[-3] == heads[0] * heads[1]:
                attn_mask = attn_mask.reshape(*attn_mask.shape[:-3], *heads, *attn_mask.shape[-2:])
            elif heads is not None and attn_mask.ndim >= 3:
                attn_mask = attn_mask.unsqueeze(-3)
            scores = attn_mask.where(scores, -math.inf) if attn_mask.dtype.is_bool else scores + attn_mask
        attn = scores.softmax(-1)
        if dropout_p > 0:
            attn = attn.dropout(dropout_p, training=True)
        out = attn.matmul(v)
        return out if heads is None else out.reshape(*out.shape[:-4], heads[0] * heads[1], *out.shape[-2:])

    # ---------------------------------------------------------------- losses

    def cross_entropy(
        self,
        target: Tensor,
        weight: Tensor | None = None,
        ignore_index: int = -100,
        reduction: str = "mean",
        label_smoothing: float = 0.0,
    ) -> Tensor:
        """Cross entropy of logits self (N, C, ...) or (C,) with class indices (N, ...) or class probabilities
        (self's shape), as torch's cross_entropy: per-class weight, ignore_index, label_smoothing, reduction.

        >>> round(Tensor([[0.0, 0.0]]).cross_entropy(Tensor([1])).item(), 4)
        0.6931
        """
        _check_reduction("cross_entropy", reduction)
        if not 0 <= label_smoothing <= 1:
            raise ValueError(f"cross_entropy() label_smoothing must be between 0 and 1, got {label_smoothing}")
        x = self._class_dim_first("cross_entropy")
        c = x.shape[1]
        _check_class_weight("cross_entropy", weight, c)
        logp = x.log_softmax(axis=1)
        wb = None if weight is None else weight.reshape(1, c, *([1] * (x.ndim - 2)))
        if target.dtype.is_float:  # class probabilities
            if target.shape != self.shape:
                raise ValueError(
                    f"cross_entropy() with probabilities needs target of shape {self.shape}, got {target.shape}"
                )
            t = target.reshape(x.shape)
            if label_smoothing:
                t = t * (1 - label_smoothing) + label_smoothing / c
            terms = -(logp * t if wb is None else logp * t * wb).sum(axis=1)
            if reduction == "none":
                return terms if self.ndim > 1 else terms.reshape(())
            return terms.sum() if reduction == "sum" else terms.mean()
        hit, valid, w_t = x._pick(target, weight, ignore_index, "cross_entropy")
        nll = _reduce_weighted(-(hit.where(logp, 0).sum(axis=1)) * w_t, w_t, reduction, self.ndim)
        if not label_smoothing:
            return nll
        smooth = -(logp if wb is None else logp * wb).sum(axis=1) * valid
        if reduction == "mean":
            smooth = smooth.sum() / (w_t if weight is not None else valid).sum()
        else:
            smooth = _reduce_weighted(smooth, valid, reduction, self.ndim)
        return (1 - label_smoothing) * nll + (label_smoothing / c) * smooth

    def nll_loss(
        self, target: Tensor, weight: Tensor | None = None, ignore_index: int = -100, reduction: str = "mean"
    ) -> Tensor:
        """Negative log likelihood of log-probabilities self (N, C, ...) or (C,) at class indices target, as torch's
        nll_loss; 'mean' divides by the summed weights of the targets that are not ignore_index.

        >>> Tensor([[-1.0, -2.0]]).nll_loss(Tensor([1])).item()
        2.0
        """
        _check_reduction("nll_loss", reduction)
        x = self._class_dim_first("nll_loss")
        _check_class_weight("nll_loss", weight, x.shape[1])
        hit, _, w_t = x._pick(target, weight, ignore_index, "nll_loss")
        return _reduce_weighted(-(hit.where(x, 0).sum(axis=1)) * w_t, w_t, reduction, self.ndim)

    def _class_dim_first(self, name: str) -> Tensor:
        """(C,) becomes (1, C); (N, C, ...) stays."""
        if self.ndim == 0:
            raise ValueError(f"{name}() needs input (C,) or (N, C, ...), got a 0-d tensor")
        if not self.dtype.is_float:
            raise TypeError(f"{name}() needs float input, got {self.dtype.name}")
        return self.reshape(1, self.shape[0]) if self.ndim == 1 else self

    def _pick(
        self, target: Tensor, weight: Tensor | None, ignore_index: int, name: str
    ) -> tuple[Tensor, Tensor, Tensor]:
        """For class indices: where each target's class is (N, C, ...), which targets count (N, ...), and the
        weight of each target's class, 0 where ignored (N, ...)."""
        if target.dtype.is_float or target.dtype.is_bool:
            raise TypeError(f"{name}() target must hold integer class indices, got {target.dtype.name}")
        n, c, *rest = self.shape
        want = (n, *rest)
        t = target.reshape(1) if target.ndim == 0 else target
        if t.shape != want:
            raise ValueError(f"{name}(): input {self.shape} needs target of shape {want}, got {target.shape}")
        classes = type(self).arange(c, device=self.device).reshape(1, c, *([1] * len(rest)))
        hit = t.unsqueeze(1) == classes
        valid = (t != ignore_index).cast(self.dtype)
        if weight is None:
            return hit, valid, valid
        w_t = hit.where(weight.reshape(1, c, *([1] * len(rest))).cast(self.dtype), 0).sum(axis=1)
        return hit, valid, w_t * valid

    def binary_cross_entropy(self, target: Tensor, weight: Tensor | None = None, reduction: str = "mean") -> Tensor:
        """-(t*log(x) + (1-t)*log(1-x)) for probabilities x = self, logs clamped at -100, as torch's.

        >>> round(Tensor([0.5]).binary_cross_entropy(Tensor([1.0])).item(), 4)
        0.6931
        """
        _check_reduction("binary_cross_entropy", reduction)
        _check_same_shape("binary_cross_entropy", self, target)
        terms = -(target * self.log().clip(-100) + (1 - target) * (1 - self).log().clip(-100))
        if weight is not None:
            terms = terms * weight
        return _reduce_plain(terms, reduction)

    def binary_cross_entropy_with_logits(
        self, target: Tensor, weight: Tensor | None = None, reduction: str = "mean", pos_weight: Tensor | None = None
    ) -> Tensor:
        """binary_cross_entropy of sigmoid(self), computed stably from the logits; pos_weight scales the
        positive term per class (broadcast along the last dim), as torch's.

        >>> round(Tensor([0.0]).binary_cross_entropy_with_logits(Tensor([1.0])).item(), 4)
        0.6931
        """
        _check_reduction("binary_cross_entropy_with_logits", reduction)
        _check_same_shape("binary_cross_entropy_with_logits", self, target)
        x = self
        # log(1 + exp(-x)) = log(1 + exp(-|x|)) + max(-x, 0), exact for large |x|
        softplus_neg = (1 + (-x.abs()).exp()).log() + (-x).relu()
        if pos_weight is None:
            terms = (1 - target) * x + softplus_neg
        else:
            terms = (1 - target) * x + (1 + (pos_weight - 1) * target) * softplus_neg
        if weight is not None:
            terms = terms * weight
        return _reduce_plain(terms, reduction)

    def mse_loss(self, target: Tensor, reduction: str = "mean") -> Tensor:
        """(self - target)^2, reduced, as torch's mse_loss.

        >>> Tensor([1.0, 2.0]).mse_loss(Tensor([0.0, 0.0])).item()
        2.5
        """
        _check_reduction("mse_loss", reduction)
        return _reduce_plain((self - target).square(), reduction)

    def l1_loss(self, target: Tensor, reduction: str = "mean") -> Tensor:
        """|self - target|, reduced, as torch's l1_loss.

        >>> Tensor([1.0, -3.0]).l1_loss(Tensor([0.0, 0.0]), reduction="sum").item()
        4.0
        """
        _check_reduction("l1_loss", reduction)
        return _reduce_plain((self - target).abs(), reduction)

    # ---------------------------------------------------------------- shared

    def _with_batch(self, nd: int, name: str) -> tuple[Tensor, bool]:
        """(N, C, *spatial) as it is, or (C, *spatial) with a batch of one; and whether it had a batch."""
        if self.ndim not in (nd + 1, nd + 2):
            raise ValueError(f"{name}() needs input (N, C, {nd} spatial dims) or (C, ...), got shape {self.shape}")
        return (self, True) if self.ndim == nd + 2 else (self.unsqueeze(0), False)


# ---------------------------------------------------------------- windows


def _select(x: Tensor, dim: int, start: int, step: int, count: int) -> Tensor:
    """x with `dim` replaced by `count` positions: position o reads x[start + o*step], 0 where that is outside x."""
    size = x.shape[dim]
    lo = min(max(-(start // step), 0), count)  # first o with start + o*step >= 0
    hi = max(min((size - 1 - start) // step + 1, count), lo)  # one past the last o with start + o*step < size
    first, n = start + lo * step, hi - lo
    if n == 0:
        taken = x.shrink(_along(x.ndim, dim, (0, 0)))
    elif step == 1:
        taken = x.shrink(_along(x.ndim, dim, (first, first + n)))
    else:
        taken = _strided(x, dim, first, n, step)
    return taken.pad(_along(x.ndim, dim, (lo, count - hi), (0, 0)))


def _strided(x: Tensor, dim: int, first: int, n: int, step: int) -> Tensor:
    """x[first], x[first + step] ... (n of them) along dim, as views: rows of `step` elements, one column kept."""
    size = x.shape[dim]
    if n * step <= size:  # n whole rows fit: pick the column so that they stay inside x
        col = min(first, step - 1)
        col = max(col, first + n * step - size)
        begin = first - col
        rows = x.shrink(_along(x.ndim, dim, (begin, begin + n * step)))
        rows = rows.reshape(*x.shape[:dim], n, step, *x.shape[dim + 1 :])
        picked = rows.shrink([None] * (dim + 1) + [(col, col + 1)] + [None] * (x.ndim - dim - 1))
        return picked.reshape(*x.shape[:dim], n, *x.shape[dim + 1 :])
    # n rows do not fit (the last one is short): the first n-1 as rows, the last element on its own
    head = _strided(x, dim, first, n - 1, step)
    last_at = first + (n - 1) * step
    last = x.shrink(_along(x.ndim, dim, (last_at, last_at + 1)))
    return head.pad(_along(x.ndim, dim, (0, 1), (0, 0))) + last.pad(_along(x.ndim, dim, (n - 1, 0), (0, 0)))


def _along(ndim: int, dim: int, value: tuple[int, int], other: tuple[int, int] | None = None) -> list:
    """`value` at dim and `other` elsewhere: the argument of a shrink (other None) or a pad (other (0, 0))."""
    return [other] * dim + [value] + [other] * (ndim - dim - 1)


def _slot(ks: Sequence[int], kernel: Sequence[int]) -> list[tuple[int, int]]:
    """Padding that puts a size-1 dim at position k of a kernel-sized dim, for each kernel dim."""
    return [(k, size - 1 - k) for k, size in zip(ks, kernel)]


def _windows(x: Tensor, starts: Sequence[Sequence[int]], strides: Sequence[int], out: Sequence[int]) -> Tensor:
    """(N, C, *spatial) -> (N, C, *out, *kernel) with [.., o_j .., k_j ..] = x[.., o_j*stride_j + starts[j][k_j] ..]
    (0 outside x): one view of x per kernel offset, each padded into its kernel slot, added up.

    A strided dim is split once into (rows, stride) where a whole number of rows covers every element the windows
    read; then each offset is a row shift and a column, and the gradients of all offsets add up in the split
    view before it is merged back (one kernel). Where no such split fits, each offset takes its own strided view.
    """
    nd = len(starts)
    kernel = [len(s) for s in starts]
    regions = [_split_region(x.shape[2 + j], starts[j], strides[j], out[j]) for j in range(nd)]
    prepared, dims, shape = x, [], list(x.shape[:2])
    for j, region in enumerate(regions):
        dims.append(len(shape))
        size, st = x.shape[2 + j], strides[j]
        if region is None:
            shape.append(size)
            continue
        r0, rows = region
        prepared = prepared.shrink(_along(x.ndim, 2 + j, (r0, r0 + rows * st)))
        shape += [rows, st]
    prepared = prepared.reshape(shape)
    terms = []
    for ks in itertools.product(*(range(k) for k in kernel)):
        t = prepared
        for j, k in enumerate(ks):
            if regions[j] is None:
                t = _select(t, dims[j], starts[j][k], strides[j], out[j])
                continue
            row, col = divmod(starts[j][k] - regions[j][0], strides[j])
            t = _select(t, dims[j], row, 1, out[j]).shrink(_along(t.ndim, dims[j] + 1, (col, col + 1)))
        t = t.reshape(*x.shape[:2], *out, *([1] * nd))
        terms.append(t.pad([(0, 0)] * (2 + nd) + _slot(ks, kernel)))
    return _tree_sum(terms)


def _split_region(size: int, starts: Sequence[int], stride: int, out: int) -> tuple[int, int] | None:
    """(first, rows): whole rows of `stride` elements inside [0, size) that hold every element the windows read
    along this dim; None for stride 1 or where no such rows fit."""
    if stride == 1:
        return None
    reads = [s + o * stride for s in starts for o in range(out) if 0 <= s + o * stride < size]
    if not reads:
        return None
    lo, hi = min(reads), max(reads)
    for first in range(lo, max(lo - stride, -1), -1):
        rows = -(-(hi + 1 - first) // stride)
        if first + rows * stride <= size:
            return first, rows
    return None


def _tree_sum(terms: list[Tensor]) -> Tensor:
    """Add in a balanced tree, so the graph stays shallow for large kernels."""
    while len(terms) > 1:
        terms = [terms[i] + terms[i + 1] if i + 1 < len(terms) else terms[i] for i in range(0, len(terms), 2)]
    return terms[0]


def _window_inside(size: int, starts: Sequence[int], stride: int, out: int) -> np.ndarray:
    """(out, kernel) bools: whether window o's element k lies inside the input."""
    pos = np.arange(out)[:, None] * stride + np.asarray(starts)[None, :]
    return (pos >= 0) & (pos < size)


def _outer_and(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """a (o1.., k1..) and b (o2, k2) -> (o1.., o2, k1.., k2), the logical and of every pair."""
    na = a.ndim // 2
    a_ = a.reshape(*a.shape[:na], 1, *a.shape[na:], 1)
    b_ = b.reshape(*([1] * na), b.shape[0], *([1] * na), b.shape[1])
    return a_ & b_


def _window_counts(size: int, k: int, stride: int, pad: int, out: int, include_pad: bool) -> np.ndarray:
    """How many elements each average-pool window divides by, as torch counts them."""
    start = np.arange(out) * stride - pad
    end = np.minimum(start + k, size + pad)
    if include_pad:
        return (end - start).astype(np.int64)
    return (np.minimum(end, size) - np.maximum(start, 0)).astype(np.int64)


def _pool_out(size: int, k: int, stride: int, pad: int, dilation: int, ceil_mode: bool) -> int:
    span = size + 2 * pad - dilation * (k - 1) - 1
    out = (-(-span // stride) if ceil_mode else span // stride) + 1
    if ceil_mode and (out - 1) * stride >= size + pad:  # the last window would start in the right padding
        out -= 1
    return out


def _pool_args(
    kernel_size: IntOrSeq, stride: IntOrSeq | None, padding: IntOrSeq, dilation: IntOrSeq, nd: int, name: str
) -> tuple[tuple[int, ...], ...]:
    kernel = _ints(kernel_size, nd, "kernel_size", name)
    strides = kernel if stride is None or stride == [] else _ints(stride, nd, "stride", name)
    return kernel, strides, _ints(padding, nd, "padding", name, 0), _ints(dilation, nd, "dilation", name)


def _check_pool(
    name: str,
    spatial: Sequence[int],
    kernel: Sequence[int],
    pads: Sequence[int],
    dils: Sequence[int],
    out: Sequence[int],
) -> None:
    for k, p, d in zip(kernel, pads, dils):
        if p > (d * (k - 1) + 1) // 2:
            raise ValueError(f"{name}(): padding {tuple(pads)} must be at most half the kernel size {tuple(kernel)}")
    if any(o <= 0 for o in out):
        raise ValueError(f"{name}(): kernel {tuple(kernel)} does not fit input {tuple(spatial)}: output {tuple(out)}")


def _adaptive_matrix(size: int, out: int) -> np.ndarray:
    """(out, size): row o averages input [floor(o*size/out), ceil((o+1)*size/out))."""
    m = np.zeros((out, size), dtype=np.float64)
    for o in range(out):
        lo, hi = (o * size) // out, -(-((o + 1) * size) // out)
        m[o, lo:hi] = 1 / (hi - lo)
    return m


def _nearest_sources(size: int, out: int, scale: float, mode: str) -> np.ndarray:
    """The input index each output position copies, computed as torch does (in float32, from the float32 scale)."""
    sc, pos = np.float32(scale), np.arange(out).astype(np.float32)
    src = np.floor((pos + np.float32(0.5)) * sc) if mode == "nearest-exact" else np.floor(pos * sc)
    return np.minimum(src.astype(np.int64), size - 1)


def _linear_matrix(size: int, out: int, scale: float, align_corners: bool, from_size: bool) -> np.ndarray:
    """(out, size): output position o mixes its two nearest inputs, as torch's linear interpolation."""
    o = np.arange(out)
    m = np.zeros((out, size), dtype=np.float64)
    if align_corners:
        src = o * ((size - 1) / (out - 1)) if out > 1 else np.zeros(out)
    else:
        sc = size / out if from_size else scale
        src = np.maximum((o + 0.5) * sc - 0.5, 0)
    i0 = np.minimum(np.floor(src).astype(np.int64), size - 1)
    i1 = np.minimum(i0 + 1, size - 1)
    lam = src - i0
    np.add.at(m, (o, i0), 1 - lam)
    np.add.at(m, (o, i1), lam)
    return m


# ---------------------------------------------------------------- einsum


def _parse_einsum(formula: str, ndims: list[int]) -> tuple[list[list[str]], list[str]]:
    """Each operand's labels (one per dim; '...' dims become '.0', '.1' ... aligned from the right) and the output's."""
    lhs, arrow, rhs = formula.partition("->")
    inputs = lhs.split(",")
    if len(inputs) != len(ndims):
        raise ValueError(f"einsum(): '{formula}' names {len(inputs)} operand(s), {len(ndims)} given")
    for term in [*inputs, rhs]:
        body = term.replace("...", "")
        if term.count("...") > 1 or not all(ch.isalpha() and ch.isascii() for ch in body):
            raise ValueError(f"einsum(): bad subscripts '{term}' in '{formula}' (letters and at most one '...')")
    n_ell = 0
    for term, nd in zip(inputs, ndims):
        letters = len(term.replace("...", ""))
        if ("..." in term and letters > nd) or ("..." not in term and letters != nd):
            raise ValueError(f"einsum(): subscripts '{term}' do not fit an operand with {nd} dims in '{formula}'")
        n_ell = max(n_ell, nd - letters if "..." in term else 0)
    ell = [f".{i}" for i in range(n_ell)]
    terms = []
    for term, nd in zip(inputs, ndims):
        before, _, after = term.partition("...")
        k = nd - len(before) - len(after) if "..." in term else 0
        terms.append([*before, *ell[n_ell - k :], *after])
    if arrow:
        before, dots, after = rhs.partition("...")
        out = [*before, *(ell if dots else []), *after]
        if len(set(out)) != len(out):
            raise ValueError(f"einsum(): output subscripts '{rhs}' repeat a label")
        used = set().union(*terms)
        if any(lab not in used for lab in out):
            raise ValueError(f"einsum(): output subscripts '{rhs}' name a label no operand has")
    else:
        counts = {lab: sum(t.count(lab) for t in terms) for lab in set().union(*terms)}
        out = ell + sorted(lab for lab, c in counts.items() if c == 1 and not lab.startswith("."))
    return terms, out


def _label_name(lab: str) -> str:
    return "'...'" if lab.startswith(".") else f"'{lab}'"


def _einsum_diagonals(t: Tensor, labels: list[str], index: int) -> tuple[Tensor, list[str]]:
    """Take the diagonal over each label that repeats within one operand."""
    labels = list(labels)
    while len(set(labels)) != len(labels):
        lab = next(x for x in labels if labels.count(x) > 1)
        a, b = [i for i, x in enumerate(labels) if x == lab][:2]
        if t.shape[a] != t.shape[b]:
            raise ValueError(
                f"einsum(): label '{lab}' repeats in operand {index} over sizes {t.shape[a]} and {t.shape[b]}"
            )
        rest = [i for i in range(t.ndim) if i not in (a, b)]
        s = t.shape[a]
        flat = t.permute(*rest, a, b).reshape(*(t.shape[i] for i in rest), s * s)
        t = _strided(flat, flat.ndim - 1, 0, s, s + 1) if s > 1 else flat
        labels = [labels[i] for i in rest] + [lab]
    return t, labels


def _aligned_product(a: Tensor, la: list[str], b: Tensor, lb: list[str]) -> tuple[Tensor, list[str]]:
    """a * b with their labelled dims lined up (broadcast where one side lacks a label)."""
    union = la + [lab for lab in lb if lab not in la]

    def lined_up(t: Tensor, labels: list[str]) -> Tensor:
        order = [labels.index(lab) for lab in union if lab in labels]
        t = t.permute(order) if t.ndim else t
        return t.reshape(tuple(t.shape[order.index(labels.index(lab))] if lab in labels else 1 for lab in union))

    return lined_up(a, la) * lined_up(b, lb), union


# ---------------------------------------------------------------- argument checks


def _ints(v: IntOrSeq, n: int, what: str, name: str, minimum: int = 1) -> tuple[int, ...]:
    out = (v,) * n if isinstance(v, int) else tuple(v)
    if len(out) != n or not all(isinstance(i, int) and not isinstance(i, bool) and i >= minimum for i in out):
        raise ValueError(f"{name}() {what} takes an int or {n} ints, each at least {minimum}, got {v!r}")
    return out


def _conv_padding(
    padding: IntOrSeq | str, kernel: Sequence[int], dils: Sequence[int], strides: Sequence[int], name: str
) -> list[tuple[int, int]]:
    if padding == "valid":
        return [(0, 0)] * len(kernel)
    if padding == "same":
        if any(s != 1 for s in strides):
            raise ValueError(f"{name}(): padding='same' needs stride 1, got stride {tuple(strides)}")
        totals = [d * (k - 1) for k, d in zip(kernel, dils)]
        return [(t // 2, t - t // 2) for t in totals]
    if isinstance(padding, str):
        raise ValueError(f"{name}() padding must be an int, a tuple, 'valid' or 'same', got {padding!r}")
    return [(p, p) for p in _ints(padding, len(kernel), "padding", name, 0)]


def _check_groups(name: str, groups: int, cin: int, cout: int, in_what: str, out_what: str) -> None:
    if not isinstance(groups, int) or groups <= 0:
        raise ValueError(f"{name}() groups must be a positive int, got {groups!r}")
    if cin % groups or cout % groups:
        raise ValueError(f"{name}(): groups={groups} must divide the {cin} {in_what} and the {cout} {out_what}")


def _check_bias(name: str, bias: Tensor | None, cout: int) -> None:
    if bias is not None and bias.shape != (cout,):
        raise ValueError(f"{name}(): bias must have shape ({cout},) for {cout} output channels, got {bias.shape}")


def _check_reduction(name: str, reduction: str) -> None:
    if reduction not in REDUCTIONS:
        raise ValueError(f"{name}() reduction must be 'none', 'mean' or 'sum', got {reduction!r}")


def _check_class_weight(name: str, weight: Tensor | None, c: int) -> None:
    if weight is not None and weight.shape != (c,):
        raise ValueError(f"{name}(): weight must have one value per class, shape ({c},), got {weight.shape}")


def _check_same_shape(name: str, x: Tensor, target: Tensor) -> None:
    if x.shape != target.shape:
        raise ValueError(f"{name}(): target shape {target.shape} must equal input shape {x.shape}")


def _reduce_plain(terms: Tensor, reduction: str) -> Tensor:
    if reduction == "none":
        return terms
    return terms.sum() if reduction == "sum" else terms.mean()


def _reduce_weighted(terms: Tensor, weights: Tensor, reduction: str, in_ndim: int) -> Tensor:
    """Losses over class indices: 'mean' divides by the summed weights of the counted targets, as torch's."""
    if reduction == "mean":
        return terms.sum() / weights.sum()
    if reduction == "sum":
        return terms.sum()
    return terms.reshape(()) if in_ndim == 1 else terms
