"""tiny.llm against Hugging Face transformers: small random-initialized models saved with save_pretrained, loaded by
tiny.llm.load; logits equal to 1e-4 in float32 and 32 greedily generated tokens identical to transformers' generate.
(No model hub is reachable: the weights are random, which checks every weight's place as well as trained ones do.)"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tiny.ir.config import Context
from tiny.ir.dtypes import dtypes
from tiny.llm import load
from tiny.models.llama import LlamaConfig
from tiny.tensor.realize import capture, programs

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

PROMPT = [1, 5, 9, 20, 33, 7, 41]
LLAMA3_ROPE = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 16,
}
SMALL = {"vocab_size": 97, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2}


def _llama3_gqa(**sizes: int) -> object:
    """Grouped-query attention (4 heads, 2 key/value heads), Llama 3's RoPE scaling, untied output."""
    return transformers.LlamaForCausalLM(
        transformers.LlamaConfig(
            **{**SMALL, **sizes},
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=128,
            rope_theta=500000.0,
            rope_scaling=LLAMA3_ROPE,
        )
    )


MODELS = {
    "llama3_gqa": _llama3_gqa,
    # Llama 2: multi-head attention, plain RoPE, the embedding tied to the output
    "llama2_tied": lambda: transformers.LlamaForCausalLM(
        transformers.LlamaConfig(
            **SMALL, num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=96, tie_word_embeddings=True
        )
    ),
    "mistral": lambda: transformers.MistralForCausalLM(
        transformers.MistralConfig(
            **SMALL, num_attention_heads=8, num_key_value_heads=2, head_dim=16, max_position_embeddings=128
        )
    ),
    "gpt2": lambda: transformers.GPT2LMHeadModel(
        transformers.GPT2Config(vocab_size=97, n_positions=96, n_embd=64, n_layer=2, n_head=4)
    ),
    # Qwen2: biases on the q, k and v projections
    "qwen2": lambda: transformers.Qwen2ForCausalLM(
        transformers.Qwen2Config(
            **SMALL,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=128,
            tie_word_embeddings=False,
        )
    ),
}
# K-quantized matrices take rows of whole 256-value super-blocks: llama3_gqa, wider (not among the models compared
# with transformers above)
WIDE = {"llama3_wide": lambda: _llama3_gqa(hidden_size=256, intermediate_size=512)}


def _saved(name: str, folder: Path) -> object:
    torch.manual_seed(len(name))
    model = {**MODELS, **WIDE}[name]().eval()
    with torch.no_grad():  # random biases (transformers starts them at 0), so a misplaced one shows
        for n, p in model.named_parameters():
            if n.endswith("bias"):
                p.normal_(0, 0.1)
    model.save_pretrained(folder)
    return model


@pytest.mark.parametrize("name", sorted(MODELS))
def test_logits_and_greedy_tokens_equal_transformers(name: str, tmp_path: Path) -> None:
    ref = _saved(name, tmp_path)
    ids = torch.tensor([PROMPT])
    with torch.no_grad():
        want = ref(ids).logits[0].numpy()
        generated = ref.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=32, do_sample=False)
    want_tokens = generated[0, len(PROMPT) :].tolist()
    model = load(tmp_path)
    np.testing.assert_allclose(model(PROMPT).numpy()[0], want, rtol=1e-4, atol=1e-4)
    got = model.generate(PROMPT, max_new_tokens=32, stop=[])
    n = len(want_tokens)  # (transformers stops early at its eos token; tiny was told not to)
    assert got[:n] == want_tokens


def test_generating_loads_only_what_it_uses(tmp_path: Path) -> None:
    """A process that loads a model and generates greedily keeps out what it does not use, each of which was a few
    MB of a 4-bit 1B model's peak memory (which is to stay within 1.2x its file): OpenSSL (hashlib, and numpy.random
    for a generator greedy decoding never draws from), the optimizers, dataset readers, MPI and the other models,
    and ROCm's HIP runtime where there is no /dev/kfd for it to find a GPU through."""
    import os
    import subprocess
    import sys

    _saved("llama2_tied", tmp_path)
    unwanted = [
        "_hashlib", "numpy.random", "tiny.nn.optim", "tiny.nn.datasets", "tiny.nn.mpi",
        "tiny.models.bert", "tiny.models.resnet", "tiny.models.vit", "tiny.models.whisper",
    ]  # fmt: skip
    script = (
        "import sys\n"
        "from tiny.llm import load\n"
        f"assert len(load({str(tmp_path)!r}).generate([1, 2, 3], max_new_tokens=4, stop=[])) == 4\n"
        f"print([m for m in {unwanted!r} if m in sys.modules])\n"
        "print([line.split()[-1] for line in open('/proc/self/maps') if 'libamdhip64' in line][:1])\n"
    )
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    loaded, hip = run.stdout.strip().splitlines()
    assert loaded == "[]"
    if not os.path.exists("/dev/kfd"):
        assert hip == "[]"


