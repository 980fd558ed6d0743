"""The tokenizer a GGUF file carries in its metadata (llama.cpp's `tokenizer.ggml.*` keys), as a Hugging Face
`tokenizers.Tokenizer`: the same object a model folder's tokenizer.json gives, so `LLM` reads and writes text alike.

Two kinds of vocabulary are rebuilt, as llama.cpp's converter writes them:

- "gpt2": byte-level BPE (GPT-2, Llama 3, Qwen2): the tokens (bytes mapped to printable characters), the merges in
  rank order, and the pre-tokenizer's split pattern named by `tokenizer.ggml.pre`.
- "llama": SentencePiece BPE (Llama 2, Mistral): the pieces with their scores; the merges are every split of a piece
  into two pieces, ranked by the merged piece's score (the higher first), which is the order SentencePiece's BPE
  merges in. Spaces are "▁", the text gets a leading "▁", and bytes no piece covers become `<0xNN>` tokens.

Control tokens (type 3) and the unknown token (2) are special tokens, user-defined ones (4) added tokens: each
encodes as one id wherever it stands in the text. The BOS (and EOS) token is added to each encoding as
`tokenizer.ggml.add_bos_token` (`add_eos_token`) says, or else as llama.cpp does by default (BOS for "llama" and
Llama 3's, none for the others).

>>> from tiny.nn.gguf import gguf_load  # doctest: +SKIP
>>> _, meta = gguf_load("model.gguf")  # doctest: +SKIP
>>> tokenizer_from_metadata(meta, "model.gguf").encode("Hello world").ids  # doctest: +SKIP
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

# llama.cpp's token types (gguf.TokenType)
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6

# GPT-2's split pattern (what `pre_tokenizers.ByteLevel(use_regex=True)` applies): contractions, letters, digits,
# other symbols, each with at most one space before it; runs of spaces keep their last one for the next word
GPT2_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
# Llama 3's: contractions of any case, a letter run with one non-letter before it, digits three at a time, symbols
# with the line breaks after them, line breaks with the spaces before them
LLAMA3_PATTERN = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"""
    r"""|\s+(?!\S)|\s+"""
)
# Qwen2's: Llama 3's with one digit at a time
QWEN2_PATTERN = LLAMA3_PATTERN.replace(r"\p{N}{1,3}", r"\p{N}")

# tokenizer.ggml.pre -> the split pattern (any other: GPT-2's)
_LLAMA3_PRES = ("llama-bpe", "llama3", "llama-v3", "smaug-bpe", "dbrx", "falcon3")
_PATTERNS = {"gpt-2": GPT2_PATTERN, "qwen2": QWEN2_PATTERN} | dict.fromkeys(_LLAMA3_PRES, LLAMA3_PATTERN)

_KEY = "tokenizer.ggml."
SPACE = "\u2581"  # SentencePiece's "▁"


def tokenizer_from_metadata(meta: Mapping[str, Any], path: str | os.PathLike) -> Any:
    """The `tokenizers.Tokenizer` of a GGUF file's metadata; None where it has no vocabulary or one of another kind
    than "gpt2" and "llama" (the model still runs on ids). A byte-level vocabulary whose `tokenizer.ggml.pre` is
    none of GPT-2's, Llama 3's or Qwen2's splits its text as GPT-2 does: the right ids for most text, but not always
    the model's own (numbers, line breaks and non-Latin scripts may split otherwise). A vocabulary whose lists
    disagree in length, or whose special ids are out of range, is a ValueError naming the file and the keys."""
    kind, tokens = meta.get(_KEY + "model"), meta.get(_KEY + "tokens")
    if kind not in ("gpt2", "llama") or tokens is None:
        return None
    tokens = _strings(tokens, "tokens", path)
    types = _list(meta, "token_type", len(tokens), NORMAL, path)
    try:
        import tokenizers
    except ImportError:
        raise ImportError(
            f"{path} has a tokenizer, read with the `tokenizers` library: pip install 'tiny-tensor[llm]'"
        ) from None
    if kind == "gpt2":
        tok = _byte_level_bpe(tokenizers, meta, tokens, path)
    else:
        scores = [float(s) for s in _list(meta, "scores", len(tokens), 0.0, path)]
        tok = _sentencepiece_bpe(tokenizers, meta, tokens, scores, types, path)
    specials = [i for i, t in enumerate(types) if t in (CONTROL, UNKNOWN)]
    tok.add_special_tokens([tokenizers.AddedToken(tokens[i], special=True, normalized=False) for i in specials])
    tok.add_tokens(
        [tokenizers.AddedToken(tokens[i], normalized=False) for i, t in enumerate(types) if t == USER_DEFINED]
    )
    tok.post_processor = _bos_eos(tokenizers, meta, tokens, path, default_bos=kind == "llama" or _is_llama3(meta))
    return tok


def special_tokens(meta: Mapping[str, Any]) -> dict[str, str]:
    """The BOS and EOS tokens' text ({"bos_token": ..., "eos_token": ...}, where the file names them), which chat
    templates write."""
    tokens, out = meta.get(_KEY + "tokens"), {}
    for name in ("bos", "eos"):
        i = meta.get(f"{_KEY}{name}_token_id")
        if isinstance(tokens, list) and isinstance(i, int) and 0 <= i < len(tokens) and isinstance(tokens[i], str):
            out[f"{name}_token"] = tokens[i]
    return out


def _is_llama3(meta: Mapping[str, Any]) -> bool:
    return meta.get(_KEY + "pre") in _LLAMA3_PRES


