"""`python -m tiny.examples.mnist` as a newcomer meets it, run as a command: `--help` says what each option does and
its default; a bad argument, missing data, a checkpoint path that cannot be written and a checkpoint that is missing,
unreadable or not this model's weights each print one line saying what is wrong (exit status 1, 2 for arguments),
without a traceback; a tiny training run on a small fake dataset names the dataset, its folder and the epochs.
Needs no MNIST data."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from test_nn_datasets import fake_mnist

from tiny.examples import mnist as job
from tiny.ir.config import CACHEDB, cache_dir
from tiny.nn.state import safe_save
from tiny.tensor import Tensor

FASHION_FIRST_LABELS = (9, 0, 0, 3, 0, 2, 7, 2, 5, 5)  # the first training labels of Fashion-MNIST
# the job's search with Debian's Fashion-MNIST hidden and a mirror where nothing listens, run as the command runs
HIDDEN = """import runpy, sys
from pathlib import Path
from tiny.nn import datasets
datasets._DEBIAN_FASHION = Path(sys.argv.pop(1))
datasets.MIRRORS.update({"mnist": ("http://127.0.0.1:9/",), "fashion-mnist": ("http://127.0.0.1:9/",)})
runpy.run_module("tiny.examples.mnist", run_name="__main__")
"""


def command(tmp_path: Path, *args: str, hidden: bool = False) -> subprocess.CompletedProcess:
    """The command with `args`, with no dataset in TINY_DATA or the cache (both in `tmp_path`)."""
    env = os.environ | {
        "PYTHONPATH": os.pathsep.join(sys.path),
        "TINY_DATA": str(tmp_path / "no-data"),
        "XDG_CACHE_HOME": str(tmp_path / "cache"),
        # the kernel cache stays where it is (it follows XDG_CACHE_HOME too): compiled kernels are reused
        "CACHEDB": CACHEDB.value or os.path.join(cache_dir(), "cache.db"),
    }
    if hidden:
        job_command = [sys.executable, "-c", HIDDEN, str(tmp_path / "not-installed")]
    else:
        job_command = [sys.executable, "-m", "tiny.examples.mnist"]
    return subprocess.run(
        [*job_command, *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def evaluate(path: Path | str, tmp_path: Path) -> subprocess.CompletedProcess:
    return command(tmp_path, "--eval", str(path))


def one_line_error(run: subprocess.CompletedProcess, status: int = 1) -> str:
    assert run.returncode == status, (run.returncode, run.stdout, run.stderr)
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in run.stderr, run.stderr
    assert lines[0].startswith("mnist: ") and not lines[0].startswith("mnist: mnist:"), run.stderr
    assert run.stdout == "", run.stdout
    return lines[0]


def test_help_says_what_each_option_does_and_its_default(tmp_path: Path) -> None:
    run = command(tmp_path, "--help")
    assert run.returncode == 0 and run.stderr == "", run.stderr
    out = " ".join(run.stdout.split())  # argparse wraps the help to the terminal's width
    for option, default in [
        ("--epochs N", "default: 3"),
        ("--steps N", "default: 0"),
        ("--batch N", "default: 128"),
        ("--lr LR", "default: 0.001"),
        ("--seed N", "default: 0"),
        ("--data DIR", "default: the first folder found"),
        ("--save PATH", f"default: {job.DEFAULT_SAVE}"),
        ("--eval-limit N", "default: 0"),
    ]:
        assert option in out and default in out[out.index(option) :], (option, default, run.stdout)
    assert "--fashion" in out and "--eval CHECKPOINT" in out and "XDG_CACHE_HOME" in out, run.stdout


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--epochs", "0"], "argument --epochs: 0 is less than 1"),
        (["--batch", "lots"], "argument --batch: 'lots' is not a whole number"),
        (["--lr", "-1"], "argument --lr: '-1' is not a positive number"),
        (["--bogus"], "unrecognized arguments: --bogus"),
    ],
)
def test_a_bad_argument_is_one_line(tmp_path: Path, args: list[str], says: str) -> None:
    line = one_line_error(command(tmp_path, *args), status=2)
    assert says in line and "--help" in line, line


def test_missing_data_is_one_line_that_names_the_option(tmp_path: Path) -> None:
    line = one_line_error(command(tmp_path, "--steps", "1", hidden=True))
    assert line.startswith("mnist: no MNIST or Fashion-MNIST files in "), line
    assert str(tmp_path / "cache" / "tiny" / "datasets" / "mnist") in line, line  # XDG_CACHE_HOME's cache
    assert "downloading them failed (http://127.0.0.1:9/: " in line and "--data DIR" in line, line
    assert "data_dir" not in line and "apt-get install dataset-fashion-mnist" in line, line
    assert not (tmp_path / "cache").exists() and not (tmp_path / "no-data").exists()  # the download left nothing
    line = one_line_error(command(tmp_path, "--data", str(tmp_path / "nowhere")))
    assert line == f"mnist: --data {tmp_path / 'nowhere'}: no such folder; it should be a folder with " + (
        "the four IDX files train-images-idx3-ubyte, train-labels-idx1-ubyte, t10k-images-idx3-ubyte, "
        "t10k-labels-idx1-ubyte (each .gz or not)"
    ), line
    line = one_line_error(command(tmp_path, "--data", str(tmp_path)))
    assert line.startswith(f"mnist: --data {tmp_path}: the folder does not have the four IDX files"), line


def test_the_checkpoint_path_is_checked_before_training(tmp_path: Path) -> None:
    fake_mnist(tmp_path / "data", n_train=16, n_test=4)
    path = tmp_path / "missing" / "cnn.safetensors"
    line = one_line_error(command(tmp_path, "--data", str(tmp_path / "data"), "--save", str(path)))
    assert line == f"mnist: --save {path}: the folder {path.parent} does not exist", line
    line = one_line_error(command(tmp_path, "--data", str(tmp_path / "data"), "--save", str(tmp_path)))
    assert line == f"mnist: --save {tmp_path} is a folder; give the path of the file to write", line


def test_a_tiny_training_run_names_the_dataset_and_the_epochs(tmp_path: Path) -> None:
    fake_mnist(tmp_path / "data", n_train=16, n_test=4, first_labels=FASHION_FIRST_LABELS)
    ckpt = tmp_path / "cnn.safetensors"
    run = command(tmp_path, "--data", str(tmp_path / "data"), "--epochs", "2", "--batch", "8", "--save", str(ckpt))
    assert run.returncode == 0 and "Traceback" not in run.stderr, (run.stdout, run.stderr)
    out = run.stdout
    assert out.startswith(
        f"training on Fashion-MNIST (clothing, harder than the digits) from {tmp_path / 'data'}: "
        "16 train / 4 test images\n"
    ), out
    assert "2 epochs of 2 steps of 8 images" in out, out
    assert "epoch 1/2 step 2/2 loss" in out and "epoch 2/2 step 2/2 loss" in out and "steps/s" in out, out
    assert "on 4 Fashion-MNIST test images" in out and f"saved {ckpt}" in out and ckpt.is_file(), out
    run = command(tmp_path, "--data", str(tmp_path / "data"), "--eval", str(ckpt))
    assert run.returncode == 0, run.stderr
    assert f"test accuracy of {ckpt} on 4 Fashion-MNIST test images from {tmp_path / 'data'}: " in run.stdout


def test_the_default_checkpoint_is_ignored_by_git() -> None:
    root = Path(__file__).resolve().parents[3]
    if not (root / ".git").exists() or shutil.which("git") is None:
        pytest.skip("not in a git checkout of the project")
    run = subprocess.run(["git", "-C", str(root), "check-ignore", "-q", job.DEFAULT_SAVE], capture_output=True)
    assert run.returncode == 0, f"{job.DEFAULT_SAVE} is not in .gitignore: {run.stderr!r}"


def test_a_missing_checkpoint(tmp_path: Path) -> None:
    path = tmp_path / "nowhere.safetensors"
    line = one_line_error(evaluate(path, tmp_path))
    assert str(path) in line and "No such file" in line, line


def test_a_directory_for_a_checkpoint(tmp_path: Path) -> None:
    line = one_line_error(evaluate(tmp_path, tmp_path))
    assert "cannot read the checkpoint" in line and "directory" in line, line


@pytest.mark.parametrize("size", [4096, 5])
def test_a_corrupt_checkpoint(tmp_path: Path, size: int) -> None:
    path = tmp_path / "random.safetensors"
    path.write_bytes(np.random.default_rng(size).integers(0, 256, size, dtype=np.uint8).tobytes())
    line = one_line_error(evaluate(path, tmp_path))
    assert str(path) in line and "not a safetensors file" in line, line


def test_a_checkpoint_of_another_model(tmp_path: Path) -> None:
    path = tmp_path / "other.safetensors"
    safe_save({"fc.weight": Tensor.zeros(3, 3)}, str(path))
    line = one_line_error(evaluate(path, tmp_path))
    assert "does not hold this model's weights" in line and "missing: 'conv1.weight'" in line and "17 more" in line, (
        line
    )
