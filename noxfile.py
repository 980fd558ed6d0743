"""One nox session per package, plus lint.

`nox` runs every session; `nox -s tensor` runs one; `nox -s ir -- -k flags -x` passes the words after `--` to pytest;
`nox -R` reuses the virtual environments and skips the installs (the tiny packages are installed editable, so edits
under packages/*/src are seen without reinstalling).

The tiny-* packages are always installed from this checkout, all in one pip command with no index at all, after
everything from an index (test tools, third-party dependencies, hatchling) is in place. A tiny-* name missing from
that command fails the install instead of being fetched from PyPI, where those names are not ours.
"""

from __future__ import annotations

import ctypes.util
import os
import shutil
import tomllib
from pathlib import Path

import nox
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parent
PACKAGES = ROOT / "packages"

nox.options.default_venv_backend = "virtualenv"
nox.options.reuse_venv = "yes"
nox.options.error_on_missing_interpreters = True
nox.options.sessions = [
    "ir",
    "codegen",
    "runtime_misc",
    "nv",
    "amd",
    "tensor",
    "cl",
    "llvm",
    "webgpu",
    "mesa",
    "lint",
]


def _project(pyproject: Path) -> dict:
    return tomllib.loads(pyproject.read_text())["project"]


# distribution name -> its [project] table, for every package under packages/
LOCAL = {canonicalize_name(p["name"]): p for p in (_project(f) for f in sorted(PACKAGES.glob("*/pyproject.toml")))}
# tool name -> the requirement string of the umbrella's `dev` extra (the one place the tools are pinned)
DEV_TOOLS = _project(ROOT / "pyproject.toml")["optional-dependencies"]["dev"]
DEV = {canonicalize_name(Requirement(r).name): r for r in DEV_TOOLS}
TEST_TOOLS = [DEV["pytest"], DEV["pytest-xdist"], DEV["hypothesis"], DEV["numpy"]]
# every pytest run spreads its tests over the cores (pytest-xdist); `nox -s NAME -- -n 0` runs them in one process
# (the words after `--` come later on pytest's command line and win)
PARALLEL = ["-n", "auto"]
# what pip needs to build editable installs without build isolation (hatchling asks for editables~=0.3)
EDITABLE_BACKEND = [DEV["hatchling"], "editables~=0.3"]


def _requirements(dist: str, extras: tuple[str, ...] = ()) -> list[Requirement]:
    project = LOCAL[dist]
    reqs = list(project.get("dependencies", []))
    for extra in extras:
        reqs += project.get("optional-dependencies", {})[extra]
    return [Requirement(r) for r in reqs]


def _local_closure(dist: str, extras: tuple[str, ...] = ()) -> dict[str, set[str]]:
    """`dist` and every tiny package it needs (with `extras`), dependencies first, each with the extras asked of it
    (tiny-tensor asks tiny-runtime-misc for [llvm])."""
    order: dict[str, set[str]] = {}

    def visit(name: str, extras: tuple[str, ...]) -> None:
        for req in _requirements(name, extras):
            dep = canonicalize_name(req.name)
            if dep in LOCAL and (dep not in order or not set(req.extras) <= order[dep]):
                visit(dep, tuple(sorted(order.get(dep, set()) | set(req.extras))))
        order.setdefault(name, set()).update(extras)

    visit(dist, extras)
    return order


def _third_party(dists: dict[str, set[str]]) -> list[str]:
    """The requirements of `dists` (with their extras) that come from an index (everything not a tiny package)."""
    reqs = [r for d, extras in dists.items() for r in _requirements(d, tuple(sorted(extras)))]
    return sorted({str(r) for r in reqs if canonicalize_name(r.name) not in LOCAL})


def _install_local(
    session: nox.Session,
    dist: str,
    extras: tuple[str, ...] = (),
    tools: tuple[str, ...] = (),
    test_with: tuple[str, ...] = (),
) -> None:
    """Install dist (and test_with: local packages its tests use but it does not depend on)."""
    dists: dict[str, set[str]] = {}
    for name in (*test_with, dist):
        for d, asked in _local_closure(name, extras if name == dist else ()).items():
            dists.setdefault(d, set()).update(asked)
    # 1. from the index: test tools, the packages' third-party dependencies, and the build backend
    from_index = [*TEST_TOOLS, *tools, *_third_party(dists), *EDITABLE_BACKEND]
    session.install(*dict.fromkeys(from_index))
    # 2. from this checkout, with no index, no find-links and no pip config: nothing can be fetched here
    offline = {name: None for name in os.environ if name.startswith("PIP_")} | {"PIP_CONFIG_FILE": os.devnull}
    editables = [arg for d in dists for arg in ("-e", str(PACKAGES / d))]
    session.install("--no-index", "--no-build-isolation", *editables, env=offline)


