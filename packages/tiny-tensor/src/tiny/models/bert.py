"""BERT, as Hugging Face's BertModel, BertForMaskedLM, BertForSequenceClassification and BertForTokenClassification
compute it and name their weights: word, position and token-type embeddings summed and normalized, then layers of
self-attention and a feed-forward, each added to its input and normalized after (post-norm); the pooler (the first
token through a dense layer and tanh); the masked-LM head (a dense layer, the activation and a LayerNorm, then the
decoder, tied to the word embeddings, plus a bias per token); a linear classifier of the pooled output or of every
token.

The attention mask is Hugging Face's: (batch, keys) or (batch, queries, keys), 1 for a token to attend to and 0 for
padding; a masked key's score gets the lowest value of the model's dtype added, so it weighs nothing after the
softmax. The model computes in its weights' dtype: float32, or float16 / bfloat16 with load(..., dtype=).

>>> from tiny.models import bert  # doctest: +SKIP
>>> model = bert.load("path/to/folder")  # doctest: +SKIP
>>> model([[101, 7592, 102]]).last_hidden_state.shape  # doctest: +SKIP
(1, 3, 768)
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import numpy as np

from tiny.models.hf import LOWEST, activation, compute_dtype, load_weights, read_config, read_weights
from tiny.models.rows import embed_rows
from tiny.nn import Embedding, LayerNorm, Linear, skip_init
from tiny.nn.layers import parameter  # (a weight as tiny.nn's layers make theirs: a leaf, or lazy in skip_init)
from tiny.tensor import DType, Tensor, dtypes

__all__ = [
    "BertConfig",
    "BertForMaskedLM",
    "BertForSequenceClassification",
    "BertForTokenClassification",
    "BertModel",
    "BertOutput",
    "load",
]

ARCHITECTURES = ("BertModel", "BertForMaskedLM", "BertForSequenceClassification", "BertForTokenClassification")


@dataclass(frozen=True)
class BertConfig:
    vocab_size: int = 30522
    hidden_size: int = 768
    num_hidden_layers: int = 12
    num_attention_heads: int = 12
    intermediate_size: int = 3072
    hidden_act: str = "gelu"
    max_position_embeddings: int = 512
    type_vocab_size: int = 2
    layer_norm_eps: float = 1e-12
    tie_word_embeddings: bool = True
    num_labels: int = 2

    @staticmethod
    def from_hf(cfg: dict[str, Any]) -> BertConfig:
        """From a Hugging Face config.json of model_type bert."""
        kind = cfg.get("position_embedding_type", "absolute")
        if kind != "absolute":
            raise ValueError(f"BERT: position_embedding_type {kind!r} is not supported (absolute is)")
        if cfg.get("is_decoder") or cfg.get("add_cross_attention"):
            raise ValueError("BERT as a decoder (is_decoder, add_cross_attention) is not supported: an encoder is")
        hidden, heads = int(cfg["hidden_size"]), int(cfg["num_attention_heads"])
        if hidden % heads:
            raise ValueError(f"BERT: hidden_size {hidden} is not a multiple of num_attention_heads {heads}")
        activation(cfg.get("hidden_act", "gelu"))  # (an unknown one is an error now, not at the first call)
        labels = cfg.get("id2label")
        return BertConfig(
            vocab_size=int(cfg["vocab_size"]),
            hidden_size=hidden,
            num_hidden_layers=int(cfg["num_hidden_layers"]),
            num_attention_heads=heads,
            intermediate_size=int(cfg["intermediate_size"]),
            hidden_act=cfg.get("hidden_act", "gelu"),
            max_position_embeddings=int(cfg.get("max_position_embeddings", 512)),
            type_vocab_size=int(cfg.get("type_vocab_size", 2)),
            layer_norm_eps=float(cfg.get("layer_norm_eps", 1e-12)),
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", True)),
            num_labels=len(labels) if labels else int(cfg.get("num_labels", 2)),
        )


@dataclass(frozen=True)
class BertOutput:
    """What the Hugging Face model returns: the last layer's hidden states (batch, length, hidden), the pooled first
    token (batch, hidden) where the model has a pooler, and the head's logits where it has a head."""

    last_hidden_state: Tensor
    pooler_output: Tensor | None = None
    logits: Tensor | None = None


