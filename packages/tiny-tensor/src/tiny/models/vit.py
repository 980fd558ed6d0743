"""The Vision Transformer, as Hugging Face's ViTModel and ViTForImageClassification compute it and name their weights:
the image cut into patches by a strided convolution, a learned class token before them and learned position
embeddings added; layers of self-attention and a feed-forward, each normalized before (pre-norm) and added to its
input; a final LayerNorm; the pooler (the class token through a dense layer and its activation) where the model has
one, and a linear classifier of the class token's state where it classifies.

Images are (batch, channels, height, width) of the config's size, as Hugging Face's image processor makes them; with
interpolate_pos_encoding, of any size, the position embeddings of the patches resized to its grid (bicubic, as
Hugging Face resizes them). The model computes in its weights' dtype: float32, or float16 / bfloat16 with
load(..., dtype=), the images cast to it.

>>> from tiny.models import vit  # doctest: +SKIP
>>> model = vit.load("path/to/folder")  # doctest: +SKIP
>>> model(pixels).logits.argmax(-1).tolist()  # doctest: +SKIP
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Any

import numpy as np

from tiny.models.hf import activation, compute_dtype, load_weights, read_config, read_weights
from tiny.nn import Conv2d, LayerNorm, Linear, skip_init
from tiny.nn.layers import parameter  # (a weight as tiny.nn's layers make theirs: a leaf, or lazy in skip_init)
from tiny.tensor import DType, Tensor, dtypes

__all__ = ["ViTConfig", "ViTForImageClassification", "ViTModel", "ViTOutput", "load"]

ARCHITECTURES = ("ViTModel", "ViTForImageClassification")


def _pair(v: Any, what: str) -> tuple[int, int]:
    pair = (v, v) if isinstance(v, int) else tuple(int(x) for x in v)
    if len(pair) != 2:
        raise ValueError(f"ViT: {what} must be an int or two ints, got {v!r}")
    return pair  # type: ignore[return-value]


@dataclass(frozen=True)
class ViTConfig:
    image_size: tuple[int, int] = (224, 224)
    patch_size: tuple[int, int] = (16, 16)
    num_channels: int = 3
    hidden_size: int = 768
    num_hidden_layers: int = 12
    num_attention_heads: int = 12
    intermediate_size: int = 3072
    hidden_act: str = "gelu"
    layer_norm_eps: float = 1e-12
    qkv_bias: bool = True
    pooler_output_size: int = 768
    pooler_act: str = "tanh"
    num_labels: int = 2

    @property
    def num_patches(self) -> int:
        return (self.image_size[0] // self.patch_size[0]) * (self.image_size[1] // self.patch_size[1])

    @staticmethod
    def from_hf(cfg: dict[str, Any]) -> ViTConfig:
        """From a Hugging Face config.json of model_type vit."""
        hidden, heads = int(cfg["hidden_size"]), int(cfg["num_attention_heads"])
        if hidden % heads:
            raise ValueError(f"ViT: hidden_size {hidden} is not a multiple of num_attention_heads {heads}")
        for key, default in (("hidden_act", "gelu"), ("pooler_act", "tanh")):
            activation(cfg.get(key) or default)  # (an unknown one is an error now, not at the first call)
        labels = cfg.get("id2label")
        return ViTConfig(
            image_size=_pair(cfg.get("image_size", 224), "image_size"),
            patch_size=_pair(cfg.get("patch_size", 16), "patch_size"),
            num_channels=int(cfg.get("num_channels", 3)),
            hidden_size=hidden,
            num_hidden_layers=int(cfg["num_hidden_layers"]),
            num_attention_heads=heads,
            intermediate_size=int(cfg["intermediate_size"]),
            hidden_act=cfg.get("hidden_act") or "gelu",
            layer_norm_eps=float(cfg.get("layer_norm_eps", 1e-12)),
            qkv_bias=bool(cfg.get("qkv_bias", True)),
            pooler_output_size=int(cfg.get("pooler_output_size") or hidden),
            pooler_act=cfg.get("pooler_act") or "tanh",
            num_labels=len(labels) if labels else int(cfg.get("num_labels", 2)),
        )


@dataclass(frozen=True)
class ViTOutput:
    """What the Hugging Face model returns: the hidden states after the final LayerNorm (batch, 1 + patches,
    hidden), the pooled class token (batch, pooler_output_size) where the model has a pooler, and the logits
    (batch, num_labels) where it classifies."""

    last_hidden_state: Tensor
    pooler_output: Tensor | None = None
    logits: Tensor | None = None


class PatchEmbeddings:
    def __init__(self, cfg: ViTConfig, device: str | None) -> None:
        self.projection = Conv2d(
            cfg.num_channels, cfg.hidden_size, cfg.patch_size, stride=cfg.patch_size, device=device
        )

    def __call__(self, pixels: Tensor) -> Tensor:
        return self.projection(pixels).flatten(2).transpose(1, 2)  # (batch, patches, hidden), row by row


class Embeddings:
    def __init__(self, cfg: ViTConfig, device: str | None) -> None:
        self.patch_size = cfg.patch_size
        self.cls_token = parameter(Tensor.normal(1, 1, cfg.hidden_size, device=device))
        self.position_embeddings = parameter(Tensor.normal(1, cfg.num_patches + 1, cfg.hidden_size, device=device))
        self.patch_embeddings = PatchEmbeddings(cfg, device)

    def __call__(self, pixels: Tensor, interpolate_pos_encoding: bool = False) -> Tensor:
        patches = self.patch_embeddings(pixels)
        cls = self.cls_token.expand(pixels.shape[0], 1, self.cls_token.shape[2])
        positions = self.position_embeddings
        height, width = pixels.shape[2:]
        if interpolate_pos_encoding and (patches.shape[1] != positions.shape[1] - 1 or height != width):
            positions = self._resized(height // self.patch_size[0], width // self.patch_size[1])
        return cls.cat(patches, dim=1) + positions

    def _resized(self, rows: int, cols: int) -> Tensor:
        """The position embeddings for a grid of rows x cols patches: the class token's as it is, the patches' (a
        square grid) resized by bicubic interpolation, one matrix per axis."""
        table = self.position_embeddings
        count, dim = table.shape[1] - 1, table.shape[2]
        side = math.isqrt(count)
        if side * side != count:
            raise ValueError(f"ViT: interpolate_pos_encoding needs a square grid of positions, the model has {count}")
        grid = table[0, 1:].reshape(side, side, dim).permute(2, 0, 1)  # (dim, side, side)
        down = Tensor(_bicubic(side, rows), device=table.device)  # (rows, side)
        across = Tensor(_bicubic(side, cols), device=table.device)  # (cols, side)
        resized = down.matmul(grid.cast(dtypes.float32)).matmul(across.T).cast(table.dtype)  # (dim, rows, cols)
        return table[:, :1].cat(resized.permute(1, 2, 0).reshape(1, rows * cols, dim), dim=1)


def _bicubic(size: int, out: int) -> np.ndarray:
    """(out, size): torch's bicubic resize of one axis as a matrix (align_corners=False: a pixel's center maps to a
    center; Keys' cubic convolution with A = -0.75 over the 4 nearest, the edge repeated past the border)."""
    a = -0.75

    def near(x: float) -> float:  # |x| <= 1
        return ((a + 2) * x - (a + 3)) * x * x + 1

    def far(x: float) -> float:  # 1 < |x| < 2
        return ((a * x - 5 * a) * x + 8 * a) * x - 4 * a

    m = np.zeros((out, size), dtype=np.float64)
    for i in range(out):
        source = (i + 0.5) * size / out - 0.5
        left = math.floor(source)
        t = source - left
        for offset, w in zip((-1, 0, 1, 2), (far(t + 1), near(t), near(1 - t), far(2 - t)), strict=True):
            m[i, min(max(left + offset, 0), size - 1)] += w
    return m.astype(np.float32)


