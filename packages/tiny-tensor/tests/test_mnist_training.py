"""The MNIST training job on a short run of real data: the loss falls, the test accuracy passes a bar, and the saved
checkpoint evaluates to the same accuracy. Skips, saying why, where no MNIST or Fashion-MNIST files are found."""

from __future__ import annotations

import re

import numpy as np
import pytest

from tiny.examples import mnist as job
from tiny.nn.datasets import mnist


@pytest.fixture(scope="module")
def have_data() -> None:
    try:
        mnist()
    except FileNotFoundError as e:
        pytest.skip(f"no MNIST data here: {e}")


def test_a_short_training_run_learns(have_data, tmp_path, capsys) -> None:  # noqa: ANN001
    ckpt = str(tmp_path / "cnn.safetensors")
    args = ["--steps", "30", "--batch", "32", "--eval-limit", "1000", "--save", ckpt]
    out = job.main(args)
    assert out is not None
    losses = out["losses"]
    assert len(losses) == 30 and np.mean(losses[-5:]) < 0.75 * np.mean(losses[:5]), losses
    assert out["test_accuracy"] >= 0.6, out["test_accuracy"]
    printed = capsys.readouterr().out
    assert "steps/s" in printed and "loss" in printed and "epoch 1/1 step 30/30" in printed, printed
    assert re.match(r"training on (Fashion-)?MNIST \(.*\) from .*: 60000 train / 10000 test images\n", printed), printed
    assert "30 steps of 32 images (1875 steps make an epoch)" in printed, printed
    job.main(["--eval", ckpt, "--eval-limit", "1000"])
    evaluated = re.search(r"test accuracy of .*: ([0-9.]+)%", capsys.readouterr().out)
    assert evaluated is not None and abs(float(evaluated.group(1)) / 100 - out["test_accuracy"]) < 1e-9


@pytest.mark.slow  # (the one-device run takes the kernels the test above built; the other compiles its own: 40 s)
def test_data_parallel_training_gives_the_one_device_losses(have_data, tmp_path, capsys) -> None:  # noqa: ANN001
    """--devices CPU:0,CPU:1 against one device, same seed: the first loss within float rounding; after that Adam's
    first steps (g / sqrt(g^2) for each weight) magnify the gradients' rounding (5e-5 of their scale: the batch's
    sums taken in another order), so the later losses agree within 2e-3."""
    common = ["--steps", "3", "--batch", "32", "--eval-limit", "1000"]
    one = job.main([*common, "--save", str(tmp_path / "one.safetensors")])
    two = job.main([*common, "--save", str(tmp_path / "two.safetensors"), "--devices", "CPU:0,CPU:1"])
    assert one is not None and two is not None
    assert "on CPU, CPU:1: 3 steps of 32 images" in capsys.readouterr().out
    np.testing.assert_allclose(two["losses"][0], one["losses"][0], rtol=1e-5)
    np.testing.assert_allclose(two["losses"], one["losses"], rtol=2e-3)
