"""Language-model decoding and prefill: tiny against llama.cpp and PyTorch + transformers, the same model files.

A LLaMA-shaped model with random weights (no model hub is reachable; speed does not depend on the values) is written
once into a cache folder: a `transformers` folder (float32 safetensors) and GGUF files at F32, F16, Q8_0 and Q4_0 as
llama.cpp's converter lays them out. Each side then runs in its own process, so that its peak memory is its own:

- tiny: `tiny.llm.load` of the GGUF file (and of the folder, for the float32 row), prefill then jitted decoding;
- llama.cpp: `llama_cpp.Llama` (llama-cpp-python, built from source here) on the same GGUF file;
- transformers: `LlamaForCausalLM` from the folder, eager, in float32 and in bfloat16.

Every side uses the same number of threads. Decoding is greedy: `--decode` tokens after a `--prompt`-token prompt,
timed from the first generated token to the last (the prompt's pass is prefill, timed apart). Prefill is one pass
over `--prefill` tokens (each length its own run, from an empty cache) to the logits of the last position alone, as
generation needs them (llama.cpp's eval; tiny's `LLM.prefill`; transformers' `logits_to_keep=1`), timed after one
pass (two for tiny: its pass over a prompt length is a TinyJit, built on the first and captured on the second). The
roofline is the bytes of weights one token reads over the read bandwidth measured in the run (a `--threads`-thread
sum over 1 GiB); decoding is reported as a fraction of it. Peak memory is each process's peak resident set, against
the file's size.

    python -m bench.llm                          # the 1B model, every format and side; table on stdout
    python -m bench.llm --formats Q4_0 --sides tiny,llama.cpp
    python -m bench.llm --quick                  # a small model: checks that the benchmark runs
    python -m bench.llm --markdown bench/RESULTS_LLM.md
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

FORMATS = ("F32", "F16", "Q8_0", "Q4_0")
SIDES = ("tiny", "llama.cpp", "torch")

# the model: hidden 2048, 16 layers, 32 heads, 8 key/value heads, FFN 5632, vocab 32000, untied output
FULL = {
    "vocab_size": 32000,
    "hidden_size": 2048,
    "intermediate_size": 5632,
    "num_hidden_layers": 16,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "max_position_embeddings": 2048,
}
QUICK = {
    "vocab_size": 512,
    "hidden_size": 128,
    "intermediate_size": 352,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 1024,
}

# llama.cpp's name of each weight of a block, by Hugging Face's
_BLOCK_NAMES = {
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


def cache_folder(quick: bool) -> Path:
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "tiny" / "bench-llm" / ("quick" if quick else "1b")


# ---------------------------------------------------------------- the model files


def make_files(folder: Path, config: dict[str, int], formats: tuple[str, ...]) -> None:
    """The transformers folder and the GGUF files that are not in `folder` yet (random weights, seed 0)."""
    hf = folder / "hf"
    if not (hf / "config.json").is_file():
        import torch
        import transformers

        torch.manual_seed(0)
        cfg = transformers.LlamaConfig(**config, tie_word_embeddings=False, torch_dtype="float32")
        print(f"writing a random {config['hidden_size']}-wide LLaMA to {hf}", file=sys.stderr)
        model = transformers.LlamaForCausalLM(cfg)
        model.save_pretrained(hf, max_shard_size="20GB")
        (hf / "tokenizer.json").unlink(missing_ok=True)
    state: dict[str, np.ndarray] | None = None
    for fmt in formats:
        path = folder / f"model-{fmt}.gguf"
        if path.is_file():
            continue
        if state is None:
            from safetensors.numpy import load_file

            state = load_file(hf / "model.safetensors")
        print(f"writing {path}", file=sys.stderr)
        _write_gguf(state, json.loads((hf / "config.json").read_text()), path, fmt)


def _write_gguf(state: dict[str, np.ndarray], cfg: dict[str, Any], path: Path, fmt: str) -> None:
    """The weights as llama.cpp's converter writes a LLaMA: its names and metadata, each head's query and key rows
    in adjacent-pair order, norms in F32 and the matrices in `fmt`."""
    import gguf

    heads, kv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    tmp = path.with_suffix(".partial")
    w = gguf.GGUFWriter(str(tmp), "llama")
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(cfg["hidden_size"])
    w.add_block_count(cfg["num_hidden_layers"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(heads)
    w.add_head_count_kv(kv)
    w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    w.add_rope_freq_base(cfg["rope_theta"])
    w.add_vocab_size(cfg["vocab_size"])
    w.add_file_type({"F32": 0, "F16": 1, "Q8_0": 7, "Q4_0": 2}[fmt])

    def put(name: str, a: np.ndarray) -> None:
        a = np.ascontiguousarray(a, dtype=np.float32)
        if a.ndim == 1 or fmt == "F32":
            w.add_tensor(name, a)
        elif fmt == "F16":
            w.add_tensor(name, a.astype(np.float16))
        else:
            kind = getattr(gguf.GGMLQuantizationType, fmt)
            w.add_tensor(name, gguf.quants.quantize(a, kind), raw_dtype=kind)

    def pairs(a: np.ndarray, n: int) -> np.ndarray:  # each head's rows (2, pair) -> (pair, 2)
        return a.reshape(n, 2, a.shape[0] // n // 2, *a.shape[1:]).swapaxes(1, 2).reshape(a.shape)

    put("token_embd.weight", state["model.embed_tokens.weight"])
    for i in range(cfg["num_hidden_layers"]):
        for hf_name, name in _BLOCK_NAMES.items():
            a = state[f"model.layers.{i}.{hf_name}"]
            if "q_proj" in hf_name or "k_proj" in hf_name:
                a = pairs(a, heads if "q_proj" in hf_name else kv)
            put(f"blk.{i}.{name}", a)
    put("output_norm.weight", state["model.norm.weight"])
    put("output.weight", state["lm_head.weight"])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    tmp.rename(path)


# ---------------------------------------------------------------- one side, in its own process


@dataclass
class Run:
    """What one side measured: prefill tokens/s by prompt length, decode tokens/s, peak resident bytes."""

    side: str
    fmt: str
    prefill: dict[int, float]
    decode: float
    peak: int
    note: str = ""


def _peak_bytes() -> int:
    """This process's peak resident set (VmHWM: since its exec, unlike ru_maxrss, which a child's fork inherits)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _prompt(n: int, vocab: int) -> list[int]:
    return [int(x) for x in np.random.default_rng(n).integers(1, vocab, n)]


