"""Stable Diffusion 1.x and 2.x, as diffusers computes them and names their weights: the UNet that predicts a
latent's noise (UNet2DConditionModel: ResNet blocks on a timestep embedding, transformer blocks that attend to the
text), the VAE's decoder from latents to pixels (AutoencoderKL.decode), the DDIM and Euler schedulers, and the
pipeline that joins them with CLIP's text encoder (tiny.models.clip) and classifier-free guidance.

A checkpoint is diffusers' folder: model_index.json beside text_encoder/, tokenizer/, unet/, vae/ and scheduler/,
each with its config; weights are read lazily from each folder's safetensors file.

>>> from tiny.models import stable_diffusion  # doctest: +SKIP
>>> pipe = stable_diffusion.load("path/to/stable-diffusion-v1-5")  # doctest: +SKIP
>>> pipe("a photo of an astronaut", steps=20, seed=0).shape  # doctest: +SKIP
(1, 512, 512, 3)

The images are (batch, height, width, 3), floats in [0, 1]. Each model computes in its weights' dtype: float32, or
float16 / bfloat16 with load(..., dtype=) (its inputs cast to it); the pipeline keeps the latents between steps and
the scheduler's arithmetic in float32.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from tiny.models import clip
from tiny.models.hf import compute_dtype, load_weights, read_json
from tiny.nn import Conv2d, GroupNorm, LayerNorm, Linear, skip_init
from tiny.nn.state import safe_load
from tiny.tensor import DType, Tensor, dtypes

__all__ = [
    "AutoencoderKL",
    "DDIMScheduler",
    "EulerDiscreteScheduler",
    "StableDiffusion",
    "UNet2DConditionModel",
    "UNetConfig",
    "VAEConfig",
    "load",
    "load_unet",
    "load_vae",
]

_DOWN = ("CrossAttnDownBlock2D", "DownBlock2D")
_UP = ("CrossAttnUpBlock2D", "UpBlock2D")
_UNET_FIXED = (  # settings of UNet2DConditionModel that Stable Diffusion keeps at these values, and this UNet too
    ("class_embed_type", None),
    ("addition_embed_type", None),
    ("time_embedding_type", "positional"),
    ("resnet_time_scale_shift", "default"),
    ("act_fn", "silu"),
    ("center_input_sample", False),
)


def _per_block(v: Any, n: int, what: str) -> tuple[int, ...]:
    values = (v,) * n if isinstance(v, int) else tuple(int(x) for x in v)
    if len(values) != n:
        raise ValueError(f"UNet: {what} has {len(values)} values for {n} blocks")
    return values


@dataclass(frozen=True)
class UNetConfig:
    """The part of diffusers' UNet2DConditionModel config that Stable Diffusion 1.x and 2.x use."""

    sample_size: int = 64
    in_channels: int = 4
    out_channels: int = 4
    flip_sin_to_cos: bool = True
    freq_shift: int = 0
    down_block_types: tuple[str, ...] = ("CrossAttnDownBlock2D",) * 3 + ("DownBlock2D",)
    up_block_types: tuple[str, ...] = ("UpBlock2D",) + ("CrossAttnUpBlock2D",) * 3
    block_out_channels: tuple[int, ...] = (320, 640, 1280, 1280)
    layers_per_block: int = 2
    norm_num_groups: int = 32
    norm_eps: float = 1e-5
    cross_attention_dim: int = 768
    heads: tuple[int, ...] = (8, 8, 8, 8)  # per down block (the up blocks take them reversed)
    transformer_layers: tuple[int, ...] = (1, 1, 1, 1)
    use_linear_projection: bool = False

    @staticmethod
    def from_diffusers(cfg: dict[str, Any]) -> UNetConfig:
        """From a diffusers unet/config.json. Its attention_head_dim is the number of heads where num_attention_heads
        is not given (a naming diffusers keeps for these checkpoints)."""
        down, up = tuple(cfg.get("down_block_types", UNetConfig.down_block_types)), tuple(cfg["up_block_types"])
        unknown = [t for t in down if t not in _DOWN] + [t for t in up if t not in _UP]
        mid = cfg.get("mid_block_type", "UNetMidBlock2DCrossAttn")
        if unknown or mid != "UNetMidBlock2DCrossAttn" or len(down) != len(up):
            raise ValueError(
                f"UNet: blocks {list(down)} / {mid} / {list(up)} are not Stable Diffusion's "
                f"(down: {_DOWN}, mid: UNetMidBlock2DCrossAttn, up: {_UP}, as many up as down)"
            )
        for key, want in _UNET_FIXED:
            if cfg.get(key, want) != want:
                raise ValueError(f"UNet: {key}={cfg[key]!r} is not supported (Stable Diffusion's is {want!r})")
        channels = tuple(int(c) for c in cfg["block_out_channels"])
        n = len(channels)
        heads = cfg.get("num_attention_heads") or cfg.get("attention_head_dim", 8)
        return UNetConfig(
            sample_size=int(cfg.get("sample_size", 64)),
            in_channels=int(cfg.get("in_channels", 4)),
            out_channels=int(cfg.get("out_channels", 4)),
            flip_sin_to_cos=bool(cfg.get("flip_sin_to_cos", True)),
            freq_shift=int(cfg.get("freq_shift", 0)),
            down_block_types=down,
            up_block_types=up,
            block_out_channels=channels,
            layers_per_block=int(cfg.get("layers_per_block", 2)),
            norm_num_groups=int(cfg.get("norm_num_groups", 32)),
            norm_eps=float(cfg.get("norm_eps", 1e-5)),
            cross_attention_dim=int(cfg.get("cross_attention_dim", 768)),
            heads=_per_block(heads, n, "attention_head_dim"),
            transformer_layers=_per_block(
                cfg.get("transformer_layers_per_block", 1), n, "transformer_layers_per_block"
            ),
            use_linear_projection=bool(cfg.get("use_linear_projection", False)),
        )