def test_the_decode_step_is_built_once(tmp_path: Path) -> None:
    _saved("llama3_gqa", tmp_path)
    model = load(tmp_path)
    model.generate(PROMPT, max_new_tokens=4, stop=[])  # the step's warm-up and capture
    built = len(programs())
    tokens = model.generate(PROMPT, max_new_tokens=40, stop=[])  # (the same prompt: its prefill is built already)
    assert len(tokens) == 40
    assert len(programs()) == built, "a new position compiled the decode step again"
    assert len(model._step.recordings) == 1 and model._step.replays >= 40


@pytest.mark.parametrize("name", ["llama3_gqa", "gpt2"])
def test_prefill_runs_in_chunks_each_a_replayed_pass(name: str, tmp_path: Path) -> None:
    """LLM.prefill: the prompt in chunks of `prompt_chunk` tokens (16 for these small models: their weights are few
    bytes beside a chunk's activations), the last padded after its end to a power of two (from 16), each a pass of
    one TinyJit at its start position. The logits are the last position's of the whole prompt in one unpadded pass,
    replayed prompts give their own, and generation after a prompt of several chunks is transformers' own."""
    from tiny.llm import PROMPT_BUCKET

    ref = _saved(name, tmp_path)
    model = load(tmp_path)
    assert model.prompt_chunk == PROMPT_BUCKET == 16
    prompts = [PROMPT, PROMPT[::-1], [3, 1, 4, 1, 5, 9, 2], [2, 7, 1, 8, 2, 8, 1]]  # (7 tokens: padded to 16)
    for ids in prompts:
        want = model(ids).numpy()[0, -1]
        np.testing.assert_allclose(model.prefill(ids), want, rtol=1e-5, atol=1e-5)
    assert model._prompt.replays == len(prompts) - 2  # (the first warmed up, the second was captured)
    long = [(7 * i) % 97 for i in range(1, 41)]  # (40 tokens: 16 at 0, 16 at 16, 8 padded to 16 at 32)
    for _ in range(2):
        np.testing.assert_allclose(model.prefill(long), model(long).numpy()[0, -1], rtol=1e-5, atol=1e-5)
    assert len(model._prompt.recordings) == 1 and model._prompt.replays == len(prompts) - 2 + 6
    ids = torch.tensor([long])
    with torch.no_grad():
        generated = ref.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=16, do_sample=False)
    want_tokens = generated[0, len(long) :].tolist()
    assert model.generate(long, max_new_tokens=16, stop=[])[: len(want_tokens)] == want_tokens
    with pytest.raises(ValueError, match="one prompt"):
        model.prefill([PROMPT, PROMPT])
    with pytest.raises(ValueError, match="length >= 1"):
        model.prefill([])


