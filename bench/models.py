"""Model inference: tiny's models against PyTorch eager and onnxruntime, the same random weights, in one run.

Each model is built (random weights, seed 0) by the library a user has it from: torchvision's ResNet-50,
transformers' BertModel at BERT-base's size, diffusers' UNet2DConditionModel in Stable Diffusion 1.5's shape. tiny
loads the model's state dict by the library's names (tiny.models.resnet, .bert, .stable_diffusion); onnxruntime runs
the model exported once by `torch.onnx.export` (the TorchScript exporter, opset 17) on its CPU provider with its
default threads (intra-op: one per physical core). PyTorch runs the model eagerly in `torch.no_grad()` with its
default threads (`torch.get_num_threads()`, in the header). The sides are timed in turns as in `python -m bench.run`
(bench/core.py's `measure`), every side warmed up first (compilation excluded), figures from the fastest run.

| workload | full size (`--quick`) | unit | sides |
| --- | --- | --- | --- |
| `resnet50` | batch 8, 224 x 224 (ResNet-18, batch 1, 64 x 64) | images/s | tiny (TinyJit), torch, onnxruntime |
| `bert_base` | batch 8, sequence 128 (2 layers of 32, batch 2, 16) | sequences/s | tiny (un-jitted), torch, ort |
| `sd_unet` | one step, batch 2, latents 4 x 64 x 64, 77 tokens (a one-level UNet, 16 x 16) | ms | tiny, diffusers |

Targets (issue 29): tiny at least 1.0x PyTorch eager and 0.8x onnxruntime (the UNet: 1.0x diffusers).

    python -m bench.models                            # every workload, full sizes
    python -m bench.models --quick                    # small models: checks that the benchmark runs
    python -m bench.models --only resnet50 --markdown /tmp/models.md
    python -m bench.models --unet-latent 32           # the UNet at 256 x 256 pixels (a quarter of the work)

The UNet step at 64 x 64 latents takes about 7.4 GB on tiny's side (4.1 GB of it weights): a schedule's temporary
buffers (each attention layer's scores, 1 GiB at that size) share memory one after another (tiny.ir.schedule.memory).

torchvision: as tests/test_resnet.py finds it (an importable `torchvision`, else the folder TINY_TORCHVISION names,
its pure-Python models imported without the package's __init__); without either the ResNet row says so.
"""

from __future__ import annotations

import argparse
import functools
import gc
import importlib
import io
import json
import os
import sys
import types
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from bench.core import MS, Metric, Params, Prepared, Result, Unavailable, measure
from bench.frameworks import TinyJit, tiny_done, tiny_upload, torch
from bench.report import machine
from tiny.models import bert, resnet
from tiny.models import stable_diffusion as sd
from tiny.models.hf import load_weights
from tiny.nn import skip_init
from tiny.tensor import Device, Tensor

try:
    import onnxruntime
except ImportError:  # the column says "not installed"
    onnxruntime = None

SIDES = ("tiny", "torch", "onnxruntime")
TARGETS = {"torch": 1.0, "onnxruntime": 0.8}  # tiny's ratio against each reference, at least

IMAGES = Metric("images/s", 1.0, "images")
SEQUENCES = Metric("sequences/s", 1.0, "sequences")

BERT_QUICK = {"vocab_size": 100, "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2,
              "intermediate_size": 64, "max_position_embeddings": 64}  # fmt: skip
UNET_SD15 = {"sample_size": 64, "cross_attention_dim": 768}  # diffusers' defaults are SD 1.x's otherwise
# (one level: the smoke test's UNet compiles in half the time of two; tests/test_stable_diffusion.py checks the layout)
UNET_QUICK = {"sample_size": 16, "block_out_channels": (32,), "layers_per_block": 1, "cross_attention_dim": 24,
              "attention_head_dim": 4, "norm_num_groups": 8, "up_block_types": ("CrossAttnUpBlock2D",),
              "down_block_types": ("CrossAttnDownBlock2D",)}  # fmt: skip


@dataclass(frozen=True)
class ModelWorkload:
    name: str
    what: str
    metric: Metric
    full: Params
    quick: Params
    sides: tuple[str, ...]
    warmup: int = 3  # (TinyJit captures on its second call; PyTorch takes two calls to settle)
    reps: int = 5

    def params(self, quick: bool) -> Params:
        return self.quick if quick else self.full

    def amounts(self, params: Params) -> dict[str, float]:
        return {"images": params["batch"], "sequences": params["batch"]}