def _side_tiny(model_path: str, args: dict[str, Any]) -> dict[str, Any]:
    from tiny.llm import load

    llm = load(model_path, max_context=args["context"])
    vocab = llm.model.cfg.vocab_size
    prefill = {}
    for n in args["prefill"]:  # (the logits of the last position alone, as llama.cpp's eval and generation)
        for _ in range(2):  # (a length's first pass builds its kernels, its second is captured: TinyJit replays)
            llm.prefill(_prompt(n, vocab))
        start = time.perf_counter()
        llm.prefill(_prompt(n, vocab))
        prefill[n] = n / (time.perf_counter() - start)
    prompt = _prompt(args["prompt"], vocab)
    llm.generate(prompt, max_new_tokens=3, stop=[])  # (the decode step is captured on its second call)
    stamps = []
    for _ in llm.stream(prompt, max_new_tokens=args["decode"], stop=[]):
        stamps.append(time.perf_counter())
    return {"prefill": prefill, "decode": (len(stamps) - 1) / (stamps[-1] - stamps[0])}


def _side_llama_cpp(model_path: str, args: dict[str, Any]) -> dict[str, Any]:
    import llama_cpp

    threads = args["threads"]
    llm = llama_cpp.Llama(
        model_path,
        n_ctx=args["context"],
        n_threads=threads,
        n_threads_batch=threads,
        n_batch=max(args["prefill"] + [args["prompt"]]),
        n_ubatch=max(args["prefill"] + [args["prompt"]]),
        verbose=False,
        kv_overrides={"tokenizer.ggml.model": "none"},  # (the files carry no vocabulary: ids in, ids out)
    )
    vocab = llm.n_vocab()
    prefill = {}
    for n in args["prefill"]:
        for timed in (False, True):
            llm.reset()
            llm._ctx.kv_cache_clear()
            start = time.perf_counter()
            llm.eval(_prompt(n, vocab))
            if timed:
                prefill[n] = n / (time.perf_counter() - start)
    llm.reset()
    llm._ctx.kv_cache_clear()
    stamps = []
    for _ in llm.generate(_prompt(args["prompt"], vocab), top_k=1, top_p=1.0, temp=0.0, reset=True):
        stamps.append(time.perf_counter())
        if len(stamps) == args["decode"]:
            break
    return {"prefill": prefill, "decode": (len(stamps) - 1) / (stamps[-1] - stamps[0])}


