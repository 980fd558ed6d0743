"""Language-model decoding and prefill: tiny against llama.cpp and PyTorch + transformers, the same model files.

A LLaMA-shaped model with random weights (no model hub is reachable; speed does not depend on the values) is written
once into a cache folder: a `transformers` folder (float32 safetensors) and GGUF files at F32, F16, Q8_0 and Q4_0 as
llama.cpp's converter lays them out. Each side then runs in its own process, so that its peak memory is its own:

- tiny: `tiny.llm.load` of the GGUF file (and of the folder, for the float32 row), prefill then jitted decoding;
- llama.cpp: `llama_cpp.Llama` (llama-cpp-python, built from source here) on the same GGUF file;
- transformers: `LlamaForCausalLM` from the folder, eager, in float32 and in bfloat16.

Every side uses the same number of threads. Decoding is greedy: `--decode` tokens after a `--prompt`-token prompt,
timed from the first generated token to the last (the prompt's pass is prefill, timed apart), `--rounds` times: the
sides of one file are all loaded, each in its process, and timed in turns, so that a change in the machine's speed
meets them alike; a side's figure is the median of its rounds, its ratio the median of the rounds' ratios. Prefill
is one pass over `--prefill` tokens (each length its own run, from an empty cache) to the logits of the last
position alone, as generation needs them (llama.cpp's eval; tiny's `LLM.prefill`; transformers' `logits_to_keep=1`),
timed after one pass (two for tiny: its pass over a prompt length is a TinyJit, built on the first and captured on
the second). The roofline is the bytes of weights one token reads over the read bandwidth (a `--threads`-thread sum
over 1 GiB), measured before each decode round; decoding is reported as a fraction of it (the median of the rounds'
fractions, each against its own measurement). Peak memory is each process's peak resident set, against the file's
size.

    python -m bench.llm                          # the 1B model, every format and side; table on stdout
    python -m bench.llm --formats Q4_0 --sides tiny,llama.cpp
    python -m bench.llm --quick                  # a small model: checks that the benchmark runs
    python -m bench.llm --markdown bench/RESULTS_LLM.md
    python -m bench.llm --device CUDA --sides tiny,torch --formats F16 --torch-device cuda --torch-dtypes float16

On a GPU (the last line, bench/gpu_check.sh's `llm` stage) tiny runs on `--device` and transformers on
`--torch-device`, the ratios are against transformers (no llama.cpp side), and the roofline's bandwidth is a sum of 1
GiB on the torch device.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

FORMATS = ("F32", "F16", "Q8_0", "Q4_0")
SIDES = ("tiny", "llama.cpp", "torch")
TORCH_DTYPES = {"float32": "F32", "bfloat16": "BF16", "float16": "F16"}  # transformers' dtypes, as the table names them

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
        cfg = transformers.LlamaConfig(**config, tie_word_embeddings=False, dtype="float32")
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
    decode: float  # the median of its rounds
    peak: int
    note: str = ""
    rounds: list[float] = field(default_factory=list)  # decode tokens/s of each round, in the order timed
    bandwidths: list[float] = field(default_factory=list)  # the read bandwidth measured just before each round


def _peak_bytes() -> int:
    """This process's peak resident set (VmHWM: since its exec, unlike ru_maxrss, which a child's fork inherits)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _prompt(n: int, vocab: int) -> list[int]:
    """n token ids from 1 to vocab - 1, the same for every side: drawn by the standard library's generator, as
    numpy.random would load OpenSSL into the side's process (6 MB of a 4-bit 1B model's peak that were the bench's)."""
    draw = random.Random(n)
    return [draw.randrange(1, vocab) for _ in range(n)]


PREFILL_RUNS = 3  # timed passes of a prompt length after its untimed ones; a side's figure is its fastest


def _fastest(n: int, run: Callable[[], object]) -> float:
    """Tokens/s of the fastest of PREFILL_RUNS passes of an n-token prompt (one pass alone moved by a quarter between
    runs on this VM; each side is timed alike)."""
    best = float("inf")
    for _ in range(PREFILL_RUNS):
        start = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - start)
    return n / best