class SelfAttention:
    def __init__(self, cfg: ViTConfig, device: str | None) -> None:
        self.heads = cfg.num_attention_heads
        self.query = Linear(cfg.hidden_size, cfg.hidden_size, bias=cfg.qkv_bias, device=device)
        self.key = Linear(cfg.hidden_size, cfg.hidden_size, bias=cfg.qkv_bias, device=device)
        self.value = Linear(cfg.hidden_size, cfg.hidden_size, bias=cfg.qkv_bias, device=device)

    def __call__(self, x: Tensor) -> Tensor:
        batch, length, hidden = x.shape
        q, k, v = (
            p(x).reshape(batch, length, self.heads, -1).transpose(1, 2) for p in (self.query, self.key, self.value)
        )
        return q.scaled_dot_product_attention(k, v).transpose(1, 2).reshape(batch, length, hidden)


class Dense:
    """One Linear named `dense` (the attention's output, the feed-forward's two halves)."""

    def __init__(self, features: int, out: int, device: str | None, act: str | None = None) -> None:
        self.dense = Linear(features, out, device=device)
        self.act = None if act is None else activation(act)

    def __call__(self, x: Tensor) -> Tensor:
        h = self.dense(x)
        return h if self.act is None else self.act(h).contiguous()


class Attention:
    def __init__(self, cfg: ViTConfig, device: str | None) -> None:
        self.attention = SelfAttention(cfg, device)
        self.output = Dense(cfg.hidden_size, cfg.hidden_size, device)

    def __call__(self, x: Tensor) -> Tensor:
        return self.output(self.attention(x))