WORKLOADS = (
    ModelWorkload(
        "resnet50",
        "torchvision's ResNet-50 (random weights and batch-norm statistics, eval), logits of a batch of images",
        IMAGES,
        {"arch": "resnet50", "batch": 8, "size": 224},
        {"arch": "resnet18", "batch": 1, "size": 64},
        SIDES,
    ),
    ModelWorkload(
        "bert_base",
        "transformers' BertModel at BERT-base's size (12 layers of 768, 12 heads), last hidden state and pooler of "
        "a batch of token ids with an all-ones attention mask",
        SEQUENCES,
        {"config": "base", "batch": 8, "length": 128},
        {"config": "quick", "batch": 2, "length": 16},
        SIDES,
    ),
    ModelWorkload(
        "sd_unet",
        "diffusers' UNet2DConditionModel in SD 1.5's shape (860M parameters), one denoising step at timestep 500 "
        "of a guided batch (2 latents) against 77 tokens of text states, float32",
        MS,
        {"config": "sd15", "batch": 2, "latent": 64, "tokens": 77},
        {"config": "quick", "batch": 2, "latent": 16, "tokens": 8},
        ("tiny", "torch"),
        warmup=1,
        reps=3,
    ),
)


# ---------------------------------------------------------------- the reference models, built once per size


def _torchvision_resnet() -> types.ModuleType:
    """torchvision.models.resnet: imported where torchvision imports, else from TINY_TORCHVISION's folder as a bare
    package (PyPI's torchvision is the CUDA build, whose __init__ fails beside the CPU torch), taken out of
    sys.modules after so that transformers, which imports torchvision where it finds one, does not see it."""
    folder = os.environ.get("TINY_TORCHVISION")
    if not folder:
        try:
            return importlib.import_module("torchvision.models.resnet")
        except ImportError:
            raise Unavailable("torchvision is not installed and TINY_TORCHVISION is unset") from None
    if not (Path(folder) / "torchvision" / "models" / "resnet.py").is_file():
        raise Unavailable(f"TINY_TORCHVISION={folder} holds no torchvision (pip install --no-deps --target)")
    saved = {k: sys.modules.pop(k) for k in list(sys.modules) if k == "torchvision" or k.startswith("torchvision.")}
    package = types.ModuleType("torchvision")
    package.__path__ = [str(Path(folder) / "torchvision")]
    sys.modules["torchvision"] = package
    try:
        return importlib.import_module("torchvision.models.resnet")
    finally:
        for k in [k for k in sys.modules if k == "torchvision" or k.startswith("torchvision.")]:
            del sys.modules[k]
        sys.modules.update(saved)


def _no_torchvision_for_transformers() -> None:
    """transformers and diffusers import torchvision where one is installed; PyPI's (CUDA) build fails to import
    beside the CPU torch, so a broken one is marked absent first."""
    try:
        import torchvision  # noqa: F401
    except Exception:  # noqa: BLE001
        sys.modules["torchvision"] = None  # type: ignore[assignment]


@functools.cache
def reference(name: str, key: str) -> Any:
    """The reference model of a workload (built once, shared by every side): eval mode, random weights, seed 0."""
    if torch is None:
        raise Unavailable("PyTorch is not installed")
    torch.manual_seed(0)
    if name == "resnet50":
        model = getattr(_torchvision_resnet(), key)()
        with torch.no_grad():  # batch-norm statistics away from 0 and 1, so that the layers compute
            for m in model.modules():
                if isinstance(m, torch.nn.BatchNorm2d):
                    m.running_mean.normal_(0, 0.1)
                    m.running_var.uniform_(0.5, 1.5)
        return model.eval()
    _no_torchvision_for_transformers()
    if name == "bert_base":
        import transformers

        config = transformers.BertConfig(**(BERT_QUICK if key == "quick" else {}))
        return transformers.BertModel(config).eval()
    import diffusers

    return diffusers.UNet2DConditionModel(**(UNET_QUICK if key == "quick" else UNET_SD15)).eval()


def _key(name: str, params: Params) -> str:
    return params.get("arch") or params["config"]


def _state(model: Any, device: str) -> dict[str, Tensor]:
    return {k: Tensor(v.detach().numpy(), device=device) for k, v in model.state_dict().items()}


def _inputs(name: str, params: Params) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    if name == "resnet50":
        return {"images": rng.standard_normal((params["batch"], 3, params["size"], params["size"]), dtype=np.float32)}
    if name == "bert_base":
        vocab = 100 if params["config"] == "quick" else 30522
        shape = (params["batch"], params["length"])
        return {"ids": rng.integers(0, vocab, shape).astype(np.int64), "mask": np.ones(shape, dtype=np.int64)}
    width = UNET_QUICK["cross_attention_dim"] if params["config"] == "quick" else UNET_SD15["cross_attention_dim"]
    latents = rng.standard_normal((params["batch"], 4, params["latent"], params["latent"]), dtype=np.float32)
    return {"latents": latents, "context": rng.standard_normal((params["batch"], params["tokens"], width), np.float32)}