def _pytest(session: nox.Session, dist: str, env: dict[str, str] | None = None) -> None:
    # `nox -s ir -- packages/tiny-ir/tests/test_x.py` runs what it names; otherwise the package's tests folder
    names_paths = any(Path(arg.split("::")[0]).exists() for arg in session.posargs if not arg.startswith("-"))
    paths = [] if names_paths else [str(PACKAGES / dist / "tests")]
    # pytest exits 5 when it collects no test; that fails the session like any other non-zero exit
    # the slowest tests are listed at the end: the default run is kept under 40 minutes, and this says where it goes
    session.run("pytest", *PARALLEL, "--durations=15", *paths, *session.posargs, env=env)


@nox.session
def ir(session: nox.Session) -> None:
    """tiny-ir: the IR, scheduler and device interface, and the repository's packaging tests."""
    _install_local(session, "tiny-ir")
    _pytest(session, "tiny-ir")


@nox.session
def codegen(session: nox.Session) -> None:
    """tiny-codegen: lowering, optimizer and renderers."""
    _install_local(session, "tiny-codegen")
    _pytest(session, "tiny-codegen")


@nox.session
def runtime_misc(session: nox.Session) -> None:
    """tiny-runtime-misc: CPU, PYTHON, NULL and the smaller runtimes."""
    # the runtime depends on tiny-ir alone; its tests also render kernels, with tiny-codegen's C renderer
    _install_local(session, "tiny-runtime-misc", test_with=("tiny-codegen",))
    _pytest(session, "tiny-runtime-misc")


def _unopened(session: nox.Session, device: str, shown: str, env: dict[str, str] | None = None) -> str | None:
    """Why `device` does not open in the session's environment (its error, in a line), or None where it opens;
    `shown`: what of the opened device the log shows."""
    code = (
        "from tiny.ir.device import Device\n"
        f"try:\n    print({device!r}, 'ok:', {shown})\n"
        f"except Exception as e:\n    print({device!r}, 'missing:', type(e).__name__, e)\n"
    )
    probe = session.run("python", "-c", code, silent=True, env=env or {})
    return None if probe is None or f"{device} ok:" in probe else probe.strip()


@nox.session
def nv(session: nox.Session) -> None:
    """tiny-runtime-nv: the compile-only tests run everywhere: every kernel of a set of tensor ops as CUDA C compiled
    by NVRTC (the nvidia-cuda-nvrtc wheels of the cu12 and cu13 extras) and as PTX assembled by ptxas (from the
    nvidia-cuda-nvcc-cu12 wheel, or a CUDA toolkit), the tensor-core kernels' machine code read back by nvdisasm.
    Then, where a GPU opens, the device tests and the whole tiny-tensor suite with DEVICE=CUDA and with
    DEVICE=CUDA:PTX; without a GPU it says that it skipped those."""
    project = LOCAL["tiny-runtime-nv"]["optional-dependencies"]
    nvrtc = (*project["cu12"], *project["cu13"])
    ptxas = "nvidia-cuda-nvcc-cu12>=12.4"  # ptxas checks the PTX renderer's output where no CUDA toolkit is
    nvdisasm = "nvidia-cuda-nvdisasm>=13.0"  # the SASS of cubins (test_sass.py): what runs on the GPU
    tools = (DEV["torch"], DEV["safetensors"], DEV["gguf"], *nvrtc, ptxas, nvdisasm)
    _install_local(session, "tiny-runtime-nv", tools=tools, test_with=("tiny-tensor",))
    _pytest(session, "tiny-runtime-nv")
    if (why := _unopened(session, "CUDA", 'Device["CUDA"].gpu')) is not None:
        session.log(f"SKIPPED the GPU suite (DEVICE=CUDA and DEVICE=CUDA:PTX): no GPU opens here: {why}")
        return
    own = PACKAGES / "tiny-runtime-nv" / "tests" / "test_cuda_device.py"
    for device in ("CUDA", "CUDA:PTX"):
        session.env["DEVICE"] = device
        session.run("pytest", str(own), str(PACKAGES / "tiny-tensor" / "tests"), *session.posargs)