class Layer:
    def __init__(self, cfg: ViTConfig, device: str | None) -> None:
        self.layernorm_before = LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps, device=device)
        self.attention = Attention(cfg, device)
        self.layernorm_after = LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps, device=device)
        self.intermediate = Dense(cfg.hidden_size, cfg.intermediate_size, device, act=cfg.hidden_act)
        self.output = Dense(cfg.intermediate_size, cfg.hidden_size, device)

    def __call__(self, x: Tensor) -> Tensor:
        h = x + self.attention(self.layernorm_before(x).contiguous())
        return (h + self.output(self.intermediate(self.layernorm_after(h).contiguous()))).contiguous()


class Encoder:
    def __init__(self, cfg: ViTConfig, device: str | None) -> None:
        self.layer = [Layer(cfg, device) for _ in range(cfg.num_hidden_layers)]

    def __call__(self, x: Tensor) -> Tensor:
        for layer in self.layer:
            x = layer(x)
        return x


class ViTModel:
    """Embeddings, layers, the final LayerNorm and (with add_pooling_layer) the pooler; names without a prefix."""

    def __init__(self, cfg: ViTConfig, add_pooling_layer: bool = True, device: str | None = None) -> None:
        self.cfg, self.device = cfg, device
        self.embeddings = Embeddings(cfg, device)
        self.encoder = Encoder(cfg, device)
        self.layernorm = LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps, device=device)
        self.pooler = (
            Dense(cfg.hidden_size, cfg.pooler_output_size, device, cfg.pooler_act) if add_pooling_layer else None
        )

    def __call__(self, pixel_values: Tensor | Any, interpolate_pos_encoding: bool = False) -> ViTOutput:
        """The hidden states of images (batch, channels, height, width) of the config's size (of any size with
        interpolate_pos_encoding)."""
        pixels = _pixels(pixel_values, self.cfg, self.device, interpolate_pos_encoding)
        x = self.embeddings(pixels.cast(self.embeddings.cls_token.dtype), interpolate_pos_encoding)
        x = self.layernorm(self.encoder(x)).contiguous()
        return ViTOutput(x, None if self.pooler is None else self.pooler(x[:, 0]))


def _pixels(pixels: Tensor | Any, cfg: ViTConfig, device: str | None, any_size: bool) -> Tensor:
    if not isinstance(pixels, Tensor):
        pixels = Tensor(np.asarray(pixels, dtype=np.float32), device=device)
    elif not pixels.dtype.is_float:
        raise TypeError(f"pixel_values must be floats, got dtype {pixels.dtype.name}")
    if any_size:
        fits = pixels.ndim == 4 and pixels.shape[1] == cfg.num_channels
        fits = fits and all(s >= p for s, p in zip(pixels.shape[2:], cfg.patch_size, strict=True))
        if not fits:
            raise ValueError(
                f"pixel_values must be (batch, {cfg.num_channels}, height, width) with height, width at least the "
                f"patch size {cfg.patch_size}, got shape {pixels.shape}"
            )
    elif pixels.ndim != 4 or tuple(pixels.shape[1:]) != (cfg.num_channels, *cfg.image_size):
        want = ", ".join(map(str, (cfg.num_channels, *cfg.image_size)))
        raise ValueError(
            f"pixel_values must be (batch, {want}), got shape {pixels.shape} (other sizes: interpolate_pos_encoding)"
        )
    return pixels


class ViTForImageClassification:
    """ViTModel without the pooler (`vit.*`) and a linear classifier of the class token (`classifier.*`; none where
    num_labels is 0: the logits are then the class token's state, as Hugging Face's Identity gives)."""

    def __init__(self, cfg: ViTConfig, device: str | None = None) -> None:
        self.cfg, self.device = cfg, device
        self.vit = ViTModel(cfg, add_pooling_layer=False, device=device)
        self.classifier = Linear(cfg.hidden_size, cfg.num_labels, device=device) if cfg.num_labels else None

    def __call__(self, pixel_values: Tensor | Any, interpolate_pos_encoding: bool = False) -> ViTOutput:
        """The logits (batch, num_labels) of images (batch, channels, height, width), as ViTModel takes them."""
        x = self.vit(pixel_values, interpolate_pos_encoding).last_hidden_state
        first = x[:, 0]
        return ViTOutput(x, None, first if self.classifier is None else self.classifier(first))


def load(
    path: str | os.PathLike, device: str | None = None, dtype: DType | str = dtypes.float32
) -> ViTModel | ViTForImageClassification:
    """The model a Hugging Face folder holds (config.json's architecture: ViTModel or ViTForImageClassification),
    its weights read lazily from model.safetensors (or its shards) into the device. dtype: what the model computes
    in, whatever the file holds (float32 by default: a float16 checkpoint is widened; dtypes.float16 computes in
    half)."""
    dtype = compute_dtype(dtype, "ViT")
    folder, raw, arch = read_config(path, ARCHITECTURES)
    cfg = ViTConfig.from_hf(raw)
    with skip_init():  # (the weights come from the files: no random ones first)
        model = ViTModel(cfg, device=device) if arch == "ViTModel" else ViTForImageClassification(cfg, device)
    load_weights(model, read_weights(folder, device), folder, base="vit", dtype=dtype)
    return model