def _byte_level_bpe(tokenizers: Any, meta: Mapping[str, Any], tokens: list[str], path: Any) -> Any:
    """GPT-2-style BPE: byte-level tokens and ranked merges ("left right" each); Llama 3's takes a word that is a
    token whole before merging (its tokenizer.json's ignore_merges)."""
    merges = meta.get(_KEY + "merges")
    if merges is None:
        raise ValueError(
            f"{path}: a byte-level BPE vocabulary (tokenizer.ggml.model 'gpt2') needs tokenizer.ggml.merges"
        )
    pairs = []
    for i, m in enumerate(_strings(merges, "merges", path)):
        left, space, right = m.partition(" ")
        if not space or not left or not right:
            raise ValueError(f"{path}: tokenizer.ggml.merges[{i}] is {m!r}, not two tokens split by a space")
        pairs.append((left, right))
    model = tokenizers.models.BPE(_vocab(tokens), pairs, ignore_merges=_is_llama3(meta))
    tok = tokenizers.Tokenizer(model)
    pattern = _PATTERNS.get(meta.get(_KEY + "pre"), GPT2_PATTERN)
    tok.pre_tokenizer = tokenizers.pre_tokenizers.Sequence(
        [
            tokenizers.pre_tokenizers.Split(tokenizers.Regex(pattern), behavior="isolated"),
            tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    if pattern == QWEN2_PATTERN:
        tok.normalizer = tokenizers.normalizers.NFC()  # (Qwen2's tokenizer.json composes characters first)
    tok.decoder = tokenizers.decoders.ByteLevel()
    return tok


def _sentencepiece_bpe(
    tokenizers: Any, meta: Mapping[str, Any], tokens: list[str], scores: list[float], types: list[int], path: Any
) -> Any:
    """SentencePiece BPE: merges from the pieces' scores, byte fallback to `<0xNN>`, "▁" for spaces and before the
    text (unless tokenizer.ggml.add_space_prefix is false), as Llama 2's tokenizer.json does."""
    vocab = _vocab(tokens)
    normal = {t for t, kind in zip(tokens, types, strict=True) if kind == NORMAL}
    ranked = []  # (-score of the merged piece, its id, left id, right id, left, right)
    for t in normal:
        i = vocab[t]
        for cut in range(1, len(t)):
            left, right = t[:cut], t[cut:]
            if left in normal and right in normal:
                ranked.append((-scores[i], i, vocab[left], vocab[right], left, right))
    ranked.sort()  # (equal scores: the vocabulary's order, which is SentencePiece's)
    unk = _special_id(meta, "unknown", len(tokens), path)
    if unk is None:
        unk = next((i for i, kind in enumerate(types) if kind == UNKNOWN), None)
    model = tokenizers.models.BPE(
        vocab,
        [(r[4], r[5]) for r in ranked],
        unk_token=None if unk is None else tokens[unk],
        fuse_unk=True,
        byte_fallback=BYTE in types,
    )
    tok = tokenizers.Tokenizer(model)
    prefix = bool(meta.get(_KEY + "add_space_prefix", True))
    norm = [tokenizers.normalizers.Replace(" ", SPACE)]
    tok.normalizer = tokenizers.normalizers.Sequence([tokenizers.normalizers.Prepend(SPACE), *norm] if prefix else norm)
    steps = [tokenizers.decoders.Replace(SPACE, " "), tokenizers.decoders.ByteFallback(), tokenizers.decoders.Fuse()]
    tok.decoder = tokenizers.decoders.Sequence([*steps, tokenizers.decoders.Strip(" ", 1, 0)] if prefix else steps)
    return tok


def _bos_eos(tokenizers: Any, meta: Mapping[str, Any], tokens: list[str], path: Any, default_bos: bool) -> Any:
    """The post-processor that puts BOS before (and EOS after) each encoding; None where neither is added."""
    ends = []
    for name, flag, default in (("bos", "add_bos_token", default_bos), ("eos", "add_eos_token", False)):
        i = _special_id(meta, name, len(tokens), path)
        ends.append(tokens[i] if i is not None and bool(meta.get(_KEY + flag, default)) else None)
    bos, eos = ends
    if bos is None and eos is None:
        return None
    specials = [(t, _special_id(meta, n, len(tokens), path)) for t, n in ((bos, "bos"), (eos, "eos")) if t]
    single = [t for t in (bos, "$A", eos) if t]
    pair = [t for t in (bos, "$A", eos, bos, "$B:1", eos) if t]
    return tokenizers.processors.TemplateProcessing(single=single, pair=pair, special_tokens=specials)


def _special_id(meta: Mapping[str, Any], name: str, n: int, path: Any) -> int | None:
    key = f"{_KEY}{name}_token_id"
    i = meta.get(key)
    if i is None:
        return None
    if not isinstance(i, int) or not 0 <= i < n:
        raise ValueError(f"{path}: {key} is {i!r}, not the id of one of its {n} tokens")
    return i


def _vocab(tokens: list[str]) -> dict[str, int]:
    """Each token's id (the first, where a token's text is written twice)."""
    vocab: dict[str, int] = {}
    for i, t in enumerate(tokens):
        vocab.setdefault(t, i)
    return vocab


def _strings(value: Any, name: str, path: Any) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ValueError(f"{path}: tokenizer.ggml.{name} is not a list of strings")
    return value


def _list(meta: Mapping[str, Any], name: str, n: int, default: Any, path: Any) -> list[Any]:
    """tokenizer.ggml.<name>, one entry a token ([default] * n where the file has none)."""
    value = meta.get(_KEY + name)
    if value is None:
        return [default] * n
    if not isinstance(value, list) or len(value) != n:
        got = f"{len(value)} entries" if isinstance(value, list) else type(value).__name__
        raise ValueError(f"{path}: tokenizer.ggml.{name} has {got} for the {n} of tokenizer.ggml.tokens")
    return value
