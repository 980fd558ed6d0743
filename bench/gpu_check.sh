#!/usr/bin/env bash
# Time on a GPU goes to measuring: one script that installs tiny on an NVIDIA machine, runs the GPU tests and the
# GPU benchmark, and writes what it found into one folder. Everything else is built and checked on a CPU machine.
#
#   bash bench/gpu_check.sh wheels          # on a machine with pip and an index: tiny's six wheels into .whl/
#                                           (PYTHON names a python with pip and hatchling; default python3)
#   bash bench/gpu_check.sh run [OUTDIR]    # on the GPU machine, from the checkout's root (no index needed there)
#
# `run` needs python3 with numpy, torch (CUDA), pytest, hypothesis and the nvidia-cuda-nvrtc wheel installed (an
# image with PyTorch for CUDA has them); tiny itself comes from .whl/, installed into a private folder. It writes to
# OUTDIR (default: $OUT where that is set, else bench/gpu_out): log.txt (everything printed), tests.txt (the GPU
# tests), kernels.txt (the matmul kernel under each plan, timed alone), RESULTS_GPU.md and results_gpu.json (the
# suite, as bench/RESULTS_GPU.md is kept; *_tf32.* the MNIST step again with TF32=1), beam.txt, profile.txt
# (bench/gpu_profile.py: each kernel's time; profile_tf32.txt the MNIST step's with TF32=1). Each
# stage has its own time limit, so a stage that hangs costs its limit and the stages after it still run; all of them
# take up to 11 minutes, so pick stages to fit a device call. GPU_CHECK_STAGES (default
# tests,kernels,suite,beam,profile) picks stages, GPU_CHECK_ONLY passes --only to the suite, GPU_CHECK_BUDGET
# (default 25) is the suite's --budget in seconds per side. The stage `llm` (not a default: up to 7 minutes) is the
# language models' GPU rows (bench.llm): a random 1B LLaMA written as a float32 folder and an F16 GGUF file in
# /tmp/tiny-llm, tiny on CUDA over the file against transformers in float16 on cuda, decode and prefill; llm.md and
# llm.txt (needs transformers and safetensors there, as the image has them; gguf comes with the wheels).
set -uo pipefail
cd "$(dirname "$0")/.."

build_wheels() {  # from the last commit (git archive HEAD), so that the figures belong to a commit
    local tree
    tree=$(mktemp -d)
    git archive HEAD packages | tar -x -C "$tree" || exit 1
    rm -rf .whl && mkdir -p .whl
    git rev-parse --short HEAD > .whl/COMMIT
    for dist in tiny-ir tiny-codegen tiny-runtime-misc tiny-runtime-nv tiny-runtime-amd tiny-tensor; do
        "${PYTHON:-python3}" -m pip wheel --no-deps --no-build-isolation -q -w .whl "$tree/packages/$dist" || exit 1
    done
    rm -rf "$tree"
    # the tests run in parallel there (16 cores): pytest-xdist comes along, as the GPU machine has no index
    "${PYTHON:-python3}" -m pip download -q --no-deps -d .whl pytest-xdist==3.8.0 execnet==2.1.1 || exit 1
    # and the gguf package (pure Python), which the llm stage writes its model file with
    "${PYTHON:-python3}" -m pip download -q --no-deps -d .whl gguf==0.19.0 || exit 1
    echo "wheels of $(cat .whl/COMMIT):" && ls .whl
}