class _TinySide:
    def __init__(self, model_path: str, args: dict[str, Any]) -> None:
        from tiny.llm import load

        self.args = args
        self.llm = load(model_path, device=args["device"], max_context=args["context"])
        self.vocab = self.llm.model.cfg.vocab_size
        self.llm.generate(_prompt(args["prompt"], self.vocab), max_new_tokens=3, stop=[])  # (captured on its 2nd)

    def prefill(self, n: int) -> float:
        """Tokens/s of one pass to the last position's logits (as llama.cpp's eval and generation need them)."""
        for _ in range(2):  # (a length's first pass builds its kernels, its second is captured: TinyJit replays)
            self.llm.prefill(_prompt(n, self.vocab))
        return _fastest(n, lambda: self.llm.prefill(_prompt(n, self.vocab)))

    def decode(self, n: int) -> float:
        stamps = []
        for _ in self.llm.stream(_prompt(self.args["prompt"], self.vocab), max_new_tokens=n, stop=[]):
            stamps.append(time.perf_counter())
        return (len(stamps) - 1) / (stamps[-1] - stamps[0])


class _LlamaCppSide:
    def __init__(self, model_path: str, args: dict[str, Any]) -> None:
        import llama_cpp

        threads, self.args = args["threads"], args
        if args["llama_cpp_repack"] == "off":
            # (Llama() takes no word for it: the default model parameters it starts from, without the weights' CPU
            # buffers of other layouts, AMX's and the repacked Q4_0's)
            default = llama_cpp.llama_cpp.llama_model_default_params

            def params() -> Any:
                p = default()
                p.use_extra_bufts = False
                return p

            llama_cpp.llama.llama_cpp.llama_model_default_params = params
        self.llm = llama_cpp.Llama(
            model_path,
            n_ctx=args["context"],
            n_threads=threads,
            n_threads_batch=threads,
            n_batch=max(args["prefill"] + [args["prompt"]]),
            n_ubatch=max(args["prefill"] + [args["prompt"]]),
            verbose=False,
            kv_overrides={"tokenizer.ggml.model": "none"},  # (the files carry no vocabulary: ids in, ids out)
        )
        self.vocab = self.llm.n_vocab()

    def _empty(self) -> None:
        self.llm.reset()
        self.llm._ctx.kv_cache_clear()

    def prefill(self, n: int) -> float:
        self._empty()
        self.llm.eval(_prompt(n, self.vocab))

        def run() -> None:
            self._empty()
            self.llm.eval(_prompt(n, self.vocab))

        return _fastest(n, run)

    def decode(self, n: int) -> float:
        self._empty()
        stamps = []
        for _ in self.llm.generate(_prompt(self.args["prompt"], self.vocab), top_k=1, top_p=1.0, temp=0.0, reset=True):
            stamps.append(time.perf_counter())
            if len(stamps) == n:
                break
        return (len(stamps) - 1) / (stamps[-1] - stamps[0])


class _TorchSide:
    def __init__(self, model_path: str, args: dict[str, Any]) -> None:
        import torch
        import transformers

        self.torch, self.transformers, self.args = torch, transformers, args
        torch.set_num_threads(args["threads"])
        dtype = getattr(torch, args["torch_dtype"])
        self.device = args["torch_device"]
        model = transformers.LlamaForCausalLM.from_pretrained(model_path, dtype=dtype)
        self.model = model.to(self.device).eval()
        self.vocab = self.model.config.vocab_size
        gpu = self.device.startswith("cuda")
        self.sync: Callable[[], None] = torch.cuda.synchronize if gpu else lambda: None  # (a GPU's work is queued)

    def prefill(self, n: int) -> float:
        ids = self.torch.tensor([_prompt(n, self.vocab)], device=self.device)

        def run() -> None:
            self.model(ids, logits_to_keep=1)
            self.sync()

        with self.torch.inference_mode():
            run()
            return _fastest(n, run)

    def decode(self, n: int) -> float:
        torch, transformers = self.torch, self.transformers
        stamps: list[float] = []
        sync = self.sync

        class Stamp(transformers.StoppingCriteria):
            def __call__(self, input_ids: Any, scores: Any, **kwargs: Any) -> Any:
                sync()
                stamps.append(time.perf_counter())
                return torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)

        with torch.inference_mode():
            self.model.generate(
                torch.tensor([_prompt(self.args["prompt"], self.vocab)], device=self.device),
                max_new_tokens=n,
                min_new_tokens=n,
                do_sample=False,
                stopping_criteria=transformers.StoppingCriteriaList([Stamp()]),
            )
        return (len(stamps) - 1) / (stamps[-1] - stamps[0])


