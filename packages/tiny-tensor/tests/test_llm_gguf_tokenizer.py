"""Tokenizers embedded in GGUF files against the Hugging Face tokenizers they were converted from: small vocabularies
trained here (no model hub is reachable), written to GGUF as llama.cpp's converter writes them, read back by
tiny.llm, and checked to encode a set of varied strings to the reference's ids and to decode them back to the text.
Byte-level BPE (GPT-2's split, and Llama 3's with its special tokens) is checked against transformers' fast
tokenizer; SentencePiece BPE (Llama 2's kind) against sentencepiece itself and transformers' LlamaTokenizer."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from test_llm import _write_gguf

from tiny.llm import load
from tiny.llm.gguf_tokenizer import tokenizer_from_metadata
from tiny.nn.gguf import gguf_load

tokenizers = pytest.importorskip("tokenizers")
transformers = pytest.importorskip("transformers")
gguf = pytest.importorskip("gguf")
torch = pytest.importorskip("torch")

NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6  # llama.cpp's token types

_WORDS = (
    "the quick brown fox jumps over lazy dog while tokenizers learn merges from text and numbers like 2024 or 3.14 "
    "it's they're we'll I'd you've she's HELLO World café naïve résumé über straße Ω π λ東京 Привет мир"
).split()
_SYLLABLES = "ka to ri men sha lo pe dra qui zon ve ly ste ban gor fi nu hel tra cko".split()
# the words above and made-up ones of two to four syllables (enough pairs for hundreds of merges)
_WORDS += ["".join(_SYLLABLES[(i * k * 7 + k * k + i) % len(_SYLLABLES)] for k in range(2 + i % 3)) for i in range(300)]
# a few hundred lines of words, digits, punctuation, code and line breaks
CORPUS = [
    " ".join(_WORDS[(i * 37 + j * 11) % len(_WORDS)] for j in range(4 + i % 9))
    + [".", ",", "!", "?", ":", ";", " (x)", " 42"][i % 8]
    + ("\n" if i % 5 == 0 else "")
    + ("    return f(x) + 1  # done\n" if i % 11 == 0 else "")
    for i in range(400)
]
TEXTS = [
    "Hello world",
    "the quick brown fox jumps over the lazy dog.",
    " leading space, two  spaces and   three, trailing ",
    "line one\nline two\n\n\tindented\r\nwindows",
    "digits 1234567 and 3.14159, 2024-01-02 12:30",
    "unicode: café naïve Ω π 東京 Привет мир straße",
    "emoji 🙂🚀 and 👩‍💻 zero-width joiner",
    "it's they're I'LL we'd YOU'VE",
    "code: def f(x):\n    return x**2  # comment",
    "",
    " ",
    "a\n\n\n",
]
LLAMA3_SPECIALS = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]
# Meta's Llama 3 split, written out here (not taken from tiny's module)
LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
LLAMA3_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<|start_header_id|>{{ m['role'] }}<|end_header_id|>\n\n"
    "{{ m['content'] | trim }}<|eot_id|>{% endfor %}"
    "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}"
)


def _byte_level(pre: str) -> Any:
    """A byte-level BPE of a few hundred merges trained on CORPUS, as transformers' fast tokenizer: GPT-2's split
    and <|endoftext|> ("gpt-2"), or Llama 3's split, special tokens, BOS added and whole-word tokens ("llama-bpe");
    both with a user-defined (not special) token, <tool>."""
    pt = tokenizers.pre_tokenizers
    llama3 = pre == "llama-bpe"
    tok = tokenizers.Tokenizer(tokenizers.models.BPE(ignore_merges=llama3))
    if llama3:
        split = pt.Split(tokenizers.Regex(LLAMA3_SPLIT), behavior="isolated")
        tok.pre_tokenizer = pt.Sequence([split, pt.ByteLevel(add_prefix_space=False, use_regex=False)])
    else:
        tok.pre_tokenizer = pt.ByteLevel(add_prefix_space=False)
    tok.decoder = tokenizers.decoders.ByteLevel()
    trainer = tokenizers.trainers.BpeTrainer(
        vocab_size=256 + 400, initial_alphabet=pt.ByteLevel.alphabet(), show_progress=False
    )
    tok.train_from_iterator(CORPUS, trainer)
    assert tok.get_vocab_size() > 256 + 300  # (hundreds of merges)
    if llama3:
        tok.add_special_tokens(LLAMA3_SPECIALS)
        bos = LLAMA3_SPECIALS[0]
        tok.post_processor = tokenizers.processors.TemplateProcessing(
            single=f"{bos} $A", pair=f"{bos} $A {bos} $B:1", special_tokens=[(bos, tok.token_to_id(bos))]
        )
        fast = transformers.PreTrainedTokenizerFast(
            tokenizer_object=tok, bos_token=bos, eos_token="<|eot_id|>", chat_template=LLAMA3_TEMPLATE
        )
    else:
        tok.add_special_tokens(["<|endoftext|>"])
        fast = transformers.PreTrainedTokenizerFast(
            tokenizer_object=tok, bos_token="<|endoftext|>", eos_token="<|endoftext|>"
        )
    fast.add_tokens(["<tool>"])
    return fast


def _byte_level_metadata(fast: Any, folder: Path, pre: str, vocab_size: int | None = None) -> Any:
    """What llama.cpp's converter writes for a byte-level tokenizer (its get_vocab_base and gguf's SpecialVocab): every
    id's token (a [PAD<i>] of type UNUSED where the model's vocabulary is bigger), added tokens as CONTROL (special)
    or USER_DEFINED, then merges, special ids, add_bos and the chat template from the saved tokenizer files."""
    fast.save_pretrained(folder)
    reverse = {i: t for t, i in fast.get_vocab().items()}
    added, decoder = fast.get_added_vocab(), fast.added_tokens_decoder
    tokens, types = [], []
    for i in range(vocab_size or len(reverse)):
        if i not in reverse:
            tokens.append(f"[PAD{i}]")
            types.append(UNUSED)
            continue
        tokens.append(reverse[i])
        types.append((CONTROL if decoder[i].special else USER_DEFINED) if reverse[i] in added else NORMAL)

    def write(w: Any) -> None:
        w.add_tokenizer_model("gpt2")
        w.add_tokenizer_pre(pre)
        w.add_token_list(tokens)
        w.add_token_types(types)
        gguf.SpecialVocab(folder, load_merges=True, n_vocab=len(tokens)).add_to_gguf(w)

    return write


def _vocab_only(path: Path, write: Any) -> Any:
    """A GGUF file of the metadata `write` adds (and one small tensor); tiny's tokenizer of it."""
    w = gguf.GGUFWriter(str(path), "llama")
    write(w)
    w.add_tensor("token_embd.weight", np.zeros((2, 4), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    _, meta = gguf_load(path)
    tok = tokenizer_from_metadata(meta, path)
    assert tok is not None
    return tok


@pytest.mark.parametrize("pre", ["gpt-2", "llama-bpe"])
def test_byte_level_bpe_encodes_as_transformers(pre: str, tmp_path: Path) -> None:
    fast = _byte_level(pre)
    tok = _vocab_only(tmp_path / "v.gguf", _byte_level_metadata(fast, tmp_path / "hf", pre))
    specials = LLAMA3_SPECIALS if pre == "llama-bpe" else ["<|endoftext|>"]
    texts = [*TEXTS, f"{specials[0]}start {specials[-1]} mid<tool>end{specials[0]}", "a <tool> b <tool>"]
    bos = pre == "llama-bpe"
    for text in texts:
        want = fast.encode(text)
        got = tok.encode(text).ids
        assert got == want, text
        if bos:
            assert got[0] == fast.bos_token_id
        assert tok.decode(got[bos:], skip_special_tokens=False) == text
        assert tok.decode(got) == fast.decode(want, skip_special_tokens=True)
    assert tok.encode("\n".join(texts), add_special_tokens=False).ids == fast.encode(
        "\n".join(texts), add_special_tokens=False
    )


def _sentencepiece(folder: Path) -> tuple[Any, Path]:
    """A SentencePiece BPE trained on CORPUS as Llama 2's was set up: byte fallback, the identity normalization (no
    whitespace removal), a dummy prefix; <unk>, <s>, </s> as ids 0, 1, 2."""
    spm = pytest.importorskip("sentencepiece")
    folder.mkdir()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(CORPUS),
        model_prefix=str(folder / "tokenizer"),
        model_type="bpe",
        vocab_size=700,
        hard_vocab_limit=False,
        byte_fallback=True,
        character_coverage=0.99,
        normalization_rule_name="identity",
        remove_extra_whitespaces=False,
        add_dummy_prefix=True,
        allow_whitespace_only_pieces=True,
        minloglevel=2,
    )
    model = folder / "tokenizer.model"
    return spm.SentencePieceProcessor(model_file=str(model)), model


def _sentencepiece_metadata(sp: Any) -> Any:
    """What llama.cpp's converter writes for a SentencePiece model (_set_vocab_sentencepiece): each piece, its score
    and its type; the special ids; BOS added."""
    tokens, scores, types = [], [], []
    for i in range(sp.vocab_size()):
        tokens.append(sp.IdToPiece(i))
        scores.append(sp.GetScore(i))
        kind = NORMAL
        if sp.IsUnknown(i):
            kind = UNKNOWN
        elif sp.IsControl(i):
            kind = CONTROL
        elif sp.IsUnused(i):
            kind = UNUSED
        elif sp.IsByte(i):
            kind = BYTE
        types.append(kind)

    def write(w: Any) -> None:
        w.add_tokenizer_model("llama")
        w.add_tokenizer_pre("default")
        w.add_token_list(tokens)
        w.add_token_scores(scores)
        w.add_token_types(types)
        w.add_unk_token_id(sp.unk_id())
        w.add_bos_token_id(sp.bos_id())
        w.add_eos_token_id(sp.eos_id())
        w.add_add_bos_token(True)
        w.add_add_eos_token(False)

    return write


def test_sentencepiece_bpe_encodes_as_sentencepiece_and_transformers(tmp_path: Path) -> None:
    sp, model = _sentencepiece(tmp_path / "sp")
    assert sum(sp.IsByte(i) for i in range(sp.vocab_size())) == 256 and sp.vocab_size() > 256 + 300
    ref = transformers.LlamaTokenizer(vocab_file=str(model), legacy=True)  # (add_bos_token: True)
    tok = _vocab_only(tmp_path / "v.gguf", _sentencepiece_metadata(sp))
    for text in TEXTS:
        got = tok.encode(text).ids
        assert got == [sp.bos_id(), *sp.encode(text)], text
        assert got == ref.encode(text), text
        assert tok.decode(got) == sp.decode(got[1:]) == text
    assert any(sp.IsByte(i) for i in tok.encode(TEXTS[6]).ids)  # (the emoji: byte fallback)
    for text in ["<s>in the text</s>", "a</s>b <unk> c"]:  # special tokens in the text: one id each
        assert tok.encode(text).ids == ref.encode(text), text


@pytest.fixture(scope="module")
def llama3_gguf(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any]:
    """A small random Llama whose GGUF file carries a Llama-3-style vocabulary (three ids more than the tokenizer
    has, as [PAD] tokens) and chat template; (the file, the reference tokenizer)."""
    folder = tmp_path_factory.mktemp("llama3")
    fast = _byte_level("llama-bpe")
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=len(fast) + 3,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        bos_token_id=fast.bos_token_id,
        eos_token_id=fast.eos_token_id,
    )
    ref = transformers.LlamaForCausalLM(config).eval()
    write = _byte_level_metadata(fast, folder / "hf", "llama-bpe", config.vocab_size)
    _write_gguf(ref, folder / "m.gguf", "F32", write)
    return folder / "m.gguf", fast