class Embeddings:
    def __init__(self, cfg: BertConfig, device: str | None) -> None:
        self.word_embeddings = Embedding(cfg.vocab_size, cfg.hidden_size, device=device)
        self.position_embeddings = Embedding(cfg.max_position_embeddings, cfg.hidden_size, device=device)
        self.token_type_embeddings = Embedding(cfg.type_vocab_size, cfg.hidden_size, device=device)
        self.LayerNorm = LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps, device=device)

    def __call__(
        self,
        input_ids: Tensor | None,
        token_type_ids: Tensor | None,
        position_ids: Tensor | None,
        inputs_embeds: Tensor | None,
    ) -> Tensor:
        x = (
            embed_rows(self.word_embeddings, input_ids)
            if inputs_embeds is None
            else inputs_embeds.cast(self.word_embeddings.weight.dtype)
        )
        length = x.shape[1]
        if position_ids is None:  # positions 0..length-1 for every sequence
            x = x + self.position_embeddings.weight[:length]
        else:
            x = x + self.position_embeddings(position_ids)
        if token_type_ids is None:  # every token of type 0
            x = x + self.token_type_embeddings.weight[0]
        else:
            x = x + self.token_type_embeddings(token_type_ids)
        return self.LayerNorm(x).contiguous()


class SelfAttention:
    def __init__(self, cfg: BertConfig, device: str | None) -> None:
        self.heads = cfg.num_attention_heads
        self.query = Linear(cfg.hidden_size, cfg.hidden_size, device=device)
        self.key = Linear(cfg.hidden_size, cfg.hidden_size, device=device)
        self.value = Linear(cfg.hidden_size, cfg.hidden_size, device=device)

    def __call__(self, x: Tensor, mask: Tensor | None) -> Tensor:
        batch, length, hidden = x.shape
        q, k, v = (
            p(x).reshape(batch, length, self.heads, -1).transpose(1, 2) for p in (self.query, self.key, self.value)
        )
        out = q.scaled_dot_product_attention(k, v, attn_mask=mask)  # (softmax of q k^T / sqrt(head size) + mask) v
        return out.transpose(1, 2).reshape(batch, length, hidden)


class AttentionOutput:
    """A dense layer, added to the attention's input and normalized (also the feed-forward's end: LayerOutput)."""

    def __init__(self, features: int, cfg: BertConfig, device: str | None) -> None:
        self.dense = Linear(features, cfg.hidden_size, device=device)
        self.LayerNorm = LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps, device=device)

    def __call__(self, h: Tensor, residual: Tensor) -> Tensor:
        return self.LayerNorm(self.dense(h) + residual).contiguous()


LayerOutput = AttentionOutput


class Attention:
    def __init__(self, cfg: BertConfig, device: str | None) -> None:
        self.self = SelfAttention(cfg, device)
        self.output = AttentionOutput(cfg.hidden_size, cfg, device)

    def __call__(self, x: Tensor, mask: Tensor | None) -> Tensor:
        return self.output(self.self(x, mask), x)


class Intermediate:
    def __init__(self, cfg: BertConfig, device: str | None) -> None:
        self.dense = Linear(cfg.hidden_size, cfg.intermediate_size, device=device)
        self.act = activation(cfg.hidden_act)

    def __call__(self, x: Tensor) -> Tensor:
        return self.act(self.dense(x)).contiguous()


class Layer:
    def __init__(self, cfg: BertConfig, device: str | None) -> None:
        self.attention = Attention(cfg, device)
        self.intermediate = Intermediate(cfg, device)
        self.output = LayerOutput(cfg.intermediate_size, cfg, device)

    def __call__(self, x: Tensor, mask: Tensor | None) -> Tensor:
        h = self.attention(x, mask)
        return self.output(self.intermediate(h), h)


class Encoder:
    def __init__(self, cfg: BertConfig, device: str | None) -> None:
        self.layer = [Layer(cfg, device) for _ in range(cfg.num_hidden_layers)]

    def __call__(self, x: Tensor, mask: Tensor | None) -> Tensor:
        for layer in self.layer:
            x = layer(x, mask)
        return x


class Pooler:
    """The first token's hidden state through a dense layer and tanh."""

    def __init__(self, cfg: BertConfig, device: str | None) -> None:
        self.dense = Linear(cfg.hidden_size, cfg.hidden_size, device=device)

    def __call__(self, x: Tensor) -> Tensor:
        return self.dense(x[:, 0]).tanh()