# ---------------------------------------------------------------- the blocks both models share


def _silu(x: Tensor) -> Tensor:
    return x.silu()


class ResnetBlock2D:
    """GroupNorm, SiLU, 3x3 conv; the timestep's embedding added per channel (where there is one); again; plus the
    input (through a 1x1 conv where the channels change)."""

    def __init__(self, cin: int, cout: int, temb: int | None, groups: int, eps: float, device: str | None) -> None:
        self.norm1 = GroupNorm(groups, cin, eps=eps, device=device)
        self.conv1 = Conv2d(cin, cout, 3, padding=1, device=device)
        self.time_emb_proj = Linear(temb, cout, device=device) if temb else None
        self.norm2 = GroupNorm(groups, cout, eps=eps, device=device)
        self.conv2 = Conv2d(cout, cout, 3, padding=1, device=device)
        self.conv_shortcut = Conv2d(cin, cout, 1, device=device) if cin != cout else None

    def __call__(self, x: Tensor, temb: Tensor | None = None) -> Tensor:
        h = self.conv1(_silu(self.norm1(x)))
        if self.time_emb_proj is not None and temb is not None:
            h = h + self.time_emb_proj(_silu(temb)).reshape(*temb.shape[:1], -1, 1, 1)
        h = self.conv2(_silu(self.norm2(h.contiguous())))
        return ((x if self.conv_shortcut is None else self.conv_shortcut(x)) + h).contiguous()


class Downsample2D:
    def __init__(self, channels: int, device: str | None) -> None:
        self.conv = Conv2d(channels, channels, 3, stride=2, padding=1, device=device)

    def __call__(self, x: Tensor) -> Tensor:
        return self.conv(x)


class Upsample2D:
    """Each pixel repeated 2 x 2 (nearest), then a 3x3 conv."""

    def __init__(self, channels: int, device: str | None) -> None:
        self.conv = Conv2d(channels, channels, 3, padding=1, device=device)

    def __call__(self, x: Tensor) -> Tensor:
        b, c, h, w = x.shape
        x = x.reshape(b, c, h, 1, w, 1).expand(b, c, h, 2, w, 2).reshape(b, c, h * 2, w * 2)
        return self.conv(x.contiguous())


class Attention:
    """diffusers' Attention: heads over to_q of the queries and to_k, to_v of the context (the queries where there is
    none), then to_out[0]."""

    def __init__(self, dim: int, heads: int, context: int | None, bias: bool, device: str | None) -> None:
        self.heads = heads
        self.to_q = Linear(dim, dim, bias=bias, device=device)
        self.to_k = Linear(context or dim, dim, bias=bias, device=device)
        self.to_v = Linear(context or dim, dim, bias=bias, device=device)
        self.to_out = [Linear(dim, dim, device=device)]

    def __call__(self, x: Tensor, context: Tensor | None = None) -> Tensor:
        batch, length, dim = x.shape
        ctx = x if context is None else context
        q = self.to_q(x).reshape(batch, length, self.heads, -1).transpose(1, 2)
        k, v = (p(ctx).reshape(batch, ctx.shape[1], self.heads, -1).transpose(1, 2) for p in (self.to_k, self.to_v))
        out = q.scaled_dot_product_attention(k, v).transpose(1, 2).reshape(batch, length, dim)
        return self.to_out[0](out)


class GEGLU:
    def __init__(self, dim: int, inner: int, device: str | None) -> None:
        self.proj = Linear(dim, inner * 2, device=device)

    def __call__(self, x: Tensor) -> Tensor:
        h, gate = self.proj(x).chunk(2, dim=-1)
        return h * gate.gelu()


class FeedForward:
    def __init__(self, dim: int, device: str | None) -> None:
        self.net = [GEGLU(dim, dim * 4, device), None, Linear(dim * 4, dim, device=device)]  # (net.1 is a dropout)

    def __call__(self, x: Tensor) -> Tensor:
        return self.net[2](self.net[0](x).contiguous())


class BasicTransformerBlock:
    """Self-attention, attention to the text, a GEGLU feed-forward; each after a LayerNorm and added to its input."""

    def __init__(self, dim: int, heads: int, context: int, device: str | None) -> None:
        self.norm1, self.norm2, self.norm3 = (LayerNorm(dim, device=device) for _ in range(3))
        self.attn1 = Attention(dim, heads, None, False, device)
        self.attn2 = Attention(dim, heads, context, False, device)
        self.ff = FeedForward(dim, device)

    def __call__(self, x: Tensor, context: Tensor) -> Tensor:
        x = (x + self.attn1(self.norm1(x).contiguous())).contiguous()
        x = (x + self.attn2(self.norm2(x).contiguous(), context)).contiguous()
        return (x + self.ff(self.norm3(x).contiguous())).contiguous()


