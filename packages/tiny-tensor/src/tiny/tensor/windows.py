"""Convolutions, pooling and resizing with torch.nn.functional's meaning, composed from existing Tensor ops.

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
from typing import TYPE_CHECKING, Any

import numpy as np

from tiny.ir.dtypes import dtypes
from tiny.ir.multi import multi
from tiny.ir.schedule import is_realized, layout
from tiny.ir.uop import Ops, UOp
from tiny.tensor.base import TensorBase
from tiny.tensor.checks import default_int, first_device
from tiny.tensor.gradient import Grads, primitive_gradient, set_composite_rule

if TYPE_CHECKING:
    from tiny.tensor.tensor import Tensor

IntOrSeq = int | Sequence[int]
DW_GROUP_BYTES = 1 << 18  # a channels-last weight gradient sums over images in groups of about this many bytes read


class WindowOps(TensorBase):
    __slots__ = ()

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
        if (parts := _per_device(self, weight, bias, nd)) is not None:  # a convolution on each device, its own
            convs = [x._conv(w, b, stride, padding, dilation, groups, nd, name) for x, w, b in parts]  # derivative too
            return self._new(multi([y.uop for y in convs], self.uop.arg))
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
        strides, dils = pool_ints(stride, nd, "stride", name), pool_ints(dilation, nd, "dilation", name)
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
        given_pads = pads
        last = groups == 1 and _channels_last(x, weight, out)
        grown = [(max(lo, 0), max(hi, 0)) for lo, hi in pads]
        pads = [(lo - g, hi - h) for (lo, hi), (g, h) in zip(pads, grown)]
        if last:
            # channels innermost, zeros written around the input once in every spatial dim but the first: the
            # convolution reads it without a mask per load, in whole vectors. The first dim's padding stays a mask,
            # which is the same for the whole loop over a kernel row: that loop skips the rows of zeros
            # (tiny.codegen.narrow) instead of multiplying them. (Not with a stride or dilation along it: the rows
            # a kernel row reads are then no band a loop bound can follow, and the mask would gate every load)
            first = grown[0] if strides[0] == 1 and dils[0] == 1 else (0, 0)
            inner = [(lo - f, hi - g) for (lo, hi), (f, g) in zip(grown, [first] + [(0, 0)] * (nd - 1))]
            if any(lo or hi for lo, hi in inner):
                # (each position's channels then a line of spare ones, where the tile's reads would share few of
                # the cache's sets: tiny.ir.schedule.layout.spare_channels)
                spare = layout.spare_channels(first_device(x.device), x.dtype, c, strides[-1])
                xl = x.permute(0, *range(2, nd + 2), 1).pad([(0, 0), *inner, (0, spare)]).contiguous()
                xl = xl[..., :c] if spare else xl
            else:
                xl = _channels_innermost(x)
            x = _channels_first(xl).pad([(0, 0), (0, 0), first, *([(0, 0)] * (nd - 1))])
        elif any(lo or hi for lo, hi in grown):
            # zeros written around the input once: a copy of the input costs far less than a gate on each of k*k reads
            x = x.pad([(0, 0), (0, 0), *grown]).contiguous()
        else:
            x = _in_memory(x)
        starts = [[k * d - lo for k in range(ks)] for ks, d, (lo, _) in zip(kernel, dils, pads)]
        win = _windows(x, starts, strides, out)  # (N, C, *out, *kernel)
        if last:
            # (N, *out, C_out) in memory, output channels innermost: vectors of output channels, their weights read
            # from a copy of the weight in panels, each `width` output channels' one block (C_out / width, C_in,
            # *kernel, width): a tile's vectors of them follow one another down the reduction, where with C_out
            # innermost they lie C_out apart (a page past 1024 channels); C_out innermost where it is no whole number
            # of panels. The result is a permuted view of it
            sp, ks = range(2, 2 + nd), range(2 + nd, 2 + 2 * nd)
            width = layout.conv_panel_width(first_device(x.device), x.dtype, cout)
            a = win.permute(0, *sp, 1, *ks).reshape(n, *out, 1, c, *kernel)
            if width:
                wt = weight.reshape(cout // width, width, c, *kernel).permute(0, *range(2, nd + 3), 1).contiguous()
                b = wt.permute(0, nd + 2, *range(1, nd + 2)).reshape(1, *([1] * nd), cout // width, width, c, *kernel)
                y = (a.reshape(n, *out, 1, 1, c, *kernel) * b).sum(axis=tuple(range(nd + 3, 2 * nd + 4)))
            else:
                wt = weight.permute(*range(1, nd + 2), 0).contiguous()  # (C_in, *kernel, C_out)
                b = wt.permute(nd + 1, *range(nd + 1)).reshape(1, *([1] * nd), cout, c, *kernel)
                y = (a * b).sum(axis=tuple(range(nd + 2, 2 * nd + 3)))
            y = _channels_first(y.reshape(n, *out, cout).contiguous())
            win = a
        else:
            win = win.reshape(n, groups, 1, c // groups, *out, *kernel)
            w = weight.reshape(1, groups, cout // groups, cin_g, *([1] * nd), *kernel)
            y = (win * w).sum(axis=(3, *range(4 + nd, 4 + 2 * nd)), keepdim=True).reshape(n, cout, *out)

        tensor, win_node = type(self), win.uop

        def conv_grads(node: UOp, inputs: tuple[UOp, ...], g: UOp, needed: tuple[bool, ...]) -> Grads:
            """The input's gradient is a transposed convolution of g (not the window gradient the primitives give,
            a buffer kernel-size times the input); the weight's comes through the primitives, or, with output
            channels innermost, as a product of the windows with a copy of g that has them innermost too."""
            # both gradients read each element of g many times: it is written once (channels innermost where the
            # weight's gradient reads it so)
            x_node, w_node = inputs
            gl = _channels_innermost(tensor(g)) if last else None
            gm = _in_memory(tensor(g)) if gl is None else _channels_first(gl)
            dx = None
            if needed[0]:
                if all(st == 1 for st in strides):  # a plain convolution of g, zero-padded, with the flipped weight
                    flipped = _transposed_weight(tensor(w_node), groups).flip(tuple(range(2, 2 + nd)))
                    reach = [d * (k - 1) for d, k in zip(dils, kernel)]
                    full = gm._conv(flipped, None, 1, reach, dils, groups, nd, name)
                else:
                    full = gm._conv_transpose(tensor(w_node), None, strides, 0, 0, groups, dils, nd, name)
                for j, (size, (lo, _)) in enumerate(zip(spatial, given_pads)):
                    full = _take(full, 2 + j, lo, size)  # full[.., i, ..] is padded position i: the input starts at lo
                dx = full.uop if batched else full.reshape(x_node.shape).uop
            dw = None
            if needed[1] and gl is not None:  # (C_in, *kernel, C_out), vectors of output channels, viewed as the weight
                # in groups of images whose windows and gradient stay in cache while every output tile reads them
                # (a tile's reduction over all of them would stream both from memory once per tile), then summed
                per = math.prod(out) * (c + cout) * g.dtype.itemsize
                group = max((d for d in range(1, n + 1) if n % d == 0 and d * per <= DW_GROUP_BYTES), default=1)
                gt = gl.reshape(n // group, group, *out, 1, *([1] * nd), cout)
                windows = tensor(win_node).reshape(n // group, group, *out, c, *kernel, 1)
                dw = (windows * gt).sum(axis=tuple(range(1, nd + 2)))
                dw = (dw.sum(0) if group < n else dw.reshape(dw.shape[1:])).contiguous()
                dw = dw.permute(nd + 1, *range(nd + 1)).uop
            elif needed[1]:
                dw = primitive_gradient(node, inputs, gm.uop, w_node)
            return (dx, dw)

        set_composite_rule(y.uop, (self.uop, weight.uop), conv_grads)  # (tensors' uops change on realize)
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
        strides, dils = pool_ints(stride, nd, "stride", name), pool_ints(dilation, nd, "dilation", name)
        pads = pool_ints(padding, nd, "padding", name, 0)
        opads = pool_ints(output_padding, nd, "output_padding", name, 0)
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
        x = _in_memory(x)
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

        tensor = type(self)

        def conv_transpose_grads(node: UOp, inputs: tuple[UOp, ...], g: UOp, needed: tuple[bool, ...]) -> Grads:
            """The input's gradient is a convolution of g with the same weight; the weight's, the primitives'."""
            x_node, w_node = inputs
            gm = _in_memory(tensor(g))  # both gradients read each element of g many times
            dx = None
            if needed[0]:
                conv = gm._conv(tensor(w_node), None, strides, pads, dils, groups, nd, name)
                dx = conv.uop if batched else conv.reshape(x_node.shape).uop
            dw = primitive_gradient(node, inputs, gm.uop, w_node) if needed[1] else None
            return (dx, dw)

        set_composite_rule(y.uop, (self.uop, weight.uop), conv_transpose_grads)  # (uops change on realize)
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
        return_indices: bool = False,
    ) -> Any:
        """Maximum over kernel_size windows of (N, C, H, W) (stride defaults to kernel_size), as torch's
        max_pool2d; padding is never the maximum. With return_indices, also where each maximum is: its flat index
        in its (H, W) plane (the first in the window where several are equal; a NaN is the maximum), as
        max_unpool2d takes it.

        >>> Tensor([[[[1.0, 2.0], [3.0, 4.0]]]]).max_pool2d(2).tolist()
        [[[[4.0]]]]
        """
        return self._max_pool(kernel_size, stride, padding, dilation, ceil_mode, 2, return_indices)

    def max_pool1d(
        self,
        kernel_size: IntOrSeq,
        stride: IntOrSeq | None = None,
        padding: IntOrSeq = 0,
        dilation: IntOrSeq = 1,
        ceil_mode: bool = False,
        return_indices: bool = False,
    ) -> Any:
        """Maximum over windows of (N, C, L), as torch's max_pool1d (return_indices: as max_pool2d's).

        >>> Tensor([[[1.0, 3.0, 5.0, 2.0]]]).max_pool1d(2).tolist()
        [[[3.0, 5.0]]]
        """
        return self._max_pool(kernel_size, stride, padding, dilation, ceil_mode, 1, return_indices)

    def _max_pool(
        self,
        kernel_size: IntOrSeq,
        stride: IntOrSeq | None,
        padding: IntOrSeq,
        dilation: IntOrSeq,
        ceil_mode: bool,
        nd: int,
        return_indices: bool = False,
    ) -> Any:
        name = f"max_pool{nd}d"
        x, batched = self._with_batch(nd, name)
        kernel, strides, pads, dils = _pool_args(kernel_size, stride, padding, dilation, nd, name)
        spatial = x.shape[2:]
        out = [_pool_out(s, k, st, p, d, ceil_mode) for s, k, st, p, d in zip(spatial, kernel, strides, pads, dils)]
        _check_pool(name, spatial, kernel, pads, dils, out)
        if not return_indices and _pads_in_memory(x, kernel, pads, out, strides, dils):
            # the padding written once, channels innermost, as the lowest value: the windows read it without a
            # mask, in whole vectors of channels (a gate on each of k*k reads: ResNet-50's first pool 6.9 ms)
            grown = [(0, 0), *((p, p) for p in pads), (0, 0)]
            xl = x.permute(0, *range(2, nd + 2), 1).pad(grown, value=x.dtype.min).contiguous()
            starts = [[k * d for k in range(ks)] for ks, d in zip(kernel, dils)]
            y = _windows(_channels_first(xl), starts, strides, out).max(axis=tuple(range(2 + nd, 2 + 2 * nd)))
            return y if batched else y.reshape(y.shape[1:])
        starts = [[k * d - p for k in range(ks)] for ks, d, p in zip(kernel, dils, pads)]
        win = _windows(x, starts, strides, out)
        inside = [_window_inside(s, st_k, st, o) for s, st_k, st, o in zip(spatial, starts, strides, out)]
        mask = inside[0]
        for m in inside[1:]:
            mask = _outer_and(mask, m)
        if not mask.all():  # some windows reach into the padding: it must never be the max
            win = type(self)(mask, device=x.device).where(win, x.dtype.min)  # (mask: (*out, *kernel))
        kernel_axes = tuple(range(2 + nd, 2 + 2 * nd))
        y = win.max(axis=kernel_axes)
        if not return_indices:
            return y if batched else y.reshape(y.shape[1:])
        flat = _window_positions(spatial, starts, strides, out)  # (*out, *kernel): each element's place in the plane
        at_max = (win == y.reshape(*y.shape, *(1,) * nd)) | ((win != win) & (y != y).reshape(*y.shape, *(1,) * nd))
        past = math.prod(spatial)  # (past every place: what padding is never chosen as)
        where = type(self)(np.where(mask, flat, past), device=x.device, dtype=default_int(x.device))
        idx = at_max.where(where, past).min(axis=kernel_axes)
        return (y, idx) if batched else (y.reshape(y.shape[1:]), idx.reshape(idx.shape[1:]))

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
            out = list(pool_ints(size, nd, "size", "interpolate"))
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
        wide = np.float64 if self.dtype == dtypes.float64 else np.float32  # float64 weights only where x is float64
        m = type(self)(matrix.astype(wide), device=self.device).cast(self.dtype)
        return self.transpose(dim, -1).matmul(m.T).transpose(dim, -1)

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
        taken = strided(x, dim, first, n, step)
    return taken.pad(_along(x.ndim, dim, (lo, count - hi), (0, 0)))