class BertModel:
    """The encoder: embeddings, layers and (with add_pooling_layer) the pooler; its weights' names have no prefix."""

    def __init__(self, cfg: BertConfig, add_pooling_layer: bool = True, device: str | None = None) -> None:
        self.cfg, self.device = cfg, device
        self.embeddings = Embeddings(cfg, device)
        self.encoder = Encoder(cfg, device)
        self.pooler = Pooler(cfg, device) if add_pooling_layer else None

    def __call__(
        self,
        input_ids: Tensor | Any = None,
        attention_mask: Tensor | Any = None,
        token_type_ids: Tensor | Any = None,
        position_ids: Tensor | Any = None,
        inputs_embeds: Tensor | None = None,
    ) -> BertOutput:
        """The hidden states of token ids (batch, length) (or of their embeddings, inputs_embeds (batch, length,
        hidden)); attention_mask (1 keep, 0 padding), token_type_ids and position_ids as Hugging Face takes them."""
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError("BERT takes exactly one of input_ids and inputs_embeds")
        cfg = self.cfg
        if inputs_embeds is None:
            input_ids = _ids(input_ids, "input_ids", cfg.vocab_size, self.device)
            batch, length = input_ids.shape
        else:
            if inputs_embeds.ndim != 3 or inputs_embeds.shape[2] != cfg.hidden_size:
                raise ValueError(f"inputs_embeds must be (batch, length, {cfg.hidden_size}), got {inputs_embeds.shape}")
            batch, length = inputs_embeds.shape[:2]
        if length > cfg.max_position_embeddings:
            raise ValueError(f"{length} tokens are past BERT's {cfg.max_position_embeddings} positions")
        device = self.device if inputs_embeds is None else inputs_embeds.device
        if token_type_ids is not None:
            token_type_ids = _ids(token_type_ids, "token_type_ids", cfg.type_vocab_size, device, (batch, length))
        if position_ids is not None:
            position_ids = _ids(position_ids, "position_ids", cfg.max_position_embeddings, device, (batch, length))
        x = self.embeddings(input_ids, token_type_ids, position_ids, inputs_embeds)
        dtype = self.embeddings.word_embeddings.weight.dtype
        x = self.encoder(x, _additive_mask(attention_mask, batch, length, device, dtype))
        return BertOutput(x, None if self.pooler is None else self.pooler(x))


def _ids(ids: Tensor | Any, what: str, limit: int, device: str | None, shape: tuple[int, int] | None = None) -> Tensor:
    """Integer ids (batch, length) ((length,): one sequence), each in [0, limit) where they are given as data."""
    if not isinstance(ids, Tensor):
        arr = np.asarray(ids)
        if arr.dtype.kind not in "iu":
            raise TypeError(f"{what} must be integers, got {arr.dtype}")
        if arr.size and (arr.min() < 0 or arr.max() >= limit):
            raise IndexError(f"{what} must be in [0, {limit}), got {arr.min()}..{arr.max()}")
        ids = Tensor(arr.astype(np.int32), device=device)
    elif ids.dtype.is_float or ids.dtype.is_bool:
        raise TypeError(f"{what} must be integers, got dtype {ids.dtype.name}")
    if ids.ndim == 1:
        ids = ids.reshape(1, -1)
    if ids.ndim != 2 or ids.shape[1] == 0 or (shape is not None and ids.shape != shape):
        want = "(batch, length) with length >= 1" if shape is None else f"{shape}, as input_ids"
        raise ValueError(f"{what} must be {want}, got shape {ids.shape}")
    return ids


def _additive_mask(mask: Tensor | Any, batch: int, length: int, device: str | None, dtype: DType) -> Tensor | None:
    """Hugging Face's extended attention mask: 0 where a key is kept, dtype's lowest value where it is masked,
    (batch, 1, 1, keys) for a (batch, keys) mask, (batch, 1, queries, keys) for a (batch, queries, keys) one."""
    if mask is None:
        return None
    m = mask if isinstance(mask, Tensor) else Tensor(np.asarray(mask, dtype=np.float32), device=device)
    if m.shape == (length,) and batch == 1:
        m = m.reshape(1, length)
    if m.shape not in ((batch, length), (batch, length, length)):
        raise ValueError(f"attention_mask must be ({batch}, {length}) or ({batch}, {length}, {length}), got {m.shape}")
    m = m.reshape(batch, 1, 1, length) if m.ndim == 2 else m.reshape(batch, 1, length, length)
    return (1.0 - m.cast(dtype)) * LOWEST[dtype]


class PredictionTransform:
    def __init__(self, cfg: BertConfig, device: str | None) -> None:
        self.dense = Linear(cfg.hidden_size, cfg.hidden_size, device=device)
        self.transform_act_fn = activation(cfg.hidden_act)
        self.LayerNorm = LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps, device=device)

    def __call__(self, x: Tensor) -> Tensor:
        return self.LayerNorm(self.transform_act_fn(self.dense(x))).contiguous()