run_checks() {
    local out="${1:-${OUT:-bench/gpu_out}}"
    mkdir -p "$out"
    exec > >(tee "$out/log.txt") 2>&1
    local site=/tmp/tiny-site
    rm -rf "$site"
    python3 -m pip install -q --no-index --no-deps --no-compile --target "$site" .whl/*.whl || exit 1
    export PYTHONPATH="$site" PYTHONUNBUFFERED=1
    echo "== machine"
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv
    python3 -c "import sys, numpy, torch; print(sys.version.split()[0], 'numpy', numpy.__version__, 'torch', \
torch.__version__, 'cuda', torch.version.cuda)"
    echo "tiny: wheels of commit $(cat .whl/COMMIT)"
    python3 -m tiny.ir.device 2>&1 | head -20

    local stages=",${GPU_CHECK_STAGES:-tests,kernels,suite,beam,profile},"
    if [[ $stages == *,tests,* ]]; then
        echo "== GPU tests (tiny-runtime-nv; the tensor tests of matmuls, convolutions, softmax, norms, attention, 16-bit floats and symbolic sizes on CUDA, symbolic on CUDA:PTX)"
        {
            timeout 150 python3 -m pytest -q -n 8 -p no:cacheprovider --maxfail=5 packages/tiny-runtime-nv/tests
            echo "-- tiny-runtime-nv tests exited $? (124: cut short by the timeout, so not all of them ran)"
            DEVICE=CUDA timeout 200 python3 -m pytest -q -n 8 -p no:cacheprovider packages/tiny-tensor/tests \
                -k "matmul or conv2d or softmax or float16 or symbolic or norm or attention or rows" --maxfail=5
            echo "-- CUDA tensor tests exited $? (124: cut short by the timeout, so not all of them ran)"
            DEVICE=CUDA:PTX timeout 90 python3 -m pytest -q -n 8 -p no:cacheprovider \
                packages/tiny-tensor/tests/test_symbolic.py --maxfail=5
            echo "-- CUDA:PTX symbolic tests exited $?"
        } 2>&1 | tee "$out/tests.txt" | tail -40
    fi
    if [[ $stages == *,kernels,* ]]; then
        echo "== the matmul and 3 x 3 convolution kernels under each plan (bench/gpu_kernels.py)"
        timeout 150 python3 -m bench.gpu_kernels 2>&1 | tee "$out/kernels.txt"
        echo "-- the same kernels in CUDA C without ldmatrix (LDMATRIX=0): one shared-memory load per element"
        LDMATRIX=0 timeout 60 python3 -m bench.gpu_kernels --devices CUDA --sizes 4096 --conv 0 2>&1 | tee -a "$out/kernels.txt"
    fi
    if [[ $stages == *,suite,* ]]; then
        echo "== the GPU suite"
        timeout 240 python3 -m bench.run --gpu --budget "${GPU_CHECK_BUDGET:-25}" ${GPU_CHECK_ONLY:+--only "$GPU_CHECK_ONLY"} \
            --markdown "$out/RESULTS_GPU.md" --json "$out/results_gpu.json" --commit "$(cat .whl/COMMIT) (wheels)"
        echo "-- the MNIST step with TF32=1: float32 products on tensor cores, as PyTorch's cuDNN convolutions by default"
        TF32=1 timeout 120 python3 -m bench.run --gpu --budget "${GPU_CHECK_BUDGET:-25}" --only gpu_mnist_step \
            --markdown "$out/RESULTS_GPU_tf32.md" --json "$out/results_gpu_tf32.json" --commit "$(cat .whl/COMMIT) (wheels)"
    fi
    if [[ $stages == *,beam,* ]]; then
        echo "== BEAM on the fp16 4096 product's kernel (CUDA C)"
        timeout 120 python3 -m bench.gpu_kernels --devices CUDA --dtypes float16 --sizes 4096 --conv 0 --beam 4 \
            --beam-budget 60 2>&1 | tail -1 | tee "$out/beam.txt"
    fi
    if [[ $stages == *,profile,* ]]; then
        echo "== where the time goes: each kernel of softmax, the MNIST step and a decode step timed alone"
        timeout 120 python3 -m bench.gpu_profile --device CUDA 2>&1 | tee "$out/profile.txt"
        TF32=1 timeout 60 python3 -m bench.gpu_profile --device CUDA --only mnist_step 2>&1 | tee "$out/profile_tf32.txt"
    fi
    if [[ $stages == *,llm,* ]]; then
        echo "== language models: a 1B LLaMA in float16, tiny on CUDA against transformers on cuda (bench.llm)"
        timeout 420 python3 -m bench.llm --device CUDA --torch-device cuda --sides tiny,torch --formats F16 \
            --torch-dtypes float16 --folder /tmp/tiny-llm --side-timeout 300 --markdown "$out/llm.md" 2>&1 \
            | tee "$out/llm.txt"
    fi
    echo "== done: $out"
}

case "${1:-}" in
    wheels) build_wheels ;;
    run) run_checks "${2:-}" ;;
    *) echo "usage: bash bench/gpu_check.sh wheels | run [OUTDIR]" >&2; exit 2 ;;
esac
