"""Smoke test of the benchmark suite at the repository root: `python -m bench.run --quick` on a few fast workloads
runs, prints its table and writes JSON with finite, positive figures for tiny and NumPy; the GPU suite
(`--gpu --quick`) runs every workload with tiny on the CPU device and PyTorch on the CPU. It never checks a time:
benchmarks measure, tests check."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
WORKLOADS = ("matmul512", "elementwise", "sum", "softmax", "overhead_each")
FRAMEWORKS = ("tiny", "numpy", "torch", "tinygrad")
GPU_WORKLOADS = (
    *(f"gpu_matmul_{dtype}_{n}" for n in (4096, 8192) for dtype in ("fp16", "bf16")),
    "gpu_elementwise",
    "gpu_softmax",
    "gpu_layer_norm",
    "gpu_attention",
    "gpu_mnist_step",
    "gpu_jit_launch",
    "gpu_decode_step",
)
GPU_FRAMEWORKS = ("tiny", "torch", "peak")


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, str]:
    """The JSON report and the printed table of one quick run (the jit_replay row is there for its n/a path)."""
    out = tmp_path_factory.mktemp("bench") / "results.json"
    only = ",".join((*WORKLOADS, "jit_replay"))
    cmd = [sys.executable, "-m", "bench.run", "--quick", "--only", only, "--json", str(out)]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, f"bench.run exited {done.returncode}:\n{done.stdout}\n{done.stderr}"
    return json.loads(out.read_text()), done.stdout


def _finite_positive(x: object) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x) and x > 0


def test_report_names_the_machine_and_every_chosen_workload(run: tuple[dict, str]) -> None:
    report, _ = run
    assert set(report["workloads"]) == {*WORKLOADS, "jit_replay"}
    for key in ("cpu", "cores", "python", "numpy", "torch", "tinygrad", "tiny_device", "date"):
        assert key in report["machine"], key
    assert report["options"]["quick"] is True


@pytest.mark.parametrize("name", WORKLOADS)
def test_tiny_and_numpy_have_finite_positive_figures(run: tuple[dict, str], name: str) -> None:
    entry = run[0]["workloads"][name]
    assert set(entry["results"]) == set(FRAMEWORKS)
    for framework in ("tiny", "numpy"):
        side = entry["results"][framework]
        assert side["status"] == "ok", side
        assert entry["metrics"] and set(side["figures"]) == set(entry["metrics"])
        assert all(_finite_positive(v) for v in side["figures"].values()), side["figures"]
        assert side["samples_s"] and all(_finite_positive(s) for s in side["samples_s"])
    assert _finite_positive(entry["ratios"]["numpy"])


def test_ratio_means_times_as_fast_for_every_unit(run: tuple[dict, str]) -> None:
    # sum reports GB/s (higher is better) and ms (lower is better): tiny's ratio must be the same number for both
    sides = run[0]["workloads"]["sum"]["results"]
    tiny, numpy = sides["tiny"]["figures"], sides["numpy"]["figures"]
    assert tiny["GB/s"] / numpy["GB/s"] == pytest.approx(numpy["ms"] / tiny["ms"], rel=1e-6)
    assert run[0]["workloads"]["sum"]["ratios"]["numpy"] == pytest.approx(tiny["GB/s"] / numpy["GB/s"], rel=1e-6)


def test_a_side_that_cannot_run_is_reported_not_fatal(run: tuple[dict, str]) -> None:
    sides = run[0]["workloads"]["jit_replay"]["results"]
    assert sides["tiny"]["status"] in ("ok", "n/a")  # n/a until TinyJit exists
    assert sides["numpy"]["status"] == "none"


def test_table_has_a_row_per_workload_and_unit(run: tuple[dict, str]) -> None:
    _, table = run
    lines = table.splitlines()
    assert lines[0].split()[:3] == ["workload", "size", "unit"] and "met?" in lines[0]
    for name in WORKLOADS:
        assert any(line.startswith(name + " ") for line in lines), name
    assert sum(line.startswith("sum ") for line in lines) == 2  # GB/s and ms


@pytest.fixture(scope="module")
def gpu_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, str]:
    """The JSON report and the table of one quick run of the GPU suite with tiny on the CPU device and PyTorch on
    the CPU (--torch-device cpu): every code path of the GPU workloads but PyTorch's CUDA graph capture."""
    out = tmp_path_factory.mktemp("bench_gpu") / "results_gpu.json"
    cmd = [sys.executable, "-m", "bench.run", "--gpu", "--quick", "--device", "CPU", "--torch-device", "cpu"]
    done = subprocess.run([*cmd, "--json", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, f"bench.run --gpu exited {done.returncode}:\n{done.stdout}\n{done.stderr}"
    return json.loads(out.read_text()), done.stdout


def test_gpu_suite_has_its_workloads_columns_and_machine(gpu_run: tuple[dict, str]) -> None:
    report, table = gpu_run
    assert list(report["workloads"]) == list(GPU_WORKLOADS)
    assert report["machine"]["tiny_device"] == "CPU" and report["machine"]["torch_device"] == "cpu"
    assert report["machine"]["gpu"] is None  # PyTorch on the CPU names no GPU
    assert "gpu_driver" in report["machine"] and "torch_cuda" in report["machine"]
    head = table.splitlines()[0].split()
    assert head[:6] == ["workload", "size", "unit", *GPU_FRAMEWORKS] and "peak" in head[6:], head


@pytest.mark.parametrize("name", GPU_WORKLOADS)
def test_gpu_workload_has_tiny_and_torch_figures_and_its_target_ratio(gpu_run: tuple[dict, str], name: str) -> None:
    entry = gpu_run[0]["workloads"][name]
    assert tuple(entry["results"]) == GPU_FRAMEWORKS
    for framework in ("tiny", "torch"):
        side = entry["results"][framework]
        assert side["status"] == "ok", side
        assert set(side["figures"]) == set(entry["metrics"])
        assert all(_finite_positive(v) for v in side["figures"].values()), side["figures"]
    assert _finite_positive(entry["ratios"]["torch"])
    if entry["target"]:  # ">=0.7x torch": the ratio its check reads is there; --quick does not check it
        assert _finite_positive(entry["ratios"][entry["target"].split()[-1]]), entry["target"]
        assert entry["target_met"] is None
    expected_peak = "ok" if name == "gpu_elementwise" else "none"
    assert entry["results"]["peak"]["status"] == expected_peak


def test_gpu_elementwise_ratio_is_against_the_copy_bandwidth(gpu_run: tuple[dict, str]) -> None:
    entry = gpu_run[0]["workloads"]["gpu_elementwise"]
    tiny, peak = entry["results"]["tiny"], entry["results"]["peak"]
    # the peak counts its own copy's bytes, read and written; tiny counts the chain's 4 inputs and 1 output
    assert peak["figures"]["GB/s"] == pytest.approx(2 * entry["params"]["copy_bytes"] / peak["seconds"] / 1e9)
    assert tiny["figures"]["GB/s"] == pytest.approx(5 * 4 * entry["params"]["n"] / tiny["seconds"] / 1e9)
    assert entry["ratios"]["peak"] == pytest.approx(tiny["figures"]["GB/s"] / peak["figures"]["GB/s"])
    assert entry["target"] == ">=0.85x peak"


def test_torch_device_is_refused_without_gpu() -> None:
    cmd = [sys.executable, "-m", "bench.run", "--torch-device", "cpu", "--only", "sum"]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 2 and "--torch-device goes with --gpu" in done.stderr


def _has_gcc_and_clang() -> bool:
    import shutil

    from tiny.runtime.cpu import find_clang

    return shutil.which("gcc") is not None and find_clang() is not None


@pytest.mark.skipif(not _has_gcc_and_clang(), reason="the compiler axis test needs clang and gcc on PATH")
def test_the_compiler_axis_times_each_cpu_path_in_one_run(tmp_path: Path) -> None:
    """--compiler all: tiny on clang's C (the tiny column), LLVM in-process and gcc's C, each against the same
    references and compared with the first; the cold and the warm first result both run on each path."""
    out = tmp_path / "results.json"
    only = "matmul512,first_result_warm"
    cmd = [sys.executable, "-m", "bench.run", "--quick", "--compiler", "all", "--only", only, "--json", str(out)]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, f"bench.run exited {done.returncode}:\n{done.stdout}\n{done.stderr}"
    report = json.loads(out.read_text())
    compilers = report["machine"]["compilers"]
    assert list(compilers) == ["tiny", "tiny:llvm", "tiny:gcc"]
    assert "clang" in compilers["tiny"] and "llvmlite" in compilers["tiny:llvm"] and "gcc" in compilers["tiny:gcc"]
    for name in ("matmul512", "first_result_warm"):
        entry = report["workloads"][name]
        assert list(entry["results"])[:3] == ["tiny", "tiny:llvm", "tiny:gcc"]
        assert all(entry["results"][s]["status"] == "ok" for s in compilers), entry["results"]
        first = entry["metrics"][0]
        for side in ("tiny:llvm", "tiny:gcc"):
            theirs, ours = entry["results"][side]["figures"][first], entry["results"]["tiny"]["figures"][first]
            expected = theirs / ours if first == "GFLOPS" else ours / theirs
            assert entry["compiler_ratios"][side] == pytest.approx(expected)
        assert "tiny:llvm" not in entry["ratios"] and "numpy" in entry["ratios"]
    header = done.stdout.splitlines()[0]
    assert "tiny:llvm vs tiny" in header and "tiny:gcc vs tiny" in header
    assert any(line.startswith("tiny:llvm vs tiny: at least 0.9x on ") for line in done.stdout.splitlines())


def test_an_unknown_compiler_is_refused() -> None:
    cmd = [sys.executable, "-m", "bench.run", "--compiler", "icc", "--only", "sum"]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 2 and "--compiler takes clang, llvm, gcc or all" in done.stderr


@pytest.fixture
def bench_core(monkeypatch: pytest.MonkeyPatch):
    """bench.core imported in this process, with one timed run per turn."""
    monkeypatch.syspath_prepend(str(ROOT))
    import bench.core

    monkeypatch.setattr(bench.core, "TURN_SECONDS", 0.0)
    return bench.core


def _logging_side(core, name: str, log: list[str], fail_on: int | None = None):
    def setup(params: dict, device: str):
        def run() -> None:
            log.append(name)
            if fail_on is not None and log.count(name) == fail_on:
                raise ValueError(f"{name} broke")

        return core.Prepared(run)

    return setup


def test_sides_are_timed_in_turns_each_rewarmed_after_another(bench_core) -> None:
    log: list[str] = []
    sides = {n: _logging_side(bench_core, n, log) for n in "ab"}
    results = bench_core.measure(sides, {}, "CPU", warmup=1, reps=2, budget=60.0, min_seconds=0.0)
    # warmups; round 1 (a, b), each turn an untimed run after the other side's; round 2 reversed (b, a): b ran last
    assert "".join(log) == "ab" + "aabb" + "baa"
    assert [len(results[n].samples) for n in "ab"] == [2, 2] and all(results[n].ok for n in "ab")


def test_a_side_that_fails_while_timed_is_an_error_and_the_others_finish(bench_core) -> None:
    log: list[str] = []
    sides = {"a": _logging_side(bench_core, "a", log), "b": _logging_side(bench_core, "b", log, fail_on=3)}
    results = bench_core.measure(sides, {}, "CPU", warmup=1, reps=3, budget=60.0, min_seconds=0.0)
    assert results["b"].status == "error" and results["b"].error == "ValueError: b broke"
    assert results["a"].ok and len(results["a"].samples) == 3


def test_a_warmup_past_the_budget_is_the_one_measurement(bench_core) -> None:
    log: list[str] = []
    results = bench_core.measure(
        {"a": _logging_side(bench_core, "a", log)}, {}, "CPU", warmup=2, reps=5, budget=-1.0, min_seconds=0.0
    )
    assert log == ["a"] and results["a"].over_budget and len(results["a"].samples) == 1


def test_the_language_model_benchmark_runs(tmp_path: Path) -> None:
    """`python -m bench.llm --quick` on tiny and transformers (llama.cpp where llama-cpp-python is installed): a
    small model's files written, then each side's decode and prefill tokens/s and peak memory in the table, finite
    and positive (no time is checked)."""
    pytest.importorskip("transformers")
    pytest.importorskip("gguf")
    sides = "tiny,torch" + (",llama.cpp" if _installed("llama_cpp") else "")
    cmd = [sys.executable, "-m", "bench.llm", "--quick", "--formats", "F32,Q8_0", "--sides", sides]
    cmd += ["--decode", "4", "--prefill", "8", "--folder", str(tmp_path / "files")]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, f"bench.llm exited {done.returncode}:\n{done.stdout}\n{done.stderr}"
    rows = [line.split(" | ") for line in done.stdout.splitlines() if line.startswith("| ") and "---" not in line]
    table = {(r[0].strip("| "), r[1]): r for r in rows[1:]}
    for key in (("F32", "tiny"), ("Q8_0", "tiny"), ("F32", "torch"), ("BF16", "torch"), ("F32 (folder)", "tiny")):
        decode, prefill, peak = (float(table[key][i]) for i in (2, 5, -3))
        assert math.isfinite(decode) and decode > 0 and prefill > 0 and peak > 0, (key, table[key])
    assert "read bandwidth" in done.stdout


def test_the_language_model_benchmark_takes_the_gpus_form(tmp_path: Path) -> None:
    """bench.llm as bench/gpu_check.sh runs it on a GPU (tiny on --device, transformers in --torch-dtypes on
    --torch-device, no llama.cpp), here on the CPU: the F16 file's tiny row and transformers' float16 row, the ratios
    against transformers at the same format."""
    pytest.importorskip("transformers")
    pytest.importorskip("gguf")
    cmd = [sys.executable, "-m", "bench.llm", "--quick", "--formats", "F16", "--sides", "tiny,torch", "--device", "CPU"]
    cmd += ["--torch-device", "cpu", "--torch-dtypes", "float16", "--decode", "4", "--prefill", "8"]
    cmd += ["--folder", str(tmp_path / "files")]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, f"bench.llm exited {done.returncode}:\n{done.stdout}\n{done.stderr}"
    rows = [line.split(" | ") for line in done.stdout.splitlines() if line.startswith("| ") and "---" not in line]
    assert rows[0][3] == "vs torch"
    table = {(r[0].strip("| "), r[1]): r for r in rows[1:]}
    assert set(table) == {("F16", "tiny"), ("F16", "torch")}  # (no float32 folder row without float32)
    assert table[("F16", "torch")][3] == "1.00x" and float(table[("F16", "tiny")][3].rstrip("x")) > 0


def test_the_language_model_benchmark_pairs_its_rounds(monkeypatch: pytest.MonkeyPatch) -> None:
    """bench.llm times the sides' decoding in turns: a side's ratio to llama.cpp is the median of the rounds' ratios,
    each of two figures timed one after the other (this VM's memory bandwidth moves: one process decoding F32 went
    from 63 to 48 ms a token mid-run), where the medians of each side would pair figures of different moments."""
    monkeypatch.syspath_prepend(str(ROOT))
    from bench.llm import Run, _ratio

    tiny, ref = Run("tiny", "F32", {}, 20.0, 0, rounds=[10.0, 20.0, 30.0]), Run("llama.cpp", "F32", {}, 25.0, 0)
    ref.rounds = [8.0, 25.0, 30.0]
    assert _ratio(tiny, ref) == 1.0  # (the rounds' ratios 1.25, 0.8, 1.0; the medians' 20 / 25 = 0.8)
    assert _ratio(Run("tiny", "F32", {}, 20.0, 0), ref) == 0.8  # (no rounds: the medians)


def test_the_language_model_benchmarks_roofline_is_each_rounds_own(monkeypatch: pytest.MonkeyPatch) -> None:
    """A side's fraction of the roofline is the median of its rounds' fractions, each against the read bandwidth
    measured just before that round (the machine's speed drifts within a run), not all against the bandwidth of the
    run's start; without a bandwidth a round, the median decode against the given one."""
    monkeypatch.syspath_prepend(str(ROOT))
    from bench.llm import Run, of_roofline

    run = Run("tiny", "Q4_0", {}, 20.0, 0, rounds=[10.0, 20.0, 30.0], bandwidths=[1e9, 4e9, 3e9])
    # (roofs of 10, 40 and 30 tokens/s at 1e8 bytes a token: fractions 1.0, 0.5 and 1.0; the start's 4e9: 20 / 40)
    assert of_roofline(run, 10**8, 4e9) == 1.0
    assert of_roofline(Run("tiny", "Q4_0", {}, 20.0, 0, rounds=[10.0, 20.0, 30.0]), 10**8, 4e9) == 0.5


def test_the_language_model_benchmark_counts_a_prompts_fastest_pass(monkeypatch: pytest.MonkeyPatch) -> None:
    """A side's prefill figure is its fastest of PREFILL_RUNS timed passes (one alone moved by a quarter between runs
    on this VM), every side timed alike: here on a clock that each pass moves by 3, 1 and 2 seconds."""
    monkeypatch.syspath_prepend(str(ROOT))
    import bench.llm as llm

    clock, steps = [0.0], iter([3.0, 1.0, 2.0])

    def run() -> None:
        clock[0] += next(steps)

    monkeypatch.setattr(llm.time, "perf_counter", lambda: clock[0])
    assert llm.PREFILL_RUNS == 3 and llm._fastest(64, run) == 64.0


def test_a_language_model_side_that_crashes_is_named_by_its_signal(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A side's process killed by a signal (llama.cpp's AMX product on some hosts: SIGSEGV) leaves nothing on stderr:
    the table's note names the signal."""
    import argparse
    import signal

    monkeypatch.syspath_prepend(str(ROOT))
    import bench.llm as llm

    args = argparse.Namespace(threads=1, prefill=[8], prompt=8, decode=4, context=24, device=None)
    args.torch_device, args.llama_cpp_repack, args.side_timeout = "cpu", "off", 60.0
    child = llm._Child("tiny", tmp_path / "none.gguf", args)
    child.proc.send_signal(signal.SIGSEGV)  # (at once: long before the child's imports are done)
    with pytest.raises(llm._SideFailed, match="SIGSEGV"):
        child.expect("ready")
    child.timer.cancel()


def _installed(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None


def test_the_model_benchmark_runs(tmp_path: Path) -> None:
    """`python -m bench.models --quick`: small models of each workload built by their libraries (ResNet-18 where
    torchvision is found), tiny's side, PyTorch's and onnxruntime's timed; each figure finite and positive, a ratio
    for each reference, and the workloads' target left unjudged at --quick (no time is checked)."""
    pytest.importorskip("transformers")
    pytest.importorskip("diffusers")
    pytest.importorskip("onnxruntime")
    out = tmp_path / "models.json"
    cmd = [sys.executable, "-m", "bench.models", "--quick", "--json", str(out), "--markdown", str(tmp_path / "m.md")]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, f"bench.models exited {done.returncode}:\n{done.stdout}\n{done.stderr}"
    report = json.loads(out.read_text())
    assert report["machine"]["onnxruntime"] and report["machine"]["load_average"]
    assert list(report["workloads"]) == ["resnet50", "bert_base", "sd_unet"]
    for name, entry in report["workloads"].items():
        sides = entry["results"]
        if name == "resnet50" and sides["tiny"]["status"] == "n/a":  # (no torchvision here: every side says so)
            assert "torchvision" in sides["tiny"]["note"]
            continue
        want = ("tiny", "torch", "onnxruntime") if name != "sd_unet" else ("tiny", "torch")
        assert tuple(sides) == want and all(sides[s]["status"] == "ok" for s in want), sides
        assert all(math.isfinite(sides[s]["figure"]) and sides[s]["figure"] > 0 for s in want)
        assert set(entry["ratios"]) == set(want[1:]) and entry["target_met"] is None
    assert "| bert_base |" in (tmp_path / "m.md").read_text()


def test_compare_takes_the_two_checkouts_in_turns(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(ROOT))
    from bench.compare import turns

    assert turns(["a", "b"], 2) == [
        (0, "a", "before"), (0, "a", "after"), (0, "b", "after"), (0, "b", "before"),
        (1, "a", "after"), (1, "a", "before"), (1, "b", "before"), (1, "b", "after"),
    ]  # fmt: skip


def test_compare_runs_a_workload_on_two_checkouts(tmp_path: Path) -> None:
    """bench.compare with this checkout on both sides: a row of finite figures for tiny and PyTorch, each side's
    run from the checkout it names."""
    out = tmp_path / "compare.json"
    cmd = [sys.executable, "-m", "bench.compare", str(ROOT), str(ROOT), "--quick", "--rounds", "1", "--only", "sum"]
    done = subprocess.run([*cmd, "--json", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, f"{done.stdout}\n{done.stderr}"
    report = json.loads(out.read_text())
    (row,) = report["rows"]
    assert row["workload"] == "sum"
    for key in ("tiny_before", "tiny_after", "torch_before", "torch_after", "after_over_before", "normalized"):
        assert _finite_positive(row[key]), (key, row)
    assert [len(report["runs"][side]["sum"]) for side in ("before", "after")] == [1, 1]
    assert "geometric mean after/before" in done.stdout and "sum" in done.stdout


def test_compare_refuses_a_folder_that_is_no_checkout(tmp_path: Path) -> None:
    cmd = [sys.executable, "-m", "bench.compare", str(tmp_path), str(ROOT), "--quick", "--only", "sum"]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "is not a checkout of tiny" in done.stderr


def test_a_fresh_process_reads_tinys_modules_as_bytecode(monkeypatch: pytest.MonkeyPatch) -> None:
    """The first-result workloads time a new process as a user's is: its Python's modules (tiny's too) read as
    bytecode once the warmup wrote it, even where this environment says PYTHONDONTWRITEBYTECODE (a checkout's sources
    would otherwise be compiled again in every timed process, and PyTorch's come with their bytecode)."""
    monkeypatch.syspath_prepend(str(ROOT))
    from bench.frameworks import bytecode_cache, spawn_fresh

    monkeypatch.setenv("PYTHONDONTWRITEBYTECODE", "1")
    spawn_fresh("import tiny.tensor", {})
    written = [p for p in Path(bytecode_cache()).rglob("*.pyc") if "tiny" in p.parts]
    assert any(p.name.startswith("tensor.") and p.parent.name == "tensor" for p in written), written


def test_compare_gives_each_checkout_bytecode(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """bench.compare's processes (and the fresh ones they time) read their checkout's Python as bytecode kept under
    the side's scratch folder, whatever the checkout's bench does about PYTHONDONTWRITEBYTECODE."""
    monkeypatch.syspath_prepend(str(ROOT))
    from bench.checkout import environment

    monkeypatch.setenv("PYTHONDONTWRITEBYTECODE", "1")
    env = environment(ROOT, tmp_path)
    assert "PYTHONDONTWRITEBYTECODE" not in env and env["PYTHONPYCACHEPREFIX"] == str(tmp_path / "bytecode")
    done = subprocess.run([sys.executable, "-c", "import tiny.ir.uop"], env=env, capture_output=True, timeout=120)
    assert done.returncode == 0 and list((tmp_path / "bytecode").rglob("uop.*.pyc")), done.stderr