# the tiny-tensor tests the amd session runs on the AMD device by default (on the GPU where /dev/kfd exists, on the
# mock kernel driver everywhere): tensors of every dtype, creation and random numbers, fusion, matmuls, convolution
# gradients (kernels that spill to scratch) and the JIT; ~290 tests, about a minute and a half on the mock on a 2-core
# machine (its own tests 2 more). `nox -s amd -- --full` runs all of tiny-tensor's tests (about half an hour on the
# mock); there, all but two that would take hours on the PYTHON emulator (the MNIST training job, a reduction over
# 2**31 elements)
AMD_SUBSET = [
    "test_tensor_basics.py",
    "test_creation.py",
    "test_fusion.py",
    "test_ops.py::test_matmul_shapes",
    "test_conv_gradient.py",
    "test_jit.py",
    "test_symbolic.py",
]
AMD_MOCK_TARGET = "gfx1100"


@nox.session
def amd(session: nox.Session) -> None:
    """tiny-runtime-amd: its own tests (the code-object reader and compilers, the KFD driver layer, AQL queue and AMD
    device on the mock kernel driver); then tiny-tensor's tests with DEVICE=AMD on the real GPU where /dev/kfd exists
    (said and skipped where it does not), and again with AMD_MOCK=gfx1100 on the mock, whose kernels run on the
    PYTHON emulator. AMD_SUBSET by default, all of tiny-tensor's tests with `nox -s amd -- --full`."""
    _install_local(
        session,
        "tiny-runtime-amd",
        extras=("mock",),
        tools=(DEV["torch"], DEV["safetensors"], DEV["gguf"]),
        test_with=("tiny-tensor",),
    )
    args = [a for a in session.posargs if a != "--full"]
    session.run("pytest", *PARALLEL, str(PACKAGES / "tiny-runtime-amd" / "tests"), *args)
    tests = PACKAGES / "tiny-tensor" / "tests"
    paths = [str(tests)] if "--full" in session.posargs else [str(tests / t) for t in AMD_SUBSET]
    if Path("/dev/kfd").exists():
        session.run("pytest", *paths, *args, env={"DEVICE": "AMD", "AMD_MOCK": ""})
    else:
        session.log("no /dev/kfd here: tiny-tensor's tests on a real AMD GPU are skipped; they run on the mock only")
    # the emulator would take hours over the MNIST training job and a reduction of 2**31 elements: those skip the mock
    slow = [
        "test_mnist_training.py::test_a_short_training_run_learns",
        "test_big_index.py::test_windows_over_more_than_2_31_elements_compute_right",
    ]
    mock_args = [f"--deselect={(tests / t).relative_to(ROOT)}" for t in slow] if "--full" in session.posargs else []
    mock = {"DEVICE": "AMD", "AMD_MOCK": AMD_MOCK_TARGET}
    # the mock's kernels are compiled as a GPU's: without an AMDGPU toolchain (clang and ld.lld, or COMGR) the device
    # does not open, and tiny-tensor's tests on it are skipped, saying why (its own tests above skip one by one)
    if (why := _unopened(session, "AMD", 'Device["AMD"].name', env=mock)) is not None:
        session.log(f"SKIPPED tiny-tensor's tests on the AMD mock: the device does not open here: {why}")
        return
    session.run("pytest", *PARALLEL, *paths, *mock_args, *args, env=mock)