class Predictions:
    """A score per vocabulary token: the transform, then the decoder (the word embeddings where tied) and a bias."""

    def __init__(self, cfg: BertConfig, device: str | None) -> None:
        self.transform = PredictionTransform(cfg, device)
        self.decoder = Linear(cfg.hidden_size, cfg.vocab_size, bias=False, device=device)
        self.bias = parameter(Tensor.zeros(cfg.vocab_size, device=device))  # (the file's decoder.bias is this one)

    def __call__(self, x: Tensor) -> Tensor:
        return self.decoder(self.transform(x)) + self.bias


class MaskedLMHead:
    def __init__(self, cfg: BertConfig, device: str | None) -> None:
        self.predictions = Predictions(cfg, device)


class BertForMaskedLM:
    """BertModel without the pooler (`bert.*`) and the masked-LM head (`cls.predictions.*`)."""

    def __init__(self, cfg: BertConfig, device: str | None = None) -> None:
        self.cfg, self.device = cfg, device
        self.bert = BertModel(cfg, add_pooling_layer=False, device=device)
        self.cls = MaskedLMHead(cfg, device)
        if cfg.tie_word_embeddings:
            self.tie()

    def tie(self) -> None:
        """Share the word embeddings as the decoder's weight (tie_word_embeddings)."""
        self.cls.predictions.decoder.weight = self.bert.embeddings.word_embeddings.weight

    def __call__(self, input_ids: Tensor | Any = None, attention_mask: Tensor | Any = None, **kw: Any) -> BertOutput:
        """The logits (batch, length, vocab) of every position, with BertModel's arguments."""
        out = self.bert(input_ids, attention_mask, **kw)
        return BertOutput(out.last_hidden_state, None, self.cls.predictions(out.last_hidden_state))


class BertForSequenceClassification:
    """BertModel with the pooler (`bert.*`) and a linear classifier of the pooled output (`classifier.*`)."""

    def __init__(self, cfg: BertConfig, device: str | None = None) -> None:
        self.cfg, self.device = cfg, device
        self.bert = BertModel(cfg, device=device)
        self.classifier = Linear(cfg.hidden_size, cfg.num_labels, device=device)

    def __call__(self, input_ids: Tensor | Any = None, attention_mask: Tensor | Any = None, **kw: Any) -> BertOutput:
        """The logits (batch, num_labels) of each sequence, with BertModel's arguments."""
        out = self.bert(input_ids, attention_mask, **kw)
        assert out.pooler_output is not None
        return BertOutput(out.last_hidden_state, out.pooler_output, self.classifier(out.pooler_output))


class BertForTokenClassification:
    """BertModel without the pooler (`bert.*`) and a linear classifier of every token (`classifier.*`)."""

    def __init__(self, cfg: BertConfig, device: str | None = None) -> None:
        self.cfg, self.device = cfg, device
        self.bert = BertModel(cfg, add_pooling_layer=False, device=device)
        self.classifier = Linear(cfg.hidden_size, cfg.num_labels, device=device)

    def __call__(self, input_ids: Tensor | Any = None, attention_mask: Tensor | Any = None, **kw: Any) -> BertOutput:
        """The logits (batch, length, num_labels) of each token, with BertModel's arguments."""
        out = self.bert(input_ids, attention_mask, **kw)
        return BertOutput(out.last_hidden_state, None, self.classifier(out.last_hidden_state))


Bert = BertModel | BertForMaskedLM | BertForSequenceClassification | BertForTokenClassification
_HEADS = {
    "BertForMaskedLM": BertForMaskedLM,
    "BertForSequenceClassification": BertForSequenceClassification,
    "BertForTokenClassification": BertForTokenClassification,
}


def load(path: str | os.PathLike, device: str | None = None, dtype: DType | str = dtypes.float32) -> Bert:
    """The model a Hugging Face folder holds (config.json's architecture: BertModel, BertForMaskedLM,
    BertForSequenceClassification or BertForTokenClassification), its weights read lazily from model.safetensors (or
    its shards) into the device. dtype: what the model computes in, whatever the file holds (float32 by default: a
    float16 checkpoint is widened; dtypes.float16 computes in half)."""
    dtype = compute_dtype(dtype, "BERT")
    folder, raw, arch = read_config(path, ARCHITECTURES)
    cfg = BertConfig.from_hf(raw)
    model: Bert
    with skip_init():  # (the weights come from the files: no random ones first)
        model = BertModel(cfg, device=device) if arch == "BertModel" else _HEADS[arch](cfg, device)
    tying = isinstance(model, BertForMaskedLM) and cfg.tie_word_embeddings  # (the decoder is the word embeddings)
    tied = ("cls.predictions.decoder.weight",) if tying else ()
    load_weights(model, read_weights(folder, device), folder, base="bert", tied=tied, dtype=dtype)
    if isinstance(model, BertForMaskedLM) and tying:
        model.tie()
    return model
