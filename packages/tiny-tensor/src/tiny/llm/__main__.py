"""python -m tiny.llm generate --model PATH --prompt TEXT | chat --model PATH: text from a language model, streamed
as it is generated, then the prompt's and the generation's tokens per second."""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from tiny.llm import CACHE_DTYPES, LLM, load


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m tiny.llm", description=__doc__)
    sub = p.add_subparsers(dest="command", required=True)
    srv = sub.add_parser(
        "serve", help="an OpenAI-compatible HTTP server", description="an OpenAI-compatible HTTP server"
    )
    srv.add_argument("--model", required=True, help="a Hugging Face model folder or a .gguf file")
    srv.add_argument("--host", default="127.0.0.1", help="the address to listen on (default 127.0.0.1)")
    srv.add_argument("--port", type=int, default=8000, help="the port (default 8000)")
    srv.add_argument("--device", default=None, help="the device to run on (default: the fastest one here)")
    for name, what in (("generate", "continue a prompt"), ("chat", "talk, one line at a time (empty line: quit)")):
        s = sub.add_parser(name, help=what, description=what)
        s.add_argument("--model", required=True, help="a Hugging Face model folder or a .gguf file")
        if name == "generate":
            s.add_argument("--prompt", required=True, help="the text to continue")
        s.add_argument("--device", default=None, help="the device to run on (default: the fastest one here)")
        s.add_argument("--max-tokens", type=int, default=128, help="the most tokens to generate (default 128)")
        s.add_argument("--temperature", type=float, default=0.0, help="0 (the default): greedy; else sampling")
        s.add_argument("--top-k", type=int, default=0, help="sample among the k most likely tokens (0: all)")
        s.add_argument("--top-p", type=float, default=1.0, help="sample among the most likely tokens up to this mass")
        s.add_argument("--seed", type=int, default=None, help="the sampling's seed")
    for s in sub.choices.values():
        s.add_argument("--max-context", type=int, default=None, help="the KV cache's length (default: the model's)")
        s.add_argument(
            "--cache-dtype",
            choices=CACHE_DTYPES,
            default=None,
            help="what the KV cache keeps (default: float16 for a .gguf file, as llama.cpp; float32 for a folder)",
        )
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        model = load(args.model, device=args.device, max_context=args.max_context, cache_dtype=args.cache_dtype)
        if model.tokenizer is None:
            raise ValueError(
                f"{args.model} has no tokenizer (tokenizer.json or a GGUF vocabulary): this command reads text"
            )
        if args.command == "serve":
            from tiny.llm.server import serve

            serve(model, Path(args.model).name, args.host, args.port)
            return 0
        if args.command == "generate":
            _run(model, args, args.prompt)
            return 0
        return _chat(model, args)
    except (OSError, ValueError, TypeError, ImportError) as e:  # a bad path, model, prompt or option: one line
        print(f"error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


def _run(model: LLM, args: argparse.Namespace, text: str) -> list[int]:
    tok = model.tokenizer
    ids = tok.encode(text).ids
    start = time.perf_counter()
    stream = model.stream(ids, args.max_tokens, args.temperature, args.top_k, args.top_p, args.seed)
    new, first = [], None
    for piece in _text(tok, stream, new):
        if first is None:
            first = time.perf_counter()
        sys.stdout.write(piece)
        sys.stdout.flush()
    end = time.perf_counter()
    print()
    prefill = (first or end) - start
    decode = end - (first or end)
    print(
        f"prompt: {len(ids)} tokens, {len(ids) / prefill:.1f} tokens/s; generation: {len(new)} tokens, "
        f"{max(len(new) - 1, 0) / decode if decode > 0 else 0.0:.1f} tokens/s",
        file=sys.stderr,
    )
    return new


def _text(tok: object, stream: Iterator[int], new: list[int]) -> Iterator[str]:
    """The decoded text as it grows: each step yields what the new token added to the decoding of all of them (a
    token can be part of a character, or change how the one before it reads)."""
    shown = ""
    for token in stream:
        new.append(token)
        text = tok.decode(new)  # type: ignore[attr-defined]
        if text.endswith("\ufffd"):
            continue  # an incomplete character: wait for its other bytes
        yield text[len(shown) :] if text.startswith(shown) else text
        shown = text


def _chat(model: LLM, args: argparse.Namespace) -> int:
    messages: list[dict[str, str]] = []
    while True:
        try:
            line = input("> ")
        except EOFError:
            return 0
        if not line.strip():
            return 0
        messages.append({"role": "user", "content": line})
        reply = model.tokenizer.decode(_run(model, args, model.format_chat(messages)))  # type: ignore[union-attr]
        messages.append({"role": "assistant", "content": reply.strip()})


if __name__ == "__main__":
    sys.exit(main())