@nox.session
def tensor(session: nox.Session) -> None:
    """tiny-tensor: Tensor, autograd, nn; numerics checked against NumPy and PyTorch (CPU build, pinned); VIZ's page
    in headless chromium through selenium (skipped, saying why, without chromium and chromedriver); training across
    processes with mpi4py (the [mpi] extra) under Open MPI's mpirun (skipped, saying why, without mpirun)."""
    tools = (
        DEV["torch"],
        DEV["safetensors"],
        DEV["gguf"],
        DEV["transformers"],
        DEV["sentencepiece"],
        DEV["openai"],
        DEV["selenium"],
        DEV["onnx"],
        DEV["onnxruntime"],
        DEV["pillow"],
        DEV["diffusers"],
    )
    _install_local(session, "tiny-tensor", extras=("llm", "mpi"), tools=tools)
    torchvision = Path(session.create_tmp()) / "torchvision"
    session.install("--no-deps", "--upgrade", "--target", str(torchvision), TORCHVISION)
    _pytest(session, "tiny-tensor", env={"TINY_TORCHVISION": str(torchvision)})


# torchvision, the reference tiny.models.resnet is checked against (the release for torch 2.13), in a folder of its
# own that tests/test_resnet.py imports its pure-Python models and transforms from (TINY_TORCHVISION). PyPI's wheel
# is the CUDA build: its compiled ops do not load beside the CPU torch, so `import torchvision` fails, and
# transformers, which imports torchvision wherever it is installed, would fail with it
TORCHVISION = "torchvision==0.28.0"


# llama.cpp's Python binding, built from source (about 25 minutes on a 2-core machine): the llm session's reference
LLAMA_CPP = "llama-cpp-python==0.3.36"


@nox.session
def llm(session: nox.Session) -> None:
    """The language models against llama.cpp: llama-cpp-python built from source (pinned, with cmake and a C++
    compiler), then test_llm.py (its llama.cpp comparisons run here; the default tensor session skips them) and
    `python -m bench.llm --quick` with llama.cpp's side. Not in the default run: the build alone takes about 25
    minutes here. `python -m bench.llm` (the 1B model) runs in this session's environment: `nox -s llm -- bench`."""
    tools = (DEV["torch"], DEV["safetensors"], DEV["gguf"], DEV["transformers"], DEV["sentencepiece"], LLAMA_CPP)
    _install_local(session, "tiny-tensor", extras=("llm",), tools=tools)
    if session.posargs[:1] == ["bench"]:
        session.run("python", "-m", "bench.llm", *session.posargs[1:])
        return
    tests = PACKAGES / "tiny-tensor" / "tests"
    llm_tests = [str(tests / "test_llm.py"), str(tests / "test_llm_gguf_tokenizer.py")]
    session.run("pytest", *PARALLEL, *llm_tests, *session.posargs)
    session.run("python", "-m", "bench.llm", "--quick", "--decode", "8")


def _device_suite(session: nox.Session, device: str, own_tests: list[Path], subset: list[str]) -> None:
    """A device's own tests, then tiny-tensor's with DEVICE=device (its `device` fixture then runs them there alone):
    the files in `subset` by default, all of them with `nox -s NAME -- --full`."""
    session.env["DEVICE"] = device
    args = [a for a in session.posargs if a != "--full"]
    session.run("pytest", *PARALLEL, *map(str, own_tests), *args)
    tests = PACKAGES / "tiny-tensor" / "tests"
    paths = [str(tests)] if "--full" in session.posargs else [str(tests / t) for t in subset]
    session.run("pytest", *PARALLEL, *paths, *args)


# the tiny-tensor tests the cl session runs by default: elementwise ops, reductions, matmuls, movement, fusion,
# creation, every dtype the device has and the dtype errors where it lacks one (float16 on PoCL), ~200 tests in
# about 5 minutes from cold caches on a 2-core machine; the whole suite (~1300 tests) takes over an hour there
CL_SUBSET = [
    "test_tensor_basics.py",
    "test_errors.py",
    "test_creation.py",
    "test_fusion.py",
    "test_ops.py::test_matmul_shapes",
    "test_symbolic.py",
]


@nox.session
def cl(session: nox.Session) -> None:
    """The CL device (OpenCL on PoCL, or whatever driver the machine has): the runtime's CL tests, then tiny-tensor's
    tests with DEVICE=CL. PoCL spends about a second building each new kernel, so the whole tensor suite takes
    far longer on CL than on CPU; by default it runs CL_SUBSET, and `nox -s cl -- --full` runs all of it.
    Skips, saying why, where no OpenCL device opens."""
    if ctypes.util.find_library("OpenCL") is None:
        session.skip("no libOpenCL here (apt install ocl-icd-libopencl1 pocl-opencl-icd)")
    _install_local(session, "tiny-tensor", tools=(DEV["torch"], DEV["safetensors"], DEV["gguf"]))
    if (why := _unopened(session, "CL", 'Device["CL"].info')) is not None:
        session.skip(f"no OpenCL device opens here: {why}")
    _device_suite(session, "CL", [PACKAGES / "tiny-runtime-misc" / "tests" / "test_cl_device.py"], CL_SUBSET)