SIDE_RUNNERS = {"tiny": _TinySide, "llama.cpp": _LlamaCppSide, "torch": _TorchSide}


def _child(spec: str) -> None:
    """One side (the JSON spec), kept in this process: its prefill figures on a READY line, then a DECODE line for each
    `decode` line read (the parent times the sides' decoding in turns), then its peak memory on a RESULT line."""
    job = json.loads(spec)
    side = SIDE_RUNNERS[job["side"]](job["model"], job)
    print("READY " + json.dumps({"prefill": {n: side.prefill(n) for n in job["prefill"]}}), flush=True)
    for line in sys.stdin:
        if line.strip() != "decode":
            break
        print("DECODE " + json.dumps(side.decode(job["decode"])), flush=True)
    print("RESULT " + json.dumps({"peak": _peak_bytes()}), flush=True)


class _SideFailed(Exception):
    pass


class _Child:
    """A side's process (bench.llm --child), spoken to a line at a time; killed past its time limit."""

    def __init__(self, side: str, model: Path, args: argparse.Namespace, torch_dtype: str = "") -> None:
        job = {
            "side": side,
            "model": str(model),
            "threads": args.threads,
            "prefill": args.prefill,
            "prompt": args.prompt,
            "decode": args.decode,
            "context": args.context,
            "torch_dtype": torch_dtype,
            "device": args.device,
            "torch_device": args.torch_device,
            "llama_cpp_repack": args.llama_cpp_repack,
        }
        env = dict(os.environ)
        threads = str(args.threads)
        env |= {"OMP_NUM_THREADS": threads, "THREADS": threads, "MKL_NUM_THREADS": threads}
        self.limit, self.errors = args.side_timeout, tempfile.TemporaryFile(mode="w+")  # (stderr: not a pipe to fill)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "bench.llm", "--child", json.dumps(job)],
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.errors,
            text=True,
            cwd=Path(__file__).resolve().parent.parent,
        )
        self.timer = threading.Timer(args.side_timeout, self.proc.kill)
        self.timer.start()

    def expect(self, tag: str) -> Any:
        """The JSON of the next line the side prints that starts with `tag`."""
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.startswith(tag + " "):
                return json.loads(line[len(tag) + 1 :])
        self.proc.wait()
        if not self.timer.is_alive():
            raise _SideFailed(f"over {self.limit} s")
        self.errors.seek(0)
        last = (self.errors.read().strip().splitlines() or ["(no output)"])[-1]
        if self.proc.returncode < 0:  # (a crash says nothing on stderr: its signal does)
            last = f"{signal.Signals(-self.proc.returncode).name} ({last})"
        raise _SideFailed(f"failed: {last}")

    def send(self, line: str) -> None:
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write(line + "\n")
            self.proc.stdin.flush()
        except BrokenPipeError:
            pass  # (it ended: expect() says why)

    def close(self) -> None:
        self.timer.cancel()
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        self.errors.close()


