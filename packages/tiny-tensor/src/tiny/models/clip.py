"""CLIP's text encoder, as Hugging Face's CLIPTextModel computes it and names its weights (`text_model.*`): token and
position embeddings summed, then layers of causal self-attention and a feed-forward, each normalized before
(pre-norm) and added to its input; a final LayerNorm. The pooled output is the state at each sequence's end token.
Stable Diffusion conditions its UNet on the last hidden state (tiny.models.stable_diffusion).

The attention mask is Hugging Face's: (batch, keys), 1 for a token to attend to and 0 for padding, on top of the
causal mask (a query sees itself and the keys before it). The model computes in its weights' dtype: float32, or
float16 / bfloat16 with load(..., dtype=).

>>> from tiny.models import clip  # doctest: +SKIP
>>> model = clip.load("path/to/text_encoder")  # doctest: +SKIP
>>> model([[49406, 320, 1929, 49407]]).last_hidden_state.shape  # doctest: +SKIP
(1, 4, 768)
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import numpy as np

from tiny.models.hf import LOWEST, activation, compute_dtype, load_weights, read_config, read_weights
from tiny.models.rows import embed_rows
from tiny.nn import Embedding, LayerNorm, Linear, skip_init
from tiny.tensor import DType, Tensor, dtypes

__all__ = ["CLIPTextConfig", "CLIPTextModel", "CLIPTextOutput", "load"]

ARCHITECTURES = ("CLIPTextModel",)


@dataclass(frozen=True)
class CLIPTextConfig:
    vocab_size: int = 49408
    hidden_size: int = 512
    intermediate_size: int = 2048
    num_hidden_layers: int = 12
    num_attention_heads: int = 8
    max_position_embeddings: int = 77
    hidden_act: str = "quick_gelu"
    layer_norm_eps: float = 1e-5
    eos_token_id: int = 49407

    @staticmethod
    def from_hf(cfg: dict[str, Any]) -> CLIPTextConfig:
        """From a Hugging Face config.json of model_type clip_text_model (or a clip model's text_config)."""
        cfg = cfg.get("text_config") or cfg
        hidden, heads = int(cfg.get("hidden_size", 512)), int(cfg.get("num_attention_heads", 8))
        if hidden % heads:
            raise ValueError(f"CLIP: hidden_size {hidden} is not a multiple of num_attention_heads {heads}")
        act = cfg.get("hidden_act") or "quick_gelu"
        activation(act)  # (an unknown one is an error now, not at the first call)
        return CLIPTextConfig(
            vocab_size=int(cfg.get("vocab_size", 49408)),
            hidden_size=hidden,
            intermediate_size=int(cfg.get("intermediate_size", 2048)),
            num_hidden_layers=int(cfg.get("num_hidden_layers", 12)),
            num_attention_heads=heads,
            max_position_embeddings=int(cfg.get("max_position_embeddings", 77)),
            hidden_act=act,
            layer_norm_eps=float(cfg.get("layer_norm_eps", 1e-5)),
            eos_token_id=int(cfg.get("eos_token_id", 49407)),
        )


@dataclass(frozen=True)
class CLIPTextOutput:
    """What the Hugging Face model returns: the hidden states after the final LayerNorm (batch, length, hidden), the
    state of each sequence's end token (batch, hidden), and (with output_hidden_states) the input of every layer and
    the last layer's output before the final LayerNorm, as Hugging Face lists them."""

    last_hidden_state: Tensor
    pooler_output: Tensor
    hidden_states: tuple[Tensor, ...] | None = None


class Embeddings:
    def __init__(self, cfg: CLIPTextConfig, device: str | None) -> None:
        self.token_embedding = Embedding(cfg.vocab_size, cfg.hidden_size, device=device)
        self.position_embedding = Embedding(cfg.max_position_embeddings, cfg.hidden_size, device=device)

    def __call__(self, ids: Tensor) -> Tensor:
        length = ids.shape[1]
        return embed_rows(self.token_embedding, ids) + self.position_embedding.weight[:length]


class Attention:
    def __init__(self, cfg: CLIPTextConfig, device: str | None) -> None:
        self.heads = cfg.num_attention_heads
        self.q_proj, self.k_proj, self.v_proj, self.out_proj = (
            Linear(cfg.hidden_size, cfg.hidden_size, device=device) for _ in range(4)
        )

    def __call__(self, x: Tensor, mask: Tensor) -> Tensor:
        batch, length, hidden = x.shape
        q, k, v = (
            p(x).reshape(batch, length, self.heads, -1).transpose(1, 2) for p in (self.q_proj, self.k_proj, self.v_proj)
        )
        out = q.scaled_dot_product_attention(k, v, attn_mask=mask)
        return self.out_proj(out.transpose(1, 2).reshape(batch, length, hidden))


class MLP:
    def __init__(self, cfg: CLIPTextConfig, device: str | None) -> None:
        self.fc1 = Linear(cfg.hidden_size, cfg.intermediate_size, device=device)
        self.fc2 = Linear(cfg.intermediate_size, cfg.hidden_size, device=device)
        self.act = activation(cfg.hidden_act)

    def __call__(self, x: Tensor) -> Tensor:
        return self.fc2(self.act(self.fc1(x)).contiguous())


class EncoderLayer:
    def __init__(self, cfg: CLIPTextConfig, device: str | None) -> None:
        self.layer_norm1 = LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps, device=device)
        self.self_attn = Attention(cfg, device)
        self.layer_norm2 = LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps, device=device)
        self.mlp = MLP(cfg, device)

    def __call__(self, x: Tensor, mask: Tensor) -> Tensor:
        h = x + self.self_attn(self.layer_norm1(x).contiguous(), mask)
        return (h + self.mlp(self.layer_norm2(h).contiguous())).contiguous()