def strided(x: Tensor, dim: int, first: int, n: int, step: int) -> Tensor:
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
    head = strided(x, dim, first, n - 1, step)
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


def _per_device(x: Tensor, weight: Tensor, bias: Tensor | None, nd: int) -> list[tuple] | None:
    """Each device's input, weight and bias, where a convolution on several devices is one on each: the input split
    along the batch (or whole on each), the weight and bias whole on each; else None (the op is then rewritten per
    device like any other, and derived through its primitives)."""
    if x.uop.op is not Ops.MULTI or x.uop.arg not in (None, 0) or (x.uop.arg == 0 and x.ndim != nd + 2):
        return None
    others = [t for t in (weight, bias) if t is not None]
    if any(t.uop.op is not Ops.MULTI or t.uop.arg is not None or t.device != x.device for t in others):
        return None
    parts = [list(map(x._operand, t.uop.src)) if t is not None else [None] * len(x.uop.src) for t in (x, weight, bias)]
    return list(zip(*parts))


def _channels_last(x: Tensor, weight: Tensor, out: Sequence[int]) -> bool:
    """Whether a convolution computes its output channels innermost in memory: the scheduler's choice for its
    device, dtype and size (tiny.ir.schedule.layout.channels_last)."""
    if x.dtype != weight.dtype:
        return False
    work = x.shape[0] * math.prod(out) * weight.shape[0] * math.prod(weight.shape[1:])
    return layout.channels_last(first_device(x.device), x.dtype, weight.shape[0], work)


