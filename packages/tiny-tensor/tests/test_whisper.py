"""tiny.models.whisper against Hugging Face transformers: the log-mel front end against WhisperFeatureExtractor, and a
small random WhisperForConditionalGeneration saved with save_pretrained: logits equal to 1e-4 in float32, greedy
tokens equal to `generate`'s (the KV cache's steps against transformers' own cache), and the errors of bad input;
the example command on a WAV file."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
import wave
from pathlib import Path

import numpy as np
import pytest

from tiny.models import whisper

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

TOL = {"rtol": 1e-4, "atol": 1e-4}
SMALL = {
    "vocab_size": 120,
    "num_mel_bins": 80,
    "d_model": 32,
    "encoder_layers": 2,
    "decoder_layers": 2,
    "encoder_attention_heads": 4,
    "decoder_attention_heads": 4,
    "encoder_ffn_dim": 64,
    "decoder_ffn_dim": 64,
    "init_std": 0.3,  # (transformers' 0.02 makes every step's logits nearly equal: greedy ties would decide)
    "max_source_positions": 50,  # 100 frames: a 1 s chunk
    "max_target_positions": 40,
    "decoder_start_token_id": 100,
    "eos_token_id": 101,
    "pad_token_id": 101,
    "bos_token_id": 101,
    "suppress_tokens": [5, 7],
    "begin_suppress_tokens": [101, 9],
}


def _audio(seconds: float = 0.75, seed: int = 0) -> np.ndarray:
    """A tone that rises in pitch plus noise: something for the mel filters to tell apart."""
    t = np.arange(int(16000 * seconds)) / 16000
    noise = np.random.default_rng(seed).standard_normal(t.size) * 0.05
    return (0.5 * np.sin(2 * np.pi * (200 + 900 * t) * t) + noise).astype(np.float32)


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, object, object]:
    """The folder of a small random model (biases and LayerNorms random too) and its 1 s feature extractor."""
    folder = tmp_path_factory.mktemp("whisper")
    torch.manual_seed(0)
    ref = transformers.WhisperForConditionalGeneration(transformers.WhisperConfig(**SMALL)).eval()
    with torch.no_grad():
        for name, p in ref.named_parameters():
            if name.endswith("bias") or "layer_norm" in name:
                p.normal_(0, 0.3)
    ref.save_pretrained(folder)
    extractor = transformers.WhisperFeatureExtractor(feature_size=80, chunk_length=1)
    extractor.save_pretrained(folder)
    return folder, ref, extractor


def test_mel_filters_and_features_equal_the_feature_extractor() -> None:
    """30 s chunks (WhisperFeatureExtractor's defaults): a short clip padded, and a clip longer than the chunk cut."""
    extractor = transformers.WhisperFeatureExtractor()
    np.testing.assert_allclose(whisper.mel_filters(), extractor.mel_filters, rtol=1e-6, atol=1e-9)
    clips = [_audio(3.0), np.concatenate([_audio(20.0, seed=1), _audio(12.0, seed=2)])]
    want = extractor(clips, sampling_rate=16000, return_tensors="np").input_features
    got = whisper.log_mel(clips)
    assert got.shape == want.shape == (2, 80, 3000) and got.dtype == np.float32
    np.testing.assert_allclose(got, want, **TOL)
    # transformers' NumPy path (taken where torch is absent) gives the same
    padded = np.zeros(480000, np.float32)
    padded[:48000] = clips[0]
    np.testing.assert_allclose(got[0], extractor._np_extract_fbank_features(padded[None], "cpu")[0], **TOL)


def test_logits_equal_transformers(saved: tuple[Path, object, object]) -> None:
    folder, ref, extractor = saved
    model = whisper.load(folder)
    clips = [_audio(0.75), _audio(1.5, seed=3)]
    features = extractor(clips, sampling_rate=16000, return_tensors="np").input_features
    np.testing.assert_allclose(model.features(clips), features, **TOL)  # (the folder's 1 s chunk)
    ids = np.array([[100, 3, 17, 55, 9, 0], [100, 80, 2, 4, 6, 119]])
    with torch.no_grad():
        want = ref(torch.tensor(features), decoder_input_ids=torch.tensor(ids))
    got = model(features, ids)
    np.testing.assert_allclose(got.logits.numpy(), want.logits.numpy(), **TOL)
    np.testing.assert_allclose(got.encoder_last_hidden_state.numpy(), want.encoder_last_hidden_state.numpy(), **TOL)
    assert model.proj_out.weight is model.model.decoder.embed_tokens.weight  # (tied: the file has no proj_out)


def test_a_float16_file_is_computed_in_float32(saved: tuple[Path, object, object], tmp_path: Path) -> None:
    """Whisper computes in float32 only: a float16 checkpoint (save_pretrained of the model .half()) is widened as it
    loads, and its logits equal those of the float16-rounded weights in float32 to 1e-4."""
    _, ref, extractor = saved
    half = copy.deepcopy(ref).half()
    half.save_pretrained(tmp_path)
    extractor.save_pretrained(tmp_path)
    widened = half.float()
    features = extractor([_audio(0.75)], sampling_rate=16000, return_tensors="np").input_features
    ids = np.array([[100, 3, 17, 55, 9, 0]])
    with torch.no_grad():
        want = widened(torch.tensor(features), decoder_input_ids=torch.tensor(ids)).logits.numpy()
    model = whisper.load(tmp_path)
    assert model.proj_out.weight.dtype.name == "float32"
    np.testing.assert_allclose(model(features, ids).logits.numpy(), want, **TOL)


def test_greedy_tokens_equal_generate(saved: tuple[Path, object, object]) -> None:
    folder, ref, extractor = saved
    model = whisper.load(folder)
    features = extractor([_audio(0.5, seed=4), _audio(1.0, seed=5)], sampling_rate=16000, return_tensors="np")
    features = features.input_features
    with torch.no_grad():
        want = ref.generate(torch.tensor(features), max_new_tokens=20).numpy()
    got = model.generate(features, max_new_tokens=20)
    assert got.shape == want.shape == (2, 20)
    np.testing.assert_array_equal(got, want)
    assert not np.isin(got, SMALL["suppress_tokens"]).any() and not np.isin(got[:, 0], [101, 9]).any()


def test_greedy_stops_at_eos_and_pads(saved: tuple[Path, object, object], tmp_path: Path) -> None:
    """With an end token the model reaches (the first token of the first sequence that is not its first), both
    stop where transformers' do: each sequence cut before it, the one that ended first padded."""
    folder, ref, extractor = saved
    features = extractor([_audio(0.5, seed=4), _audio(1.0, seed=5)], sampling_rate=16000, return_tensors="np")
    features = features.input_features
    first = whisper.load(folder).generate(features, max_new_tokens=20)
    eos = int(next(t for t in first[0] if t != first[0, 0]))
    for name in ("config.json", "generation_config.json", "model.safetensors", "preprocessor_config.json"):
        (tmp_path / name).write_bytes((folder / name).read_bytes())
    generation = json.loads((tmp_path / "generation_config.json").read_text())
    (tmp_path / "generation_config.json").write_text(json.dumps({**generation, "eos_token_id": eos}))
    with torch.no_grad():
        want = ref.generate(torch.tensor(features), max_new_tokens=20, eos_token_id=eos).numpy()
    got = whisper.load(tmp_path).generate(features, max_new_tokens=20)
    assert got.shape == want.shape and got.shape[1] < 20 and eos not in got
    np.testing.assert_array_equal(got, want)


def test_bad_input_says_what_was_expected(saved: tuple[Path, object, object], tmp_path: Path) -> None:
    folder, _, _ = saved
    model = whisper.load(folder)
    features = np.zeros((1, 80, 100), np.float32)
    with pytest.raises(ValueError, match=r"input_features must be \(batch, 80, 100\) .*got shape \(1, 80, 3000\)"):
        model.encode(np.zeros((1, 80, 3000), np.float32))
    with pytest.raises(IndexError, match=r"decoder_input_ids must be in \[0, 120\), got 3..120"):
        model(features, [[3, 120]])
    with pytest.raises(ValueError, match="a prompt of 1 tokens and 40 new ones is past the decoder's 40 positions"):
        model.generate(features, max_new_tokens=40)
    with pytest.raises(ValueError, match="audio must be mono"):
        model.features([np.zeros((2, 100), np.float32)])
    for name in ("config.json", "model.safetensors"):
        (tmp_path / name).write_bytes((folder / name).read_bytes())
    (tmp_path / "preprocessor_config.json").write_text(json.dumps({"feature_size": 80, "chunk_length": 30}))
    with pytest.raises(ValueError, match="the feature extractor makes 80 mels x 3000 frames, the model takes 80 x 100"):
        whisper.load(tmp_path)


# ---------------------------------------------------------------- the example command


def _wav(path: Path, audio: np.ndarray, rate: int, channels: int = 1) -> Path:
    pcm = (np.clip(audio, -1, 1) * 32767).astype("<i2")
    with wave.open(str(path), "wb") as f:
        f.setnchannels(channels)
        f.setsampwidth(2)
        f.setframerate(rate)
        f.writeframes(np.repeat(pcm, channels).tobytes())
    return path


def _command(*args: str) -> subprocess.CompletedProcess:
    env = os.environ | {"PYTHONPATH": os.pathsep.join(sys.path)}
    return subprocess.run(
        [sys.executable, "-m", "tiny.examples.whisper", *args], env=env, capture_output=True, text=True, timeout=300
    )


def test_the_command_prints_the_tokens_of_a_wav(saved: tuple[Path, object, object], tmp_path: Path) -> None:
    """A stereo 8 kHz file: averaged to mono and resampled to 16 kHz, then the same tokens as generate's."""
    from tiny.examples import whisper as example

    folder, ref, extractor = saved
    audio = _audio(0.8, seed=6)[::2]  # (8 kHz)
    path = _wav(tmp_path / "clip.wav", audio, 8000, channels=2)
    samples, rate = example.read_wav(path)
    assert rate == 8000 and samples.shape == audio.shape
    resampled = example.resample(samples, 8000, 16000)
    assert resampled.shape == (2 * audio.size,)
    features = extractor(resampled, sampling_rate=16000, return_tensors="np").input_features
    with torch.no_grad():
        want = ref.generate(torch.tensor(features), max_new_tokens=8).numpy()[0]
    out = _command(str(path), "--model", str(folder), "--max-tokens", "8")
    assert out.returncode == 0, out.stderr
    assert "no tokenizer" in out.stdout
    assert out.stdout.splitlines()[-1].split() == [str(t) for t in want]


def test_the_command_errors_are_one_line(tmp_path: Path) -> None:
    (tmp_path / "notes.wav").write_text("not a wave file")
    clip = str(_wav(tmp_path / "clip.wav", _audio(0.2), 16000))
    cases = [
        ((str(tmp_path / "absent.wav"),), "no such file"),
        ((str(tmp_path / "notes.wav"),), "is not a WAV file"),
        ((clip, "--model", str(tmp_path / "absent")), "whisper: cannot load"),
    ]
    for args, message in cases:
        out = _command(*args)
        assert out.returncode in (1, 2) and message in out.stderr, (args, out.stderr)
        assert "Traceback" not in out.stderr and len(out.stderr.strip().splitlines()) == 1, out.stderr