def test_a_long_prompt_takes_no_more_memory_than_a_chunk(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Once a chunk's pass is recorded, a prompt of many chunks takes no more memory at once than a short prompt: its
    chunks replay in the recording's buffers (in one pass, a 512-token prompt of a 1B model held its 32 heads'
    scores, 2 x 33 MB, besides the rest of its activations)."""
    from tiny.tensor import Device

    _saved("llama3_gqa", tmp_path)
    model = load(tmp_path)
    for _ in range(3):
        model.prefill(PROMPT)
    allocator = Device[Device.DEFAULT].allocator
    live, most = [0], [0]
    alloc, free = allocator.alloc, allocator.free

    def counted_alloc(size: int) -> object:
        live[0] += size
        most[0] = max(most[0], live[0])
        return alloc(size)

    def counted_free(opaque: object, size: int) -> None:
        live[0] -= size
        free(opaque, size)

    monkeypatch.setattr(allocator, "alloc", counted_alloc)
    monkeypatch.setattr(allocator, "free", counted_free)
    model.prefill(PROMPT)
    short = most[0]
    most[0] = live[0] = 0
    model.prefill([(5 * i) % 97 for i in range(1, 113)])  # (7 chunks of 16)
    assert 0 < most[0] <= short


def test_the_prompt_chunk_keeps_a_pass_within_a_share_of_the_weights(tmp_path: Path) -> None:
    """prompt_chunk: the largest power of two (16 to 512) whose estimated activations and the KV cache together stay
    within SCRATCH_SHARE of the weights' bytes: more tokens a pass for a model of more bytes, fewer for a longer
    context or a wider cache."""
    import tiny.llm as llm_module
    from tiny.models.llama import Llama, LlamaConfig
    from tiny.nn import skip_init

    cfg = LlamaConfig(
        vocab_size=8192, hidden_size=256, intermediate_size=768, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=64,
    )  # fmt: skip
    model = Llama(cfg, max_context=128, cache_dtype=dtypes.float16)
    weights = llm_module._weight_bytes(model)
    assert weights == 4 * (2 * 8192 * 256 + 2 * (256 * 256 * 2 + 2 * 256 * 128 + 3 * 256 * 768 + 2 * 256) + 256)
    per_token = 4 * (2 * 4 * 128 + 3 * 768 + 8 * 256)
    cache = 2 * 2 * 128 * (2 * 64) * 2  # (keys and values, 2 layers, 128 positions, 2 heads of 64, float16)
    chunk = llm_module.prompt_chunk(model)
    budget = weights * llm_module.SCRATCH_SHARE - cache
    assert chunk * per_token <= budget < 2 * chunk * per_token and chunk == 32
    assert 2 * chunk * per_token <= weights * llm_module.SCRATCH_SHARE  # (64 without the cache counted)
    wider = Llama(cfg, max_context=128)  # (a float32 cache, as the activations)
    budget = weights * llm_module.SCRATCH_SHARE - 2 * cache
    assert llm_module.prompt_chunk(wider) == 32 and 32 * per_token <= budget
    longer = Llama(cfg, max_context=512, cache_dtype=dtypes.float16)  # (4 x the scores a token, 4 x the cache)
    assert llm_module.prompt_chunk(longer) == 16
    with skip_init():
        unread = Llama(cfg, max_context=128)  # (weights not made yet hold no memory: the floor, PROMPT_BUCKET)
    assert llm_module.prompt_chunk(unread) == 16


def test_a_float32_folder_is_read_once_into_the_weights(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Loading a float32 Hugging Face folder allocates its weights' bytes once: each weight is the buffer the file
    was read into (a copy besides made a 1B model's load peak at 10 GB for a 3.4 GB file), and the rest (the KV
    cache, the rotary tables) is small beside them."""
    from tiny.tensor import Device

    _saved("llama3_gqa", tmp_path)
    stored = _stored_bytes(tmp_path / "model.safetensors")
    allocator = Device[Device.DEFAULT].allocator
    sizes: list[int] = []
    alloc = allocator.alloc
    monkeypatch.setattr(allocator, "alloc", lambda size: sizes.append(size) or alloc(size))
    load(tmp_path, max_context=64)
    assert stored <= sum(sizes) <= 1.25 * stored, (sum(sizes), stored)


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_a_folders_matrices_are_kept_in_panels_where_products_read_them(dtype: str, tmp_path: Path) -> None:
    """Where the device's products read B from panels (layout.weight_panel_width: the CPU), a folder's matrices that
    products read, of rows a whole number of panels, are read from the files on the host straight into panels
    (weight_forms.Panels), kept in the file's dtype: the device holds their bytes once, and the logits are those of
    transformers' model with the same weights. The embedding (read by rows) and an output of rows no whole number of
    panels (a vocabulary of 97) stay as stored."""
    from tiny.ir.device import buffer_of
    from tiny.ir.schedule import layout
    from tiny.ir.uop import Ops
    from tiny.tensor import Device
    from tiny.tensor.weight_forms import Panels, form_of

    if not layout.weight_panel_width(Device.DEFAULT, dtypes.float32, 64):
        pytest.skip(f"{Device.DEFAULT}'s products read no panels")
    ref = _saved("llama3_gqa", tmp_path).to(getattr(torch, dtype))
    ref.save_pretrained(tmp_path)
    ref = ref.float()  # (the stored values, computed in float32 as tiny computes them)
    with torch.no_grad():
        want = ref(torch.tensor([PROMPT])).logits[0].numpy()
    llm = load(tmp_path)
    layer = llm.model.model.layers[0]
    for linear in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.mlp.down_proj):
        w = linear.weight
        assert isinstance(form_of(w), Panels)
        held = {id(buffer_of(u)): buffer_of(u).nbytes for u in w.uop.toposort if u.op is Ops.BUFFER}
        assert sum(held.values()) == w.numel() * getattr(dtypes, dtype).itemsize
    assert form_of(llm.model.model.embed_tokens.weight) is None and form_of(llm.model.lm_head.weight) is None
    np.testing.assert_allclose(llm(PROMPT).numpy()[0], want, rtol=1e-4, atol=1e-4)


def _stored_bytes(path: Path) -> int:
    """The bytes of a .safetensors file's tensors, as its header lists them."""
    with open(path, "rb") as f:
        header = json.loads(f.read(int.from_bytes(f.read(8), "little")))
    return sum(end - begin for k, v in header.items() if k != "__metadata__" for begin, end in [v["data_offsets"]])


def test_sampling_is_seeded_and_top_k_1_is_greedy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _saved("llama2_tied", tmp_path)
    model = load(tmp_path)
    a = model.generate(PROMPT, max_new_tokens=12, temperature=0.9, top_p=0.9, seed=3, stop=[])
    b = model.generate(PROMPT, max_new_tokens=12, temperature=0.9, top_p=0.9, seed=3, stop=[])
    assert a == b

    def drawn(*_: object) -> None:
        raise AssertionError("greedy decoding made a random generator")

    with monkeypatch.context() as m:  # (greedy needs none: numpy.random, with its OpenSSL, stays unloaded)
        m.setattr(np.random, "default_rng", drawn)
        greedy = model.generate(PROMPT, max_new_tokens=12, stop=[])
    assert model.generate(PROMPT, max_new_tokens=12, temperature=1.5, top_k=1, seed=0, stop=[]) == greedy


def test_bad_input_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="is neither"):
        load(tmp_path / "nothing")
    with pytest.raises(FileNotFoundError, match="no config.json"):
        load(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["BertModel"]}))
    with pytest.raises(ValueError, match="'BertModel' is not supported"):
        load(tmp_path)
    folder = tmp_path / "m"
    _saved("llama2_tied", folder)
    model = load(folder)
    with pytest.raises(ValueError, match="past the context of 96"):
        model.generate(list(range(90)), max_new_tokens=10)
    with pytest.raises(ValueError, match="top_p"):
        model.generate(PROMPT, top_p=0.0)
    with pytest.raises(ValueError, match="at least one token"):
        model.generate([])
    (folder / "model.safetensors").rename(folder / "moved.safetensors")
    with pytest.raises(FileNotFoundError, match="neither model.safetensors"):
        load(folder)