# ---------------------------------------------------------------- the sides


def _tiny(name: str, params: Params, device: str) -> Prepared:
    ref = reference(name, _key(name, params))
    inputs = {k: tiny_upload(v, device) for k, v in _inputs(name, params).items()}
    if name == "resnet50":
        state = _state(ref, device)
        with skip_init():
            model = resnet.ResNet(resnet.config_of(state), device)
        resnet.load_state(model, state)
        jitted = TinyJit(lambda x: model(x).realize())
        return Prepared(lambda: tiny_done(jitted(inputs["images"])), note="TinyJit")
    if name == "bert_base":
        with skip_init():
            model = bert.BertModel(bert.BertConfig.from_hf(ref.config.to_dict()), device=device)
        load_weights(model, _state(ref, device), Path("the state dict"), base="bert")

        def run() -> None:
            out = model(inputs["ids"], attention_mask=inputs["mask"])
            tiny_done(out.last_hidden_state, out.pooler_output)

        return Prepared(run, note="un-jitted (the embedding reads the ids on the host, a jitted copy a row)")
    with skip_init():
        model = sd.UNet2DConditionModel(sd.UNetConfig.from_diffusers(dict(ref.config)), device)
    load_weights(model, _state(ref, device), Path("the state dict"), base="unet")
    timestep = np.full(params["batch"], 500.0, dtype=np.float32)
    return Prepared(lambda: tiny_done(model(inputs["latents"], timestep, inputs["context"])), note="un-jitted")


def _torch(name: str, params: Params, device: str) -> Prepared:
    ref = reference(name, _key(name, params))
    inputs = {k: torch.from_numpy(v) for k, v in _inputs(name, params).items()}
    if name == "resnet50":
        call = functools.partial(ref, inputs["images"])
    elif name == "bert_base":
        call = functools.partial(ref, input_ids=inputs["ids"], attention_mask=inputs["mask"])
    else:
        timestep = torch.full((params["batch"],), 500.0)
        call = functools.partial(ref, inputs["latents"], timestep, inputs["context"])

    def run() -> object:
        with torch.no_grad():
            return call()

    attention = f", {ref.config._attn_implementation} attention" if name == "bert_base" else ""
    return Prepared(run, note=f"eager, {torch.get_num_threads()} threads{attention}")


def _onnxruntime(name: str, params: Params, device: str) -> Prepared:
    if onnxruntime is None:
        raise Unavailable("onnxruntime is not installed")
    ref = reference(name, _key(name, params))
    inputs = _inputs(name, params)
    f = io.BytesIO()
    with warnings.catch_warnings():  # (the TorchScript exporter's deprecation; the new one needs onnxscript)
        warnings.simplefilter("ignore")
        if name == "resnet50":
            args, names = (torch.from_numpy(inputs["images"]),), ["images"]
        else:
            args, names = (torch.from_numpy(inputs["ids"]), torch.from_numpy(inputs["mask"])), ["ids", "mask"]
        torch.onnx.export(ref, args, f, dynamo=False, input_names=names, opset_version=17)
    session = onnxruntime.InferenceSession(f.getvalue(), providers=["CPUExecutionProvider"])
    feed = {k: inputs[k] for k in names}
    threads = session.get_session_options().intra_op_num_threads
    return Prepared(lambda: session.run(None, feed), note=f"CPU provider, intra-op threads {threads or 'default'}")


SETUPS = {"tiny": _tiny, "torch": _torch, "onnxruntime": _onnxruntime}


# ---------------------------------------------------------------- the table


def _figure(result: Result, metric: Metric, amounts: dict[str, float]) -> float | None:
    return metric.figure(result.best(), amounts) if result.ok and result.samples else None


def rows(report: dict[str, Any]) -> list[list[str]]:
    out = []
    for name, entry in report["workloads"].items():
        cells = []
        for side in SIDES:
            r = entry["results"].get(side)
            if r is None:
                cells.append("-")
            else:
                cells.append(f"{r['figure']:.3g}" if r["status"] == "ok" else r["status"])
        ratios = [f"{entry['ratios'][s]:.2f}x" if s in entry["ratios"] else "-" for s in ("torch", "onnxruntime")]
        met = entry["target_met"]
        out.append([name, entry["size"], entry["unit"], *cells, *ratios, {True: "yes", False: "no"}.get(met, "?")])
    return out


HEADER = ["workload", "size", "unit", *SIDES, "vs torch", "vs onnxruntime", "met?"]