def _side_torch(model_path: str, args: dict[str, Any]) -> dict[str, Any]:
    import torch
    import transformers

    torch.set_num_threads(args["threads"])
    dtype = torch.bfloat16 if args["torch_dtype"] == "bfloat16" else torch.float32
    model = transformers.LlamaForCausalLM.from_pretrained(model_path, torch_dtype=dtype).eval()
    vocab = model.config.vocab_size
    prefill = {}
    with torch.inference_mode():
        for n in args["prefill"]:
            ids = torch.tensor([_prompt(n, vocab)])
            model(ids, logits_to_keep=1)
            start = time.perf_counter()
            model(ids, logits_to_keep=1)
            prefill[n] = n / (time.perf_counter() - start)
        ids = torch.tensor([_prompt(args["prompt"], vocab)])
        stamps: list[float] = []

        class Stamp(transformers.StoppingCriteria):
            def __call__(self, input_ids: Any, scores: Any, **kwargs: Any) -> Any:
                stamps.append(time.perf_counter())
                return torch.zeros(input_ids.shape[0], dtype=torch.bool)

        model.generate(
            ids,
            max_new_tokens=args["decode"],
            min_new_tokens=args["decode"],
            do_sample=False,
            stopping_criteria=transformers.StoppingCriteriaList([Stamp()]),
        )
    return {"prefill": prefill, "decode": (len(stamps) - 1) / (stamps[-1] - stamps[0])}


SIDE_RUNNERS = {"tiny": _side_tiny, "llama.cpp": _side_llama_cpp, "torch": _side_torch}


def _child(spec: str) -> None:
    """Run one side (the JSON spec) and print its figures as one JSON line."""
    job = json.loads(spec)
    out = SIDE_RUNNERS[job["side"]](job["model"], job)
    out["peak"] = _peak_bytes()
    print("RESULT " + json.dumps(out), flush=True)


def run_side(side: str, fmt: str, model: Path, args: argparse.Namespace, torch_dtype: str = "") -> Run:
    job = {
        "side": side,
        "model": str(model),
        "threads": args.threads,
        "prefill": args.prefill,
        "prompt": args.prompt,
        "decode": args.decode,
        "context": args.context,
        "torch_dtype": torch_dtype,
    }
    env = dict(os.environ)
    env |= {"OMP_NUM_THREADS": str(args.threads), "THREADS": str(args.threads), "MKL_NUM_THREADS": str(args.threads)}
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "bench.llm", "--child", json.dumps(job)],
            env=env,
            capture_output=True,
            text=True,
            cwd=Path(__file__).resolve().parent.parent,
            timeout=args.side_timeout,
        )
    except subprocess.TimeoutExpired:
        return Run(side, fmt, {}, float("nan"), 0, f"over {args.side_timeout} s")
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    if proc.returncode != 0 or not lines:
        tail = (proc.stderr.strip().splitlines() or ["(no output)"])[-1]
        return Run(side, fmt, {}, float("nan"), 0, f"failed: {tail}")
    out = json.loads(lines[-1][len("RESULT ") :])
    return Run(side, fmt, {int(k): v for k, v in out["prefill"].items()}, out["decode"], out["peak"])


# ---------------------------------------------------------------- the roofline


def read_bandwidth(threads: int) -> float:
    """Bytes per second of a `threads`-thread sum over 1 GiB of float32 (PyTorch's sum, the best of 5)."""
    import torch

    torch.set_num_threads(threads)
    x = torch.ones(2**28, dtype=torch.float32)
    x.sum()
    best = min(_timed(lambda: x.sum()) for _ in range(5))
    return x.numel() * 4 / best


def _timed(fn: Any) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def weight_bytes_per_token(path: Path) -> int:
    """The bytes a decoded token reads: every tensor of the GGUF file but the embedding (one row of it)."""
    import gguf

    reader = gguf.GGUFReader(str(path))
    total = 0
    for t in reader.tensors:
        n = int(t.n_bytes)
        total += n // int(t.shape[-1]) if t.name == "token_embd.weight" else n
    return total


# ---------------------------------------------------------------- the table


def _fmt(x: float, digits: int = 1) -> str:
    return "-" if x != x else f"{x:.{digits}f}"