def _pads_in_memory(
    x: Tensor,
    kernel: Sequence[int],
    pads: Sequence[int],
    out: Sequence[int],
    strides: Sequence[int],
    dils: Sequence[int],
) -> bool:
    """Whether a max pool writes its padding into a channels-last copy of its input: padded, on a device and size
    where convolutions keep channels innermost (tiny.ir.schedule.layout.channels_last), its windows inside the
    padded input (not with ceil_mode's last window past it)."""
    if not any(pads) or not x.dtype.is_float:
        return False
    fits = all(
        (o - 1) * st + d * (k - 1) < s + 2 * p
        for o, st, d, k, s, p in zip(out, strides, dils, kernel, x.shape[2:], pads)
    )
    work = x.shape[0] * x.shape[1] * math.prod(out) * math.prod(kernel)
    return fits and layout.channels_last(first_device(x.device), x.dtype, x.shape[1], work)


def _transposed_weight(w: Tensor, groups: int) -> Tensor:
    """A convolution's weight (C_out, C_in/groups, *k) as the weight of its transpose (C_in, C_out/groups, *k)."""
    cout, cin_g, *kernel = w.shape
    w = w.reshape(groups, cout // groups, cin_g, *kernel).transpose(1, 2)
    return w.reshape(groups * cin_g, cout // groups, *kernel)


def _in_memory(x: Tensor) -> Tensor:
    """x as a buffer: a convolution reads each input element kernel-size times output-channels times, so an input
    still to be computed (a gradient's elementwise chain, an activation) is written once rather than recomputed."""
    return x if is_realized(x.uop) or x.uop.op is Ops.CONTIGUOUS else x.contiguous()


def _channels_innermost(x: Tensor) -> Tensor:
    """(N, *spatial, C) in memory with the values of x (N, C, *spatial): the memory x already views in that order
    (a convolution's output, a copy made for one before), or a copy."""
    u, nd = x.uop, x.ndim - 2
    if u.op is Ops.PERMUTE and u.arg == _first_order(nd) and (is_realized(u.source) or u.source.op is Ops.CONTIGUOUS):
        return type(x)(u.source)
    return x.permute(0, *range(2, nd + 2), 1).contiguous()


def _channels_first(t: Tensor) -> Tensor:
    """(N, *spatial, C) viewed as (N, C, *spatial)."""
    return t.permute(_first_order(t.ndim - 2))


def _first_order(nd: int) -> tuple[int, ...]:
    """The permute from (N, *spatial, C) to (N, C, *spatial) with nd spatial dims."""
    return (0, nd + 1, *range(1, nd + 1))


def _take(t: Tensor, dim: int, start: int, size: int) -> Tensor:
    """t[start : start + size] along dim, reading 0 where that runs outside t (a shrink and a pad: views)."""
    full = t.shape[dim]
    a, b = min(max(start, 0), full), max(min(start + size, full), 0)
    if b <= a:
        return t.shrink(_along(t.ndim, dim, (0, 0))).pad(_along(t.ndim, dim, (0, size), (0, 0)))
    return t.shrink(_along(t.ndim, dim, (a, b))).pad(_along(t.ndim, dim, (a - start, start + size - b), (0, 0)))


def _tree_sum(terms: list[Tensor]) -> Tensor:
    """Add in a balanced tree, so the graph stays shallow for large kernels."""
    while len(terms) > 1:
        terms = [terms[i] + terms[i + 1] if i + 1 < len(terms) else terms[i] for i in range(0, len(terms), 2)]
    return terms[0]


def _window_inside(size: int, starts: Sequence[int], stride: int, out: int) -> np.ndarray:
    """(out, kernel) bools: whether window o's element k lies inside the input."""
    pos = np.arange(out)[:, None] * stride + np.asarray(starts)[None, :]
    return (pos >= 0) & (pos < size)


def _window_positions(
    spatial: Sequence[int], starts: Sequence[Sequence[int]], strides: Sequence[int], out: Sequence[int]
) -> np.ndarray:
    """(*out, *kernel) ints: the flat index in the (*spatial) plane of each window element (padding: anything)."""
    flat = np.zeros((*out, *(len(s) for s in starts)), np.int64)
    nd, place = len(spatial), 1
    for i in reversed(range(nd)):
        pos = np.arange(out[i])[:, None] * strides[i] + np.asarray(starts[i])[None, :]  # (out_i, kernel_i)
        shape = [1] * (2 * nd)
        shape[i], shape[nd + i] = out[i], len(starts[i])
        flat = flat + pos.reshape(shape) * place
        place *= spatial[i]
    return flat


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
    kernel = pool_ints(kernel_size, nd, "kernel_size", name)
    strides = kernel if stride is None or stride == [] else pool_ints(stride, nd, "stride", name)
    return kernel, strides, pool_ints(padding, nd, "padding", name, 0), pool_ints(dilation, nd, "dilation", name)


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


# ---------------------------------------------------------------- argument checks


def pool_ints(v: IntOrSeq, n: int, what: str, name: str, minimum: int = 1) -> tuple[int, ...]:
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
    return [(p, p) for p in pool_ints(padding, len(kernel), "padding", name, 0)]


def _check_groups(name: str, groups: int, cin: int, cout: int, in_what: str, out_what: str) -> None:
    if not isinstance(groups, int) or groups <= 0:
        raise ValueError(f"{name}() groups must be a positive int, got {groups!r}")
    if cin % groups or cout % groups:
        raise ValueError(f"{name}(): groups={groups} must divide the {cin} {in_what} and the {cout} {out_what}")


def _check_bias(name: str, bias: Tensor | None, cout: int) -> None:
    if bias is not None and bias.shape != (cout,):
        raise ValueError(f"{name}(): bias must have shape ({cout},) for {cout} output channels, got {bias.shape}")