def markdown(report: dict[str, Any]) -> str:
    m = report["machine"]
    lines = [
        f"CPU: {m['cpu']} ({m['cores']} cores), torch {m['torch']} ({m['torch_threads']} threads), onnxruntime "
        f"{m['onnxruntime']}, tiny {m['tiny_commit']} on {m['tiny_device']}, {m['date']}; load average at the start "
        f"{m['load_average']}",
        "",
        "| " + " | ".join(HEADER) + " |",
        "| " + " | ".join("---" for _ in HEADER) + " |",
    ]
    lines += ["| " + " | ".join(r) + " |" for r in rows(report)]
    notes = [f"- {name} {side}: {r['note']}" for name, e in report["workloads"].items()
             for side, r in e["results"].items() if r.get("note")]  # fmt: skip
    return "\n".join(lines + [""] + notes) + "\n"


def text(report: dict[str, Any]) -> str:
    table = [HEADER, *rows(report)]
    widths = [max(len(r[i]) for r in table) for i in range(len(HEADER))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in table)


def entry(workload: ModelWorkload, params: Params, results: dict[str, Result], quick: bool) -> dict[str, Any]:
    amounts = workload.amounts(params)
    figures = {s: _figure(r, workload.metric, amounts) for s, r in results.items()}
    ratios = {s: workload.metric.ratio(figures["tiny"], figures[s])
              for s in results if s != "tiny" and figures.get("tiny") and figures.get(s)}  # fmt: skip
    targeted = [s for s in TARGETS if s in workload.sides]
    met = None if quick or any(s not in ratios for s in targeted) else all(ratios[s] >= TARGETS[s] for s in targeted)
    sides = {}
    for s, r in results.items():
        side: dict[str, Any] = {"status": r.status, "note": r.note}
        if r.ok and r.samples:
            side |= {"figure": figures[s], "seconds": r.best(), "samples_s": r.samples, "warmup_s": r.warmups}
        elif r.error:
            side |= {"error": r.error, "traceback": r.traceback}
        sides[s] = side
    size = " ".join(f"{k}={v}" for k, v in params.items())
    return {"what": workload.what, "size": size, "unit": workload.metric.unit, "ratios": ratios,
            "target_met": met, "results": sides}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.models", description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="small models, one timed run: checks that the bench runs")
    p.add_argument("--only", metavar="NAME[,NAME]", help=f"of: {', '.join(w.name for w in WORKLOADS)}")
    p.add_argument("--device", metavar="DEV", help="tiny's device (default: the default device)")
    p.add_argument("--budget", type=float, default=900.0, help="seconds of timed runs per side at most")
    p.add_argument(
        "--unet-latent",
        type=int,
        default=64,
        metavar="N",
        help="sd_unet's latent size (default 64, 512 x 512 pixels: tiny's side peaks at about 7.4 GB)",
    )
    p.add_argument("--json", type=Path, help="write the report as JSON")
    p.add_argument("--markdown", type=Path, help="write the table as markdown")
    args = p.parse_args(argv)
    names = [n.strip() for n in (args.only or "").split(",") if n.strip()] or [w.name for w in WORKLOADS]
    unknown = sorted(set(names) - {w.name for w in WORKLOADS})
    if unknown:
        p.error(f"unknown workload(s) {unknown}; the workloads are {[w.name for w in WORKLOADS]}")
    device = Device.canonicalize(args.device) if args.device else Device.DEFAULT
    meta = machine(device) | {
        "onnxruntime": onnxruntime.__version__ if onnxruntime is not None else None,
        "load_average": " ".join(f"{x:.1f}" for x in os.getloadavg()),
    }
    report: dict[str, Any] = {"machine": meta, "options": {"quick": args.quick}, "workloads": {}}
    for workload in (w for w in WORKLOADS if w.name in names):
        sides = {s: functools.partial(SETUPS[s], workload.name) for s in workload.sides}
        reps = 1 if args.quick else workload.reps
        params = workload.params(args.quick)
        if workload.name == "sd_unet" and not args.quick:
            params = params | {"latent": args.unet_latent}
        results = measure(sides, params, device, workload.warmup, reps, args.budget, 0.0)
        report["workloads"][workload.name] = entry(workload, params, results, args.quick)
        reference.cache_clear()  # (the models' memory back before the next workload)
        gc.collect()
        print(text({"workloads": {workload.name: report["workloads"][workload.name]}}), flush=True)
    print()
    print(text(report))
    if args.json:
        args.json.write_text(json.dumps(report, indent=1))
    if args.markdown:
        args.markdown.write_text(markdown(report))
    errors = [f"{n} {s}: {r['error']}" for n, e in report["workloads"].items() for s, r in e["results"].items()
              if r["status"] == "error"]  # fmt: skip
    for line in errors:
        print(f"error: {line}", file=sys.stderr)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
