"""Draw a picture from a prompt with Stable Diffusion (1.x or 2.x) and write it as a PNG.

With --model, a diffusers folder (model_index.json, text_encoder/, tokenizer/, unet/, vae/, scheduler/), read as
diffusers names its weights. Without one, the model has Stable Diffusion 1.5's shape (or a small one, --random small)
and random weights: the picture is then noise, and the tokens are the prompt's bytes.
"""

from __future__ import annotations

import argparse
import struct
import sys
import time
import zlib
from pathlib import Path
from typing import NoReturn

import numpy as np

from tiny.models import clip
from tiny.models import stable_diffusion as sd

RANDOM_SHAPES = {
    # Stable Diffusion 1.5: CLIP ViT-L/14's text encoder, the 860M-parameter UNet, the 4-block VAE
    "sd1.5": (
        clip.CLIPTextConfig(hidden_size=768, intermediate_size=3072, num_attention_heads=12),
        sd.UNetConfig(),
        sd.VAEConfig(),
    ),  # fmt: skip
    # a few million parameters: the pipeline end to end in seconds
    "small": (
        clip.CLIPTextConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4),
        sd.UNetConfig(
            sample_size=16,
            block_out_channels=(32, 64),
            layers_per_block=1,
            cross_attention_dim=64,
            heads=(4, 4),
            transformer_layers=(1, 1),
            norm_num_groups=8,
            down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
            up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"),
        ),  # fmt: skip
        sd.VAEConfig(block_out_channels=(32, 64), layers_per_block=1, norm_num_groups=8),
    ),
}


def byte_tokens(length: int, vocab: int):  # noqa: ANN201
    """For random weights: each prompt's UTF-8 bytes as token ids, between a start and an end token."""
    start, end = vocab - 2, vocab - 1

    def tokenize(prompts: list[str]) -> np.ndarray:
        out = np.full((len(prompts), length), end, dtype=np.int64)
        for row, prompt in enumerate(prompts):
            ids = [start, *prompt.encode()[: length - 2], end]
            out[row, : len(ids)] = ids
        return out

    return tokenize


def random_pipeline(shape: str, scheduler: str, device: str | None) -> sd.StableDiffusion:
    text, unet, vae = RANDOM_SHAPES[shape]
    return sd.StableDiffusion(
        text_encoder=clip.CLIPTextModel(text, device),
        tokenizer=byte_tokens(text.max_position_embeddings, text.vocab_size),
        unet=sd.UNet2DConditionModel(unet, device),
        vae=sd.AutoencoderKL(vae, device),
        scheduler=sd.SCHEDULERS[scheduler](
            {
                "beta_start": 0.00085,
                "beta_end": 0.012,
                "beta_schedule": "scaled_linear",
                "steps_offset": 1,
                "set_alpha_to_one": False,
            }  # fmt: skip
        ),
        random_weights=True,
    )


def write_png(path: Path, image: np.ndarray) -> None:
    """An 8-bit RGB PNG of an image (height, width, 3) of floats in [0, 1]."""
    pixels = (image * 255).round().clip(0, 255).astype(np.uint8)
    height, width, _ = pixels.shape
    rows = b"".join(b"\x00" + pixels[y].tobytes() for y in range(height))  # (filter 0: each row as it is)

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)  # 8 bits, RGB, deflate, no interlace
    body = chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(rows, 6)) + chunk(b"IEND", b"")
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + body)


def progress_bar(started: float):  # noqa: ANN201
    def show(done: int, total: int) -> None:
        filled = 30 * done // total
        rate = (time.perf_counter() - started) / done
        sys.stderr.write(f"\r[{'#' * filled}{'.' * (30 - filled)}] step {done}/{total}, {rate:.2f} s/step")
        if done == total:
            sys.stderr.write("\n")
        sys.stderr.flush()

    return show


class Parser(argparse.ArgumentParser):
    """argparse, with its errors on one line (`stable_diffusion: ...`)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"stable_diffusion: {message} (see --help)\n")


def positive(kind: type):  # noqa: ANN201
    def parse(text: str):  # noqa: ANN202
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a {kind.__name__}") from None
        if not value > 0:
            raise argparse.ArgumentTypeError(f"{text} is not positive")
        return value

    return parse


def parser() -> argparse.ArgumentParser:
    p = Parser(prog="python -m tiny.examples.stable_diffusion", description=__doc__,
               formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("--prompt", required=True, help="what to draw")
    p.add_argument("--negative-prompt", default="", help="what to draw away from (default: none)")
    p.add_argument("--out", required=True, type=Path, help="the PNG file to write")
    p.add_argument("--model", type=Path, help="a diffusers Stable Diffusion folder (default: random weights)")
    p.add_argument("--random", choices=sorted(RANDOM_SHAPES), default="sd1.5",
                   help="the shape of the random-weight model without --model (default: sd1.5)")  # fmt: skip
    p.add_argument("--steps", type=positive(int), default=20, help="denoising steps (default: 20)")
    p.add_argument("--guidance", type=positive(float), default=7.5, help="classifier-free guidance (default: 7.5)")
    p.add_argument("--scheduler", choices=sorted(sd.SCHEDULERS), help="default: the folder's, else DDIM")
    p.add_argument("--height", type=positive(int), help="pixels (default: the model's size, 512 for SD 1.5)")
    p.add_argument("--width", type=positive(int), help="pixels (default: the model's size)")
    p.add_argument("--seed", type=int, default=0, help="the starting noise's seed (default: 0)")
    p.add_argument("--device", help="a device name (default: the fastest present, or DEVICE)")
    return p


def main(argv: list[str] | None = None) -> None:
    args = parser().parse_args(argv)
    if args.out.suffix.lower() != ".png":
        raise SystemExit(f"stable_diffusion: --out must name a .png file, got {args.out}")
    if not args.out.parent.is_dir():
        raise SystemExit(f"stable_diffusion: the folder of --out, {args.out.parent}, does not exist")
    started = time.perf_counter()
    try:
        if args.model is None:
            print(f"random weights ({args.random}'s shape, no --model): the picture will be noise", file=sys.stderr)
            pipe = random_pipeline(args.random, args.scheduler or "DDIMScheduler", args.device)
        else:
            pipe = sd.load(args.model, args.device, scheduler=args.scheduler)
        print(f"loaded in {time.perf_counter() - started:.1f} s", file=sys.stderr)
        started = time.perf_counter()
        size = {"height": args.height, "width": args.width}
        image = pipe(args.prompt, args.negative_prompt, steps=args.steps, guidance_scale=args.guidance, **size,
                     seed=args.seed, progress=progress_bar(started))[0]  # fmt: skip
    except (FileNotFoundError, ValueError, ImportError) as e:
        raise SystemExit(f"stable_diffusion: {e}") from None
    write_png(args.out, image)
    print(f"wrote {args.out} ({image.shape[1]} x {image.shape[0]}) in {time.perf_counter() - started:.1f} s")


if __name__ == "__main__":
    main()
