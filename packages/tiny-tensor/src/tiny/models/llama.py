"""The LLaMA family (Llama 2 and 3, Mistral, Qwen2): a decoder-only transformer with RMSNorm, rotary position
embeddings (with Llama 3's frequency scaling), grouped-query attention and a SwiGLU feed-forward, as Hugging Face's
`config.json` describes it and its `model.safetensors` names its weights.

A model keeps a KV cache per layer on the device; `model(tokens, start_pos)` runs the tokens at positions
start_pos.. (a prompt at 0, then one token at a time), writing their keys and values into the cache and attending
over everything before them. start_pos may be a bound Variable: the decode step is then one set of kernels for
every position (tiny.llm runs it under TinyJit).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tiny.ir.dtypes import DType
from tiny.models.kv_cache import KVCache, causal_mask
from tiny.models.rows import embed_rows
from tiny.nn import Embedding, Linear, RMSNorm
from tiny.tensor import Tensor, dtypes


@dataclass(frozen=True)
class LlamaConfig:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: dict[str, Any] | None = None
    max_position_embeddings: int = 2048
    tie_word_embeddings: bool = False
    attention_bias: bool = False  # Qwen2's q, k and v projections have biases
    mlp_bias: bool = False
    # rotary pairs are adjacent dims (2i, 2i+1) of a head, as llama.cpp orders a LLaMA's query and key rows, rather
    # than the halves (i, i + head_dim/2), as Hugging Face's
    rope_interleaved: bool = False
    architecture: str = "LlamaForCausalLM"
    extra: dict[str, Any] = field(default_factory=dict, compare=False)

    @staticmethod
    def from_hf(cfg: dict[str, Any]) -> LlamaConfig:
        """From a Hugging Face config.json (LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM): transformers
        4's rope_theta and rope_scaling, or transformers 5's rope_parameters, which holds both."""
        arch = (cfg.get("architectures") or ["LlamaForCausalLM"])[0]
        rope = dict(cfg.get("rope_parameters") or {})
        theta = cfg.get("rope_theta", rope.pop("rope_theta", 10000.0))
        scaling = cfg.get("rope_scaling") or (rope if rope.get("rope_type", "default") != "default" else None)
        heads = int(cfg["num_attention_heads"])
        hidden = int(cfg["hidden_size"])
        return LlamaConfig(
            vocab_size=int(cfg["vocab_size"]),
            hidden_size=hidden,
            intermediate_size=int(cfg["intermediate_size"]),
            num_hidden_layers=int(cfg["num_hidden_layers"]),
            num_attention_heads=heads,
            num_key_value_heads=int(cfg.get("num_key_value_heads") or heads),
            head_dim=int(cfg.get("head_dim") or hidden // heads),
            rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
            rope_theta=float(theta),
            rope_scaling=scaling,
            max_position_embeddings=int(cfg.get("max_position_embeddings", 2048)),
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            attention_bias=bool(cfg.get("attention_bias", arch == "Qwen2ForCausalLM")),
            mlp_bias=bool(cfg.get("mlp_bias", False)),
            architecture=arch,
        )


def rope_frequencies(cfg: LlamaConfig, factors: np.ndarray | None = None) -> np.ndarray:
    """The rotary embedding's inverse frequencies (head_dim / 2 of them), in float32 as transformers computes them,
    with Llama 3's scaling where the config asks for it: long wavelengths slowed by `factor`, short ones kept, and
    those between blended smoothly."""
    dim = cfg.head_dim
    inv = (
        1.0 / (np.float32(cfg.rope_theta) ** (np.arange(0, dim, 2, dtype=np.int64).astype(np.float32) / dim))
    ).astype(np.float32)
    if factors is not None:  # (a GGUF file's rope_freqs: each frequency divided by its factor, as llama.cpp does)
        return (inv / factors.astype(np.float32)).astype(np.float32)
    scaling = cfg.rope_scaling or {}
    kind = scaling.get("rope_type", scaling.get("type", "default"))
    if kind == "default":
        return inv
    if kind != "llama3":
        raise ValueError(f"rope scaling {kind!r} is not supported (default and llama3 are)")
    factor, low, high = (float(scaling[k]) for k in ("factor", "low_freq_factor", "high_freq_factor"))
    context = float(scaling["original_max_position_embeddings"])
    wavelen = (2 * math.pi / inv).astype(np.float32)
    slowed = np.where(wavelen > context / low, inv / factor, inv).astype(np.float32)
    blend = ((context / wavelen - low) / (high - low)).astype(np.float32)
    smoothed = ((1 - blend) * slowed / factor + blend * slowed).astype(np.float32)
    medium = ~(wavelen < context / high) & ~(wavelen > context / low)
    return np.where(medium, smoothed, slowed).astype(np.float32)


def _rotate_pairs(x: Tensor) -> Tensor:
    """(x0, x1) -> (-x1, x0) over each adjacent pair of the last dim (llama.cpp's layout of rotary pairs)."""
    pairs = x.reshape(*x.shape[:-1], x.shape[-1] // 2, 2)
    return (-pairs[..., 1:]).cat(pairs[..., :1], dim=-1).reshape(x.shape)


def _rotate_half(x: Tensor) -> Tensor:
    """(x1, x2) -> (-x2, x1) over the two halves of the last dim (Hugging Face's layout of rotary pairs)."""
    half = x.shape[-1] // 2
    return (-x[..., half:]).cat(x[..., :half], dim=-1)


class Attention:
    def __init__(self, cfg: LlamaConfig, max_context: int, device: str | None, cache_dtype: DType | None) -> None:
        self.cfg, self.max_context = cfg, max_context
        hd, heads, kv = cfg.head_dim, cfg.num_attention_heads, cfg.num_key_value_heads
        self.q_proj = Linear(cfg.hidden_size, heads * hd, bias=cfg.attention_bias, device=device)
        self.k_proj = Linear(cfg.hidden_size, kv * hd, bias=cfg.attention_bias, device=device)
        self.v_proj = Linear(cfg.hidden_size, kv * hd, bias=cfg.attention_bias, device=device)
        self.o_proj = Linear(heads * hd, cfg.hidden_size, bias=False, device=device)
        self.cache = KVCache(max_context, cache_dtype)
        self._joined: tuple[Tensor, Tensor | None, tuple[Tensor | None, ...]] | None = None

    def join(self, weight: Tensor, bias: Tensor | None) -> None:
        """Compute the query, key and value projections as one product over `weight` (their weights' rows one after
        another) and `bias`, of which the three Linears' weights and biases are views (a GGUF file's, as
        tiny.llm joins them while loading): one kernel reads them, not three (a 1B model's decode step on 2 AVX2
        cores: its 16 layers' 4-bit query, key and value products 0.24 -> 0.18 ms a layer). While any of the six
        is another tensor than it is now (a weight assigned since), the three products run apart."""
        self._joined = (weight, bias, self._projections())

    def _projections(self) -> tuple[Tensor | None, ...]:
        return tuple(t for p in (self.q_proj, self.k_proj, self.v_proj) for t in (p.weight, p.bias))

    def _qkv(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        joined = self._joined
        if joined is None or any(a is not b for a, b in zip(joined[2], self._projections())):
            return self.q_proj(x), self.k_proj(x), self.v_proj(x)
        sizes = [p.out_features for p in (self.q_proj, self.k_proj, self.v_proj)]
        q, k, v = x.linear(joined[0], joined[1]).split(sizes, dim=-1)
        return q, k, v

    def __call__(self, x: Tensor, start_pos: Any, cos: Tensor, sin: Tensor, mask: Tensor | None) -> Tensor:
        cfg = self.cfg
        batch, length = x.shape[0], x.shape[1]
        hd, heads, kv = cfg.head_dim, cfg.num_attention_heads, cfg.num_key_value_heads
        q, k, v = self._qkv(x)
        q = q.reshape(batch, length, heads, hd).transpose(1, 2)
        k = k.reshape(batch, length, kv, hd).transpose(1, 2)
        v = v.reshape(batch, length, kv, hd).transpose(1, 2)
        rotate = _rotate_pairs if cfg.rope_interleaved else _rotate_half
        q, k = q * cos + rotate(q) * sin, k * cos + rotate(k) * sin
        keys, values = self.cache.update(k, v, start_pos)
        out = q.scaled_dot_product_attention(keys, values, attn_mask=mask, enable_gqa=heads != kv)
        return self.o_proj(out.transpose(1, 2).reshape(batch, length, heads * hd))


class FeedForward:
    def __init__(self, cfg: LlamaConfig, device: str | None) -> None:
        self.gate_proj = Linear(cfg.hidden_size, cfg.intermediate_size, bias=cfg.mlp_bias, device=device)
        self.up_proj = Linear(cfg.hidden_size, cfg.intermediate_size, bias=cfg.mlp_bias, device=device)
        self.down_proj = Linear(cfg.intermediate_size, cfg.hidden_size, bias=cfg.mlp_bias, device=device)

    def __call__(self, x: Tensor) -> Tensor:
        return self.down_proj((self.gate_proj(x).silu() * self.up_proj(x)).contiguous())


class Block:
    def __init__(self, cfg: LlamaConfig, max_context: int, device: str | None, cache_dtype: DType | None) -> None:
        self.self_attn = Attention(cfg, max_context, device, cache_dtype)
        self.mlp = FeedForward(cfg, device)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, device=device)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, device=device)

    def __call__(self, x: Tensor, start_pos: Any, cos: Tensor, sin: Tensor, mask: Tensor | None) -> Tensor:
        # what a matrix product reads is made once (.contiguous()): fused into the product it would be computed
        # again for each of its outputs, the residual stream of every layer before it included
        h = x + self.self_attn(self.input_layernorm(x).contiguous(), start_pos, cos, sin, mask)
        return (h + self.mlp(self.post_attention_layernorm(h).contiguous())).contiguous()


class _Inner:
    """`model.` in the weights' names: the embedding, the blocks and the final norm."""

    def __init__(self, cfg: LlamaConfig, max_context: int, device: str | None, cache_dtype: DType | None) -> None:
        self.embed_tokens = Embedding(cfg.vocab_size, cfg.hidden_size, device=device)
        self.layers = [Block(cfg, max_context, device, cache_dtype) for _ in range(cfg.num_hidden_layers)]
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, device=device)