# the tiny-tensor tests CPU:LLVM runs by default: every op and dtype against NumPy and PyTorch (convolutions and pooling
# included), autograd, 64-bit indexing and the JIT; not the end-to-end jobs (MNIST training, BEAM search, optimizer
# fuzzing) nor the nn layers (LSTM cells alone take two minutes), which take most of the whole suite's time
LLVM_SUBSET = [
    "test_ops.py",
    "test_elementwise_torch.py",
    "test_reduce_torch.py",
    "test_functional_torch.py",
    "test_indexing_torch.py",
    "test_autograd.py",
    "test_big_index.py",
    "test_jit.py",
    "test_symbolic.py",
]


@nox.session
def llvm(session: nox.Session) -> None:
    """CPU:LLVM (LLVM IR compiled in-process by llvmlite, which comes from PyPI through the [llvm] extra): the LLVM
    IR renderer's and the runtime's tests, then tiny-tensor's tests with DEVICE=CPU:LLVM. The whole tensor suite takes
    about 16 minutes on a busy 2-core machine (6 of CPU), a quarter of it the MNIST job; by default the session runs
    LLVM_SUBSET (about 5 minutes there), and `nox -s llvm -- --full` runs all of it."""
    llvmlite = LOCAL["tiny-runtime-misc"]["optional-dependencies"]["llvm"]  # an extra of a local dependency
    _install_local(session, "tiny-tensor", tools=(DEV["torch"], DEV["safetensors"], DEV["gguf"], *llvmlite))
    own = [
        PACKAGES / "tiny-codegen" / "tests" / "test_llvmir_render.py",
        PACKAGES / "tiny-runtime-misc" / "tests" / "test_cpu_llvm.py",
    ]
    _device_suite(session, "CPU:LLVM", own, LLVM_SUBSET)


@nox.session
def mesa(session: nox.Session) -> None:
    """Mesa NIR with the tinymesa wheel (tiny-tensor's [mesa] extra): the NIR renderer's tests (its shaders through
    Mesa's nir_validate), the sweep of tensor ops rendered as NIR, and the compile sweeps of NAK (every kernel of the
    CUDA compile sweep's ops for sm_75, sm_86, sm_89 and sm_90) and ir3 (the same kernels for the Adreno a630, a660
    and a730). Compile-only; under a minute."""
    _install_local(session, "tiny-tensor", extras=("mesa",), test_with=("tiny-runtime-nv",))
    tests = ("tiny-codegen/tests/test_nir_render.py", "tiny-tensor/tests/test_nir_sweep.py")
    session.run("pytest", *PARALLEL, *(str(PACKAGES / t) for t in tests), *session.posargs)
    sweeps = ("test_nak_compile.py", "test_ir3_compile.py")
    session.run("pytest", *PARALLEL, *(str(PACKAGES / "tiny-runtime-nv/tests" / t) for t in sweeps), *session.posargs)


# the tiny-tensor tests the webgpu session runs by default: every op and dtype against NumPy and PyTorch, reductions,
# convolutions and pooling, indexing, in-place updates, autograd, fusion, the JIT, random optimization actions and
# a BEAM search (workgroups, local memory, timing); the nn layers (LSTMs), MNIST training and the benchmark suite,
# which take most of the rest of the time, run with --full
WEBGPU_SUBSET = [
    "test_ops.py",
    "test_elementwise_torch.py",
    "test_reduce_torch.py",
    "test_functional_torch.py",
    "test_indexing_torch.py",
    "test_inplace.py",
    "test_tensor_basics.py",
    "test_errors.py",
    "test_creation.py",
    "test_fusion.py",
    "test_autograd.py",
    "test_jit.py",
    "test_opt_fuzz.py",
    "test_beam_search.py",
    "test_symbolic.py",
]


