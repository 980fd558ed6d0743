"""One training step of a small MNIST CNN with Adam, on tiny (jitted when TinyJit exists), PyTorch eager and
tinygrad (TinyJit). The batch is random data of MNIST's shape; the same batch is used for every step. The --gpu
suite runs the same step: tiny's side on tiny's GPU device, `torch_mnist_step` on torch's.

The model: Conv2d(1,32,5) relu, Conv2d(32,32,5) relu, BatchNorm2d(32), max_pool2d(2), Conv2d(32,64,3) relu,
Conv2d(64,64,3) relu, BatchNorm2d(64), max_pool2d(2), flatten, Linear(576,10); cross-entropy loss; Adam lr 1e-3.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import numpy as np

from bench.core import MS, Params, Prepared, Setup, Target, Workload
from bench.frameworks import (
    TinyJit,
    spawn_fresh,
    tiny_done,
    tiny_process_env,
    tiny_upload,
    tinygrad,
    tinygrad_done,
    tinygrad_upload,
    torch,
    torch_done,
    torch_upload,
)
from tiny import nn
from tiny.nn.state import get_parameters
from tiny.tensor import Tensor


class MnistNet:
    """The model, for any framework whose layers take torch's arguments and whose tensors have relu, max_pool2d
    and flatten (tiny and tinygrad)."""

    def __init__(self, conv: Callable, batchnorm: Callable, linear: Callable) -> None:
        self.conv1, self.conv2, self.bn1 = conv(1, 32, 5), conv(32, 32, 5), batchnorm(32)
        self.conv3, self.conv4, self.bn2 = conv(32, 64, 3), conv(64, 64, 3), batchnorm(64)
        self.fc = linear(576, 10)

    def __call__(self, x):  # x: a tiny or a tinygrad Tensor
        x = self.bn1(self.conv2(self.conv1(x).relu()).relu()).max_pool2d(2)
        x = self.bn2(self.conv4(self.conv3(x).relu()).relu()).max_pool2d(2)
        return self.fc(x.flatten(1))


def _batch(params: Params) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    images = rng.standard_normal((params["batch"], 1, 28, 28), dtype=np.float32)
    return images, rng.integers(0, 10, params["batch"]).astype(np.int32)


def tiny_mnist_step(params: Params, device: str) -> tuple[Callable[[Tensor, Tensor], Tensor], Tensor, Tensor]:
    """tiny's training step (not jitted) over the model and its Adam, made here, and the batch on device."""
    Tensor.manual_seed(0)
    model = MnistNet(
        partial(nn.Conv2d, device=device), partial(nn.BatchNorm2d, device=device), partial(nn.Linear, device=device)
    )
    opt = nn.optim.Adam([p for p in get_parameters(model) if p.requires_grad], lr=1e-3)
    images, labels = _batch(params)
    x, y = tiny_upload(images, device), tiny_upload(labels, device)

    def step(x: Tensor, y: Tensor) -> Tensor:
        with Tensor.train():
            opt.zero_grad()
            loss = model(x).cross_entropy(y)
            loss.backward()
            opt.step()
        return loss.realize()

    return step, x, y


def _mnist_tiny(params: Params, device: str) -> Prepared:
    step, x, y = tiny_mnist_step(params, device)
    if TinyJit is None:
        return Prepared(lambda: tiny_done(step(x, y)), note="un-jitted: TinyJit not available")
    jitted = TinyJit(step)
    return Prepared(lambda: tiny_done(jitted(x, y)), note="TinyJit")


def _mnist_torch(params: Params, device: str) -> Prepared:
    return torch_mnist_step(params, "cpu")


