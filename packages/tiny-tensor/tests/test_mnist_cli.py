"""`python -m tiny.examples.mnist --eval FILE` of a checkpoint that is missing, unreadable or not this model's
weights prints one line saying what is wrong and exits with status 1, without a traceback. Needs no MNIST data:
the checkpoint is read before the data."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tiny.nn.state import safe_save
from tiny.tensor import Tensor


def evaluate(path: Path | str, tmp_path: Path) -> subprocess.CompletedProcess:
    env = os.environ | {"PYTHONPATH": os.pathsep.join(sys.path), "TINY_DATA": str(tmp_path / "no-data")}
    return subprocess.run(
        [sys.executable, "-m", "tiny.examples.mnist", "--eval", str(path)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def one_line_error(run: subprocess.CompletedProcess) -> str:
    assert run.returncode == 1, (run.returncode, run.stdout, run.stderr)
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in run.stderr, run.stderr
    assert lines[0].startswith("mnist: ") and run.stdout == "", run.stderr
    return lines[0]


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