def _with_tokenizer(folder: Path, chat_template: str | None = None) -> object:
    """A word-level tokenizer.json for the small models' 97 ids: <unk>, <s>, </s>, then w3 ... w96."""
    tokenizers = pytest.importorskip("tokenizers")
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2} | {f"w{i}": i for i in range(3, 97)}
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    fast = transformers.PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>", chat_template=chat_template
    )
    fast.save_pretrained(folder)
    return fast


def test_generate_from_the_command_line(tmp_path: Path) -> None:
    import subprocess
    import sys

    _saved("llama3_gqa", tmp_path)
    _with_tokenizer(tmp_path)
    model = load(tmp_path, cache_dtype="float16")
    prompt = "w5 w9 w20 w33"
    want = model.tokenizer.decode(model.generate(model.tokenizer.encode(prompt).ids, max_new_tokens=8))
    cmd = [sys.executable, "-m", "tiny.llm", "generate", "--model", str(tmp_path), "--prompt", prompt]
    run = subprocess.run(
        [*cmd, "--max-tokens", "8", "--cache-dtype", "float16"], capture_output=True, text=True, timeout=300
    )
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == want.strip() and want.strip()
    assert "prompt: 4 tokens" in run.stderr and "tokens/s" in run.stderr
    bad = subprocess.run(
        [sys.executable, "-m", "tiny.llm", "generate", "--model", str(tmp_path / "none"), "--prompt", "x"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert bad.returncode == 1 and bad.stderr.startswith("error: ") and "Traceback" not in bad.stderr


def test_chat_template_matches_transformers(tmp_path: Path) -> None:
    template = (
        "{{ bos_token }}{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}{{ eos_token }}{% endfor %}"
        "{% if add_generation_prompt %}assistant:{% endif %}"
    )
    _saved("llama2_tied", tmp_path)
    fast = _with_tokenizer(tmp_path, template)
    model = load(tmp_path)
    messages = [
        {"role": "user", "content": "w4 w5"},
        {"role": "assistant", "content": "w6"},
        {"role": "user", "content": "w7"},
    ]
    want = fast.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert model.format_chat(messages) == want


# ---------------------------------------------------------------- GGUF files, written as llama.cpp's converter does

_HF_TO_GGUF = {
    "input_layernorm.weight": "attn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}


def _quantize_q4_k(a: np.ndarray) -> np.ndarray:
    """A plain Q4_K quantizer (the gguf package only dequantizes K-quants; not llama.cpp's search for the best
    scales): per 32 values a 4-bit step and minimum from their range, the steps and minimums as 6-bit multiples of
    the super-block's f16 d and dmin, packed as llama.cpp packs them."""
    x = a.reshape(-1, 8, 32).astype(np.float32)
    low = np.minimum(x.min(-1), 0)
    step, neg = (x.max(-1) - low) / 15, -low  # value = step * q - neg, q in 0..15
    d = (step.max(-1, keepdims=True) / 63).astype(np.float16)
    dmin = (neg.max(-1, keepdims=True) / 63).astype(np.float16)
    df, dminf = d.astype(np.float32), dmin.astype(np.float32)
    sc = np.clip(np.round(np.divide(step, df, out=np.zeros_like(step), where=df > 0)), 0, 63).astype(np.uint8)
    mn = np.clip(np.round(np.divide(neg, dminf, out=np.zeros_like(neg), where=dminf > 0)), 0, 63).astype(np.uint8)
    scale, offset = (df * sc)[..., None], (dminf * mn)[..., None]
    q = np.round(np.divide(x + offset, scale, out=np.zeros_like(x), where=scale > 0))
    q = np.clip(q, 0, 15).astype(np.uint8).reshape(-1, 4, 2, 32)
    packed = np.concatenate(
        [
            sc[:, :4] | ((sc[:, 4:] >> 4) << 6),
            mn[:, :4] | ((mn[:, 4:] >> 4) << 6),
            (sc[:, 4:] & 15) | ((mn[:, 4:] & 15) << 4),
        ],
        axis=1,
    )
    qs = (q[:, :, 0] | (q[:, :, 1] << 4)).reshape(-1, 128)
    blocks = np.concatenate([d.view(np.uint8), dmin.view(np.uint8), packed, qs], axis=1)
    return blocks.reshape(a.shape[0], -1)


def _quantize_q6_k(a: np.ndarray) -> np.ndarray:
    """A plain Q6_K quantizer: per 16 values a step from their largest magnitude (q in -32..31), the steps as int8
    multiples of the super-block's f16 d; the 6-bit values split into ql's nibbles and qh's bit pairs."""
    x = a.reshape(-1, 16, 16).astype(np.float32)
    step = np.abs(x).max(-1) / 31
    d = (step.max(-1, keepdims=True) / 127).astype(np.float16)
    df = d.astype(np.float32)
    sc = np.clip(np.round(np.divide(step, df, out=np.zeros_like(step), where=df > 0)), -128, 127).astype(np.int8)
    scale = (df * sc)[..., None]
    q = np.round(np.divide(x, scale, out=np.zeros_like(x), where=scale != 0))
    q = (np.clip(q, -32, 31) + 32).astype(np.uint8).reshape(-1, 2, 4, 32)  # (super-block, half, quarter, 32)
    ql = (q[:, :, 0:2] & 15) | ((q[:, :, 2:4] & 15) << 4)  # quarters 0, 1 low nibbles; 2, 3 high
    qh = (q[:, :, 0] >> 4) | ((q[:, :, 1] >> 4) << 2) | ((q[:, :, 2] >> 4) << 4) | ((q[:, :, 3] >> 4) << 6)
    blocks = np.concatenate([ql.reshape(-1, 128), qh.reshape(-1, 64), sc.view(np.uint8), d.view(np.uint8)], axis=1)
    return blocks.reshape(a.shape[0], -1)


_OWN_QUANTIZERS = {"Q4_K": _quantize_q4_k, "Q6_K": _quantize_q6_k}


def _write_gguf(ref: object, path: Path, qtype: str, metadata: Callable[[Any], None] | None = None) -> None:
    """The transformers model as a GGUF file: llama.cpp's names and metadata, each head's query/key rows ordered for
    adjacent-pair rotation (its converter's permute), Llama 3's frequency factors as rope_freqs, and the matrices in
    `qtype` (norms stay F32, as llama.cpp keeps them). `metadata(writer)` adds more (a vocabulary)."""
    gguf = pytest.importorskip("gguf")
    cfg = ref.config
    heads, kv = cfg.num_attention_heads, cfg.num_key_value_heads
    w = gguf.GGUFWriter(str(path), "llama")
    if metadata is not None:
        metadata(w)
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_block_count(cfg.num_hidden_layers)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(heads)
    w.add_head_count_kv(kv)
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    w.add_rope_freq_base(_rope(cfg)[0])
    w.add_vocab_size(cfg.vocab_size)

    def permute(a: np.ndarray, n: int) -> np.ndarray:
        return a.reshape(n, 2, a.shape[0] // n // 2, *a.shape[1:]).swapaxes(1, 2).reshape(a.shape)

    def put(name: str, a: np.ndarray) -> None:
        a = np.ascontiguousarray(a, dtype=np.float32)
        if a.ndim == 1 or qtype == "F32":
            w.add_tensor(name, a)
        elif qtype == "F16":
            w.add_tensor(name, a.astype(np.float16))
        else:
            kind = getattr(gguf.GGMLQuantizationType, qtype)
            if qtype in _OWN_QUANTIZERS:  # (which the gguf package reads back as a quantization of a)
                packed = _OWN_QUANTIZERS[qtype](a)
                np.testing.assert_allclose(gguf.quants.dequantize(packed, kind), a, atol=0.1 * np.abs(a).max())
            else:
                packed = gguf.quants.quantize(a, kind)
            w.add_tensor(name, packed, raw_dtype=kind)

    state = {k: v.detach().numpy() for k, v in ref.state_dict().items()}
    put("token_embd.weight", state["model.embed_tokens.weight"])
    for i in range(cfg.num_hidden_layers):
        for hf, name in _HF_TO_GGUF.items():
            a = state[f"model.layers.{i}.{hf}"]
            a = permute(a, heads) if "q_proj" in hf else permute(a, kv) if "k_proj" in hf else a
            put(f"blk.{i}.{name}", a)
        for p in "qkv":  # (Qwen2's biases)
            if (bias := state.get(f"model.layers.{i}.self_attn.{p}_proj.bias")) is not None:
                put(f"blk.{i}.attn_{p}.bias", permute(bias, heads if p == "q" else kv) if p != "v" else bias)
    put("output_norm.weight", state["model.norm.weight"])
    if not cfg.tie_word_embeddings:
        put("output.weight", state["lm_head.weight"])
    if _rope(cfg)[1]:  # the factors that turn the plain frequencies into Llama 3's
        dim = cfg.hidden_size // heads
        plain = 1.0 / (_rope(cfg)[0] ** (np.arange(0, dim, 2, dtype=np.int64).astype(np.float32) / dim))
        put("rope_freqs.weight", plain / ref.model.rotary_emb.inv_freq.numpy())
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def _rope(cfg: Any) -> tuple[float, dict | None]:
    """A transformers config's rope_theta and rope_scaling: transformers 4's attributes, or transformers 5's
    rope_parameters, which holds both."""
    params = getattr(cfg, "rope_parameters", None)
    if not params:
        return float(cfg.rope_theta), cfg.rope_scaling
    kept = {k: v for k, v in params.items() if k != "rope_theta"}
    return float(params["rope_theta"]), kept if kept.get("rope_type", "default") != "default" else None


def test_a_config_json_of_transformers_4_or_5_gives_one_config() -> None:
    """transformers 5 writes rope_theta and rope_scaling into rope_parameters; both forms read the same (a model
    with rope_theta 500000 read as the default 10000 would be silently wrong)."""
    old = {"vocab_size": 97, "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2}
    old |= {"num_attention_heads": 4, "rope_theta": 500000.0, "rope_scaling": LLAMA3_ROPE}
    new = {k: v for k, v in old.items() if not k.startswith("rope")}
    new["rope_parameters"] = {"rope_theta": 500000.0, **LLAMA3_ROPE}
    assert LlamaConfig.from_hf(new) == LlamaConfig.from_hf(old)
    assert LlamaConfig.from_hf(new).rope_theta == 500000.0 and LlamaConfig.from_hf(new).rope_scaling == LLAMA3_ROPE
    plain = new | {"rope_parameters": {"rope_theta": 20000.0, "rope_type": "default"}}
    assert LlamaConfig.from_hf(plain).rope_theta == 20000.0 and LlamaConfig.from_hf(plain).rope_scaling is None


@pytest.mark.parametrize(
    ("qtype", "tolerance"), [("F32", 1e-3), ("F16", 2e-3), ("BF16", 0.01), ("Q8_0", 0.03), ("Q4_0", 0.3)]
)
def test_a_gguf_file_gives_the_float_models_logits(qtype: str, tolerance: float, tmp_path: Path) -> None:
    """Within the rounding of the weights and of the float16 KV cache (a GGUF model's, as llama.cpp's): the largest
    logit difference against the largest logit (measured 1.3e-4 for F32, 5.9e-4, 3.6e-3, 0.013 and 0.15 for F16,
    BF16, Q8_0 and Q4_0). F32 with a float32 cache: the logits of transformers."""
    ref = _saved("llama3_gqa", tmp_path / "hf")
    _write_gguf(ref, tmp_path / "m.gguf", qtype)
    with torch.no_grad():
        want = ref(torch.tensor([PROMPT])).logits[0].numpy()
    got = load(tmp_path / "m.gguf")(PROMPT).numpy()[0]
    err = np.abs(got - want).max() / np.abs(want).max()
    assert err <= tolerance, f"{qtype}: {err:.2e}"
    if qtype == "F32":
        exact = load(tmp_path / "m.gguf", cache_dtype="float32")(PROMPT).numpy()[0]
        np.testing.assert_allclose(exact, want, rtol=1e-4, atol=1e-4)


def test_a_gguf_models_cache_keeps_float16_as_llama_cpps(tmp_path: Path) -> None:
    """A GGUF model's KV cache keeps float16 (llama.cpp's default), half the bytes of a float32 one; a folder's keeps
    float32 (transformers'); cache_dtype chooses, and anything else is refused at the call."""
    ref = _saved("llama3_gqa", tmp_path / "hf")
    _write_gguf(ref, tmp_path / "m.gguf", "F32")

    def kept(model: Any) -> tuple[str, int]:
        model.generate(PROMPT, max_new_tokens=2)
        caches = [layer.self_attn.cache for layer in model.model.model.layers]
        assert {c.keys.dtype.name for c in caches} == {c.values.dtype.name for c in caches}
        return caches[0].keys.dtype.name, sum(
            (c.keys.numel() + c.values.numel()) * c.keys.dtype.itemsize for c in caches
        )

    name, half = kept(load(tmp_path / "m.gguf"))
    assert name == "float16"
    assert kept(load(tmp_path / "m.gguf", cache_dtype="float32")) == ("float32", 2 * half)
    assert kept(load(tmp_path / "hf"))[0] == "float32"
    assert kept(load(tmp_path / "hf", cache_dtype="float16")) == ("float16", half)
    with pytest.raises(ValueError, match="cache_dtype must be one of float32, float16"):
        load(tmp_path / "m.gguf", cache_dtype="int8")


def test_a_gguf_file_of_another_architecture_is_refused(tmp_path: Path) -> None:
    gguf = pytest.importorskip("gguf")
    w = gguf.GGUFWriter(str(tmp_path / "bert.gguf"), "bert")
    w.add_tensor("token_embd.weight", np.zeros((4, 8), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(ValueError, match="GGUF architecture 'bert' is not supported"):
        load(tmp_path / "bert.gguf")
    (tmp_path / "cut.gguf").write_bytes((tmp_path / "bert.gguf").read_bytes()[:40])
    with pytest.raises(ValueError, match="cut.gguf"):
        load(tmp_path / "cut.gguf")


# ---------------------------------------------------------------- the OpenAI-compatible server


@pytest.fixture
def server(tmp_path: Path):  # noqa: ANN201
    """`python -m tiny.llm serve` on a free port, over a small Llama with a word-level tokenizer; (url, model)."""
    import socket
    import subprocess
    import sys
    import time
    import urllib.request

    pytest.importorskip("uvicorn")
    pytest.importorskip("starlette")
    folder = tmp_path / "small"
    _saved("llama3_gqa", folder)
    _with_tokenizer(folder)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [sys.executable, "-m", "tiny.llm", "serve", "--model", str(folder), "--port", str(port)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(600):  # up to a minute to load the model and start listening
            if proc.poll() is not None:
                raise AssertionError(f"the server exited: {proc.communicate()[1]}")
            try:
                urllib.request.urlopen(f"{url}/v1/models", timeout=1)
                break
            except OSError:
                time.sleep(0.1)
        yield url, load(folder)
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_the_server_answers_the_openai_client(server) -> None:  # noqa: ANN001
    openai = pytest.importorskip("openai")
    url, model = server
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="none")
    assert [m.id for m in client.models.list().data] == ["small"]
    prompt = "w5 w9 w20"
    want = model.tokenizer.decode(model.generate(model.tokenizer.encode(prompt).ids, max_new_tokens=6))
    done = client.completions.create(model="small", prompt=prompt, max_tokens=6, temperature=0)
    assert done.choices[0].text.strip() == want.strip() and done.usage.prompt_tokens == 3
    streamed = "".join(
        c.choices[0].text
        for c in client.completions.create(model="small", prompt=prompt, max_tokens=6, temperature=0, stream=True)
    )
    assert streamed.strip() == want.strip()
    messages = [{"role": "user", "content": "w4 w5"}]
    chat = client.chat.completions.create(model="small", messages=messages, max_tokens=5, temperature=0)
    ids = model.tokenizer.encode(model.format_chat(messages), add_special_tokens=False).ids
    assert (
        chat.choices[0].message.content.strip() == model.tokenizer.decode(model.generate(ids, max_new_tokens=5)).strip()
    )
    pieces = client.chat.completions.create(model="small", messages=messages, max_tokens=5, temperature=0, stream=True)
    assert "".join(c.choices[0].delta.content or "" for c in pieces).strip() == chat.choices[0].message.content.strip()


def test_the_server_refuses_bad_requests_and_serves_two_clients(server) -> None:  # noqa: ANN001
    import threading
    import urllib.error
    import urllib.request

    url, _ = server

    def post(path: str, body: bytes) -> tuple[int, dict]:
        req = urllib.request.Request(f"{url}{path}", body, {"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=120) as r:
                return r.status, json.loads(r.read())
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read())

    for body in (
        b"{not json",
        b'{"prompt": 5}',
        b'{"prompt": "w5", "max_tokens": -1}',
        b'{"prompt": "w5", "top_p": 0}',
    ):
        status, answer = post("/v1/completions", body)
        assert status == 400 and answer["error"]["message"], body
    status, answer = post("/v1/chat/completions", b'{"messages": "hello"}')
    assert status == 400 and "messages" in answer["error"]["message"]
    results: list[tuple[int, dict]] = []
    ask = json.dumps({"prompt": "w7 w8", "max_tokens": 8, "temperature": 0}).encode()
    threads = [threading.Thread(target=lambda: results.append(post("/v1/completions", ask))) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert [s for s, _ in results] == [200, 200]
    assert results[0][1]["choices"][0]["text"] == results[1][1]["choices"][0]["text"]  # (greedy: the same answer)


def test_a_gguf_layers_query_key_and_value_are_one_product(tmp_path: Path) -> None:
    """A GGUF file's query, key and value weights (and Qwen2's biases) are read as one tensor a layer and computed by
    one kernel, not three; the model's three weights are views of it, and assigning one runs the three products
    apart again. Both give transformers' logits."""
    from tiny.ir.device import buffer_of
    from tiny.ir.uop import Ops
    from tiny.tensor import Tensor

    ref = _saved("qwen2", tmp_path / "hf")
    _write_gguf(ref, tmp_path / "m.gguf", "F32")
    llm = load(tmp_path / "m.gguf", cache_dtype="float32")
    with torch.no_grad():
        want = ref(torch.tensor([PROMPT])).logits[0].numpy()

    def memory(b: Any) -> Any:  # (a kernel may read a view of a buffer: a Buffer of its own over the memory)
        return b if b.base is None else b.base

    def readers() -> tuple[list[int], np.ndarray]:
        """How many kernels of a pass over one token (a decode step's) read each layer's query, key or value
        weights; the logits of the prompt, then."""
        x = llm.model.embed(Tensor([PROMPT[:1]])).realize()
        with capture() as launches:
            llm.model.run(x).realize()
        counts = []
        for layer in llm.model.model.layers:
            a = layer.self_attn
            weights = [p.weight.uop for p in (a.q_proj, a.k_proj, a.v_proj)]
            held = {id(memory(buffer_of(u))) for w in weights for u in w.toposort if u.op is Ops.BUFFER}
            counts.append(sum(any(id(memory(b)) in held for b in k.buffers) for k in launches))
        return counts, llm.model(Tensor([PROMPT])).numpy()[0]

    counts, joined = readers()
    assert counts == [1, 1]
    np.testing.assert_allclose(joined, want, rtol=1e-4, atol=1e-4)
    for layer in llm.model.model.layers:
        for p in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj):
            p.weight = Tensor(p.weight.numpy())
    counts, apart = readers()
    assert counts == [3, 3]
    np.testing.assert_allclose(apart, want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("qtype", ["Q8_0", "Q4_0", "F16", "BF16", "Q4_K", "Q6_K"])
def test_quantized_weights_stay_quantized_in_device_memory(qtype: str, tmp_path: Path) -> None:
    """The device holds a quantized file's blocks (about the file's size), not float32 weights four to eight times
    bigger; the kernels that read them dequantize. The logits are those of the weights dequantized when loaded.
    (Q4_K and Q6_K files are quantized by the plain quantizers above, of a wider model.)"""
    from tiny.ir.device import buffer_of
    from tiny.ir.uop import Ops
    from tiny.nn.gguf import gguf_load

    ref = _saved("llama3_wide" if qtype.endswith("_K") else "llama3_gqa", tmp_path / "hf")
    path = tmp_path / "m.gguf"
    _write_gguf(ref, path, qtype)
    model = load(path)
    held = {}
    for owner, attr, _, _ in model.model.parameters_by_name().values():
        for u in getattr(owner, attr).uop.toposort:
            if u.op is Ops.BUFFER:
                held[id(buffer_of(u))] = buffer_of(u).nbytes
    assert sum(held.values()) <= 1.2 * path.stat().st_size
    logits = model(PROMPT).numpy()
    dense, _ = gguf_load(path)  # every tensor dequantized to float32 on loading
    assert sum(t.numel() * t.dtype.itemsize for t in dense.values()) > 1.7 * path.stat().st_size
    want = load(tmp_path / "hf")(PROMPT).numpy()
    np.testing.assert_allclose(logits, want, atol=0.3 * np.abs(want).max())
    assert len(model.generate(PROMPT, max_new_tokens=6, stop=[])) == 6  # (the jitted decode step over the blocks)


def test_q8_0_products_of_signed_bytes_equal_those_of_offset_ones(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Q8_0's quants times the rounded input as signed bytes both (Ops.SDOT4, where the renderer has it faster: AVX2
    without VNNI) or offset by 128 (Ops.DOT4, less 128 times the input's sums): the same integer sums, so the same
    logits (the float32 sums of the blocks aside, which a kernel's plan may order differently). Each renderer's way is
    forced in turn."""
    from dataclasses import replace

    from tiny.tensor import Device
    from tiny.tensor.weight_forms import form_of

    renderer = Device[Device.DEFAULT].renderer
    if not renderer.caps.dot4:
        pytest.skip(f"{Device.DEFAULT}'s renderer multiplies no bytes (RendererCaps.dot4 off): Q8_0 stays float32")
    ref = _saved("llama3_gqa", tmp_path / "hf")
    _write_gguf(ref, tmp_path / "m.gguf", "Q8_0")
    got = {}
    for signed in (False, True):
        monkeypatch.setattr(renderer, "caps", replace(renderer.caps, sdot4=signed))
        model = load(tmp_path / "m.gguf")
        form = form_of(model.model.model.layers[0].mlp.up_proj.weight)
        assert form is not None and form.signed == signed and form.offset == (0 if signed else 128)
        got[signed] = model(PROMPT).numpy()
    np.testing.assert_allclose(got[True], got[False], rtol=1e-6, atol=1e-6 * np.abs(got[False]).max())


@pytest.mark.parametrize(
    ("qtype", "tolerance", "q8"),
    [("F32", 1e-3, 0), ("F16", 3e-3, 0), ("Q8_0", 0.03, 0), ("Q4_0", 0.1, 0), ("Q8_0", 0.03, 1), ("Q4_0", 0.1, 1)],
)
def test_a_gguf_file_gives_llama_cpps_logits(qtype: str, tolerance: float, q8: int, tmp_path: Path) -> None:
    """The same GGUF file in llama.cpp (llama-cpp-python, built from source: `pip install llama-cpp-python`; skipped
    where it is not installed) and in tiny: the logits of every position of the prompt, the largest difference
    against the largest logit. (llama.cpp rounds the activations of a quantized product to 8 bits; so does tiny over
    Q8_0 and Q4_0 where the device multiplies bytes (Q8_ACTIVATIONS=1, the default; tiny.tensor.byte_blocks), else and
    with Q8_ACTIVATIONS=0 it keeps them in float32. Both keep a float16 KV cache. Measured: 1.7e-4 for F32 (2.3e-4
    with tiny's cache in float32, where tiny is transformers' to 1e-4), 4.7e-4 for F16; 7.6e-3 and 9.6e-3 for Q8_0
    and Q4_0 in float32, 7.4e-3 and 9.7e-3 as bytes: no closer, as a value that differs a little elsewhere may round
    to the next of 255 steps.)"""
    llama_cpp = pytest.importorskip("llama_cpp")
    ref = _saved("llama3_gqa", tmp_path / "hf")
    path = tmp_path / "m.gguf"
    _write_gguf(ref, path, qtype)
    theirs = llama_cpp.Llama(
        str(path), n_ctx=64, n_threads=1, logits_all=True, verbose=False, kv_overrides={"tokenizer.ggml.model": "none"}
    )
    theirs.eval(PROMPT)
    want = np.asarray(theirs.scores[: len(PROMPT)], dtype=np.float32)
    with Context(Q8_ACTIVATIONS=q8):  # (read as the model loads)
        got = load(path)(PROMPT).numpy()[0]
    err = np.abs(got - want).max() / np.abs(want).max()
    assert err <= tolerance, f"{qtype}: {err:.2e}"