def run_sides(
    fmt: str,
    model: Path,
    sides: list[str],
    args: argparse.Namespace,
    torch_dtype: str = "",
    bandwidth: Callable[[], float] | None = None,
) -> list[Run]:
    """The sides on one model file, each in its own process, all started before any is timed: each reports its
    prefill, then their decoding is timed in turns, `--rounds` times (the first side to go alternating), so that a
    change in the machine's speed meets every side alike (this VM's memory bandwidth moves between runs by up to
    1.5x); a side's decode figure is the median of its rounds. `bandwidth()`, where given, is measured before each
    round (the sides idle), for the roofline of that round."""
    children: dict[str, _Child] = {}
    prefill: dict[str, dict[int, float]] = {}
    decodes: dict[str, list[float]] = {side: [] for side in sides}
    bandwidths: list[float] = []
    notes: dict[str, str] = {}
    try:
        for side in sides:  # (one at a time: loading is not timed, but two loading at once would slow each other)
            children[side] = _Child(side, model, args, torch_dtype)
            try:
                prefill[side] = {int(k): v for k, v in children[side].expect("READY")["prefill"].items()}
            except _SideFailed as e:
                notes[side] = str(e)
        live = [side for side in sides if side not in notes]
        for r in range(args.rounds):
            if bandwidth is not None and live:
                bandwidths.append(bandwidth())
            for side in live if r % 2 == 0 else live[::-1]:
                if side in notes:
                    continue
                children[side].send("decode")
                try:
                    decodes[side].append(children[side].expect("DECODE"))
                except _SideFailed as e:
                    notes[side] = str(e)
        runs = []
        for side in sides:
            peak = 0
            if side not in notes:
                children[side].send("done")
                try:
                    peak = children[side].expect("RESULT")["peak"]
                except _SideFailed as e:
                    notes[side] = str(e)
            if side in notes:
                runs.append(Run(side, fmt, {}, float("nan"), 0, notes[side]))
            else:
                median = statistics.median(decodes[side])
                runs.append(Run(side, fmt, prefill[side], median, peak, "", decodes[side], bandwidths))
        return runs
    finally:
        for child in children.values():
            child.close()


# ---------------------------------------------------------------- the roofline


class ReadBandwidth:
    """Bytes per second of a `threads`-thread sum over 1 GiB of float32 on `device` (PyTorch's sum, the best of 5;
    a GPU's waited for), each call measured again (the GiB made once)."""

    def __init__(self, threads: int, device: str = "cpu") -> None:
        self.threads, self.device = threads, device
        self.x: Any = None

    def __call__(self) -> float:
        import torch

        torch.set_num_threads(self.threads)
        sync = torch.cuda.synchronize if self.device.startswith("cuda") else lambda: None
        if self.x is None:
            self.x = torch.ones(2**28, dtype=torch.float32, device=self.device)
            self.x.sum()
        best = min(_timed(lambda: (self.x.sum(), sync())) for _ in range(5))
        return self.x.numel() * 4 / best


def of_roofline(run: Run, bytes_per_token: int, bandwidth: float) -> float:
    """A side's decode as a fraction of the roofline (the read bandwidth over the bytes a token reads): the median of
    its rounds' fractions, each against the bandwidth measured just before it (the machine's speed drifts within a
    run: one read 29.7 GB/s at its start and 22.9-26.3 before its Q8_0 rounds), where it has them; else
    its median against `bandwidth`."""
    if run.rounds and len(run.bandwidths) == len(run.rounds):
        return statistics.median(d * bytes_per_token / bw for d, bw in zip(run.rounds, run.bandwidths))
    return run.decode * bytes_per_token / bandwidth


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


def _ratio(run: Run, ref: Run) -> float:
    """A side's decode over the reference's: the median of the rounds' ratios, each of two figures timed one after
    the other (where both have every round), else of the medians."""
    if run.rounds and len(run.rounds) == len(ref.rounds):
        return statistics.median(a / b for a, b in zip(run.rounds, ref.rounds))
    return run.decode / ref.decode


