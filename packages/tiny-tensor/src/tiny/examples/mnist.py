"""Train the classic small MNIST CNN with Adam, save a safetensors checkpoint, and evaluate checkpoints.

Train (on the CPU by default, on any device with DEVICE=...; data-parallel over several with --devices):
    python -m tiny.examples.mnist [--epochs 3] [--batch 128] [--save mnist.safetensors] [--devices CPU:0,CPU:1]
Or data-parallel over processes started by MPI (pip install 'tiny-tensor[mpi]'):
    mpirun -n 2 python -m tiny.examples.mnist --mpi
Evaluate a checkpoint on the test set:
    python -m tiny.examples.mnist --eval mnist.safetensors

The data is MNIST (handwritten digits) or Fashion-MNIST (clothing), 28x28 grey images of 10 classes as IDX files:
those in --data DIR, else the first found by tiny.nn.datasets ($TINY_DATA, the user's cache, where Debian's
dataset-fashion-mnist package puts Fashion-MNIST), else downloaded; --fashion picks Fashion-MNIST. The job says which
it trains on: Fashion-MNIST is the harder one, and its 91% after 3 epochs is a good score there, a poor one on digits.
The model: two 5x5 and two 3x3 convolutions with batch norm and max pooling, then a linear layer.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import NoReturn

import numpy as np

from tiny import nn
from tiny.nn import mpi
from tiny.nn.datasets import IDX_FILES, DatasetNotFound, MnistData, read_mnist
from tiny.nn.state import get_parameters, get_state_dict, load_state_dict, safe_load, safe_save
from tiny.tensor import Device, Tensor, TinyJit

DEFAULT_SAVE = "mnist.safetensors"  # in the current folder; the checkout's .gitignore lists it
KINDS = {"MNIST": "handwritten digits", "Fashion-MNIST": "clothing, harder than the digits"}


class MnistCNN:
    def __init__(self) -> None:
        self.conv1, self.conv2, self.bn1 = nn.Conv2d(1, 32, 5), nn.Conv2d(32, 32, 5), nn.BatchNorm2d(32)
        self.conv3, self.conv4, self.bn2 = nn.Conv2d(32, 64, 3), nn.Conv2d(64, 64, 3), nn.BatchNorm2d(64)
        self.fc = nn.Linear(576, 10)

    def __call__(self, x: Tensor) -> Tensor:
        x = self.bn1(self.conv2(self.conv1(x).relu()).relu()).max_pool2d(2)
        x = self.bn2(self.conv4(self.conv3(x).relu()).relu()).max_pool2d(2)
        return self.fc(x.flatten(1))


def normalize(images: np.ndarray) -> np.ndarray:
    """uint8 pixels -> float32 around 0."""
    return (images.astype(np.float32) - 127.5) / 127.5


def load_data(args: argparse.Namespace) -> MnistData:
    """The dataset, or the end of the program with one line saying what is missing and how to get it."""
    try:
        return read_mnist(args.data, fashion=True if args.fashion else None)
    except DatasetNotFound as e:
        sys.exit(f"mnist: {missing_data(e, args.data)}")
    except (OSError, ValueError) as e:
        sys.exit(f"mnist: cannot read the data: {e}")


def missing_data(e: DatasetNotFound, data: str | None) -> str:
    """The one line the job prints where no dataset was found: where it looked, what downloading said, what to do."""
    files = f"the four IDX files {', '.join(IDX_FILES)} (each .gz or not)"
    if data is not None and not Path(data).is_dir():
        return f"--data {data}: no such folder; it should be a folder with {files}"
    if data is not None:
        return f"--data {data}: the folder does not have {files}"
    looked = ", ".join(str(p) for p in e.looked_in)
    download = f"; downloading them failed ({'; '.join(e.download_failures)})" if e.download_failures else ""
    return (
        f"no MNIST or Fashion-MNIST files in {looked}{download}. Get Fashion-MNIST with "
        f"`apt-get install dataset-fashion-mnist` (Debian/Ubuntu), or pass --data DIR, a folder with {files}"
    )


def describe(data: MnistData) -> str:
    """Which dataset, where from, how many images: so that an accuracy is read against the right dataset."""
    kind = f" ({KINDS[data.name]})" if data.name in KINDS else ""
    return f"{data.name}{kind} from {data.folder}: {len(data.x_train)} train / {len(data.x_test)} test images"


def evaluate(
    model: MnistCNN, images: np.ndarray, labels: np.ndarray, batch: int = 1000, devices: tuple[str, ...] = ()
) -> float:
    """Accuracy over the whole set, in eval mode (batch norm uses its running statistics); with `devices`, each batch
    split over them."""
    predict = TinyJit(lambda x: model(x).argmax(1).realize())
    correct = 0
    for start in range(0, len(images), batch):
        x = normalize(images[start : start + batch])
        if devices and len(x) < len(devices):  # (too few images left to split: the model gathered to one device)
            x_t = Tensor(x, device=devices)
        else:
            x_t = Tensor(x).shard(devices, axis=0) if devices else Tensor(x)
        pred = predict(x_t).numpy() if len(x) == batch else model(x_t).argmax(1).numpy()
        correct += int((pred == labels[start : start + batch]).sum())
    return correct / len(images)


def train(args: argparse.Namespace) -> dict[str, float | list[float]]:
    """Train, evaluate, save; returns the losses seen every step and the test accuracy."""
    world = join_world(args) if args.mpi else None
    with world if world is not None else contextlib.nullcontext():
        return train_in(args, world)


def join_world(args: argparse.Namespace) -> mpi.World:
    """The MPI processes this one trains with, or the end of the program saying why there are none."""
    try:
        world = mpi.world()
    except mpi.MPIError as e:
        sys.exit(f"mnist: --mpi: {e}")
    if args.batch < world.size:
        sys.exit(f"mnist: --batch {args.batch} is too small to split over the {world.size} MPI processes")
    return world


def train_in(args: argparse.Namespace, world: mpi.World | None) -> dict[str, float | list[float]]:
    """The training job; with `world`, this process's part of it (rank 0 prints, evaluates and saves)."""
    data = load_data(args)
    if args.batch > len(data.x_train):
        sys.exit(f"mnist: --batch {args.batch} is more than the {len(data.x_train)} training images")
    x_train, y_train = data.x_train[:, None], data.y_train.astype(np.int32)
    Tensor.manual_seed(args.seed)
    model = MnistCNN()
    devices = args.devices
    if devices:  # data-parallel: the whole model on each device, each batch split over them
        if args.batch < len(devices):
            sys.exit(f"mnist: --batch {args.batch} is too small to split over the {len(devices)} devices {devices}")
        for p in get_state_dict(model).values():
            p.shard_(devices)
    if world is not None:  # data-parallel over processes: rank 0's weights everywhere (the seeds make them equal too)
        world.broadcast(get_state_dict(model).values())
        mpi.SyncBatchNorm.convert(model, world)  # the whole batch's statistics, as one process would take them
    params = [p for p in get_parameters(model) if p.requires_grad]
    opt = nn.optim.Adam(params, lr=args.lr)

    @TinyJit
    def step(x: Tensor, y: Tensor) -> tuple[Tensor, Tensor]:
        loss, accuracy, _ = gradients(x, y)
        opt.step()
        return loss.realize(), accuracy.realize()

    def gradients(x: Tensor, y: Tensor) -> tuple[Tensor, Tensor, list[Tensor]]:
        with Tensor.train():
            opt.zero_grad()
            logits = model(x)
            loss = logits.cross_entropy(y)
            loss.backward()
            accuracy = (logits.argmax(1) == y).float().mean()
        return loss, accuracy, [p.grad for p in params if p.grad is not None]

    # over MPI the step is three: the gradients (each process's part of the whole batch's, through the batch norms'
    # sums over the processes: host all-reduces inside, so not jitted), their all-reduce, the update (jitted)
    @TinyJit
    def update(*grads: Tensor) -> None:
        for p, g in zip(params, grads, strict=True):
            p.grad = g
        opt.step()

    def mpi_step(x: np.ndarray, y: np.ndarray, world: mpi.World) -> tuple[float, float]:
        mine = world.share(len(x))
        weight = (mine.stop - mine.start) / len(x)  # this process's share of the batch's mean loss
        y_mine = Tensor(y[mine])
        with Tensor.train():
            logits = model(Tensor(x[mine]))
            loss = logits.cross_entropy(y_mine)
            parts = world.gradients(loss * weight, params)
        accuracy = (logits.argmax(1) == y_mine).float().mean().realize(loss)  # (before the update writes the weights)
        grads = [p.zeros_like() if g is None else g for p, g in zip(params, parts)]
        update(*world.all_reduce(grads, weight=1.0))
        return world.sum(loss.item() * weight), world.sum(accuracy.item() * weight)

    rng = np.random.default_rng(args.seed)
    steps_per_epoch = len(x_train) // args.batch
    total = args.steps or args.epochs * steps_per_epoch
    epochs = math.ceil(total / steps_per_epoch)
    schedule = nn.optim.CosineAnnealingLR(opt, T_max=total)  # the lr falls to 0 over the run
    say = print if world is None or world.rank == 0 else quiet
    say(f"training on {describe(data)}")
    where = ", ".join(devices) if devices else Device.DEFAULT
    if world is not None:
        where = f"{world.size} MPI processes (each on {where}, with its share of each batch)"
    if args.steps:
        say(f"on {where}: {total} steps of {args.batch} images ({steps_per_epoch} steps make an epoch)")
    else:
        plural = "s" if epochs > 1 else ""
        say(f"on {where}: {epochs} epoch{plural} of {steps_per_epoch} steps of {args.batch} images")
    start = time.perf_counter()
    losses: list[float] = []
    for i in range(total):
        epoch, at = divmod(i, steps_per_epoch)
        if at == 0:
            order = rng.permutation(len(x_train))
        idx = order[at * args.batch : (at + 1) * args.batch]
        if world is not None:
            loss, acc = mpi_step(normalize(x_train[idx]), y_train[idx], world)
        else:
            x, y = Tensor(normalize(x_train[idx])), Tensor(y_train[idx])
            loss_t, acc_t = step(x.shard(devices, axis=0), y.shard(devices, axis=0)) if devices else step(x, y)
            loss, acc = loss_t.item(), acc_t.item()
        losses.append(loss)
        schedule.step()
        in_epoch = min(steps_per_epoch, total - epoch * steps_per_epoch)  # the last epoch of --steps may be short
        if at % 10 == 0 or at == in_epoch - 1:
            rate = (i + 1) / (time.perf_counter() - start)
            bar = "#" * (30 * (at + 1) // in_epoch)
            say(
                f"\r[{bar:<30}] epoch {epoch + 1}/{epochs} step {at + 1}/{in_epoch} loss {loss:.3f} "
                f"acc {acc:6.1%} {rate:.2f} steps/s",
                end="\n" if at == in_epoch - 1 else "",
                flush=True,
            )
    if world is not None and world.rank != 0:  # rank 0 evaluates and saves for the job
        return {"losses": losses, "test_accuracy": math.nan}
    limit = args.eval_limit or len(data.x_test)
    test_acc = evaluate(model, data.x_test[:limit, None], data.y_test[:limit].astype(np.int32), devices=devices)
    print(f"test accuracy {test_acc:.2%} on {limit} {data.name} test images")
    try:
        safe_save(get_state_dict(model), args.save)
    except OSError as e:
        sys.exit(f"mnist: cannot save the checkpoint to {args.save}: {e.strerror or e}")
    print(f"saved {args.save}; evaluate it with: python -m tiny.examples.mnist --eval {args.save}")
    return {"losses": losses, "test_accuracy": test_acc}


def quiet(*args: object, **kwargs: object) -> None:
    """print's stand-in on the MPI processes other than rank 0."""


def check_save_path(path: str) -> None:
    """End the program at once, not after the training, where the checkpoint could not be written."""
    folder = Path(path).parent
    if Path(path).is_dir():
        sys.exit(f"mnist: --save {path} is a folder; give the path of the file to write")
    if not folder.is_dir():
        sys.exit(f"mnist: --save {path}: the folder {folder} does not exist")
    if not os.access(folder, os.W_OK):
        sys.exit(f"mnist: --save {path}: the folder {folder} is not writable")


def load_checkpoint(path: str) -> MnistCNN:
    """The model with a safetensors checkpoint's weights; a file that is missing, unreadable, not a safetensors
    file or not this model's weights ends the program with one line that says so (exit status 1)."""
    model = MnistCNN()
    try:
        state = safe_load(path)
    except OSError as e:
        sys.exit(f"mnist: cannot read the checkpoint {path}: {e.strerror or e}")
    except (ValueError, TypeError) as e:
        sys.exit(f"mnist: the checkpoint is not a safetensors file this can read: {e}")
    try:
        load_state_dict(model, state)
    except RuntimeError as e:
        problems = [line.strip() for line in str(e).splitlines()[1:]]
        more = f" and {len(problems) - 3} more" if len(problems) > 3 else ""
        sys.exit(f"mnist: {path} does not hold this model's weights: {'; '.join(problems[:3])}{more}")
    return model


def evaluate_checkpoint(args: argparse.Namespace) -> None:
    model = load_checkpoint(args.eval)  # before the data: a wrong path fails at once
    data = load_data(args)
    limit = args.eval_limit or len(data.x_test)
    accuracy = evaluate(model, data.x_test[:limit, None], data.y_test[:limit].astype(np.int32))
    print(f"test accuracy of {args.eval} on {limit} {data.name} test images from {data.folder}: {accuracy:.2%}")


class Parser(argparse.ArgumentParser):
    """argparse, with its errors on one line (`mnist: ...`) instead of the usage and then the error."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"mnist: {message} (see --help)\n")


def count(least: int) -> Callable[[str], int]:
    """An argparse type: a whole number of at least `least`."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
        if value < least:
            raise argparse.ArgumentTypeError(f"{value} is less than {least}")
        return value

    return parse


def learning_rate(text: str) -> float:
    """An argparse type: a positive, finite number."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive number")
    return value


def device_list(text: str) -> tuple[str, ...]:
    """An argparse type: devices separated by commas, each one that starts here."""
    try:
        return Device.canonicalize_many(tuple(d.strip() for d in text.split(",")))
    except (ValueError, TypeError, RuntimeError) as e:
        raise argparse.ArgumentTypeError(str(e)) from None


WHERE = f"""where the data is looked for, in order (the first folder with the four IDX files is used):
  DIR                                         (with --data DIR: there only)
  $TINY_DATA/mnist, $TINY_DATA/fashion-mnist  (where TINY_DATA is set)
  <cache>/mnist, <cache>/fashion-mnist        (<cache>: $XDG_CACHE_HOME/tiny/datasets or ~/.cache/tiny/datasets)
  /usr/share/datasets/fashion-mnist           (apt-get install dataset-fashion-mnist, on Debian/Ubuntu)
--fashion skips the digits' folders. Where no folder has them, MNIST (Fashion-MNIST with --fashion) is downloaded
into $TINY_DATA/<name>, or <cache>/<name> where TINY_DATA is unset. The four files (each .gz or not):
  {" ".join(IDX_FILES)}

the device: the fastest present, or the one DEVICE names (DEVICE=CPU, DEVICE=CUDA, ...); --devices CPU:0,CPU:1 trains
data-parallel: the model on each device, each batch split among them, batch norm over the whole batch, the gradients
all-reduced (the same losses as one device, within float rounding). --mpi trains data-parallel over processes
(mpirun -n 2 python -m tiny.examples.mnist --mpi): each process on one device with its share of each batch, the
gradients summed with an MPI all-reduce, batch norm over the whole batch (tiny.nn.mpi.SyncBatchNorm: its sums
all-reduced forward and backward), so the losses are one process's with the whole batch, within float rounding; rank
0 prints, evaluates and saves."""


def parser() -> argparse.ArgumentParser:
    p = Parser(
        prog="python -m tiny.examples.mnist",
        description=__doc__,
        epilog=WHERE,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    n = {"metavar": "N"}
    p.add_argument("--epochs", type=count(1), default=3, help="passes over the training images (default: 3)", **n)
    p.add_argument("--steps", type=count(0), default=0, help="train N steps instead (default: 0, whole epochs)", **n)
    p.add_argument("--batch", type=count(1), default=128, help="images per training step (default: 128)", **n)
    p.add_argument(
        "--lr",
        type=learning_rate,
        default=1e-3,
        help="Adam's learning rate at the start; a cosine schedule takes it to 0 by the last step (default: 0.001)",
    )
    p.add_argument(
        "--seed", type=count(0), default=0, help="seeds the first weights and the image order (default: 0)", **n
    )
    p.add_argument(
        "--data",
        "--data-dir",
        metavar="DIR",
        help="a folder with the four IDX files (default: the first folder found, as listed below, else a download)",
    )
    p.add_argument("--fashion", action="store_true", help="Fashion-MNIST even where digit MNIST is found")
    p.add_argument(
        "--devices",
        type=device_list,
        default=(),
        metavar="D0,D1,...",
        help="train data-parallel over these devices, comma-separated (CPU:0,CPU:1; default: one device)",
    )
    p.add_argument(
        "--mpi",
        action="store_true",
        help="train data-parallel over the processes mpirun started, each with its share of each batch "
        "(mpirun -n 2 python -m tiny.examples.mnist --mpi; needs mpi4py: pip install 'tiny-tensor[mpi]')",
    )
    p.add_argument(
        "--save",
        "--checkpoint",
        default=DEFAULT_SAVE,
        metavar="PATH",
        help=f"where training saves the weights, a safetensors file (default: {DEFAULT_SAVE}, in the current folder)",
    )
    p.add_argument(
        "--eval", metavar="CHECKPOINT", help="evaluate this checkpoint on the test images instead of training"
    )
    p.add_argument(
        "--eval-limit", type=count(0), default=0, help="evaluate on the first N test images only (default: 0, all)", **n
    )
    return p


def main(argv: list[str] | None = None) -> dict[str, float | list[float]] | None:
    args = parser().parse_args(argv)
    if args.mpi and args.eval:
        sys.exit("mnist: --mpi trains; --eval evaluates a checkpoint in one process: give one of them")
    if args.eval:
        evaluate_checkpoint(args)
        return None
    if args.mpi and args.devices:
        sys.exit("mnist: --mpi and --devices: give one of them (each MPI process trains on one device)")
    check_save_path(args.save)
    return train(args)


if __name__ == "__main__":
    main()