def table(runs: list[Run], files: dict[str, Path], bandwidth: float, prefill: list[int]) -> str:
    head = ["format", "side", "decode tok/s", "vs llama.cpp", "of roofline"]
    head += [f"prefill {n} tok/s" for n in prefill] + [f"vs llama.cpp ({n})" for n in prefill]
    head += ["peak GB", "vs file", "note"]
    rows = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in runs:
        ref = next((x for x in runs if x.fmt == r.fmt and x.side == "llama.cpp"), None)
        path = files.get(r.fmt)
        roof = bandwidth / weight_bytes_per_token(path) if path else float("nan")
        size = path.stat().st_size if path else float("nan")
        cells = [r.fmt, r.side, _fmt(r.decode, 2)]
        cells.append(_fmt(r.decode / ref.decode, 2) + "x" if ref and ref.decode == ref.decode else "-")
        cells.append(_fmt(r.decode / roof, 2) if roof == roof else "-")
        cells += [_fmt(r.prefill.get(n, float("nan"))) for n in prefill]
        for n in prefill:
            mine, theirs = r.prefill.get(n, float("nan")), ref.prefill.get(n, float("nan")) if ref else float("nan")
            cells.append(_fmt(mine / theirs, 2) + "x" if mine == mine and theirs == theirs else "-")
        cells += [_fmt(r.peak / 1e9, 2), _fmt(r.peak / size, 2) + "x" if size == size else "-", r.note]
        rows.append("| " + " | ".join(cells) + " |")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.llm", description=__doc__.split("\n\n")[0])
    p.add_argument("--child", help=argparse.SUPPRESS)
    p.add_argument("--quick", action="store_true", help="a small model (checks that the benchmark runs)")
    p.add_argument("--formats", default=",".join(FORMATS), help="GGUF formats (default: %(default)s)")
    p.add_argument("--sides", default=",".join(SIDES), help="sides to run (default: %(default)s)")
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="threads for every side (default: cores)")
    p.add_argument("--prompt", type=int, default=32, help="prompt tokens before decoding (default: %(default)s)")
    p.add_argument("--decode", type=int, default=128, help="tokens decoded (default: %(default)s)")
    p.add_argument("--prefill", default="32,512", help="prefill lengths (default: %(default)s)")
    p.add_argument("--folder", type=Path, help="where the model files go (default: ~/.cache/tiny/bench-llm/...)")
    p.add_argument("--markdown", type=Path, help="also write the table to this file")
    p.add_argument("--side-timeout", type=float, default=900, help="seconds one side may take (default: %(default)s)")
    args = p.parse_args(argv)
    if args.child:
        _child(args.child)
        return 0
    args.prefill = [int(x) for x in args.prefill.split(",") if x]
    args.context = max([*args.prefill, args.prompt + args.decode]) + 8
    formats = tuple(f for f in args.formats.split(",") if f)
    sides = tuple(s for s in args.sides.split(",") if s)
    bad = [f for f in formats if f not in FORMATS] + [s for s in sides if s not in SIDES]
    if bad:
        p.error(f"unknown format or side {', '.join(bad)} (formats: {', '.join(FORMATS)}; sides: {', '.join(SIDES)})")
    folder = args.folder or cache_folder(args.quick)
    make_files(folder, QUICK if args.quick else FULL, formats)
    files = {fmt: folder / f"model-{fmt}.gguf" for fmt in formats}
    bandwidth = read_bandwidth(args.threads)
    runs = []
    for fmt in formats:
        for side in sides:
            if side == "torch":
                continue
            runs.append(run_side(side, fmt, files[fmt], args))
            print(f"{fmt} {side}: {runs[-1]}", file=sys.stderr)
    if "torch" in sides:
        for dtype, fmt in (("float32", "F32"), ("bfloat16", "BF16")):
            runs.append(run_side("torch", fmt, folder / "hf", args, dtype))
            print(f"{fmt} torch: {runs[-1]}", file=sys.stderr)
        if "tiny" in sides:
            runs.append(run_side("tiny", "F32 (folder)", folder / "hf", args))
            print(f"hf tiny: {runs[-1]}", file=sys.stderr)
    text = table(runs, files, bandwidth, args.prefill)
    text += f"\n\nread bandwidth ({args.threads}-thread sum of 1 GiB): {bandwidth / 1e9:.1f} GB/s"
    print(text)
    if args.markdown:
        args.markdown.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
