"""Neural-network functions with torch.nn.functional's meaning: linear and einsum, normalization, dropout,
attention and losses, all composed from existing Tensor ops (autograd needs no rules of its own here).
Convolutions, pooling and resizing are in tiny.tensor.windows.

"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

from tiny.ir.config import flag
from tiny.ir.dtypes import dtypes
from tiny.ir.schedule import is_memory, layout
from tiny.ir.uop import Ops
from tiny.tensor.base import TensorBase
from tiny.tensor.checks import first_device
from tiny.tensor.shapes import prod
from tiny.tensor.weight_forms import form_of
from tiny.tensor.windows import strided

if TYPE_CHECKING:
    from tiny.tensor.tensor import Tensor

IntOrSeq = int | Sequence[int]
REDUCTIONS = ("none", "mean", "sum")
Q8_ACTIVATIONS = flag(
    "Q8_ACTIVATIONS",
    int,
    1,
    "1: a GGUF weight of Q8_0 or Q4_0 blocks, loaded where the device multiplies bytes (x86 with VNNI: the CPU's C), "
    "is kept as words and linear() over it rounds each block of its input to int8 and sums the products in int32, "
    "as llama.cpp (tiny.tensor.byte_blocks); 0: dequantized to float32 in the product's kernel (read at loading)",
)
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
        one_device = type(self.device) is str and self.device == weight.device  # (else the float path says why)
        if weight.ndim == 2 and self.dtype == dtypes.float32 and one_device and (form := form_of(weight)) is not None:
            out = form.product(self)  # (stored in a layout for products: tiny.tensor.weight_forms)
        elif weight.ndim == 2 and (blocks := weight.blocks()) is not None:  # (a block's fields reach it through views)
            x = self.reshape(*self.shape[:-1], 1, *blocks.shape[1:])
            out = (x * blocks.cast(x.dtype)).sum(axis=tuple(range(-(blocks.ndim - 1), 0)))
        else:
            out = self.matmul(_stored(weight).T if weight.ndim == 2 else weight)
        return out if bias is None else out + bias

    def blocks(self) -> Tensor | None:
        """A matrix (rows, k) that is a reshape of values computed block by block, as the computation it reshapes,
        split (rows, k / n, *block): a GGUF file's quantized weight (tiny.nn.gguf) is a graph over blocks of n
        values (their scales and quants, each a tensor of the file's bytes). None for anything else.

        A product or a row lookup over the split form reads every field of a block through a view, so it runs in
        one kernel with the dequantization inside; over the flat k dim no view reaches a block's scale (at k // n),
        and the values would be computed into memory first, four times the file's bytes."""
        from tiny.ir.schedule import is_memory, is_realized

        if self.ndim != 2 or self.uop.op is not Ops.RESHAPE or is_realized(self.uop) or is_memory(self.uop.source):
            return None  # (a reshape computed into memory already is read there)
        src, (rows, k) = self.uop.source, self.shape
        for lead in range(1, len(src.shape)):  # (blocks, *block) or (rows, k / n, *block): the biggest block
            block = math.prod(src.shape[lead:])
            if block >= 2 and k % block == 0 and math.prod(src.shape[:lead]) == rows * (k // block):
                return self._new(src).reshape(rows, k // block, *src.shape[lead:])
        return None

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
            # the running statistics as one scale and one shift a channel, as PyTorch computes them, each a buffer of
            # its own: fused into what reads them, every position computed its channel's square root and division
            # again (ResNet-50's batch norms took 33 of its 280 ms of kernels)
            scale = (running_var + eps).rsqrt()
            if weight is not None:
                scale = scale * weight
            shift = -running_mean * scale if bias is None else bias - running_mean * scale
            return self * scale.contiguous().reshape(bshape) + shift.contiguous().reshape(bshape)
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

    def normalize(self, p: float = 2.0, dim: int = 1, eps: float = 1e-12) -> Tensor:
        """x / max(||x||_p, eps) along a dim, as torch.nn.functional.normalize (a zero vector stays zero, with a
        zero gradient).

        >>> [round(v, 4) for v in Tensor([[3.0, 4.0]]).normalize().tolist()[0]]
        [0.6, 0.8]
        """
        if not isinstance(p, (int, float)) or isinstance(p, bool) or p <= 0:
            raise ValueError(f"normalize() needs a p > 0, got {p!r}")
        x = self._float_input()
        if x.ndim == 0:
            raise ValueError("normalize() needs a tensor of at least 1 dim, got a 0-d one")
        total = (x.square() if p == 2 else x.abs().pow(p)).sum(dim, keepdim=True)
        positive = total > 0  # the root's derivative is infinite at 0: a zero vector takes the root of 1 there
        safe = positive.where(total, 1.0)
        norm = positive.where(safe.sqrt() if p == 2 else safe.pow(1.0 / p), 0.0)
        return x / norm.maximum(eps)

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
        # many queries (a prompt, an encoder): the keys transposed once, so each row of scores is read along memory,
        # where each of its values was a key's row apart (one query, a decode step, reads each key's row in place)
        many = type(length) is int and length >= 16
        n_keys = k.shape[-2]
        # ... and their number padded to whole vectors, the padding's scores masked out (77 text tokens: the scores
        # took no vectors at all, their softmax scalar rows)
        padded = layout.whole_vectors(first_device(self.device), self.dtype, n_keys) if many else n_keys
        if padded != n_keys:
            k, v = (t.pad([(0, 0)] * (t.ndim - 2) + [(0, padded - n_keys), (0, 0)]) for t in (k, v))
            if attn_mask is not None:  # (a bool mask keeps nothing there, a float one adds -inf)
                fill = False if attn_mask.dtype.is_bool else -math.inf
                attn_mask = attn_mask.expand(*attn_mask.shape[:-1], n_keys)  # (a mask broadcast along the keys)
                attn_mask = attn_mask.pad([(0, 0)] * (attn_mask.ndim - 1) + [(0, padded - n_keys)], value=fill)
            else:  # (the causal mask below takes it too)
                inside = type(self).arange(padded, device=self.device) < n_keys
                if not is_causal:
                    attn_mask = inside
        keys = k.transpose(-1, -2)
        if many:
            keys = keys.contiguous()
            if not is_memory(q.uop):  # (computed queries, as rotated ones, in memory: a kernel of scores whose keys
                q = q.contiguous()  # are no whole vectors (a prompt's chunk over the cache) computed them again a key)
        scores = q.matmul(keys) * (1 / math.sqrt(emb) if scale is None else scale)
        if is_causal:
            rows = type(self).arange(length, device=self.device).reshape(length, 1)
            attn_mask = rows >= type(self).arange(padded, device=self.device).reshape(1, padded)
            if padded != n_keys:
                attn_mask = attn_mask & inside
        if attn_mask is not None:
            if heads is not None and attn_mask.ndim >= 3 and attn_mask.shape[-3] == heads[0] * heads[1]:
                attn_mask = attn_mask.reshape(*attn_mask.shape[:-3], *heads, *attn_mask.shape[-2:])
            elif heads is not None and attn_mask.ndim >= 3:
                attn_mask = attn_mask.unsqueeze(-3)
            scores = attn_mask.where(scores, -math.inf) if attn_mask.dtype.is_bool else scores + attn_mask
        # the scores in their own order, so the softmax reads each row along memory (a product over heads split
        # from one projection is otherwise stored in the projection's order: a row's values 12 heads apart), and for
        # many queries the probabilities a buffer of their own: fused into the product with value, each exp is
        # computed again for every column block of the output, one scalar at a time (BERT-base's attention: 13.3 ->
        # 4.8 ms a layer); one query's few exps cost less than the kernel more (a decode step)
        attn = scores.contiguous().softmax(-1)
        if many:
            attn = attn.contiguous()
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
        t = strided(flat, flat.ndim - 1, 0, s, s + 1) if s > 1 else flat
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


def _stored(weight: Tensor) -> Tensor:
    """A weight that is a float widened from a narrower one (a float16 GGUF matrix read as float32), as stored: a
    product widens it as it reads it, and the copy of it in panels a prompt's product makes holds half the bytes.
    Where it takes gradients, the weight itself."""
    u = weight.uop
    if weight.requires_grad or u.op is not Ops.CAST or not u.dtype.is_float:
        return weight
    source = u.source
    return weight._new(source) if source.dtype.is_float and source.dtype.itemsize < u.dtype.itemsize else weight
