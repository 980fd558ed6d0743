"""Whisper, as Hugging Face's WhisperForConditionalGeneration computes it and names its weights, and the log-mel
front end of its WhisperFeatureExtractor.

The front end: audio at 16 kHz padded with silence (or cut) to the chunk's 30 s, a short-time Fourier transform (a
periodic Hann window of n_fft samples every hop_length, the signal reflected at both ends), the power of each
frequency through a bank of triangular mel filters (Slaney's scale and area normalization), log10, everything below
the chunk's loudest value less 8 raised to it, and scaled as (x + 4) / 4. The last frame is dropped: 3000 frames of
80 mels for 30 s.

The encoder: two 1-d convolutions (the second halving the frames) with GELU, learned position embeddings, and
pre-norm layers of self-attention and a feed-forward, a final LayerNorm. The decoder: token and learned position
embeddings, pre-norm layers of causal self-attention (its keys and values kept in a KV cache while generating),
attention over the encoder's states and a feed-forward, a final LayerNorm; the logits are the decoder's states times
the token embeddings (proj_out, tied) or proj_out's own weight.

>>> from tiny.models import whisper  # doctest: +SKIP
>>> model = whisper.load("path/to/folder")  # doctest: +SKIP
>>> model.generate(model.features(audio)).tolist()  # doctest: +SKIP
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tiny.models.hf import activation, load_weights, read_config, read_json, read_weights
from tiny.models.kv_cache import KVCache
from tiny.nn import Conv1d, Embedding, LayerNorm, Linear, skip_init
from tiny.tensor import Tensor, Variable, dtypes

__all__ = ["FeatureConfig", "WhisperConfig", "WhisperForConditionalGeneration", "load", "log_mel", "mel_filters"]

ARCHITECTURES = ("WhisperForConditionalGeneration",)


# ---------------------------------------------------------------- the log-mel front end


@dataclass(frozen=True)
class FeatureConfig:
    """WhisperFeatureExtractor's settings (a folder's preprocessor_config.json)."""

    feature_size: int = 80
    sampling_rate: int = 16000
    hop_length: int = 160
    chunk_length: int = 30
    n_fft: int = 400
    padding_value: float = 0.0

    @property
    def n_samples(self) -> int:
        return self.chunk_length * self.sampling_rate

    @property
    def frames(self) -> int:
        return self.n_samples // self.hop_length

    @staticmethod
    def from_hf(cfg: dict[str, Any]) -> FeatureConfig:
        names = ("feature_size", "sampling_rate", "hop_length", "chunk_length", "n_fft")
        kept = {k: int(cfg[k]) for k in names if k in cfg}
        return FeatureConfig(**kept, padding_value=float(cfg.get("padding_value", 0.0)))


def _hz_to_mel(hz: np.ndarray) -> np.ndarray:
    """Slaney's mel scale: linear up to 1 kHz (3 mels per 200 Hz), logarithmic above (27 mels per factor of 6.4)."""
    hz = np.asarray(hz, dtype=np.float64)
    log_part = 15.0 + 27.0 * np.log(np.maximum(hz, 1e-10) / 1000.0) / np.log(6.4)
    return np.where(hz >= 1000.0, log_part, 3.0 * hz / 200.0)


def _mel_to_hz(mel: np.ndarray) -> np.ndarray:
    mel = np.asarray(mel, dtype=np.float64)
    return np.where(mel >= 15.0, 1000.0 * np.exp(np.log(6.4) * (mel - 15.0) / 27.0), 200.0 * mel / 3.0)