@nox.session
def webgpu(session: nox.Session) -> None:
    """WEBGPU (WGSL through wgpu-native, which comes from PyPI through the [webgpu] extra; tested on Mesa's lavapipe,
    apt install mesa-vulkan-drivers): the WGSL renderer's and the runtime's tests, then tiny-tensor's tests with
    DEVICE=WEBGPU. lavapipe runs kernels on the CPU and the nn layers' LSTM and convolution tests are slow there: on a
    2-core machine the whole tensor suite took 5 to 11 minutes (by the load), WEBGPU_SUBSET a minute and a half. By
    default it runs WEBGPU_SUBSET, and `nox -s webgpu -- --full` runs all of it. Skips, saying why, where no adapter
    is found."""
    wgpu = LOCAL["tiny-runtime-misc"]["optional-dependencies"]["webgpu"]  # an extra of a local dependency
    _install_local(session, "tiny-tensor", tools=(DEV["torch"], DEV["safetensors"], DEV["gguf"], *wgpu))
    if (why := _unopened(session, "WEBGPU", 'Device["WEBGPU"].gpu.adapter.info["device"]')) is not None:
        session.skip(f"no WebGPU adapter here: {why}")
    own = [
        PACKAGES / "tiny-runtime-misc" / "tests" / "test_webgpu_device.py",
        PACKAGES / "tiny-codegen" / "tests" / "test_wgsl_render.py",
    ]
    _device_suite(session, "WEBGPU", own, WEBGPU_SUBSET)


# what `nox -s replay` records by default: every renderer's compile-only tests (C, LLVM IR, PTX, CUDA C, HIP, AMDGPU,
# OpenCL, WGSL; tensor cores, staging, ldmatrix), the optimizer's actions, and tiny-tensor's op tests on the CPU
# (about 2 minutes on a 2-core machine, each side)
REPLAY_TESTS = ["packages/tiny-codegen/tests", "packages/tiny-tensor/tests/test_ops.py"]


@nox.session
def replay(session: nox.Session) -> None:
    """Process replay: the kernels REPLAY_TESTS render with a base commit are recorded (python -m tiny.replay record),
    then rendered again with this working tree; the session fails listing each kernel whose source changed, with a
    diff. The base is REPLAY_BASE if set, else the merge base of HEAD and main (HEAD itself on main: the uncommitted
    edits are checked). `nox -s replay -- <pytest args>` records those tests (paths as the base has them) instead.
    Not in the default run: a refactor's check, run it before committing one."""
    llvmlite = LOCAL["tiny-runtime-misc"]["optional-dependencies"]["llvm"]
    _install_local(session, "tiny-tensor", tools=(DEV["torch"], DEV["safetensors"], DEV["gguf"], *llvmlite))
    base = os.environ.get("REPLAY_BASE") or _git(session, "merge-base", "HEAD", "main")
    base = _git(session, "rev-parse", "--verify", f"{base}^{{commit}}")
    work = Path(session.create_tmp()).resolve() / "replay"  # (absolute: the record step runs in the base's tree)
    shutil.rmtree(work, ignore_errors=True)
    tree, out = work / "base", work / "recording"
    tree.mkdir(parents=True)
    session.log(f"recording the kernels of the base {base[:12]} (exported to {tree})")
    session.run("bash", "-c", f"git -C {ROOT} archive {base} | tar -x -C {tree}", external=True)
    src = os.pathsep.join(str(p) for p in sorted((tree / "packages").glob("*/src")))
    tests = session.posargs or [*REPLAY_TESTS, "-q", "-p", "no:cacheprovider"]
    with session.chdir(tree):
        session.run("python", "-m", "tiny.replay", "record", str(out), "--", *tests, env={"PYTHONPATH": src})
    session.run("python", "-m", "tiny.replay", "compare", str(out))


def _git(session: nox.Session, *args: str) -> str:
    out = session.run("git", "-C", str(ROOT), *args, external=True, silent=True)
    return str(out).strip()


@nox.session
def lint(session: nox.Session) -> None:
    """ruff check and ruff format --check over the Python in this repository."""
    session.install(DEV["ruff"])
    targets = [str(p.relative_to(ROOT)) for p in (PACKAGES, ROOT / "noxfile.py", ROOT / "bench") if p.exists()]
    session.run("ruff", "check", *targets, *session.posargs)
    session.run("ruff", "format", "--check", *targets)