class Encoder:
    def __init__(self, cfg: CLIPTextConfig, device: str | None) -> None:
        self.layers = [EncoderLayer(cfg, device) for _ in range(cfg.num_hidden_layers)]


class TextTransformer:
    def __init__(self, cfg: CLIPTextConfig, device: str | None) -> None:
        self.cfg = cfg
        self.embeddings = Embeddings(cfg, device)
        self.encoder = Encoder(cfg, device)
        self.final_layer_norm = LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps, device=device)


class CLIPTextModel:
    """The text transformer under `text_model` (the names of Hugging Face's CLIPTextModel)."""

    def __init__(self, cfg: CLIPTextConfig, device: str | None = None) -> None:
        self.cfg, self.device = cfg, device
        self.text_model = TextTransformer(cfg, device)

    def __call__(
        self, input_ids: Tensor | Any, attention_mask: Tensor | Any | None = None, output_hidden_states: bool = False
    ) -> CLIPTextOutput:
        """The hidden states of token ids (batch, length), length at most max_position_embeddings."""
        ids = _ids(input_ids, self.cfg, self.device)
        batch, length = ids.shape
        keep = Tensor.ones(length, length, dtype="bool", device=self.device).tril().reshape(1, 1, length, length)
        if attention_mask is not None:
            keys = _mask(attention_mask, (batch, length), self.device)
            keep = keep * keys.reshape(batch, 1, 1, length)
        model = self.text_model
        mask = keep.where(0.0, LOWEST[model.final_layer_norm.weight.dtype]).cast(model.final_layer_norm.weight.dtype)
        x = model.embeddings(ids).contiguous()
        states = [x]
        for layer in model.encoder.layers:
            x = layer(x, mask)
            states.append(x)
        out = model.final_layer_norm(x).contiguous()
        return CLIPTextOutput(out, self._pooled(out, ids), tuple(states) if output_hidden_states else None)

    def _pooled(self, out: Tensor, ids: Tensor) -> Tensor:
        """Each sequence's state at its end token: where the config's eos_token_id is the old 2, the largest id (as
        Hugging Face keeps for those checkpoints), else the first eos_token_id (the first position where none)."""
        values = ids.numpy()
        if self.cfg.eos_token_id == 2:
            at = values.argmax(-1)
        else:
            at = (values == self.cfg.eos_token_id).argmax(-1)
        picks = Tensor(np.eye(out.shape[1], dtype=np.float32)[at], device=out.device).cast(out.dtype)  # (batch, length)
        return (picks.unsqueeze(1) @ out).squeeze(1)


def _ids(input_ids: Tensor | Any, cfg: CLIPTextConfig, device: str | None) -> Tensor:
    ids = input_ids if isinstance(input_ids, Tensor) else Tensor(np.asarray(input_ids), device=device)
    if ids.dtype.is_float or ids.dtype.is_bool or ids.ndim != 2:
        raise ValueError(f"input_ids must be integer token ids (batch, length), got {ids.dtype.name} {ids.shape}")
    if not 0 < ids.shape[1] <= cfg.max_position_embeddings:
        raise ValueError(
            f"CLIP: a sequence of {ids.shape[1]} tokens; the model takes 1 to {cfg.max_position_embeddings}"
        )
    return ids


def _mask(mask: Tensor | Any, shape: tuple[int, int], device: str | None) -> Tensor:
    values = mask.numpy() if isinstance(mask, Tensor) else np.asarray(mask)
    if values.shape != shape:
        raise ValueError(f"attention_mask must be (batch, length) = {shape}, got {values.shape}")
    return Tensor(values != 0, device=device)


def load(path: str | os.PathLike, device: str | None = None, dtype: DType | str = dtypes.float32) -> CLIPTextModel:
    """The CLIPTextModel a Hugging Face folder holds (a Stable Diffusion checkpoint's text_encoder folder), its
    weights read lazily from model.safetensors into the device. dtype: what the model computes in, whatever the file
    holds (float32 by default: a float16 checkpoint is widened; dtypes.float16 computes in half)."""
    dtype = compute_dtype(dtype, "CLIP")
    folder, raw, _ = read_config(path, ARCHITECTURES)
    with skip_init():  # (the weights come from the files: no random ones first)
        model = CLIPTextModel(CLIPTextConfig.from_hf(raw), device)
    weights = read_weights(folder, device)
    weights.pop("text_model.embeddings.position_ids", None)  # (a buffer older checkpoints saved)
    load_weights(model, weights, folder, base="text_model", dtype=dtype)
    return model