def mel_filters(cfg: FeatureConfig = FeatureConfig()) -> np.ndarray:
    """(n_fft // 2 + 1, feature_size): triangular filters whose corners are evenly spaced in mels from 0 Hz to 8 kHz,
    each scaled to unit area over its band (Slaney's normalization)."""
    corners = _mel_to_hz(np.linspace(_hz_to_mel(0.0), _hz_to_mel(8000.0), cfg.feature_size + 2))
    bins = np.linspace(0, cfg.sampling_rate // 2, cfg.n_fft // 2 + 1)
    widths = np.diff(corners)
    offsets = corners[None, :] - bins[:, None]  # (bins, corners): how far each corner lies above each bin
    rising = -offsets[:, :-2] / widths[:-1]
    falling = offsets[:, 2:] / widths[1:]
    filters = np.maximum(0.0, np.minimum(rising, falling))
    return filters * (2.0 / (corners[2:] - corners[:-2]))


def log_mel(audio: np.ndarray | Sequence[Any], cfg: FeatureConfig = FeatureConfig()) -> np.ndarray:
    """(batch, feature_size, frames) float32: the log-mel features of mono audio at cfg.sampling_rate, one clip
    (samples,) or several ((batch, samples), or a list of clips of any lengths), as WhisperFeatureExtractor gives
    them: each clip padded with padding_value (or cut) to chunk_length seconds."""
    clips = [audio] if isinstance(audio, np.ndarray) and audio.ndim == 1 else list(audio)
    if not clips:
        raise ValueError("log_mel: no audio given")
    filters, window = mel_filters(cfg), 0.5 - 0.5 * np.cos(2 * np.pi * np.arange(cfg.n_fft) / cfg.n_fft)
    out = []
    for clip in clips:
        samples = np.asarray(clip, dtype=np.float32)
        if samples.ndim != 1:
            raise ValueError(f"log_mel: audio must be mono, one sample per step; got a clip of shape {samples.shape}")
        padded = np.full(cfg.n_samples, cfg.padding_value, dtype=np.float64)
        padded[: min(len(samples), cfg.n_samples)] = samples[: cfg.n_samples]
        half = cfg.n_fft // 2
        signal = np.pad(padded, (half, half), mode="reflect")
        frames = np.lib.stride_tricks.sliding_window_view(signal, cfg.n_fft)[:: cfg.hop_length][:-1]  # (frames, n_fft)
        power = np.abs(np.fft.rfft(frames * window, axis=-1)) ** 2  # (frames, bins)
        mels = np.log10(np.maximum(power @ filters, 1e-10)).T  # (feature_size, frames)
        mels = np.maximum(mels, mels.max() - 8.0)
        out.append((mels + 4.0) / 4.0)
    return np.stack(out).astype(np.float32)


# ---------------------------------------------------------------- the model


@dataclass(frozen=True)
class WhisperConfig:
    vocab_size: int = 51865
    num_mel_bins: int = 80
    d_model: int = 384
    encoder_layers: int = 4
    encoder_attention_heads: int = 6
    encoder_ffn_dim: int = 1536
    decoder_layers: int = 4
    decoder_attention_heads: int = 6
    decoder_ffn_dim: int = 1536
    activation_function: str = "gelu"
    max_source_positions: int = 1500
    max_target_positions: int = 448
    tie_word_embeddings: bool = True
    # generation (generation_config.json where the folder has one, else config.json's)
    decoder_start_token_id: int = 50257
    eos_token_id: int = 50256
    pad_token_id: int = 50256
    suppress_tokens: tuple[int, ...] = ()
    begin_suppress_tokens: tuple[int, ...] = (220, 50256)
    forced_decoder_ids: tuple[tuple[int, int], ...] = ()
    no_timestamps_token_id: int | None = None
    lang_to_id: dict[str, int] = field(default_factory=dict)
    task_to_id: dict[str, int] = field(default_factory=dict)

    @staticmethod
    def from_hf(cfg: dict[str, Any], generation: dict[str, Any] | None = None) -> WhisperConfig:
        """From a Hugging Face config.json of model_type whisper and its generation_config.json."""
        for heads, key in (("encoder_attention_heads", "encoder"), ("decoder_attention_heads", "decoder")):
            if int(cfg["d_model"]) % int(cfg[heads]):
                raise ValueError(f"Whisper: d_model {cfg['d_model']} is not a multiple of {key} heads {cfg[heads]}")
        activation(cfg.get("activation_function", "gelu"))  # (an unknown one is an error now)
        gen = {**cfg, **(generation or {})}
        forced = tuple((int(i), int(t)) for i, t in gen.get("forced_decoder_ids") or () if t is not None)
        return WhisperConfig(
            vocab_size=int(cfg["vocab_size"]),
            num_mel_bins=int(cfg.get("num_mel_bins", 80)),
            d_model=int(cfg["d_model"]),
            encoder_layers=int(cfg["encoder_layers"]),
            encoder_attention_heads=int(cfg["encoder_attention_heads"]),
            encoder_ffn_dim=int(cfg["encoder_ffn_dim"]),
            decoder_layers=int(cfg["decoder_layers"]),
            decoder_attention_heads=int(cfg["decoder_attention_heads"]),
            decoder_ffn_dim=int(cfg["decoder_ffn_dim"]),
            activation_function=cfg.get("activation_function", "gelu"),
            max_source_positions=int(cfg["max_source_positions"]),
            max_target_positions=int(cfg["max_target_positions"]),
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", True)),
            decoder_start_token_id=int(gen["decoder_start_token_id"]),
            eos_token_id=int(gen["eos_token_id"]),
            pad_token_id=int(gen.get("pad_token_id", gen["eos_token_id"])),
            suppress_tokens=tuple(int(t) for t in gen.get("suppress_tokens") or ()),
            begin_suppress_tokens=tuple(int(t) for t in gen.get("begin_suppress_tokens") or ()),
            forced_decoder_ids=forced,
            no_timestamps_token_id=gen.get("no_timestamps_token_id"),
            lang_to_id=dict(gen.get("lang_to_id") or {}),
            task_to_id=dict(gen.get("task_to_id") or {}),
        )


class Attention:
    """q_proj, k_proj (no bias), v_proj and out_proj, as Hugging Face's WhisperAttention."""

    def __init__(self, dim: int, heads: int, device: str | None) -> None:
        self.heads = heads
        self.q_proj = Linear(dim, dim, device=device)
        self.k_proj = Linear(dim, dim, bias=False, device=device)
        self.v_proj = Linear(dim, dim, device=device)
        self.out_proj = Linear(dim, dim, device=device)

    def split(self, x: Tensor) -> Tensor:
        """(batch, length, dim) -> (batch, heads, length, head_dim)."""
        batch, length, _ = x.shape
        return x.reshape(batch, length, self.heads, -1).transpose(1, 2)

    def keys_values(self, x: Tensor) -> tuple[Tensor, Tensor]:
        return self.split(self.k_proj(x)), self.split(self.v_proj(x))

    def __call__(self, x: Tensor, keys: Tensor, values: Tensor, mask: Tensor | None = None) -> Tensor:
        batch, length, dim = x.shape
        out = self.split(self.q_proj(x)).scaled_dot_product_attention(keys, values, attn_mask=mask)
        return self.out_proj(out.transpose(1, 2).reshape(batch, length, dim))


class EncoderLayer:
    def __init__(self, cfg: WhisperConfig, device: str | None) -> None:
        dim = cfg.d_model
        self.self_attn = Attention(dim, cfg.encoder_attention_heads, device)
        self.self_attn_layer_norm = LayerNorm(dim, device=device)
        self.fc1 = Linear(dim, cfg.encoder_ffn_dim, device=device)
        self.fc2 = Linear(cfg.encoder_ffn_dim, dim, device=device)
        self.final_layer_norm = LayerNorm(dim, device=device)
        self.act = activation(cfg.activation_function)

    def __call__(self, x: Tensor) -> Tensor:
        h = self.self_attn_layer_norm(x).contiguous()
        x = x + self.self_attn(h, *self.self_attn.keys_values(h))
        h = self.final_layer_norm(x).contiguous()
        return (x + self.fc2(self.act(self.fc1(h)).contiguous())).contiguous()


class Encoder:
    def __init__(self, cfg: WhisperConfig, device: str | None) -> None:
        self.cfg = cfg
        self.conv1 = Conv1d(cfg.num_mel_bins, cfg.d_model, 3, padding=1, device=device)
        self.conv2 = Conv1d(cfg.d_model, cfg.d_model, 3, stride=2, padding=1, device=device)
        self.embed_positions = Embedding(cfg.max_source_positions, cfg.d_model, device=device)
        self.layers = [EncoderLayer(cfg, device) for _ in range(cfg.encoder_layers)]
        self.layer_norm = LayerNorm(cfg.d_model, device=device)

    def __call__(self, features: Tensor) -> Tensor:
        """(batch, max_source_positions, d_model): the states of features (batch, num_mel_bins, 2 *
        max_source_positions)."""
        x = self.conv2(self.conv1(features).gelu()).gelu().transpose(1, 2)
        x = x + self.embed_positions.weight
        for layer in self.layers:
            x = layer(x)
        return self.layer_norm(x).contiguous()


class DecoderLayer:
    def __init__(self, cfg: WhisperConfig, device: str | None) -> None:
        dim = cfg.d_model
        self.self_attn = Attention(dim, cfg.decoder_attention_heads, device)
        self.self_attn_layer_norm = LayerNorm(dim, device=device)
        self.encoder_attn = Attention(dim, cfg.decoder_attention_heads, device)
        self.encoder_attn_layer_norm = LayerNorm(dim, device=device)
        self.fc1 = Linear(dim, cfg.decoder_ffn_dim, device=device)
        self.fc2 = Linear(cfg.decoder_ffn_dim, dim, device=device)
        self.final_layer_norm = LayerNorm(dim, device=device)
        self.act = activation(cfg.activation_function)
        self.cache = KVCache(cfg.max_target_positions)

    def __call__(
        self, x: Tensor, cross: tuple[Tensor, Tensor], start_pos: Any, mask: Tensor | None, cached: bool
    ) -> Tensor:
        h = self.self_attn_layer_norm(x).contiguous()
        keys, values = self.self_attn.keys_values(h)
        if cached:
            keys, values = self.cache.update(keys, values, start_pos)
        x = x + self.self_attn(h, keys, values, mask)
        x = x + self.encoder_attn(self.encoder_attn_layer_norm(x).contiguous(), *cross)
        h = self.final_layer_norm(x).contiguous()
        return (x + self.fc2(self.act(self.fc1(h)).contiguous())).contiguous()


class Decoder:
    def __init__(self, cfg: WhisperConfig, device: str | None) -> None:
        self.embed_tokens = Embedding(cfg.vocab_size, cfg.d_model, device=device)
        self.embed_positions = Embedding(cfg.max_target_positions, cfg.d_model, device=device)
        self.layers = [DecoderLayer(cfg, device) for _ in range(cfg.decoder_layers)]
        self.layer_norm = LayerNorm(cfg.d_model, device=device)

    def cross(self, encoded: Tensor) -> list[tuple[Tensor, Tensor]]:
        """Each layer's keys and values of the encoder's states, computed once for every decoding step."""
        out = []
        for layer in self.layers:
            keys, values = layer.encoder_attn.keys_values(encoded)
            out.append((keys.contiguous().realize(), values.contiguous().realize()))
        return out

    def __call__(
        self, tokens: Tensor, cross: list[tuple[Tensor, Tensor]], start_pos: Any = 0, cached: bool = False
    ) -> Tensor:
        """The states (batch, length, d_model) of tokens (batch, length) at positions start_pos.. (an int, or a
        bound Variable with cached), attending to the tokens before them (in the cache where cached)."""
        length = tokens.shape[1]
        x = self.embed_tokens(tokens) + self.embed_positions.weight[start_pos : start_pos + length]
        mask = None
        if length > 1:  # query i (at start_pos + i) sees the keys up to its own position
            rows = Tensor.arange(length, device=x.device).reshape(length, 1) + start_pos
            mask = rows >= Tensor.arange(start_pos + length, device=x.device).reshape(1, -1)
        for layer, kv in zip(self.layers, cross, strict=True):
            x = layer(x, kv, start_pos, mask, cached)
        return self.layer_norm(x)


class WhisperModel:
    def __init__(self, cfg: WhisperConfig, device: str | None) -> None:
        self.encoder = Encoder(cfg, device)
        self.decoder = Decoder(cfg, device)


@dataclass(frozen=True)
class WhisperOutput:
    """What the Hugging Face model returns: the logits (batch, length, vocab) and the encoder's states."""

    logits: Tensor
    encoder_last_hidden_state: Tensor


class WhisperForConditionalGeneration:
    """model.encoder, model.decoder and proj_out (the token embeddings where tie_word_embeddings)."""

    def __init__(self, cfg: WhisperConfig, device: str | None = None, features: FeatureConfig | None = None) -> None:
        self.cfg, self.device = cfg, device
        self.feature_config = features or _default_features(cfg)
        self.model = WhisperModel(cfg, device)
        self.proj_out = Linear(cfg.d_model, cfg.vocab_size, bias=False, device=device)
        if cfg.tie_word_embeddings:
            self.tie()

    def tie(self) -> None:
        self.proj_out.weight = self.model.decoder.embed_tokens.weight

    def features(self, audio: np.ndarray | Sequence[Any]) -> np.ndarray:
        """The log-mel features of audio at the feature config's sampling rate (see log_mel)."""
        return log_mel(audio, self.feature_config)

    def encode(self, input_features: Tensor | Any) -> Tensor:
        """The encoder's states of log-mel features (batch, num_mel_bins, 2 * max_source_positions)."""
        return self.model.encoder(self._features(input_features))

    def __call__(self, input_features: Tensor | Any, decoder_input_ids: Tensor | Any) -> WhisperOutput:
        """The logits (batch, length, vocab) of decoder_input_ids (batch, length) from position 0, attending to
        the features' encoding, as the Hugging Face model's forward gives them."""
        encoded = self.encode(input_features)
        tokens = self._tokens(decoder_input_ids, encoded.shape[0])
        states = self.model.decoder(tokens, self.model.decoder.cross(encoded))
        return WhisperOutput(self.proj_out(states), encoded)

    def prompt(self, language: str | None = None, task: str | None = None) -> list[int]:
        """The tokens decoding starts with: decoder_start_token_id, then the language's and the task's tokens (or
        forced_decoder_ids' where neither is given), then <|notimestamps|> where the model has one."""
        cfg = self.cfg
        if language is None and task is None:
            forced = [t for _, t in sorted(cfg.forced_decoder_ids)]
        else:
            forced = []
            if language is not None:
                key = language if language.startswith("<|") else f"<|{language}|>"
                if key not in cfg.lang_to_id:
                    raise ValueError(
                        f"Whisper: language {language!r} is not one of the model's ({len(cfg.lang_to_id)})"
                    )
                forced.append(cfg.lang_to_id[key])
            if task is not None:
                if task not in cfg.task_to_id:
                    raise ValueError(f"Whisper: task {task!r} is not one of {sorted(cfg.task_to_id)}")
                forced.append(cfg.task_to_id[task])
        prompt = [cfg.decoder_start_token_id, *forced]
        if cfg.no_timestamps_token_id is not None and cfg.no_timestamps_token_id not in prompt:
            prompt.append(cfg.no_timestamps_token_id)
        return prompt

    def generate(
        self,
        input_features: Tensor | Any,
        max_new_tokens: int = 32,
        prompt: Sequence[int] | None = None,
        language: str | None = None,
        task: str | None = None,
    ) -> np.ndarray:
        """Greedy decoding, as the Hugging Face model's generate: the new tokens (batch, at most max_new_tokens)
        int64 after the prompt (self.prompt(language, task) unless given), each step's likeliest token,
        suppress_tokens never chosen and begin_suppress_tokens not first. A sequence ends before its eos_token_id
        (which is not returned), and those that end sooner are padded with pad_token_id. Steps stop when every
        sequence has ended. The decoder's self-attention keys and values are kept in each layer's KV cache, and
        the step's position is a bound Variable, so every step after the prompt runs the same kernels."""
        cfg = self.cfg
        start = list(self.prompt(language, task) if prompt is None else prompt)
        if not isinstance(max_new_tokens, int) or max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be an int >= 1, got {max_new_tokens!r}")
        if len(start) + max_new_tokens > cfg.max_target_positions:
            raise ValueError(
                f"a prompt of {len(start)} tokens and {max_new_tokens} new ones is past the decoder's "
                f"{cfg.max_target_positions} positions"
            )
        encoded = self.encode(input_features)
        batch = encoded.shape[0]
        cross = self.model.decoder.cross(encoded)
        tokens = np.array([start] * batch, dtype=np.int64)
        pos = Variable("pos", 1, cfg.max_target_positions - 1)
        logits = self._step(tokens, cross, 0)
        done = np.zeros(batch, dtype=bool)
        for i in range(max_new_tokens):
            if i == 0:
                logits[:, list(cfg.begin_suppress_tokens)] = -np.inf
            logits[:, list(cfg.suppress_tokens)] = -np.inf
            chosen = np.where(done, cfg.pad_token_id, logits.argmax(-1))
            tokens = np.concatenate([tokens, chosen[:, None]], axis=1)
            done |= chosen == cfg.eos_token_id
            if done.all() or i == max_new_tokens - 1:
                break
            logits = self._step(chosen[:, None], cross, pos.bind(tokens.shape[1] - 1))
        new = tokens[:, len(start) :]
        ends = [int(np.argmax(row == cfg.eos_token_id)) if (row == cfg.eos_token_id).any() else row.size for row in new]
        out = np.full((batch, max(ends)), cfg.pad_token_id, dtype=np.int64)
        for row, (seq, end) in enumerate(zip(new, ends, strict=True)):
            out[row, :end] = seq[:end]
        return out

    def _step(self, tokens: np.ndarray, cross: list[tuple[Tensor, Tensor]], start_pos: Any) -> np.ndarray:
        """The last position's logits (batch, vocab) as float32 NumPy, the tokens' keys and values cached."""
        ids = Tensor(tokens.astype(np.int32), device=self.device)
        states = self.model.decoder(ids, cross, start_pos, cached=True)
        return self.proj_out(states[:, -1]).numpy().astype(np.float32)

    def _features(self, features: Tensor | Any) -> Tensor:
        cfg = self.cfg
        if not isinstance(features, Tensor):
            features = Tensor(np.asarray(features, dtype=np.float32), device=self.device)
        elif not features.dtype.is_float:
            raise TypeError(f"input_features must be floats, got dtype {features.dtype.name}")
        want = (cfg.num_mel_bins, 2 * cfg.max_source_positions)
        if features.ndim != 3 or tuple(features.shape[1:]) != want:
            raise ValueError(
                f"input_features must be (batch, {want[0]}, {want[1]}) log-mel features (the feature extractor pads "
                f"audio to them), got shape {features.shape}"
            )
        return features.cast(dtypes.float32)

    def _tokens(self, ids: Tensor | Any, batch: int) -> Tensor:
        arr = ids.numpy() if isinstance(ids, Tensor) else np.asarray(ids)
        if arr.dtype.kind not in "iu":
            raise TypeError(f"decoder_input_ids must be integers, got dtype {arr.dtype}")
        if arr.ndim != 2 or arr.shape[0] != batch or not 1 <= arr.shape[1] <= self.cfg.max_target_positions:
            raise ValueError(
                f"decoder_input_ids must be ({batch}, length) with length 1..{self.cfg.max_target_positions}, "
                f"got shape {arr.shape}"
            )
        if arr.min() < 0 or arr.max() >= self.cfg.vocab_size:
            raise IndexError(f"decoder_input_ids must be in [0, {self.cfg.vocab_size}), got {arr.min()}..{arr.max()}")
        return Tensor(arr.astype(np.int32), device=self.device)


def load(path: str | os.PathLike, device: str | None = None) -> WhisperForConditionalGeneration:
    """The model a Hugging Face folder holds (config.json's architecture WhisperForConditionalGeneration), its
    weights read lazily from model.safetensors (or its shards), its generation settings from generation_config.json
    and its feature extractor's from preprocessor_config.json where the folder has them."""
    folder, raw, _ = read_config(path, ARCHITECTURES)
    generation = read_json(folder / "generation_config.json", {})
    cfg = WhisperConfig.from_hf(raw, generation)
    preprocessor = read_json(folder / "preprocessor_config.json", {})
    features = FeatureConfig.from_hf(preprocessor) if preprocessor else _default_features(cfg)
    if features.feature_size != cfg.num_mel_bins or features.frames != 2 * cfg.max_source_positions:
        raise ValueError(
            f"{folder}: the feature extractor makes {features.feature_size} mels x {features.frames} frames, the model "
            f"takes {cfg.num_mel_bins} x {2 * cfg.max_source_positions}"
        )
    with skip_init():  # (the weights come from the files: no random ones first)
        model = WhisperForConditionalGeneration(cfg, device, features)
    tied = ("proj_out.weight",) if cfg.tie_word_embeddings else ()
    load_weights(model, read_weights(folder, device), folder, base="model", tied=tied)
    if cfg.tie_word_embeddings:
        model.tie()
    return model


def _default_features(cfg: WhisperConfig) -> FeatureConfig:
    """WhisperFeatureExtractor's defaults, with the model's mels and a chunk of its frames (30 s for 1500 positions)."""
    base = FeatureConfig(feature_size=cfg.num_mel_bins)
    seconds, rest = divmod(2 * cfg.max_source_positions * base.hop_length, base.sampling_rate)
    return FeatureConfig(feature_size=cfg.num_mel_bins, chunk_length=seconds if seconds and not rest else 30)