class Transformer2DModel:
    """GroupNorm and a projection in (a 1x1 conv, or a Linear with use_linear_projection), the pixels as a sequence
    through the transformer blocks, a projection out, plus the input."""

    def __init__(self, cfg: UNetConfig, channels: int, heads: int, layers: int, device: str | None) -> None:
        self.linear = cfg.use_linear_projection
        self.norm = GroupNorm(cfg.norm_num_groups, channels, eps=1e-6, device=device)
        project: Callable[[], Any] = (
            (lambda: Linear(channels, channels, device=device))
            if self.linear
            else (lambda: Conv2d(channels, channels, 1, device=device))
        )
        self.proj_in = project()
        self.transformer_blocks = [
            BasicTransformerBlock(channels, heads, cfg.cross_attention_dim, device) for _ in range(layers)
        ]
        self.proj_out = project()

    def __call__(self, x: Tensor, context: Tensor) -> Tensor:
        b, c, h, w = x.shape
        t = self.norm(x)
        if self.linear:
            t = self.proj_in(t.reshape(b, c, h * w).transpose(1, 2))
        else:
            t = self.proj_in(t).reshape(b, c, h * w).transpose(1, 2)
        t = t.contiguous()
        for block in self.transformer_blocks:
            t = block(t, context)
        if self.linear:
            t = self.proj_out(t).transpose(1, 2).reshape(b, c, h, w)
        else:
            t = self.proj_out(t.transpose(1, 2).reshape(b, c, h, w).contiguous())
        return (t + x).contiguous()


# ---------------------------------------------------------------- the UNet


class DownBlock:
    """Resnets (each followed by a transformer where the block attends), then a stride-2 conv unless it is the last;
    every stage's output is kept for the up blocks' skips."""

    def __init__(self, cfg: UNetConfig, i: int, cin: int, temb: int, device: str | None) -> None:
        cout, last = cfg.block_out_channels[i], i == len(cfg.block_out_channels) - 1
        groups, eps = cfg.norm_num_groups, cfg.norm_eps
        self.resnets = [
            ResnetBlock2D(cin if j == 0 else cout, cout, temb, groups, eps, device) for j in range(cfg.layers_per_block)
        ]
        attends = cfg.down_block_types[i] == "CrossAttnDownBlock2D"
        heads, layers = cfg.heads[i], cfg.transformer_layers[i]
        self.attentions = (
            [Transformer2DModel(cfg, cout, heads, layers, device) for _ in self.resnets] if attends else None
        )
        self.downsamplers = None if last else [Downsample2D(cout, device)]

    def __call__(self, x: Tensor, temb: Tensor, context: Tensor, skips: list[Tensor]) -> Tensor:
        for j, resnet in enumerate(self.resnets):
            x = resnet(x, temb)
            if self.attentions is not None:
                x = self.attentions[j](x, context)
            skips.append(x)
        if self.downsamplers is not None:
            x = self.downsamplers[0](x)
            skips.append(x)
        return x


class MidBlock:
    def __init__(self, cfg: UNetConfig, temb: int, device: str | None) -> None:
        c = cfg.block_out_channels[-1]
        self.resnets = [ResnetBlock2D(c, c, temb, cfg.norm_num_groups, cfg.norm_eps, device) for _ in range(2)]
        self.attentions = [Transformer2DModel(cfg, c, cfg.heads[-1], cfg.transformer_layers[-1], device)]

    def __call__(self, x: Tensor, temb: Tensor, context: Tensor) -> Tensor:
        return self.resnets[1](self.attentions[0](self.resnets[0](x, temb), context), temb)


class UpBlock:
    """layers_per_block + 1 resnets, each on the input joined (along channels) with a down stage's output, the
    latest first; a transformer after each where the block attends; a 2x upsample unless it is the last."""

    def __init__(self, cfg: UNetConfig, i: int, prev: int, temb: int, device: str | None) -> None:
        channels = cfg.block_out_channels[::-1]
        cout, cin = channels[i], channels[min(i + 1, len(channels) - 1)]
        n = cfg.layers_per_block + 1
        groups, eps = cfg.norm_num_groups, cfg.norm_eps
        self.resnets = [
            ResnetBlock2D((prev if j == 0 else cout) + (cin if j == n - 1 else cout), cout, temb, groups, eps, device)
            for j in range(n)
        ]
        attends = cfg.up_block_types[i] == "CrossAttnUpBlock2D"
        heads, layers = cfg.heads[::-1][i], cfg.transformer_layers[::-1][i]
        self.attentions = (
            [Transformer2DModel(cfg, cout, heads, layers, device) for _ in self.resnets] if attends else None
        )
        self.upsamplers = None if i == len(channels) - 1 else [Upsample2D(cout, device)]

    def __call__(self, x: Tensor, temb: Tensor, context: Tensor, skips: list[Tensor]) -> Tensor:
        for j, resnet in enumerate(self.resnets):
            x = resnet(x.cat(skips.pop(), dim=1), temb)
            if self.attentions is not None:
                x = self.attentions[j](x, context)
        return x if self.upsamplers is None else self.upsamplers[0](x)


class TimestepEmbedding:
    def __init__(self, cin: int, dim: int, device: str | None) -> None:
        self.linear_1 = Linear(cin, dim, device=device)
        self.linear_2 = Linear(dim, dim, device=device)

    def __call__(self, x: Tensor) -> Tensor:
        return self.linear_2(_silu(self.linear_1(x)))