class Llama:
    """LlamaForCausalLM: `model.*` and `lm_head.weight` as Hugging Face names them (lm_head is the embedding where
    the config ties them). cache_dtype: what the KV cache keeps (None: the activations' float32; KVCache)."""

    def __init__(
        self,
        cfg: LlamaConfig,
        max_context: int | None = None,
        device: str | None = None,
        rope_factors: np.ndarray | None = None,
        cache_dtype: DType | None = None,
    ) -> None:
        self.cfg, self.device = cfg, device
        self.max_context = min(max_context or cfg.max_position_embeddings, cfg.max_position_embeddings)
        self.model = _Inner(cfg, self.max_context, device, cache_dtype)
        self.lm_head = Linear(cfg.hidden_size, cfg.vocab_size, bias=False, device=device)
        positions = np.arange(self.max_context, dtype=np.float32)[:, None]
        angles = positions * rope_frequencies(cfg, rope_factors)[None, :]
        # (positions, head_dim): each frequency for both dims of its pair
        table = np.repeat(angles, 2, axis=1) if cfg.rope_interleaved else np.concatenate([angles, angles], axis=1)
        self.cos = Tensor(np.cos(table).astype(np.float32), device=device).realize()
        self.sin = Tensor(np.sin(table).astype(np.float32), device=device).realize()

    def tie(self) -> None:
        """Share the embedding as the output projection (tie_word_embeddings)."""
        self.lm_head.weight = self.model.embed_tokens.weight

    def __call__(self, tokens: Tensor | Any, start_pos: Any = 0, last: bool = False) -> Tensor:
        """Logits (batch, length, vocab) of the tokens (batch, length) at positions start_pos.. (an int or a bound
        Variable); their keys and values go into the cache. tokens may be one token id as a bound Variable (the
        decode step: batch 1, length 1). last: the logits of the last position alone (batch, 1, vocab)."""
        length = tokens.shape[1] if isinstance(tokens, Tensor) else 1
        if isinstance(start_pos, int) and start_pos + length > self.max_context:
            raise ValueError(
                f"positions {start_pos}..{start_pos + length - 1} are past the model's context of {self.max_context}"
            )
        return self.run(self.embed(tokens), start_pos, length - 1 if last else None)

    def embed(self, tokens: Tensor | Any) -> Tensor:
        """The tokens' embeddings (batch, length, hidden): what run() takes."""
        return embed_rows(self.model.embed_tokens, tokens)

    def run(self, x: Tensor, start_pos: Any = 0, at: Any = None) -> Tensor:
        """The embedded tokens x (batch, length, hidden) at positions start_pos.. through the blocks (their keys and
        values into the cache), the norm and the output: logits (batch, length, vocab), or of position `at` of x
        alone (an int or a bound Variable; (batch, 1, vocab))."""
        length = x.shape[1]
        cos = self.cos[start_pos : start_pos + length].reshape(1, 1, length, self.cfg.head_dim)
        sin = self.sin[start_pos : start_pos + length].reshape(1, 1, length, self.cfg.head_dim)
        mask = causal_mask(length, start_pos, x.device)
        for layer in self.model.layers:
            x = layer(x, start_pos, cos, sin, mask)
        x = x if at is None else x[:, at : at + 1]
        return self.lm_head(self.model.norm(x).contiguous()).cast(dtypes.float32)

    def parameters_by_name(self) -> dict[str, tuple[Any, str, tuple[int, ...], bool]]:
        """name -> (object, attribute, shape, stored transposed) of every weight a checkpoint holds (lm_head's only
        where it is not tied to the embedding)."""
        out: dict[str, tuple[Any, str, tuple[int, ...], bool]] = {}

        def add(name: str, owner: Any, attr: str) -> None:
            if (t := getattr(owner, attr, None)) is not None:
                out[name] = (owner, attr, t.shape, False)

        inner = self.model
        add("model.embed_tokens.weight", inner.embed_tokens, "weight")
        for i, block in enumerate(inner.layers):
            p = f"model.layers.{i}"
            for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
                add(f"{p}.self_attn.{name}.weight", getattr(block.self_attn, name), "weight")
                add(f"{p}.self_attn.{name}.bias", getattr(block.self_attn, name), "bias")
            for name in ("gate_proj", "up_proj", "down_proj"):
                add(f"{p}.mlp.{name}.weight", getattr(block.mlp, name), "weight")
                add(f"{p}.mlp.{name}.bias", getattr(block.mlp, name), "bias")
            add(f"{p}.input_layernorm.weight", block.input_layernorm, "weight")
            add(f"{p}.post_attention_layernorm.weight", block.post_attention_layernorm, "weight")
        add("model.norm.weight", inner.norm, "weight")
        if not self.cfg.tie_word_embeddings:
            add("lm_head.weight", self.lm_head, "weight")
        return out
