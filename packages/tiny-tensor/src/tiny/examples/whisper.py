"""Transcribe a WAV file with Whisper: its log-mel features, the encoder, and greedy decoding with a KV cache.

    python -m tiny.examples.whisper WAV [--model FOLDER] [--tokenizer FOLDER] [--max-tokens N]

--model is a Hugging Face folder of a WhisperForConditionalGeneration (config.json, model.safetensors, and
generation_config.json and preprocessor_config.json where it has them); without it the model is whisper-tiny's shape
with random weights, whose tokens mean nothing (it says so). The text is decoded with the tokenizer.json of
--tokenizer (else of --model's folder) through Hugging Face's tokenizers library; without one the token ids are
printed. The WAV file is 16-bit PCM (Python's wave module reads it): channels are averaged, and another sampling rate
is resampled to the model's 16 kHz by linear interpolation. The first chunk (30 s) is transcribed.
"""

from __future__ import annotations

import argparse
import sys
import time
import wave
from pathlib import Path
from typing import Any, NoReturn

import numpy as np

from tiny.models import whisper


def read_wav(path: str | Path) -> tuple[np.ndarray, int]:
    """The samples of a 16-bit PCM WAV file as float32 in [-1, 1) (channels averaged) and its sampling rate."""
    with wave.open(str(path), "rb") as f:
        if f.getsampwidth() != 2:
            raise ValueError(f"{path} has {8 * f.getsampwidth()}-bit samples; 16-bit PCM is read")
        channels, rate = f.getnchannels(), f.getframerate()
        raw = np.frombuffer(f.readframes(f.getnframes()), dtype="<i2")
    return raw.reshape(-1, channels).astype(np.float32).mean(axis=1) / 32768.0, rate


def resample(samples: np.ndarray, rate: int, target: int) -> np.ndarray:
    """samples at `rate` as `target` per second, linearly interpolated (the same samples where the rates are equal)."""
    if rate == target or samples.size == 0:
        return samples
    count = int(round(samples.size * target / rate))
    return np.interp(np.arange(count) * rate / target, np.arange(samples.size), samples).astype(np.float32)


def tokenizer(folder: str | None) -> Any:
    """The tokenizers library's Tokenizer of folder/tokenizer.json, or None where there is none."""
    if folder is None or not (Path(folder) / "tokenizer.json").is_file():
        return None
    try:
        from tokenizers import Tokenizer  # (the [llm] extra's; only for decoding text)
    except ImportError:
        sys.exit("whisper: decoding text needs the tokenizers library: pip install 'tiny-tensor[llm]'")
    return Tokenizer.from_file(str(Path(folder) / "tokenizer.json"))


class Parser(argparse.ArgumentParser):
    """argparse, with its errors on one line (`whisper: ...`) instead of the usage and then the error."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"whisper: {message} (see --help)\n")


def parser() -> argparse.ArgumentParser:
    p = Parser(
        prog="python -m tiny.examples.whisper",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("wav", metavar="WAV", help="a 16-bit PCM WAV file")
    p.add_argument("--model", metavar="FOLDER", help="a Hugging Face Whisper folder (default: random weights)")
    p.add_argument("--tokenizer", metavar="FOLDER", help="a folder with tokenizer.json (default: --model's)")
    p.add_argument("--max-tokens", type=int, default=64, metavar="N", help="new tokens at most (default: 64)")
    p.add_argument("--language", help="the language's token, e.g. en (default: the model's generation config)")
    p.add_argument("--task", choices=["transcribe", "translate"], help="(default: the model's generation config)")
    p.add_argument("--device", help="the device to run on (default: DEVICE, else the fastest present)")
    return p


def main(argv: list[str] | None = None) -> None:
    args = parser().parse_args(argv)
    if not Path(args.wav).is_file():
        sys.exit(f"whisper: {args.wav}: no such file")
    try:
        samples, rate = read_wav(args.wav)
    except (wave.Error, EOFError) as e:
        sys.exit(f"whisper: {args.wav} is not a WAV file: {e}")
    except ValueError as e:
        sys.exit(f"whisper: {e}")
    if args.model is None:
        model = whisper.WhisperForConditionalGeneration(whisper.WhisperConfig(), device=args.device)
        print("whisper-tiny's shape with random weights (no --model): its tokens mean nothing")
    else:
        try:
            model = whisper.load(args.model, device=args.device)
        except (OSError, ValueError) as e:
            sys.exit(f"whisper: cannot load {args.model}: {' '.join(str(e).split())}")
    audio = resample(samples, rate, model.feature_config.sampling_rate)
    try:
        prompt = model.prompt(args.language, args.task)
        start = time.perf_counter()
        tokens = model.generate(model.features(audio), max_new_tokens=args.max_tokens, prompt=prompt)[0]
    except ValueError as e:
        sys.exit(f"whisper: {e}")
    took = time.perf_counter() - start
    seconds = min(audio.size / model.feature_config.sampling_rate, model.feature_config.chunk_length)
    text = tokenizer(args.tokenizer or args.model)
    print(f"{seconds:.1f} s of audio, {len(tokens)} tokens in {took:.2f} s")
    if text is None:
        print("no tokenizer (--tokenizer FOLDER with a tokenizer.json); the token ids:")
        print(" ".join(str(t) for t in tokens))
    else:
        print(text.decode([int(t) for t in tokens], skip_special_tokens=True).strip())


if __name__ == "__main__":
    main()