def timestep_features(t: np.ndarray, dim: int, flip_sin_to_cos: bool, shift: float) -> np.ndarray:
    """(batch, dim): the sines and cosines of each timestep at dim / 2 frequencies from 1 down to 1/10000, as
    diffusers' Timesteps makes them (cosines first with flip_sin_to_cos)."""
    half = dim // 2
    freqs = np.exp(-math.log(10000) * np.arange(half, dtype=np.float32) / (half - shift)).astype(np.float32)
    angles = t.astype(np.float32)[:, None] * freqs[None]
    sin, cos = np.sin(angles), np.cos(angles)
    out = np.concatenate([cos, sin] if flip_sin_to_cos else [sin, cos], axis=-1)
    return np.pad(out, ((0, 0), (0, dim % 2))).astype(np.float32)


class UNet2DConditionModel:
    """diffusers' UNet2DConditionModel for Stable Diffusion 1.x and 2.x: the noise in a latent (batch, 4, h, w) at a
    timestep, given the text's hidden states (batch, tokens, cross_attention_dim)."""

    def __init__(self, cfg: UNetConfig, device: str | None = None) -> None:
        self.cfg, self.device = cfg, device
        channels = cfg.block_out_channels
        temb = channels[0] * 4
        self.conv_in = Conv2d(cfg.in_channels, channels[0], 3, padding=1, device=device)
        self.time_embedding = TimestepEmbedding(channels[0], temb, device)
        self.down_blocks = [
            DownBlock(cfg, i, channels[i - 1] if i else channels[0], temb, device) for i in range(len(channels))
        ]
        self.mid_block = MidBlock(cfg, temb, device)
        reverse = channels[::-1]
        self.up_blocks = [UpBlock(cfg, i, reverse[max(i - 1, 0)], temb, device) for i in range(len(channels))]
        self.conv_norm_out = GroupNorm(cfg.norm_num_groups, channels[0], eps=cfg.norm_eps, device=device)
        self.conv_out = Conv2d(channels[0], cfg.out_channels, 3, padding=1, device=device)

    def __call__(self, sample: Tensor, timestep: float | Sequence[float] | np.ndarray, context: Tensor) -> Tensor:
        cfg = self.cfg
        sample = sample if isinstance(sample, Tensor) else Tensor(np.asarray(sample, np.float32), device=self.device)
        batch = sample.shape[0]
        levels = 2 ** (len(cfg.block_out_channels) - 1)
        if sample.ndim != 4 or sample.shape[1] != cfg.in_channels or any(s % levels for s in sample.shape[2:]):
            raise ValueError(
                f"UNet: sample must be (batch, {cfg.in_channels}, height, width) with height and width multiples of "
                f"{levels}, got {sample.shape}"
            )
        if context.ndim != 3 or context.shape[0] != batch or context.shape[2] != cfg.cross_attention_dim:
            raise ValueError(
                f"UNet: the text's hidden states must be ({batch}, tokens, {cfg.cross_attention_dim}), got "
                f"{context.shape}"
            )
        t = np.broadcast_to(np.asarray(timestep, dtype=np.float32).reshape(-1), (batch,))
        features = timestep_features(t, cfg.block_out_channels[0], cfg.flip_sin_to_cos, cfg.freq_shift)
        dtype = self.conv_in.weight.dtype
        temb = self.time_embedding(Tensor(features, device=sample.device).cast(dtype)).contiguous()
        x = self.conv_in(sample.cast(dtype)).contiguous()
        context = context.cast(dtype)
        skips = [x]
        for block in self.down_blocks:
            x = block(x, temb, context, skips)
        x = self.mid_block(x, temb, context)
        for block in self.up_blocks:
            x = block(x, temb, context, skips)
        return self.conv_out(_silu(self.conv_norm_out(x)))


# ---------------------------------------------------------------- the VAE's decoder


@dataclass(frozen=True)
class VAEConfig:
    in_channels: int = 3
    out_channels: int = 3
    block_out_channels: tuple[int, ...] = (128, 256, 512, 512)
    layers_per_block: int = 2
    latent_channels: int = 4
    norm_num_groups: int = 32
    scaling_factor: float = 0.18215
    use_post_quant_conv: bool = True

    @staticmethod
    def from_diffusers(cfg: dict[str, Any]) -> VAEConfig:
        """From a diffusers vae/config.json (AutoencoderKL)."""
        up = cfg.get("up_block_types", ["UpDecoderBlock2D"])
        if any(t != "UpDecoderBlock2D" for t in up) or cfg.get("act_fn", "silu") != "silu":
            raise ValueError(f"VAE: up blocks {up} with act_fn {cfg.get('act_fn')!r}: only UpDecoderBlock2D and silu")
        if not cfg.get("mid_block_add_attention", True):
            raise ValueError("VAE: mid_block_add_attention=False is not supported (Stable Diffusion's VAE attends)")
        return VAEConfig(
            in_channels=int(cfg.get("in_channels", 3)),
            out_channels=int(cfg.get("out_channels", 3)),
            block_out_channels=tuple(int(c) for c in cfg["block_out_channels"]),
            layers_per_block=int(cfg.get("layers_per_block", 2)),
            latent_channels=int(cfg.get("latent_channels", 4)),
            norm_num_groups=int(cfg.get("norm_num_groups", 32)),
            scaling_factor=float(cfg.get("scaling_factor", 0.18215)),
            use_post_quant_conv=bool(cfg.get("use_post_quant_conv", True)),
        )


