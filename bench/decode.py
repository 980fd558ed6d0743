"""A decode-like step: one query attends over a KV cache that grows by a token each step, as text generation does.

The step writes the new key and value at `pos` into preallocated caches and attends over `cache[:, :, :pos+1]`; tiny
jits it once with pos a bound Variable, so every length replays the same kernels. One timed run is one step at each
of the sweep's lengths (64 to 2047); the note says how many kernels were compiled after the first call (the target:
none). decode_overhead is what a step costs above its kernels: the same jitted step on the NULL device, whose kernels
do nothing (the target: under 50 us).
"""

from __future__ import annotations

import numpy as np

from bench.core import MS, Metric, Params, Prepared, Target, Workload
from bench.frameworks import TinyJit, tiny_done, torch, torch_done
from tiny.tensor import Tensor, Variable
from tiny.tensor.realize import programs

US_PER_STEP = Metric("us/step", 1e6)


def _lengths(params: Params) -> list[int]:
    most = params["max"]
    return [n for n in (64, 128, 256, 512, 1024, 2048) if n < most] + [most - 1]


def _tiny_step(params: Params, device: str) -> tuple[TinyJit, Tensor, Tensor, Variable]:
    """The jitted step on `device`, its query/key input, and the position Variable."""
    heads, dim, most = params["heads"], params["dim"], params["max"]
    cache_k = Tensor.zeros(1, heads, most, dim, device=device).contiguous().realize()
    cache_v = Tensor.zeros(1, heads, most, dim, device=device).contiguous().realize()
    pos = Variable("pos", 0, most - 1)

    def step(q: Tensor, kv: Tensor, p: object) -> Tensor:
        cache_k[:, :, p : p + 1] = kv
        cache_v[:, :, p : p + 1] = kv
        return q.scaled_dot_product_attention(cache_k[:, :, : p + 1], cache_v[:, :, : p + 1]).realize()

    rng = np.random.default_rng(0)
    q = Tensor(rng.standard_normal((1, heads, 1, dim)).astype(np.float32), device=device).realize()
    kv = Tensor(rng.standard_normal((1, heads, 1, dim)).astype(np.float32), device=device).realize()
    return TinyJit(step), q, kv, pos  # type: ignore[return-value]


def _decode_tiny(params: Params, device: str) -> Prepared:
    jitted, q, kv, pos = _tiny_step(params, device)
    lengths = _lengths(params)
    for n in lengths[:2]:  # the warm-up call and the capture
        jitted(q, kv, pos.bind(n))
    compiled = len(programs())
    for n in lengths:
        tiny_done(jitted(q, kv, pos.bind(n)))
    after = len(programs()) - compiled

    def run() -> None:
        for n in lengths:
            out = jitted(q, kv, pos.bind(n))
        tiny_done(out)

    note = f"lengths {lengths[0]}..{lengths[-1]}; {after} compiles after the first call ({jitted.replays} replays)"
    return Prepared(run, units=len(lengths), note=note)


def decode_torch(params: Params, device: str, torch_device: str | None = None) -> Prepared:
    """PyTorch's step, eager, on torch_device (by default the GPU where tiny's device is an NVIDIA one)."""
    heads, dim, most = params["heads"], params["dim"], params["max"]
    dev = torch_device or ("cuda" if device.split(":")[0] in ("CUDA", "NV") else "cpu")
    cache_k = torch.zeros(1, heads, most, dim, device=dev)
    cache_v = torch.zeros(1, heads, most, dim, device=dev)
    rng = np.random.default_rng(0)
    q = torch.from_numpy(rng.standard_normal((1, heads, 1, dim)).astype(np.float32)).to(dev)
    kv = torch.from_numpy(rng.standard_normal((1, heads, 1, dim)).astype(np.float32)).to(dev)
    lengths = _lengths(params)
    attend = torch.nn.functional.scaled_dot_product_attention

    def run() -> None:
        with torch.no_grad():
            for n in lengths:
                cache_k[:, :, n : n + 1] = kv
                cache_v[:, :, n : n + 1] = kv
                out = attend(q, cache_k[:, :, : n + 1], cache_v[:, :, : n + 1])
        torch_done(out)

    return Prepared(run, units=len(lengths))


DECODE_STEP = Workload(
    name="decode_step",
    group="decode",
    what="jitted attention of one query over a KV cache of growing length (one step at each length 64..2047, "
    "heads x dim of work); time per step, compiles after the first call in the note",
    metrics=(MS,),
    full={"heads": 128, "dim": 64, "max": 2048},
    quick={"heads": 8, "dim": 64, "max": 512},
    setups={"tiny": _decode_tiny, "torch": decode_torch},
)


def _overhead_tiny(params: Params, device: str) -> Prepared:
    jitted, q, kv, pos = _tiny_step(params, "NULL")
    lengths = _lengths(params)
    for n in lengths[:2]:
        jitted(q, kv, pos.bind(n))
    compiled = len(programs())

    def run() -> None:
        for n in lengths:
            jitted(q, kv, pos.bind(n))

    run()
    return Prepared(run, units=len(lengths), note=f"NULL device; {len(programs()) - compiled} compiles after the first")


DECODE_OVERHEAD = Workload(
    name="decode_overhead",
    group="decode",
    what="the decode step's cost above its kernels: the same jitted step on the NULL device (kernels do nothing)",
    metrics=(US_PER_STEP,),
    full={"heads": 128, "dim": 64, "max": 2048},
    quick={"heads": 8, "dim": 64, "max": 512},
    setups={"tiny": _overhead_tiny},
    target=Target("<50 us/step", max_figure=50.0),
)