def torch_mnist_step(params: Params, torch_device: str) -> Prepared:
    """PyTorch's side, eager, on torch_device ("cpu" here, "cuda" in the --gpu suite)."""
    torch.manual_seed(0)
    layers = torch.nn
    model = layers.Sequential(
        layers.Conv2d(1, 32, 5),
        layers.ReLU(),
        layers.Conv2d(32, 32, 5),
        layers.ReLU(),
        layers.BatchNorm2d(32),
        layers.MaxPool2d(2),
        layers.Conv2d(32, 64, 3),
        layers.ReLU(),
        layers.Conv2d(64, 64, 3),
        layers.ReLU(),
        layers.BatchNorm2d(64),
        layers.MaxPool2d(2),
        layers.Flatten(),
        layers.Linear(576, 10),
    )
    model = model.to(torch_device).train()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    images, labels = _batch(params)
    x, y = torch_upload(images, torch_device), torch_upload(labels.astype(np.int64), torch_device)

    def step() -> object:
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        torch_done(loss)
        return loss

    return Prepared(step, note="eager")


def _tinygrad_training() -> object:
    """tinygrad's training mode: `Tensor.train()` up to 0.10, the TRAINING context variable since."""
    if hasattr(tinygrad.Tensor, "train"):
        return tinygrad.Tensor.train()
    return tinygrad.helpers.Context(TRAINING=1)


def _mnist_tinygrad(params: Params, device: str) -> Prepared:
    model = MnistNet(tinygrad.nn.Conv2d, tinygrad.nn.BatchNorm, tinygrad.nn.Linear)
    opt = tinygrad.nn.optim.Adam(tinygrad.nn.state.get_parameters(model), lr=1e-3)
    images, labels = _batch(params)
    x, y = tinygrad_upload(images), tinygrad_upload(labels)

    @tinygrad.TinyJit
    def step(x, y):  # x, y: tinygrad Tensors
        with _tinygrad_training():
            opt.zero_grad()
            loss = model(x).sparse_categorical_crossentropy(y)
            loss.backward()
            opt.step()
        return loss.realize()

    return Prepared(lambda: tinygrad_done(step(x, y)), note="TinyJit")


MNIST_STEP = Workload(
    name="mnist_step",
    group="mnist",
    what="one training step (forward, cross-entropy, backward, Adam) of the MNIST CNN on a batch of random images",
    metrics=(MS,),
    full={"batch": 128},
    quick={"batch": 8},
    setups={"tiny": _mnist_tiny, "torch": _mnist_torch, "tinygrad": _mnist_tinygrad},
    target=Target(">=1x torch", "torch", 1.0),
    warmup=2,  # a jit captures on its second call
    reps=20,  # a step moves by 30% from run to run on a small shared machine: the minimum needs many runs
    quick_reps=2,
)


# ---------------------------------------------------------------- a cold first step in a fresh process

_COLD_STEP = (  # {block}: frameworks the process must not import (their import time is not the step's)
    "import sys\n"
    "for name in {block}: sys.modules[name] = None\n"
    "from bench.training import {setup}\n"
    "{setup}({{'batch': {batch}}}, {device!r}).run()\n"
)


def _cold_step(framework: str) -> Setup:
    def setup(params: Params, device: str) -> Prepared:
        if framework == "tiny":
            code = _COLD_STEP.format(
                block=["torch", "tinygrad"], setup="_mnist_tiny", batch=params["batch"], device=device
            )
        else:
            code = _COLD_STEP.format(block=["tinygrad"], setup="torch_mnist_step", batch=params["batch"], device="cpu")
        env = tiny_process_env(device) if framework == "tiny" else {}
        return Prepared(lambda: spawn_fresh(code, env), note="import to the first step's loss, empty compile cache")

    return setup


MNIST_COLD_STEP = Workload(
    name="mnist_cold_step",
    group="startup",
    what="wall time of a fresh Python that builds the MNIST CNN and runs its first training step, compile cache empty",
    metrics=(MS,),
    full={"batch": 128},
    quick={"batch": 8},
    setups={"tiny": _cold_step("tiny"), "torch": _cold_step("torch")},
    target=Target("<10 s", max_figure=10_000.0),
    reps=2,
    quick_reps=1,
)