class VAEAttention(Attention):
    """One head over all pixels, with diffusers' names: group_norm, then to_q, to_k, to_v and to_out[0], plus the
    input."""

    def __init__(self, channels: int, groups: int, device: str | None) -> None:
        super().__init__(channels, 1, None, True, device)
        self.group_norm = GroupNorm(groups, channels, eps=1e-6, device=device)

    def __call__(self, x: Tensor, context: Tensor | None = None) -> Tensor:
        b, c, h, w = x.shape
        seq = self.group_norm(x).reshape(b, c, h * w).transpose(1, 2).contiguous()
        out = super().__call__(seq).transpose(1, 2).reshape(b, c, h, w)
        return (out + x).contiguous()


class Decoder:
    def __init__(self, cfg: VAEConfig, device: str | None) -> None:
        channels, groups = cfg.block_out_channels, cfg.norm_num_groups
        top = channels[-1]
        self.conv_in = Conv2d(cfg.latent_channels, top, 3, padding=1, device=device)
        self.mid_block = _VAEMid(top, groups, device)
        reverse = channels[::-1]
        self.up_blocks = [
            _UpDecoderBlock(
                reverse[max(i - 1, 0)], reverse[i], cfg.layers_per_block + 1, groups, i == len(reverse) - 1, device
            )
            for i in range(len(reverse))
        ]
        self.conv_norm_out = GroupNorm(groups, channels[0], eps=1e-6, device=device)
        self.conv_out = Conv2d(channels[0], cfg.out_channels, 3, padding=1, device=device)

    def __call__(self, z: Tensor) -> Tensor:
        x = self.mid_block(self.conv_in(z).contiguous())
        for block in self.up_blocks:
            x = block(x)
        return self.conv_out(_silu(self.conv_norm_out(x)))


class _VAEMid:
    def __init__(self, channels: int, groups: int, device: str | None) -> None:
        self.resnets = [ResnetBlock2D(channels, channels, None, groups, 1e-6, device) for _ in range(2)]
        self.attentions = [VAEAttention(channels, groups, device)]

    def __call__(self, x: Tensor) -> Tensor:
        return self.resnets[1](self.attentions[0](self.resnets[0](x)))


class _UpDecoderBlock:
    def __init__(self, cin: int, cout: int, n: int, groups: int, last: bool, device: str | None) -> None:
        self.resnets = [ResnetBlock2D(cin if j == 0 else cout, cout, None, groups, 1e-6, device) for j in range(n)]
        self.upsamplers = None if last else [Upsample2D(cout, device)]

    def __call__(self, x: Tensor) -> Tensor:
        for resnet in self.resnets:
            x = resnet(x)
        return x if self.upsamplers is None else self.upsamplers[0](x)


class AutoencoderKL:
    """The decoding half of diffusers' AutoencoderKL: latents (batch, latent_channels, h, w) to pixels
    (batch, out_channels, 8h, 8w for four blocks), as `vae.decode(latents).sample` gives them."""

    def __init__(self, cfg: VAEConfig, device: str | None = None) -> None:
        self.cfg, self.device = cfg, device
        c = cfg.latent_channels
        self.post_quant_conv = Conv2d(c, c, 1, device=device) if cfg.use_post_quant_conv else None
        self.decoder = Decoder(cfg, device)

    def decode(self, latents: Tensor) -> Tensor:
        if latents.ndim != 4 or latents.shape[1] != self.cfg.latent_channels:
            raise ValueError(
                f"VAE: latents must be (batch, {self.cfg.latent_channels}, height, width), got {latents.shape}"
            )
        z = latents.cast(self.decoder.conv_in.weight.dtype)
        z = z if self.post_quant_conv is None else self.post_quant_conv(z)
        return self.decoder(z.contiguous())


# ---------------------------------------------------------------- schedulers


def _alphas_cumprod(cfg: dict[str, Any]) -> np.ndarray:
    """The products of (1 - beta) over the training steps, float32 as diffusers computes them."""
    n, start, end = int(cfg.get("num_train_timesteps", 1000)), cfg.get("beta_start", 0.0001), cfg.get("beta_end", 0.02)
    schedule = cfg.get("beta_schedule", "linear")
    if cfg.get("trained_betas") is not None:
        betas = np.asarray(cfg["trained_betas"], dtype=np.float32)
    elif schedule == "linear":
        betas = np.linspace(start, end, n, dtype=np.float32)
    elif schedule == "scaled_linear":
        betas = np.linspace(start**0.5, end**0.5, n, dtype=np.float32) ** 2
    else:
        raise ValueError(f"scheduler: beta_schedule {schedule!r} is not supported (linear, scaled_linear)")
    if cfg.get("rescale_betas_zero_snr"):
        raise ValueError("scheduler: rescale_betas_zero_snr is not supported")
    return np.cumprod(1.0 - betas.astype(np.float32), dtype=np.float32)


def _per_step(like: Tensor, *values: float) -> list[Tensor]:
    """A step's numbers as one-element tensors uploaded to like's device, not constants in the graph: every step's
    graph is then the same, its schedule and kernels made once (with constants each step was scheduled anew, the
    whole UNet with it: 11 s a step for the tests' small one on a 2-core CPU)."""
    return [Tensor(np.array([v], np.float32), device=like.device).reshape(()) for v in values]


