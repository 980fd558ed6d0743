"""Stable Diffusion and CLIP's text encoder against diffusers and transformers: each model on a small random
configuration written by the reference library, loaded here from its files, to 1e-4; the schedulers step by step; the
whole pipeline with the same starting noise."""

from __future__ import annotations

import json
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")
try:  # (transformers and diffusers import torchvision where one is installed; one built for another torch fails)
    import torchvision  # noqa: F401
except Exception:  # noqa: BLE001
    sys.modules["torchvision"] = None  # type: ignore[assignment]  (so that they take it as absent)
transformers = pytest.importorskip("transformers")
pytest.importorskip("tokenizers")
diffusers = pytest.importorskip("diffusers")

from half_compare import assert_half_close  # noqa: E402

from tiny.ir.schedule.cache import SCHEDULES  # noqa: E402
from tiny.models import clip  # noqa: E402
from tiny.models import stable_diffusion as sd  # noqa: E402
from tiny.nn import skip_init  # noqa: E402
from tiny.tensor import Tensor, dtypes  # noqa: E402

ATOL = 1e-4


def _jitter(module: torch.nn.Module, seed: int) -> torch.nn.Module:
    """Weights off their initial values (zeros and ones would hide a bias or a norm's scale applied wrong)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * 0.05)
    return module.eval()


def _close(ours: np.ndarray, ref: np.ndarray, atol: float = ATOL) -> None:
    assert ours.shape == ref.shape
    np.testing.assert_allclose(ours, ref, atol=atol, rtol=atol)


# ---------------------------------------------------------------- CLIP's text encoder


@pytest.mark.parametrize("eos", [99, 2])
def test_clip_text_model(tmp_path, eos):
    cfg = transformers.CLIPTextConfig(
        vocab_size=100, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        max_position_embeddings=16, eos_token_id=eos,
    )  # fmt: skip
    torch.manual_seed(0)
    ref = _jitter(transformers.CLIPTextModel(cfg), 1)
    ref.save_pretrained(tmp_path)
    model = clip.load(tmp_path)
    ids = np.array([[98, 5, 7, 99, 0, 0], [98, 3, 4, 8, 9, 99]])
    mask = np.array([[1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 1]])
    with torch.no_grad():
        want = ref(torch.tensor(ids), attention_mask=torch.tensor(mask), output_hidden_states=True)
    got = model(ids, attention_mask=mask, output_hidden_states=True)
    _close(got.last_hidden_state.numpy(), want.last_hidden_state.numpy())
    _close(got.pooler_output.numpy(), want.pooler_output.numpy())
    assert len(got.hidden_states) == len(want.hidden_states)
    _close(got.hidden_states[1].numpy(), want.hidden_states[1].numpy())


def test_clip_bad_input(tmp_path):
    cfg = transformers.CLIPTextConfig(
        vocab_size=50, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
        max_position_embeddings=8,
    )  # fmt: skip
    transformers.CLIPTextModel(cfg).save_pretrained(tmp_path)
    model = clip.load(tmp_path)
    with pytest.raises(ValueError, match="takes 1 to 8"):
        model(np.zeros((1, 9), dtype=np.int64))
    with pytest.raises(ValueError, match="token ids"):
        model(np.zeros((1, 4), dtype=np.float32))
    with pytest.raises(ValueError, match=r"attention_mask must be \(batch, length\)"):
        model(np.zeros((1, 4), dtype=np.int64), attention_mask=np.ones((1, 3)))


# ---------------------------------------------------------------- the UNet and the VAE


UNET_SD1 = dict(
    sample_size=8, block_out_channels=(32, 64), layers_per_block=1, cross_attention_dim=24, attention_head_dim=4,
    norm_num_groups=8, down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
    up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"),
)  # fmt: skip
UNET_SD2 = dict(
    UNET_SD1, attention_head_dim=(2, 4), use_linear_projection=True, transformer_layers_per_block=(1, 2),
    down_block_types=("CrossAttnDownBlock2D", "CrossAttnDownBlock2D"),
    up_block_types=("CrossAttnUpBlock2D", "CrossAttnUpBlock2D"),
)  # fmt: skip
VAE = dict(
    block_out_channels=(16, 32), norm_num_groups=8, latent_channels=4, layers_per_block=1,
    down_block_types=("DownEncoderBlock2D",) * 2, up_block_types=("UpDecoderBlock2D",) * 2,
)  # fmt: skip


@pytest.mark.parametrize("config", [UNET_SD1, UNET_SD2], ids=["sd1", "sd2"])
def test_unet(tmp_path, config):
    torch.manual_seed(0)
    ref = _jitter(diffusers.UNet2DConditionModel(**config), 2)
    ref.save_pretrained(tmp_path)
    model = sd.load_unet(tmp_path)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 4, 8, 8), dtype=np.float32)
    context = rng.standard_normal((2, 5, 24), dtype=np.float32)
    t = np.array([981.0, 3.5], dtype=np.float32)
    with torch.no_grad():
        want = ref(torch.tensor(x), torch.tensor(t), torch.tensor(context)).sample.numpy()
    got = model(Tensor(x), t, Tensor(context)).numpy()
    _close(got, want)


def test_vae_decode(tmp_path):
    torch.manual_seed(0)
    ref = _jitter(diffusers.AutoencoderKL(**VAE), 3)
    ref.save_pretrained(tmp_path)
    model = sd.load_vae(tmp_path)
    z = np.random.default_rng(1).standard_normal((2, 4, 4, 4), dtype=np.float32)
    with torch.no_grad():
        want = ref.decode(torch.tensor(z)).sample.numpy()
    _close(model.decode(Tensor(z)).numpy(), want)


def test_clip_unet_and_vae_in_float16(tmp_path):
    """dtype=float16: the text encoder (with a padding mask), the UNet (SD1 layout) and the VAE's decoder compute in
    half, as near the float32 outputs of the same weights as transformers' and diffusers' float16 models are
    (half_compare)."""
    torch.manual_seed(0)
    cfg = transformers.CLIPTextConfig(
        vocab_size=100, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        max_position_embeddings=16, eos_token_id=99,
    )  # fmt: skip
    _jitter(transformers.CLIPTextModel(cfg), 1).save_pretrained(tmp_path / "clip")
    _jitter(diffusers.UNet2DConditionModel(**UNET_SD1), 2).save_pretrained(tmp_path / "unet")
    _jitter(diffusers.AutoencoderKL(**VAE), 3).save_pretrained(tmp_path / "vae")
    text = transformers.CLIPTextModel.from_pretrained(tmp_path / "clip").half().float()
    unet = diffusers.UNet2DConditionModel.from_pretrained(tmp_path / "unet").half().float()
    vae = diffusers.AutoencoderKL.from_pretrained(tmp_path / "vae").half().float()
    ids, mask = np.array([[98, 5, 7, 99, 0, 0], [98, 3, 4, 8, 9, 99]]), np.array([[1, 1, 1, 1, 0, 0], [1] * 6])
    rng = np.random.default_rng(0)
    x, context = rng.standard_normal((2, 4, 8, 8), dtype=np.float32), rng.standard_normal((2, 5, 24), np.float32)
    t, z = np.array([981.0, 3.5], dtype=np.float32), rng.standard_normal((2, 4, 4, 4), dtype=np.float32)

    def run(half: bool) -> tuple[np.ndarray, ...]:
        cast = (lambda a: torch.tensor(a).half()) if half else torch.tensor
        with torch.no_grad():
            states = [m.half() if half else m.float() for m in (text, unet, vae)]
            out = states[0](torch.tensor(ids), attention_mask=torch.tensor(mask))
            noise = states[1](cast(x), torch.tensor(t), cast(context)).sample
            image = states[2].decode(cast(z)).sample
        return tuple(o.float().numpy() for o in (out.last_hidden_state, out.pooler_output, noise, image))

    want, want_half = run(False), run(True)
    out = clip.load(tmp_path / "clip", dtype="float16")(ids, attention_mask=mask)
    noise = sd.load_unet(tmp_path / "unet", dtype=dtypes.float16)(Tensor(x), t, Tensor(context))
    image = sd.load_vae(tmp_path / "vae", dtype=dtypes.float16).decode(Tensor(z))
    got = (out.last_hidden_state, out.pooler_output, noise, image)
    names = ("CLIP's hidden states", "CLIP's pooled output", "the UNet's noise", "the VAE's image")
    for ours, w, w_half, name in zip(got, want, want_half, names, strict=True):
        assert_half_close(ours, w, w_half, name)


def test_unet_bad_input(tmp_path):
    with pytest.raises(ValueError, match="not Stable Diffusion's"):
        sd.UNetConfig.from_diffusers(dict(UNET_SD1, up_block_types=("UpBlock2D", "SimpleCrossAttnUpBlock2D")))
    with pytest.raises(ValueError, match="class_embed_type='timestep' is not supported"):
        sd.UNetConfig.from_diffusers(dict(UNET_SD1, class_embed_type="timestep"))
    with skip_init():  # (the inputs are checked before any weight is read: no random weights made)
        model = sd.UNet2DConditionModel(sd.UNetConfig.from_diffusers(UNET_SD1))
    with pytest.raises(ValueError, match="multiples of 2"):
        model(Tensor.zeros(1, 4, 7, 8), 1.0, Tensor.zeros(1, 3, 24))
    with pytest.raises(ValueError, match=r"must be \(1, tokens, 24\)"):
        model(Tensor.zeros(1, 4, 8, 8), 1.0, Tensor.zeros(1, 3, 16))


# ---------------------------------------------------------------- schedulers


SD_SCHEDULE = dict(beta_start=0.00085, beta_end=0.012, beta_schedule="scaled_linear", steps_offset=1)


@pytest.mark.parametrize(
    "name,settings",
    [
        ("DDIMScheduler", dict(SD_SCHEDULE, set_alpha_to_one=False, clip_sample=False)),
        ("DDIMScheduler", dict(SD_SCHEDULE, prediction_type="v_prediction", timestep_spacing="trailing")),
        ("DDIMScheduler", dict(SD_SCHEDULE, timestep_spacing="linspace", clip_sample=True)),
        ("EulerDiscreteScheduler", dict(SD_SCHEDULE, timestep_spacing="leading")),
        ("EulerDiscreteScheduler", dict(SD_SCHEDULE, prediction_type="v_prediction")),
        ("EulerDiscreteScheduler", dict(beta_schedule="linear", timestep_spacing="trailing")),
    ],
)
def test_scheduler_steps(name, settings):
    ref = getattr(diffusers, name)(**settings)
    ours = sd.SCHEDULERS[name](dict(ref.config))
    ref.set_timesteps(7)
    ours.set_timesteps(7)
    np.testing.assert_array_equal(ours.timesteps, ref.timesteps.numpy())
    assert float(ours.init_noise_sigma) == pytest.approx(float(ref.init_noise_sigma), rel=1e-6)
    rng = np.random.default_rng(2)
    x = rng.standard_normal((1, 4, 4, 4), dtype=np.float32)
    want_x, got_x = torch.tensor(x), Tensor(x)
    for i, t in enumerate(ref.timesteps):
        output = rng.standard_normal(x.shape, dtype=np.float32)
        scaled = ref.scale_model_input(want_x, t)
        _close(ours.scale_model_input(got_x, i).numpy(), scaled.numpy())
        want_x = ref.step(torch.tensor(output), t, want_x).prev_sample
        got_x = ours.step(Tensor(output), i, got_x)
        _close(got_x.numpy(), want_x.numpy())


def test_scheduler_bad_settings():
    with pytest.raises(ValueError, match="beta_schedule 'squaredcos_cap_v2' is not supported"):
        sd.DDIMScheduler(dict(beta_schedule="squaredcos_cap_v2"))
    with pytest.raises(ValueError, match="use_karras_sigmas=True is not supported"):
        sd.EulerDiscreteScheduler(dict(use_karras_sigmas=True))
    with pytest.raises(ValueError, match="steps must be 1 to num_train_timesteps=1000, got 0"):
        sd.DDIMScheduler().set_timesteps(0)


# ---------------------------------------------------------------- the tokenizer and the pipeline


def _byte_chars() -> list[str]:
    """The 256 printable characters GPT-2's and CLIP's byte-level BPE write bytes as: the printable Latin-1 bytes as
    themselves, the others shifted past 255 in order."""
    keep = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAC + 1), *range(0xAE, 0xFF + 1)]
    chars, extra = {}, 0
    for b in range(256):
        if b in keep:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + extra)
            extra += 1
    return [chars[b] for b in range(256)]


def _write_tokenizer(folder, length: int) -> None:
    """A CLIP tokenizer folder with a small vocabulary: the bytes, the bytes ending a word, a few merges."""
    folder.mkdir(parents=True, exist_ok=True)
    merges = ["h e", "l l", "he ll", "hell o</w>", "c a", "ca t</w>", "o n</w>", "m a", "ma t</w>"]
    chars = _byte_chars()
    vocab = chars + [c + "</w>" for c in chars] + ["".join(m.split()) for m in merges]
    vocab += ["<|startoftext|>", "<|endoftext|>"]
    (folder / "vocab.json").write_text(json.dumps({tok: i for i, tok in enumerate(dict.fromkeys(vocab))}))
    (folder / "merges.txt").write_text("#version: 0.2\n" + "\n".join(merges) + "\n")
    settings = {"model_max_length": length, "bos_token": "<|startoftext|>", "eos_token": "<|endoftext|>",
                "pad_token": "<|endoftext|>", "unk_token": "<|endoftext|>"}  # fmt: skip
    (folder / "tokenizer_config.json").write_text(json.dumps(settings))


PROMPTS = ["Hello, a cat on a mat!", "  hello   CAT's 2 hats ", "", "x " * 40]


def test_tokenizer(tmp_path):
    _write_tokenizer(tmp_path, 16)
    ref = transformers.CLIPTokenizer.from_pretrained(tmp_path)
    want = ref(PROMPTS, padding="max_length", max_length=16, truncation=True).input_ids
    np.testing.assert_array_equal(sd.CLIPTokenizer(tmp_path)(PROMPTS), np.array(want))


@pytest.fixture(scope="module")
def pipeline_folder(tmp_path_factory):
    folder = tmp_path_factory.mktemp("sd")
    _write_tokenizer(folder / "tokenizer", 12)
    torch.manual_seed(0)
    text = transformers.CLIPTextConfig(
        vocab_size=600, hidden_size=24, intermediate_size=48, num_hidden_layers=2, num_attention_heads=2,
        max_position_embeddings=12,
    )  # fmt: skip
    pipe = diffusers.StableDiffusionPipeline(
        vae=_jitter(diffusers.AutoencoderKL(**VAE), 4),
        text_encoder=_jitter(transformers.CLIPTextModel(text), 5),
        tokenizer=transformers.CLIPTokenizer.from_pretrained(folder / "tokenizer"),
        unet=_jitter(diffusers.UNet2DConditionModel(**UNET_SD1), 6),
        scheduler=diffusers.DDIMScheduler(**SD_SCHEDULE, set_alpha_to_one=False, clip_sample=False),
        safety_checker=None,
        feature_extractor=None,
        requires_safety_checker=False,
    )
    pipe.save_pretrained(folder)
    return folder, pipe


@pytest.mark.parametrize("scheduler", ["DDIMScheduler", "EulerDiscreteScheduler"])
def test_pipeline(pipeline_folder, scheduler):
    folder, ref = pipeline_folder
    ref.scheduler = getattr(diffusers, scheduler).from_pretrained(folder, subfolder="scheduler")
    ours = sd.load(folder, scheduler=scheduler)
    latents = np.random.default_rng(3).standard_normal((2, 4, 8, 8), dtype=np.float32)
    prompts = ["a cat", "hello"]
    with torch.no_grad():
        want = ref(prompts, num_inference_steps=3, guidance_scale=7.5, latents=torch.tensor(latents),
                   output_type="np", height=16, width=16).images  # fmt: skip
    seen: list[tuple[int, int]] = []
    misses: list[int] = []  # the schedule cache's misses after each step

    def progress(i: int, n: int) -> None:
        seen.append((i, n))
        misses.append(SCHEDULES.misses)

    got = ours(prompts, steps=3, guidance_scale=7.5, latents=latents, progress=progress)
    assert seen == [(1, 3), (2, 3), (3, 3)]
    # every step is one graph, its numbers uploaded: scheduled once (each step was scheduled anew, UNet and all)
    assert misses[0] == misses[1] == misses[2]
    _close(got, want, atol=2e-4)


def test_pipeline_bad_input(pipeline_folder, tmp_path):
    folder, _ = pipeline_folder
    pipe = sd.load(folder)
    with pytest.raises(ValueError, match="multiples of 4"):
        pipe("a cat", steps=1, height=18, width=16)
    with pytest.raises(ValueError, match=r"latents must be \(1, 4, 8, 8\)"):
        pipe("a cat", steps=1, height=16, width=16, latents=np.zeros((1, 4, 8, 8), np.float32)[:, :, :3])
    with pytest.raises(ValueError, match="2 prompts and 1 negative prompts"):
        pipe(["a", "b"], negative_prompt=["c"], steps=1)
    with pytest.raises(FileNotFoundError, match="expected a diffusers pipeline folder"):
        sd.load(tmp_path)
    with pytest.raises(ValueError, match="scheduler 'PNDM' is not one of"):
        sd.load(folder, scheduler="PNDM")


# ---------------------------------------------------------------- the example


def _read_png(path) -> np.ndarray:
    """The pixels of an 8-bit RGB PNG with one IDAT and filter 0 rows (what the example writes)."""
    import struct
    import zlib

    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    chunks, at = {}, 8
    while at < len(data):
        (size,) = struct.unpack(">I", data[at : at + 4])
        kind, body = data[at + 4 : at + 8], data[at + 8 : at + 8 + size]
        assert struct.unpack(">I", data[at + 8 + size : at + 12 + size])[0] == zlib.crc32(kind + body)
        chunks[kind] = body
        at += 12 + size
    width, height, depth, color = struct.unpack(">IIBB", chunks[b"IHDR"][:10])
    assert (depth, color) == (8, 2)
    rows = np.frombuffer(zlib.decompress(chunks[b"IDAT"]), np.uint8).reshape(height, 1 + width * 3)
    assert (rows[:, 0] == 0).all()
    return rows[:, 1:].reshape(height, width, 3)


def test_example_with_model(pipeline_folder, tmp_path, capsys):
    from tiny.examples import stable_diffusion as example

    folder, _ = pipeline_folder
    out = tmp_path / "cat.png"
    example.main(["--model", str(folder), "--prompt", "a cat", "--steps", "2", "--seed", "5", "--out", str(out)])
    pipe = sd.load(folder)
    want = pipe("a cat", steps=2, seed=5)[0]
    np.testing.assert_array_equal(_read_png(out), (want * 255).round().clip(0, 255).astype(np.uint8))
    captured = capsys.readouterr()
    assert "step 2/2" in captured.err and f"wrote {out} (16 x 16)" in captured.out


def test_example_random_weights(tmp_path, capsys):
    from tiny.examples import stable_diffusion as example

    out = tmp_path / "noise.png"
    example.main(
        ["--random", "small", "--prompt", "x", "--steps", "1", "--height", "32", "--width", "64", "--out", str(out)]
    )
    assert _read_png(out).shape == (32, 64, 3)
    assert "random weights (small's shape, no --model): the picture will be noise" in capsys.readouterr().err


@pytest.mark.parametrize(
    "args,message",
    [
        (["--model", "/nonexistent", "--out", "x.png"], "expected a diffusers pipeline folder"),
        (["--out", "x.jpg"], "--out must name a .png file"),
        (["--out", "/nonexistent/x.png"], "the folder of --out, /nonexistent, does not exist"),
        (["--out", "x.png", "--steps", "0"], "argument --steps: 0 is not positive"),
    ],
)
def test_example_bad_input(args, message):
    import subprocess

    run = subprocess.run(
        [sys.executable, "-m", "tiny.examples.stable_diffusion", "--prompt", "a", *args],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert run.returncode != 0
    assert message in run.stderr and "Traceback" not in run.stderr, run.stderr