def test_the_chat_template_and_special_tokens_come_from_the_gguf_file(llama3_gguf: tuple[Path, Any]) -> None:
    path, fast = llama3_gguf
    model = load(path)
    assert model.special_tokens == {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"}
    assert model.eos_token_ids == (fast.eos_token_id,)
    messages = [
        {"role": "system", "content": "Be brief. "},
        {"role": "user", "content": "what's 2024 + 1?"},
        {"role": "assistant", "content": "2025"},
        {"role": "user", "content": "and in émoji 🙂"},
    ]
    want = fast.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    prompt = model.format_chat(messages)
    assert prompt == want
    assert model.tokenizer.encode(prompt, add_special_tokens=False).ids == fast.encode(prompt, add_special_tokens=False)
    assert model.tokenizer.decode([len(fast) + 1]) == f"[PAD{len(fast) + 1}]"  # (an unused id)


def test_generate_from_the_command_line_with_the_gguf_vocabulary(llama3_gguf: tuple[Path, Any]) -> None:
    path, fast = llama3_gguf
    model = load(path)
    prompt = "the quick brown fox"
    ids = model.tokenizer.encode(prompt).ids
    assert ids == fast.encode(prompt) and ids[0] == fast.bos_token_id
    want = model.tokenizer.decode(model.generate(ids, max_new_tokens=8, stop=[]))
    cmd = [sys.executable, "-m", "tiny.llm", "generate", "--model", str(path), "--prompt", prompt]
    run = subprocess.run([*cmd, "--max-tokens", "8"], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    # (a random model's bytes: the command shows no incomplete character at the end, which decodes as U+FFFD)
    assert want.strip() and run.stdout.strip() == want.rstrip("\ufffd").strip()
    assert f"prompt: {len(ids)} tokens" in run.stderr


def _metadata_file(path: Path, **keys: Any) -> dict[str, Any]:
    """A GGUF file whose metadata is `keys` (tokenizer.ggml.<key>: a value, lists of str or float32); its metadata."""
    w = gguf.GGUFWriter(str(path), "llama")
    for key, value in keys.items():
        name = f"tokenizer.ggml.{key}"
        if isinstance(value, str):
            w.add_string(name, value)
        elif isinstance(value, int):
            w.add_uint32(name, value)
        else:
            w.add_array(name, value)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return gguf_load(path)[1]


def test_small_bad_and_missing_vocabularies(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    tokens = ["<unk>", "<s>", "</s>", "\u2581a", "a"]
    bad = _metadata_file(tmp_path / "bad.gguf", model="llama", tokens=tokens, scores=[0.0, 0.0, 0.0, -1.0])
    with pytest.raises(ValueError, match=r"bad\.gguf: tokenizer\.ggml\.scores has 4 entries for the 5 of tokenizer"):
        tokenizer_from_metadata(bad, tmp_path / "bad.gguf")
    types = _metadata_file(tmp_path / "types.gguf", model="llama", tokens=tokens, token_type=[1, 3])
    with pytest.raises(ValueError, match=r"types\.gguf: tokenizer\.ggml\.token_type has 2 entries"):
        tokenizer_from_metadata(types, tmp_path / "types.gguf")
    eos = _metadata_file(tmp_path / "eos.gguf", model="llama", tokens=tokens, eos_token_id=9)
    with pytest.raises(ValueError, match=r"eos\.gguf: tokenizer\.ggml\.eos_token_id is 9"):
        tokenizer_from_metadata(eos, tmp_path / "eos.gguf")
    merges = _metadata_file(tmp_path / "merges.gguf", model="gpt2", tokens=tokens, merges=["ab"])
    with pytest.raises(ValueError, match=r"merges\[0\] is 'ab'"):
        tokenizer_from_metadata(merges, tmp_path / "merges.gguf")
    # another kind of vocabulary, or none: no tokenizer, and no error
    assert (
        tokenizer_from_metadata(_metadata_file(tmp_path / "bert.gguf", model="bert", tokens=tokens), "bert.gguf")
        is None
    )
    assert tokenizer_from_metadata(_metadata_file(tmp_path / "none.gguf", model="llama"), "none.gguf") is None
    # an unknown split falls back to GPT-2's
    ok = _metadata_file(
        tmp_path / "ok.gguf", model="gpt2", pre="some-new-model", tokens=["a", "b", "ab"], merges=["a b"]
    )
    assert tokenizer_from_metadata(ok, "ok.gguf").encode("abab ba").ids == [2, 2, 1, 0]
    # SentencePiece merges by score, not by id: "bc" (-1) before "ab" (-2)
    scored = _metadata_file(
        tmp_path / "scored.gguf",
        model="llama",
        tokens=["<unk>", "\u2581", "a", "b", "c", "ab", "bc"],
        scores=[0.0, -10.0, -11.0, -12.0, -13.0, -2.0, -1.0],
        token_type=[UNKNOWN, NORMAL, NORMAL, NORMAL, NORMAL, NORMAL, NORMAL],
    )
    assert tokenizer_from_metadata(scored, "scored.gguf").encode("abc").ids == [1, 2, 6]
    # Llama 3's takes a word that is a token whole, though no merge makes it
    whole = _metadata_file(
        tmp_path / "whole.gguf", model="gpt2", pre="llama-bpe", tokens=["a", "b", "c", "ab", "abc"], merges=["a b"]
    )
    assert tokenizer_from_metadata(whole, "whole.gguf").encode("abc cab").ids == [4, 2, 3]
    monkeypatch.setitem(sys.modules, "tokenizers", None)  # (as if the [llm] extra were not installed)
    with pytest.raises(ImportError, match=r"ok\.gguf has a tokenizer.*pip install 'tiny-tensor\[llm\]'"):
        tokenizer_from_metadata(ok, "ok.gguf")