def _spaced(cfg: dict[str, Any], steps: int, integers: bool) -> np.ndarray:
    """The timesteps of `steps` inference steps, from the noisiest, by the config's timestep_spacing."""
    n, spacing = int(cfg.get("num_train_timesteps", 1000)), cfg.get("timestep_spacing", "leading")
    if not 0 < steps <= n:
        raise ValueError(f"scheduler: steps must be 1 to num_train_timesteps={n}, got {steps}")
    if spacing == "linspace":
        t = np.linspace(0, n - 1, steps, dtype=np.float32 if not integers else np.float64)[::-1]
        return t.round().astype(np.int64) if integers else t.copy()
    if spacing == "leading":
        return (np.arange(steps) * (n // steps)).round()[::-1].astype(np.int64) + int(cfg.get("steps_offset", 0))
    if spacing == "trailing":
        return np.round(np.arange(n, 0, -n / steps)).astype(np.int64) - 1
    raise ValueError(f"scheduler: timestep_spacing {spacing!r} is not supported (linspace, leading, trailing)")


class DDIMScheduler:
    """diffusers' DDIMScheduler with eta 0 (deterministic): each step estimates the clean latent from the predicted
    noise and moves to the previous timestep's noise level along it."""

    def __init__(self, cfg: dict[str, Any] | None = None) -> None:
        self.cfg = cfg = dict(cfg or {})
        self.alphas_cumprod = _alphas_cumprod(cfg)
        self.final = 1.0 if cfg.get("set_alpha_to_one", True) else float(self.alphas_cumprod[0])
        self.prediction = cfg.get("prediction_type", "epsilon")
        if self.prediction not in ("epsilon", "v_prediction", "sample") or cfg.get("thresholding"):
            raise ValueError(f"DDIM: prediction_type {self.prediction!r} / thresholding are not supported")
        self.timesteps = np.zeros(0, dtype=np.int64)
        self.init_noise_sigma = 1.0

    def set_timesteps(self, steps: int) -> None:
        self.steps, self.timesteps = steps, _spaced(self.cfg, steps, integers=True)

    def scale_model_input(self, x: Tensor, i: int) -> Tensor:
        return x

    def step(self, output: Tensor, i: int, x: Tensor) -> Tensor:
        """The latent at step i + 1 from the latent x at step i and the UNet's output there."""
        t = int(self.timesteps[i])
        prev = t - int(self.cfg.get("num_train_timesteps", 1000)) // self.steps
        a = float(self.alphas_cumprod[t])
        a_prev = float(self.alphas_cumprod[prev]) if prev >= 0 else self.final
        root, rest, root_prev, rest_prev = _per_step(x, a**0.5, (1 - a) ** 0.5, a_prev**0.5, (1 - a_prev) ** 0.5)
        if self.prediction == "epsilon":
            x0, eps = (x - output * rest) / root, output
        elif self.prediction == "v_prediction":
            x0, eps = x * root - output * rest, output * root + x * rest
        else:
            x0 = output
            eps = (x - x0 * root) / rest
        if self.cfg.get("clip_sample"):
            bound = float(self.cfg.get("clip_sample_range", 1.0))
            x0 = x0.clip(-bound, bound)
        return (x0 * root_prev + eps * rest_prev).contiguous()


class EulerDiscreteScheduler:
    """diffusers' EulerDiscreteScheduler (no churn): noise levels sigma = sqrt((1 - a) / a) at the timesteps, the
    input scaled by 1 / sqrt(sigma^2 + 1), and one Euler step of the probability-flow ODE to the next sigma."""

    def __init__(self, cfg: dict[str, Any] | None = None) -> None:
        self.cfg = cfg = dict(cfg or {})
        self.alphas_cumprod = _alphas_cumprod(cfg)
        self.prediction = cfg.get("prediction_type", "epsilon")
        for key, want in (("interpolation_type", "linear"), ("use_karras_sigmas", False),
                          ("use_exponential_sigmas", False), ("use_beta_sigmas", False), ("final_sigmas_type", "zero"),
                          ("timestep_type", "discrete")):  # fmt: skip
            if cfg.get(key, want) not in (want, None):
                raise ValueError(f"Euler: {key}={cfg[key]!r} is not supported (only {want!r})")
        if self.prediction not in ("epsilon", "v_prediction"):
            raise ValueError(f"Euler: prediction_type {self.prediction!r} is not supported (epsilon, v_prediction)")
        self.timesteps = np.zeros(0, dtype=np.float32)
        self.sigmas = np.zeros(1, dtype=np.float32)
        self.init_noise_sigma = 1.0

    def set_timesteps(self, steps: int) -> None:
        t = _spaced({"timestep_spacing": "linspace", **self.cfg}, steps, integers=False).astype(np.float32)
        levels = ((1 - self.alphas_cumprod) / self.alphas_cumprod) ** 0.5
        sigmas = np.interp(t, np.arange(len(levels)), levels)
        self.timesteps, self.sigmas = t, np.concatenate([sigmas, [0.0]]).astype(np.float32)
        top = float(self.sigmas.max())
        spacing = self.cfg.get("timestep_spacing", "linspace")
        self.init_noise_sigma = top if spacing in ("linspace", "trailing") else (top**2 + 1) ** 0.5

    def scale_model_input(self, x: Tensor, i: int) -> Tensor:
        (norm,) = _per_step(x, float((self.sigmas[i] ** 2 + 1) ** 0.5))
        return x / norm

    def step(self, output: Tensor, i: int, x: Tensor) -> Tensor:
        sigma, following = float(self.sigmas[i]), float(self.sigmas[i + 1])
        level, move, out_scale, in_scale = _per_step(
            x, sigma, following - sigma, -sigma / (sigma**2 + 1) ** 0.5, sigma**2 + 1
        )
        if self.prediction == "epsilon":
            x0 = x - output * level
        else:
            x0 = output * out_scale + x / in_scale
        return (x + (x - x0) / level * move).contiguous()


SCHEDULERS = {"DDIMScheduler": DDIMScheduler, "EulerDiscreteScheduler": EulerDiscreteScheduler}


# ---------------------------------------------------------------- the tokenizer and the pipeline

# CLIP's split of lowercased text before byte-pair encoding: the two special tokens, English contractions, runs of
# letters, single digits, runs of other non-space characters
_CLIP_SPLIT = r"<\|startoftext\|>|<\|endoftext\|>|'s|'t|'re|'ve|'m|'ll|'d|[\p{L}]+|[\p{N}]|[^\s\p{L}\p{N}]+"


class CLIPTokenizer:
    """CLIP's byte-pair tokenizer from a tokenizer folder (vocab.json and merges.txt, or tokenizer.json), through
    Hugging Face's `tokenizers`: each prompt lowercased, split, encoded, between the start and end tokens, and padded
    (or cut) to model_max_length, as CLIPTokenizer(..., padding="max_length", truncation=True) gives the ids."""

    def __init__(self, folder: Path) -> None:
        try:
            from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers
        except ImportError:
            raise ImportError(
                "the CLIP tokenizer uses the `tokenizers` library: pip install 'tiny-tensor[llm]'"
            ) from None
        config = folder / "tokenizer_config.json"
        settings = read_json(config) if config.is_file() else {}
        vocab, merges = folder / "vocab.json", folder / "merges.txt"
        if (folder / "tokenizer.json").is_file():
            self.tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
            self.tokenizer.no_padding(), self.tokenizer.no_truncation()
            self.tokenizer.post_processor = None
        elif vocab.is_file() and merges.is_file():
            bpe = models.BPE.from_file(str(vocab), str(merges), end_of_word_suffix="</w>", unk_token="<|endoftext|>")
            tok = Tokenizer(bpe)
            tok.normalizer = normalizers.Sequence(
                [normalizers.NFC(), normalizers.Replace(Regex(r"\s+"), " "), normalizers.Lowercase()]
            )
            tok.pre_tokenizer = pre_tokenizers.Sequence(
                [
                    pre_tokenizers.Split(Regex(_CLIP_SPLIT), behavior="removed", invert=True),
                    pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
                ]
            )
            tok.decoder = decoders.ByteLevel()
            self.tokenizer = tok
        else:
            raise FileNotFoundError(f"{folder} has neither tokenizer.json nor vocab.json and merges.txt")
        ids = self.tokenizer.get_vocab()

        def token(key: str, default: str) -> int:
            name = settings.get(key) or default
            name = name["content"] if isinstance(name, dict) else name
            if name not in ids:
                raise ValueError(f"{folder}: the {key} {name!r} is not in the vocabulary")
            return ids[name]

        self.bos, self.eos = token("bos_token", "<|startoftext|>"), token("eos_token", "<|endoftext|>")
        self.pad = token("pad_token", "<|endoftext|>")
        self.length = int(settings.get("model_max_length", 77))

    def __call__(self, prompts: Sequence[str]) -> np.ndarray:
        """(len(prompts), model_max_length) token ids."""
        out = np.full((len(prompts), self.length), self.pad, dtype=np.int64)
        for row, prompt in enumerate(prompts):
            ids = [self.bos, *self.tokenizer.encode(prompt, add_special_tokens=False).ids][: self.length - 1]
            ids.append(self.eos)
            out[row, : len(ids)] = ids
        return out


@dataclass
class StableDiffusion:
    """The text encoder, the tokenizer (a function from prompts to ids), the UNet, the VAE and a scheduler, as
    diffusers' StableDiffusionPipeline joins them."""

    text_encoder: clip.CLIPTextModel
    tokenizer: Callable[[Sequence[str]], np.ndarray]
    unet: UNet2DConditionModel
    vae: AutoencoderKL
    scheduler: DDIMScheduler | EulerDiscreteScheduler
    random_weights: bool = False
    notes: list[str] = field(default_factory=list)

    def encode(self, prompts: Sequence[str]) -> Tensor:
        """The text's hidden states (len(prompts), tokens, hidden) that the UNet attends to."""
        ids = Tensor(self.tokenizer(prompts), device=self.unet.device)
        return self.text_encoder(ids).last_hidden_state

    def __call__(
        self,
        prompt: str | Sequence[str],
        negative_prompt: str | Sequence[str] = "",
        steps: int = 50,
        guidance_scale: float = 7.5,
        height: int | None = None,
        width: int | None = None,
        seed: int | None = None,
        latents: Tensor | np.ndarray | None = None,
        progress: Callable[[int, int], None] | None = None,
    ) -> np.ndarray:
        """Images (batch, height, width, 3), floats in [0, 1], of the prompts after `steps` denoising steps with
        classifier-free guidance (guidance_scale > 1: the negative prompt's prediction pushed away from). The start
        is Gaussian noise (of `seed`), or `latents` (batch, 4, height / 8, width / 8) as diffusers takes them."""
        prompts = [prompt] if isinstance(prompt, str) else list(prompt)
        negatives = [negative_prompt] * len(prompts) if isinstance(negative_prompt, str) else list(negative_prompt)
        if not prompts or len(negatives) != len(prompts):
            raise ValueError(f"{len(prompts)} prompts and {len(negatives)} negative prompts: give one of each")
        scale = 2 ** (len(self.vae.cfg.block_out_channels) - 1)
        height = height or self.unet.cfg.sample_size * scale
        width = width or self.unet.cfg.sample_size * scale
        levels = scale * 2 ** (len(self.unet.cfg.block_out_channels) - 1)
        if height % levels or width % levels:
            raise ValueError(f"height and width must be multiples of {levels}, got {height} x {width}")
        shape = (len(prompts), self.unet.cfg.in_channels, height // scale, width // scale)
        if latents is None:
            latents = np.random.default_rng(seed).standard_normal(shape, dtype=np.float32)
        x = latents if isinstance(latents, Tensor) else Tensor(np.asarray(latents, np.float32), device=self.unet.device)
        if tuple(x.shape) != shape:
            raise ValueError(f"latents must be {shape} for {len(prompts)} prompts at {height} x {width}, got {x.shape}")
        guided = guidance_scale > 1
        context = self.encode([*negatives, *prompts] if guided else prompts).contiguous().realize()
        self.scheduler.set_timesteps(steps)
        x = (x * float(self.scheduler.init_noise_sigma)).contiguous().realize()
        for i, t in enumerate(self.scheduler.timesteps):
            model_in = self.scheduler.scale_model_input(x.cat(x, dim=0) if guided else x, i)
            noise = self.unet(model_in, float(t), context)
            if guided:
                uncond, text = noise.chunk(2, dim=0)
                noise = uncond + (text - uncond) * guidance_scale
            x = self.scheduler.step(noise, i, x).realize()
            if progress is not None:
                progress(i + 1, steps)
        image = self.vae.decode(x / self.vae.cfg.scaling_factor)
        return ((image.cast(dtypes.float32) / 2 + 0.5).clip(0, 1)).permute(0, 2, 3, 1).numpy()


def _weights(folder: Path, device: str | None) -> dict[str, Tensor]:
    for name in ("diffusion_pytorch_model.safetensors", "model.safetensors"):
        if (folder / name).is_file():
            return safe_load(folder / name, device)
    raise FileNotFoundError(f"{folder} has no diffusion_pytorch_model.safetensors (.bin checkpoints are not read)")


def load_unet(
    path: str | os.PathLike, device: str | None = None, dtype: DType | str = dtypes.float32
) -> UNet2DConditionModel:
    """The UNet of a diffusers unet/ folder (config.json and diffusion_pytorch_model.safetensors), read lazily.
    dtype: what it computes in, whatever the file holds (float32 by default: a float16 file, diffusers' "fp16"
    variant, is widened; dtypes.float16 computes in half)."""
    dtype = compute_dtype(dtype, "UNet")
    folder = Path(path)
    cfg = UNetConfig.from_diffusers(read_json(folder / "config.json"))
    with skip_init():
        model = UNet2DConditionModel(cfg, device)
    load_weights(model, _weights(folder, device), folder, base="unet", dtype=dtype)
    return model


def load_vae(path: str | os.PathLike, device: str | None = None, dtype: DType | str = dtypes.float32) -> AutoencoderKL:
    """The decoder of a diffusers vae/ folder (the encoder's weights are left unread), computing in dtype."""
    dtype = compute_dtype(dtype, "VAE")
    folder = Path(path)
    cfg = VAEConfig.from_diffusers(read_json(folder / "config.json"))
    with skip_init():
        model = AutoencoderKL(cfg, device)
    weights = {k: t for k, t in _weights(folder, device).items() if not k.startswith(("encoder.", "quant_conv."))}
    load_weights(model, weights, folder, base="vae", dtype=dtype)
    return model


def load(
    path: str | os.PathLike,
    device: str | None = None,
    scheduler: str | None = None,
    dtype: DType | str = dtypes.float32,
) -> StableDiffusion:
    """The pipeline of a diffusers folder (model_index.json, text_encoder/, tokenizer/, unet/, vae/, scheduler/).
    scheduler: "DDIMScheduler" or "EulerDiscreteScheduler" with the folder's scheduler config (its own class where
    that is one of them, else DDIM; the settings the chosen class does not have are left, as its from_pretrained
    leaves them). dtype: what the text encoder, the UNet and the VAE compute in (as torch_dtype= in diffusers)."""
    dtype = compute_dtype(dtype, "Stable Diffusion")
    folder = Path(path)
    if not (folder / "model_index.json").is_file():
        raise FileNotFoundError(
            f"expected a diffusers pipeline folder (model_index.json, unet/, vae/, ...); {folder} has none"
        )
    index = read_json(folder / "model_index.json")
    settings = read_json(folder / "scheduler" / "scheduler_config.json")
    name = scheduler or (settings.get("_class_name") if settings.get("_class_name") in SCHEDULERS else "DDIMScheduler")
    if name not in SCHEDULERS:
        raise ValueError(f"scheduler {name!r} is not one of {', '.join(SCHEDULERS)}")
    del index  # (its entries name the components' classes; the folders are what is read)
    return StableDiffusion(
        text_encoder=clip.load(folder / "text_encoder", device, dtype),
        tokenizer=CLIPTokenizer(folder / "tokenizer"),
        unet=load_unet(folder / "unet", device, dtype),
        vae=load_vae(folder / "vae", device, dtype),
        scheduler=SCHEDULERS[name](settings),
    )
