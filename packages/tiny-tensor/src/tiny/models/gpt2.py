"""GPT-2: learned position embeddings, LayerNorm before each block's attention and MLP, a tanh-approximated GELU,
and the output tied to the token embedding, as Hugging Face's GPT2LMHeadModel names its weights. Its projections
are stored (in, out) (the original "Conv1D"), the transpose of a Linear's weight: loading transposes them.

The same interface as tiny.models.llama: a KV cache per layer, `model(tokens, start_pos)` with start_pos an int or a
bound Variable.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tiny.ir.dtypes import DType
from tiny.models.kv_cache import KVCache, causal_mask
from tiny.models.rows import embed_rows
from tiny.nn import Embedding, LayerNorm, Linear
from tiny.tensor import Tensor, dtypes


@dataclass(frozen=True)
class GPT2Config:
    vocab_size: int = 50257
    n_positions: int = 1024
    n_embd: int = 768
    n_layer: int = 12
    n_head: int = 12
    n_inner: int | None = None
    layer_norm_epsilon: float = 1e-5
    activation_function: str = "gelu_new"

    @staticmethod
    def from_hf(cfg: dict[str, Any]) -> GPT2Config:
        act = cfg.get("activation_function", "gelu_new")
        if act not in ("gelu_new", "gelu_pytorch_tanh", "gelu"):
            raise ValueError(f"GPT-2 activation {act!r} is not supported (gelu_new, gelu_pytorch_tanh and gelu are)")
        return GPT2Config(
            vocab_size=int(cfg["vocab_size"]),
            n_positions=int(cfg.get("n_positions", 1024)),
            n_embd=int(cfg["n_embd"]),
            n_layer=int(cfg["n_layer"]),
            n_head=int(cfg["n_head"]),
            n_inner=cfg.get("n_inner"),
            layer_norm_epsilon=float(cfg.get("layer_norm_epsilon", 1e-5)),
            activation_function=act,
        )


class GPT2Attention:
    def __init__(self, cfg: GPT2Config, max_context: int, device: str | None, cache_dtype: DType | None) -> None:
        self.cfg, self.max_context = cfg, max_context
        self.c_attn = Linear(cfg.n_embd, 3 * cfg.n_embd, device=device)
        self.c_proj = Linear(cfg.n_embd, cfg.n_embd, device=device)
        self.cache = KVCache(max_context, cache_dtype)

    def __call__(self, x: Tensor, start_pos: Any, mask: Tensor | None) -> Tensor:
        batch, length, embd = x.shape
        heads = self.cfg.n_head
        hd = embd // heads
        q, k, v = (t.reshape(batch, length, heads, hd).transpose(1, 2) for t in self.c_attn(x).chunk(3, dim=2))
        keys, values = self.cache.update(k, v, start_pos)
        out = q.scaled_dot_product_attention(keys, values, attn_mask=mask)
        return self.c_proj(out.transpose(1, 2).reshape(batch, length, embd))


class GPT2MLP:
    def __init__(self, cfg: GPT2Config, device: str | None) -> None:
        inner = cfg.n_inner or 4 * cfg.n_embd
        self.c_fc = Linear(cfg.n_embd, inner, device=device)
        self.c_proj = Linear(inner, cfg.n_embd, device=device)
        self.exact = cfg.activation_function == "gelu"

    def __call__(self, x: Tensor) -> Tensor:
        h = self.c_fc(x)
        return self.c_proj((h.gelu() if self.exact else h.gelu(approximate="tanh")).contiguous())


class GPT2Block:
    def __init__(self, cfg: GPT2Config, max_context: int, device: str | None, cache_dtype: DType | None) -> None:
        self.ln_1 = LayerNorm(cfg.n_embd, eps=cfg.layer_norm_epsilon, device=device)
        self.attn = GPT2Attention(cfg, max_context, device, cache_dtype)
        self.ln_2 = LayerNorm(cfg.n_embd, eps=cfg.layer_norm_epsilon, device=device)
        self.mlp = GPT2MLP(cfg, device)

    def __call__(self, x: Tensor, start_pos: Any, mask: Tensor | None) -> Tensor:
        # what a matrix product reads is made once (.contiguous()), not again for each of its outputs (llama.py)
        h = x + self.attn(self.ln_1(x).contiguous(), start_pos, mask)
        return (h + self.mlp(self.ln_2(h).contiguous())).contiguous()


class GPT2:
    """GPT2LMHeadModel; `transformer.*` in the weights' names (or none: the base model's files). cache_dtype: what
    the KV cache keeps (None: the activations' float32; KVCache)."""

    def __init__(
        self,
        cfg: GPT2Config,
        max_context: int | None = None,
        device: str | None = None,
        cache_dtype: DType | None = None,
    ) -> None:
        self.cfg = cfg
        self.max_context = min(max_context or cfg.n_positions, cfg.n_positions)
        self.device = device
        self.wte = Embedding(cfg.vocab_size, cfg.n_embd, device=device)
        self.wpe = Embedding(cfg.n_positions, cfg.n_embd, device=device)
        self.h = [GPT2Block(cfg, self.max_context, device, cache_dtype) for _ in range(cfg.n_layer)]
        self.ln_f = LayerNorm(cfg.n_embd, eps=cfg.layer_norm_epsilon, device=device)

    def __call__(self, tokens: Tensor | Any, start_pos: Any = 0, last: bool = False) -> Tensor:
        """Logits (batch, length, vocab) of the tokens (batch, length), or of one token id as a bound Variable, at
        positions start_pos.. (as Llama's; last: of the last position alone)."""
        length = tokens.shape[1] if isinstance(tokens, Tensor) else 1
        if isinstance(start_pos, int) and start_pos + length > self.max_context:
            raise ValueError(
                f"positions {start_pos}..{start_pos + length - 1} are past the model's context of {self.max_context}"
            )
        return self.run(self.embed(tokens), start_pos, length - 1 if last else None)

    def embed(self, tokens: Tensor | Any) -> Tensor:
        """The tokens' embeddings (batch, length, hidden), without the positions' (run() adds those)."""
        return embed_rows(self.wte, tokens)

    def run(self, x: Tensor, start_pos: Any = 0, at: Any = None) -> Tensor:
        """The embedded tokens x at positions start_pos.. through the blocks: logits, or of position `at` of x alone
        (as Llama's)."""
        length = x.shape[1]
        x = x + self.wpe.weight[start_pos : start_pos + length]
        mask = causal_mask(length, start_pos, x.device)
        for block in self.h:
            x = block(x, start_pos, mask)
        x = x if at is None else x[:, at : at + 1]
        return self.ln_f(x).contiguous().linear(self.wte.weight).cast(dtypes.float32)

    def parameters_by_name(self) -> dict[str, tuple[Any, str, tuple[int, ...], bool]]:
        """name -> (object, attribute, shape as stored, stored transposed) of every weight a checkpoint holds."""
        out: dict[str, tuple[Any, str, tuple[int, ...], bool]] = {}

        def add(name: str, owner: Any, attr: str, transposed: bool = False) -> None:
            shape = getattr(owner, attr).shape
            out[name] = (owner, attr, shape[::-1] if transposed else shape, transposed)

        add("wte.weight", self.wte, "weight")
        add("wpe.weight", self.wpe, "weight")
        for i, block in enumerate(self.h):
            p = f"h.{i}"
            for norm in ("ln_1", "ln_2"):
                add(f"{p}.{norm}.weight", getattr(block, norm), "weight")
                add(f"{p}.{norm}.bias", getattr(block, norm), "bias")
            for name, layer in (("attn.c_attn", block.attn.c_attn), ("attn.c_proj", block.attn.c_proj)):
                add(f"{p}.{name}.weight", layer, "weight", transposed=True)
                add(f"{p}.{name}.bias", layer, "bias")
            for name, layer in (("mlp.c_fc", block.mlp.c_fc), ("mlp.c_proj", block.mlp.c_proj)):
                add(f"{p}.{name}.weight", layer, "weight", transposed=True)
                add(f"{p}.{name}.bias", layer, "bias")
        add("ln_f.weight", self.ln_f, "weight")
        add("ln_f.bias", self.ln_f, "bias")
        return out