def table(runs: list[Run], files: dict[str, Path], bandwidth: float, prefill: list[int]) -> str:
    """The runs' rows, each side against llama.cpp on the same file, or where no run is llama.cpp's (a GPU's table),
    against transformers (torch) at the same format."""
    versus = "llama.cpp" if any(r.side == "llama.cpp" for r in runs) else "torch"
    head = ["format", "side", "decode tok/s", f"vs {versus}", "of roofline"]
    head += [f"prefill {n} tok/s" for n in prefill] + [f"vs {versus} ({n})" for n in prefill]
    head += ["peak GB", "vs file", "note"]
    rows = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in runs:
        ref = next((x for x in runs if x.fmt == r.fmt and x.side == versus), None)
        path = files.get(r.fmt)
        per_token = weight_bytes_per_token(path) if path else 0
        size = path.stat().st_size if path else float("nan")
        cells = [r.fmt, r.side, _fmt(r.decode, 2)]
        cells.append(_fmt(_ratio(r, ref), 2) + "x" if ref and ref.decode == ref.decode else "-")
        cells.append(_fmt(of_roofline(r, per_token, bandwidth), 2) if per_token and r.decode == r.decode else "-")
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
    p.add_argument("--decode", type=int, default=128, help="tokens decoded a round (default: %(default)s)")
    p.add_argument("--rounds", type=int, default=3, help="decode rounds, the sides in turns (default: %(default)s)")
    p.add_argument("--prefill", default="32,512", help="prefill lengths (default: %(default)s)")
    p.add_argument("--folder", type=Path, help="where the model files go (default: ~/.cache/tiny/bench-llm/...)")
    p.add_argument("--markdown", type=Path, help="also write the table to this file")
    p.add_argument("--side-timeout", type=float, default=900, help="seconds one side may take (default: %(default)s)")
    p.add_argument("--device", help="tiny's device (default: the default device)")
    p.add_argument("--torch-device", default="cpu", help="transformers' device (default: %(default)s)")
    p.add_argument(
        "--llama-cpp-repack",
        choices=("on", "off"),
        default="on",
        help="llama.cpp's weights in its CPU layouts (AMX tiles, repacked Q4_0) where it has them; off: as stored "
        "(llama.cpp's AMX product crashes on some hosts, ggml-org/llama.cpp#20824) (default: %(default)s)",
    )
    p.add_argument(
        "--torch-dtypes",
        default="float32,bfloat16",
        help=f"transformers' dtypes, of {', '.join(TORCH_DTYPES)} (default: %(default)s)",
    )
    args = p.parse_args(argv)
    if args.child:
        _child(args.child)
        return 0
    args.prefill = [int(x) for x in args.prefill.split(",") if x]
    args.context = max([*args.prefill, args.prompt + args.decode]) + 8
    formats = tuple(f for f in args.formats.split(",") if f)
    sides = tuple(s for s in args.sides.split(",") if s)
    dtypes = tuple(d for d in args.torch_dtypes.split(",") if d)
    bad = [f for f in formats if f not in FORMATS] + [s for s in sides if s not in SIDES]
    bad += [d for d in dtypes if d not in TORCH_DTYPES]
    if bad:
        p.error(
            f"unknown format, side or dtype {', '.join(bad)} (formats: {', '.join(FORMATS)}; sides: "
            f"{', '.join(SIDES)}; torch dtypes: {', '.join(TORCH_DTYPES)})"
        )
    folder = args.folder or cache_folder(args.quick)
    make_files(folder, QUICK if args.quick else FULL, formats)
    files = {fmt: folder / f"model-{fmt}.gguf" for fmt in formats}
    measure = ReadBandwidth(args.threads, args.torch_device)
    bandwidth = measure()
    runs: list[Run] = []

    def ran(new: list[Run]) -> None:
        runs.extend(new)
        for run in new:
            print(f"{run.fmt} {run.side}: {run}", file=sys.stderr)

    for fmt in formats:
        ran(run_sides(fmt, files[fmt], [side for side in sides if side != "torch"], args, bandwidth=measure))
    if "torch" in sides:
        for dtype in dtypes:
            ran(run_sides(TORCH_DTYPES[dtype], folder / "hf", ["torch"], args, dtype))
        if "tiny" in sides and "float32" in dtypes:
            ran(run_sides("F32 (folder)", folder / "hf", ["tiny"], args))
    text = table(runs, files, bandwidth, args.prefill)
    text += f"\n\nread bandwidth ({args.threads}-thread sum of 1 GiB): {bandwidth / 1e9:.1f} GB/s at the start"
    around = [bw for r in runs for bw in r.bandwidths]
    if around:  # (each format's roofline is against the bandwidth measured before each of its rounds)
        text += f"; {min(around) / 1e9:.1f}-{max(around) / 1e9:.1f} GB/s before the decode rounds"
    print(text)
    if args.markdown:
        args.markdown.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
