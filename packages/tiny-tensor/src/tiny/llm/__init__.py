"""Language models: `load(path)` a Hugging Face model folder, then `model(ids)` for logits and `model.generate(ids)`.

The prompt runs in jitted passes over chunks of it (prefill); each new token then runs through one jitted decode
step. Their positions are bound Variables, so each pass's kernels are built once for every position and replayed.
Sampling (greedy, temperature, top-k, top-p, with a seed) happens on the host over the last position's logits.

>>> from tiny.llm import load  # doctest: +SKIP
>>> model = load("path/to/folder")  # doctest: +SKIP
>>> model.generate([1, 2, 3], max_new_tokens=8)  # doctest: +SKIP
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from tiny.ir.device import buffer_of
from tiny.ir.dtypes import DType
from tiny.ir.schedule import is_memory, is_realized
from tiny.ir.uop import Ops
from tiny.llm.gguf_tokenizer import special_tokens, tokenizer_from_metadata
from tiny.models.gpt2 import GPT2, GPT2Config
from tiny.models.hf import read_panels, read_weights
from tiny.models.llama import Llama, LlamaConfig
from tiny.nn import skip_init
from tiny.tensor import Tensor, TinyJit, Variable, dtypes
from tiny.tensor.weight_forms import form_of

__all__ = ["LLM", "load"]

ARCHITECTURES = ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "GPT2LMHeadModel")


class LLM:
    """A loaded causal language model: logits, generation, and its tokenizer (None where the folder has none)."""

    def __init__(
        self,
        model: Llama | GPT2,
        tokenizer: Any = None,
        eos_token_ids: Sequence[int] = (),
        chat_template: str | None = None,
        special_tokens: dict[str, str] | None = None,
    ) -> None:
        self.model, self.tokenizer, self.chat_template = model, tokenizer, chat_template
        self.special_tokens = special_tokens or {}
        self.eos_token_ids = tuple(eos_token_ids)
        self.max_context = model.max_context
        self._pos = Variable("pos", 0, model.max_context - 1)
        self._token = Variable("token", 0, model.cfg.vocab_size - 1)
        self._step = TinyJit(self._decode)
        self._prompt = TinyJit(self._prefill)
        self.prompt_chunk = prompt_chunk(model)

    def __call__(self, ids: Sequence[int] | np.ndarray | Tensor) -> Tensor:
        """The logits (batch, length, vocab) of token ids (length,) or (batch, length), from position 0."""
        return self.model(_tokens(ids, self.max_context, self.model.device), 0)

    def prefill(self, ids: Sequence[int] | np.ndarray | Tensor) -> np.ndarray:
        """The prompt `ids` (length,) into the KV cache from position 0, and the logits of its last position (vocab,):
        what generation starts from (the output layer runs for that position alone).

        The prompt runs in chunks of `prompt_chunk` tokens, the last one padded to a power of two of at least
        PROMPT_BUCKET (at most the context); each is one pass at its start position (a bound Variable, a multiple of
        the chunk) through a TinyJit of its padded length: its kernels are built once for every chunk and prompt of
        that length and replay with no graph built (the Python of a 32-token pass took three times its kernels' time).
        A pass holds the activations of its chunk alone (a 512-token prompt of a 1B Q4_0 model in one pass held 175
        MB more than the weights, the scores of 32 heads x 512 x 512 twice). The padding comes after the prompt: no
        position of the prompt attends to it, and the cache's places it fills are written again by the tokens
        generated there."""
        given = _token_ids(ids, self.max_context)
        if given.shape[0] != 1:
            raise ValueError(f"prefill() takes one prompt (length,), got token ids of shape {given.shape}")
        chunk = self.prompt_chunk
        for start in range(0, given.shape[1], chunk):
            part = given[0, start : start + chunk]
            size = min(self.max_context - start, max(PROMPT_BUCKET, 1 << (len(part) - 1).bit_length()))
            padded = np.zeros((1, size), np.int32)
            padded[0, : len(part)] = part
            index = Variable("chunk", 0, (self.max_context - size) // chunk).bind(start // chunk)
            last = Variable("at", 0, size - 1).bind(len(part) - 1)  # (the chunk's last position, in the padding's)
            # (the embeddings an argument only: no name holds a chunk's while the next chunk's are made)
            logits = self._prompt(self.model.embed(Tensor(padded, device=self.model.device)), index, last)
        return logits[0, 0].numpy()

    def _prefill(self, x: Tensor, index: Any, last: Any) -> Tensor:
        return self.model.run(x, index * self.prompt_chunk, last).realize()

    def format_chat(self, messages: Sequence[dict[str, str]]) -> str:
        """The prompt for a conversation ({"role": ..., "content": ...} each), through the model's chat template
        (jinja2), ready for the assistant's reply; where the model has none, "role: content" lines."""
        if self.chat_template is None:
            return "".join(f"{m['role']}: {m['content']}\n" for m in messages) + "assistant:"
        try:
            import jinja2
        except ImportError:
            raise ImportError("chat templates are read with jinja2: pip install 'tiny-tensor[llm]'") from None
        env = jinja2.Environment(autoescape=False, trim_blocks=True, lstrip_blocks=True)  # noqa: S701  (text, not HTML)
        env.globals["raise_exception"] = _template_error
        template = env.from_string(self.chat_template)
        return template.render(messages=list(messages), add_generation_prompt=True, **self.special_tokens)

    def _decode(self, token: Any, pos: Any) -> Tensor:
        return self.model(token, pos, last=True)[:, -1].realize()

    def generate(
        self,
        ids: Sequence[int],
        max_new_tokens: int = 32,
        temperature: float = 0.0,
        top_k: int = 0,
        top_p: float = 1.0,
        seed: int | None = None,
        stop: Sequence[int] | None = None,
    ) -> list[int]:
        """The new token ids after the prompt `ids` (at most max_new_tokens, ending at a stop token, which is kept).
        temperature 0 is greedy; else sampling from the softmax at that temperature, kept to the top_k most likely
        (0: all) and to the smallest set whose probability reaches top_p, with a seeded generator."""
        return list(self.stream(ids, max_new_tokens, temperature, top_k, top_p, seed, stop))

    def stream(
        self,
        ids: Sequence[int],
        max_new_tokens: int = 32,
        temperature: float = 0.0,
        top_k: int = 0,
        top_p: float = 1.0,
        seed: int | None = None,
        stop: Sequence[int] | None = None,
    ) -> Iterator[int]:
        """generate(), one token id at a time as each is computed."""
        prompt = [int(i) for i in ids]
        if not prompt:
            raise ValueError("generate() needs a prompt of at least one token")
        if not isinstance(max_new_tokens, int) or max_new_tokens < 0:
            raise ValueError(f"max_new_tokens must be an int >= 0, got {max_new_tokens!r}")
        if len(prompt) + max_new_tokens > self.max_context:
            raise ValueError(
                f"a prompt of {len(prompt)} tokens and {max_new_tokens} new ones is past the context of "
                f"{self.max_context} tokens"
            )
        _check_sampling(temperature, top_k, top_p)
        stops = set(self.eos_token_ids if stop is None else stop)
        # (greedy draws nothing: numpy.random, and the OpenSSL it imports for seeds, 6 MB resident, stay unloaded)
        rng = np.random.default_rng(seed) if temperature else None
        logits = self.prefill(prompt)
        pos = len(prompt)
        for i in range(max_new_tokens):
            token = _sample(logits, temperature, top_k, top_p, rng)
            yield token
            if token in stops or i == max_new_tokens - 1:
                return
            logits = self._step(self._token.bind(token), self._pos.bind(pos))[0].numpy()
            pos += 1


# prompts are padded to a power of two of at least this many tokens (LLM.prefill): one jitted pass a length
PROMPT_BUCKET = 16
# ... and longer ones run in chunks (LLM.prompt_chunk) of at most this many tokens, a power of two
PROMPT_CHUNK_MOST = 512
# ... fewer where a chunk's activations and the KV cache together would pass this share of the weights' bytes: the
# memory a model takes is then about its weights', whatever the prompt (a 1B model at a context of 520 with a float16
# cache: Q4_0 in chunks of 32, Q8_0 128, F16 256; F32 512 with a float32 cache)
SCRATCH_SHARE = 1 / 16


def prompt_chunk(model: Llama | GPT2) -> int:
    """The tokens of one prefill pass of `model`: the largest power of two from PROMPT_BUCKET to PROMPT_CHUNK_MOST
    whose activations and the KV cache stay within SCRATCH_SHARE of the weights' bytes. A token's activations,
    estimated: its scores over the context and their softmax, the feed-forward's hidden values (3 of them), and 8 of
    the model's width, in float32. (The cache counts: a 4-bit 1B model's float16 cache is 3.5% of its weights; in
    chunks of 64 its peak was 1.27x its file, in chunks of 32, as fast, 1.22x.)"""
    cfg = model.cfg
    if isinstance(cfg, GPT2Config):
        heads, width, ffn = cfg.n_head, cfg.n_embd, cfg.n_inner or 4 * cfg.n_embd
        caches, kv_width = [block.attn.cache for block in model.h], width
    else:
        heads, width, ffn = cfg.num_attention_heads, cfg.hidden_size, cfg.intermediate_size
        caches = [block.self_attn.cache for block in model.model.layers]
        kv_width = cfg.num_key_value_heads * cfg.head_dim
    per_token = 4 * (2 * heads * model.max_context + 3 * ffn + 8 * width)
    kept = (caches[0].dtype or dtypes.float32).itemsize if caches else 4  # (none given: the activations' float32)
    cache = 2 * len(caches) * model.max_context * kv_width * kept  # (keys and values, every layer)
    budget = SCRATCH_SHARE * _weight_bytes(model) - cache
    chunk = PROMPT_CHUNK_MOST
    while chunk > PROMPT_BUCKET and chunk * per_token > budget:
        chunk //= 2
    return chunk


def _weight_bytes(model: Llama | GPT2) -> int:
    """The bytes of memory the model's weights read (a quantized weight's blocks; a tied weight once)."""
    held: dict[int, int] = {}
    for owner, attr, _, _ in model.parameters_by_name().values():
        for node in getattr(owner, attr).uop.toposort:
            if node.op is Ops.BUFFER:
                held[id(node)] = buffer_of(node).nbytes
    return sum(held.values())


def _tokens(ids: Any, context: int, device: str | None) -> Tensor:
    if not isinstance(ids, Tensor):
        return Tensor(_token_ids(ids, context), device=device)
    t = ids.reshape(1, -1) if ids.ndim == 1 else ids
    _check_tokens(t.shape, context)
    return t


def _token_ids(ids: Any, context: int) -> np.ndarray:
    """Token ids as an int32 array (batch, length), checked."""
    arr = np.asarray(ids.numpy() if isinstance(ids, Tensor) else ids)
    arr = arr.reshape(1, -1) if arr.ndim == 1 else arr
    _check_tokens(arr.shape, context)
    if arr.dtype.kind not in "iu":
        raise TypeError(f"token ids must be integers, got {arr.dtype}")
    return arr.astype(np.int32)


def _check_tokens(shape: tuple[int, ...], context: int) -> None:
    if len(shape) != 2 or shape[1] == 0:
        raise ValueError(f"token ids must be (length,) or (batch, length) with length >= 1, got shape {shape}")
    if shape[1] > context:
        raise ValueError(f"{shape[1]} tokens are past the model's context of {context}")


def _check_sampling(temperature: float, top_k: int, top_p: float) -> None:
    if not isinstance(temperature, (int, float)) or temperature < 0:
        raise ValueError(f"temperature must be a number >= 0, got {temperature!r}")
    if not isinstance(top_k, int) or top_k < 0:
        raise ValueError(f"top_k must be an int >= 0 (0: no limit), got {top_k!r}")
    if not isinstance(top_p, (int, float)) or not 0 < top_p <= 1:
        raise ValueError(f"top_p must be in (0, 1], got {top_p!r}")


def _sample(logits: np.ndarray, temperature: float, top_k: int, top_p: float, rng: np.random.Generator | None) -> int:
    if rng is None:  # (greedy: temperature 0)
        return int(np.argmax(logits))
    z = logits.astype(np.float64) / temperature
    order = np.argsort(-z, kind="stable")
    if top_k:
        order = order[:top_k]
    p = np.exp(z[order] - z[order[0]])
    p /= p.sum()
    if top_p < 1:
        keep = int(np.searchsorted(np.cumsum(p), top_p) + 1)
        order, p = order[:keep], p[:keep] / p[:keep].sum()
    return int(order[rng.choice(len(order), p=p)])


# ---------------------------------------------------------------- loading


def load(
    path: str | os.PathLike,
    device: str | None = None,
    max_context: int | None = None,
    cache_dtype: DType | str | None = None,
) -> LLM:
    """A model from a Hugging Face folder (config.json, model.safetensors or its sharded index, and tokenizer.json
    if there is one) or a GGUF file. Weights are read lazily from the files straight into the device's memory.

    cache_dtype: what the KV cache keeps, float32 or float16 (half the memory and the bytes a decode step's attention
    reads). None: float16 for a GGUF file, as llama.cpp keeps its cache; float32 for a folder, as transformers."""
    folder = Path(path)
    gguf = folder.is_file() and folder.suffix == ".gguf"
    kept = _cache_dtype(cache_dtype, dtypes.float16 if gguf else dtypes.float32)
    if gguf:
        return _load_gguf(folder, device, max_context, kept)
    if not folder.is_dir():
        raise FileNotFoundError(f"load() takes a Hugging Face model folder or a .gguf file; {str(folder)!r} is neither")
    config_path = folder / "config.json"
    if not config_path.is_file():
        raise FileNotFoundError(f"{folder} has no config.json: not a Hugging Face model folder")
    cfg = json.loads(config_path.read_text())
    arch = (cfg.get("architectures") or ["?"])[0]
    if arch not in ARCHITECTURES:
        raise ValueError(f"{folder}: architecture {arch!r} is not supported (these are: {', '.join(ARCHITECTURES)})")
    model: Llama | GPT2
    with skip_init():  # (the weights come from the files: no random ones first)
        if arch == "GPT2LMHeadModel":
            model = GPT2(GPT2Config.from_hf(cfg), max_context, device, kept)
        else:
            model = Llama(LlamaConfig.from_hf(cfg), max_context, device, cache_dtype=kept)
    weights = read_weights(folder, device)
    if isinstance(model, Llama):  # (the products' matrices in panels where the device's products read them)
        products = [n for n, (_, _, shape, _) in model.parameters_by_name().items() if len(shape) == 2]
        weights |= read_panels(folder, [n for n in products if n != "model.embed_tokens.weight"], device)
    _load_weights(model, weights, folder)
    template, special = _chat_template(folder)
    return LLM(model, _tokenizer(folder), _eos(cfg, folder), template, special)


# the dtypes a KV cache may keep
CACHE_DTYPES = ("float32", "float16")


def _cache_dtype(given: DType | str | None, default: DType) -> DType:
    if given is None:
        return default
    name = given.name if isinstance(given, DType) else given
    if name not in CACHE_DTYPES:
        raise ValueError(f"cache_dtype must be one of {', '.join(CACHE_DTYPES)} (or None), got {given!r}")
    return getattr(dtypes, name)


def _load_weights(model: Llama | GPT2, weights: dict[str, Tensor], folder: Path, lazy: bool = False) -> None:
    """Each weight into the model's attribute of its name, checked for shape; every name the model has and the files
    lack (and the other way round) listed in one error. lazy: weights that are graphs over stored blocks (a GGUF
    file's quantized tensors) stay graphs, computed by the kernels that read them; the others are realized."""
    targets = model.parameters_by_name()
    weights = {_plain_name(k): v for k, v in weights.items() if not k.endswith(_IGNORED)}
    if isinstance(model, GPT2) or model.cfg.tie_word_embeddings:  # (the output is the embedding: a copy is no news)
        weights.pop("lm_head.weight", None)
    missing = [k for k in targets if k not in weights]
    unexpected = [k for k in weights if k not in targets]
    bad = [
        f"{k}: {weights[k].shape} for {targets[k][2]}"
        for k in targets
        if k in weights and weights[k].shape != targets[k][2]
    ]
    if missing or unexpected or bad:
        lines = (
            [f"missing {k}" for k in missing] + [f"unexpected {k}" for k in unexpected] + [f"shape {b}" for b in bad]
        )
        raise ValueError(f"{folder}: the weights do not fit the config:\n  " + "\n  ".join(lines))
    for name, (owner, attr, _, transposed) in targets.items():
        loaded = weights.pop(name)  # (what the dict holds no more is freed as it is replaced)
        if form_of(loaded) is not None:  # (kept in the form its products read: the float32 graph over it)
            setattr(owner, attr, loaded)
            continue
        if not lazy and loaded.dtype == dtypes.float32 and not transposed:
            loaded = loaded.realize()  # (read from its file into the buffer that becomes the weight: one copy)
        w = loaded.cast(dtypes.float32)
        w = w.T if transposed else w
        if is_realized(w.uop) and is_memory(w.uop) and not transposed:
            setattr(owner, attr, w)  # float32 in memory already: no copy (a model would take twice its size)
        else:
            setattr(owner, attr, w if lazy and not is_realized(loaded.uop) else w.contiguous().realize())
    if isinstance(model, Llama) and model.cfg.tie_word_embeddings:
        model.tie()


# ---------------------------------------------------------------- GGUF (llama.cpp's files)

# llama.cpp's name of each weight of a block, and Hugging Face's
_GGUF_BLOCK = {
    "attn_norm.weight": "input_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_q.bias": "self_attn.q_proj.bias",
    "attn_k.bias": "self_attn.k_proj.bias",
    "attn_v.bias": "self_attn.v_proj.bias",
    "attn_output.weight": "self_attn.o_proj.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}
# each layer's query, key and value weights (and biases) read as one tensor where they are of one type (gguf_load's
# joins): one product reads them, and the model's three weights are views of it (Attention.join)
_LOOKUPS = ("token_embd.weight", "position_embd.weight")  # (tensors read by rows)
_QKV_JOINS = {f"attn_qkv.{kind}": tuple(f"attn_{p}.{kind}" for p in "qkv") for kind in ("weight", "bias")}
_QKV = tuple(_QKV_JOINS)


_GGUF_ARCHS = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM", "qwen2": "Qwen2ForCausalLM"}


def _load_gguf(path: Path, device: str | None, max_context: int | None, cache_dtype: DType) -> LLM:
    """A LLaMA-family model from a GGUF file as llama.cpp writes it: its metadata is the config (and the tokenizer and
    chat template, where it has them), its tensors (any type tiny.nn.gguf reads, kept as stored: the kernels that
    read them dequantize) the weights under llama.cpp's names. llama.cpp's converter orders a LLaMA's query and key
    rows for rotating adjacent pairs; the model rotates them so (LlamaConfig.rope_interleaved), and the weights stay
    as the file has them."""
    from tiny.nn.gguf import gguf_load

    # (every type stays as stored; Q8_0 and Q4_0 matrices as words for products of bytes where the device multiplies
    # bytes, F32, F16 and BF16 ones in panels where its products read them, but the embedding tables, read by rows:
    # a tied output's product over the token embedding stays the float32 one)
    tensors, meta = gguf_load(path, dequantize=False, device=device, lookups=_LOOKUPS, joins=_QKV_JOINS)
    arch = meta.get("general.architecture")
    if arch not in _GGUF_ARCHS:
        raise ValueError(f"{path}: GGUF architecture {arch!r} is not supported (these are: {', '.join(_GGUF_ARCHS)})")

    def key(name: str, default: Any = None) -> Any:
        value = meta.get(f"{arch}.{name}", default)
        if value is None:
            raise ValueError(f"{path}: the GGUF metadata has no {arch}.{name}")
        return value

    heads, hidden = int(key("attention.head_count")), int(key("embedding_length"))
    kv_heads = int(key("attention.head_count_kv", heads))
    vocab = meta.get(f"{arch}.vocab_size") or tensors["token_embd.weight"].shape[0]
    head_dim = int(meta.get(f"{arch}.attention.key_length") or hidden // heads)
    tied = "output.weight" not in tensors
    config = LlamaConfig(
        vocab_size=int(vocab),
        hidden_size=hidden,
        intermediate_size=int(key("feed_forward_length")),
        num_hidden_layers=int(key("block_count")),
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        head_dim=head_dim,
        rms_norm_eps=float(key("attention.layer_norm_rms_epsilon", 1e-5)),
        rope_theta=float(key("rope.freq_base", 10000.0)),
        max_position_embeddings=int(key("context_length")),
        tie_word_embeddings=tied,
        attention_bias=any(f"blk.0.attn_{p}.bias" in tensors for p in ("q", "qkv")),
        architecture=_GGUF_ARCHS[arch],
        # llama.cpp's converter orders a LLaMA's (and Mistral's) query and key rows for rotating adjacent pairs;
        # Qwen2's it keeps in Hugging Face's order (the halves of each head), which llama.cpp rotates as such
        rope_interleaved=arch in ("llama", "mistral"),
    )
    factors = tensors.pop("rope_freqs.weight", None)
    with skip_init():
        model = Llama(config, max_context, device, None if factors is None else factors.numpy(), cache_dtype)
    weights: dict[str, Tensor] = {"model.embed_tokens.weight": tensors.pop("token_embd.weight")}
    weights["model.norm.weight"] = tensors.pop("output_norm.weight")
    if not tied:
        weights["lm_head.weight"] = tensors.pop("output.weight")
    joined: dict[str, dict[str, Tensor]] = {}  # (each layer's query, key and value read as one: by layer and kind)
    for name, t in tensors.items():
        parts = name.split(".", 2)
        if parts[0] == "blk" and len(parts) == 3 and parts[2] in _QKV:
            kind = parts[2].rsplit(".", 1)[1]
            joined.setdefault(parts[1], {})[kind] = t
            for p, view in zip("qkv", t.split([heads * head_dim, kv_heads * head_dim, kv_heads * head_dim])):
                weights[f"model.layers.{parts[1]}.self_attn.{p}_proj.{kind}"] = view  # (views of the joined one)
            continue
        if parts[0] != "blk" or len(parts) != 3 or parts[2] not in _GGUF_BLOCK:
            weights[name] = t  # (reported as unexpected)
            continue
        hf = f"model.layers.{parts[1]}.{_GGUF_BLOCK[parts[2]]}"
        weights[hf] = t
    _load_weights(model, weights, path, lazy=True)
    for layer, kinds in joined.items():  # (the names checked: each layer is the model's)
        if "weight" in kinds:
            model.model.layers[int(layer)].self_attn.join(kinds["weight"], kinds.get("bias"))
    eos = meta.get("tokenizer.ggml.eos_token_id")
    template = meta.get("tokenizer.chat_template")
    return LLM(
        model,
        tokenizer_from_metadata(meta, path),
        [int(eos)] if isinstance(eos, int) else [],
        template if isinstance(template, str) else None,
        special_tokens(meta),
    )


# buffers some checkpoints carry that are not weights (rotary tables, GPT-2's causal masks)
_IGNORED = ("rotary_emb.inv_freq", ".attn.bias", ".attn.masked_bias")


def _plain_name(name: str) -> str:
    """A weight's name without GPT2LMHeadModel's "transformer." (the base model's files have none)."""
    return name.removeprefix("transformer.")


def _tokenizer(folder: Path) -> Any:
    path = folder / "tokenizer.json"
    if not path.is_file():
        return None
    try:
        from tokenizers import Tokenizer
    except ImportError:
        raise ImportError(
            f"{folder} has a tokenizer.json, read with the `tokenizers` library: pip install 'tiny-tensor[llm]'"
        ) from None
    return Tokenizer.from_file(str(path))


def _chat_template(folder: Path) -> tuple[str | None, dict[str, str]]:
    """The chat template (chat_template.jinja, as transformers saves it now, else tokenizer_config.json's) and the
    special tokens it may name (bos_token, eos_token)."""
    path, separate = folder / "tokenizer_config.json", folder / "chat_template.jinja"
    cfg = json.loads(path.read_text()) if path.is_file() else {}
    special = {}
    for key in ("bos_token", "eos_token"):
        value = cfg.get(key)
        if isinstance(value, dict):
            value = value.get("content")
        if isinstance(value, str):
            special[key] = value
    template = separate.read_text() if separate.is_file() else cfg.get("chat_template")
    return (template if isinstance(template, str) else None), special


def _template_error(message: str) -> None:
    raise ValueError(f"the chat template refused the conversation: {message}")


def _eos(cfg: dict[str, Any], folder: Path) -> list[int]:
    found = cfg.get("eos_token_id")
    generation = folder / "generation_config.json"
    if found is None and generation.is_file():
        found = json.loads(generation.read_text()).get("eos_token_id")
    if found is None:
        return []
    return [int(x) for x in (found if isinstance(found, list) else [found])]
