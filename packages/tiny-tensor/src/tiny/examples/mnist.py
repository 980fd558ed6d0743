"""Train the classic small MNIST CNN with Adam, save a safetensors checkpoint, and evaluate checkpoints.

Train (on the CPU by default, on any device with DEVICE=...):
    python -m tiny.examples.mnist [--epochs 3] [--batch 128] [--checkpoint mnist.safetensors]
Evaluate a checkpoint on the test set:
    python -m tiny.examples.mnist --eval mnist.safetensors

The data is MNIST or Fashion-MNIST as IDX files (tiny.nn.datasets.mnist finds them: --data-dir, $TINY_DATA, the
user's cache, or where Debian's dataset-fashion-mnist package puts them); --fashion picks Fashion-MNIST.
The model: two 5x5 and two 3x3 convolutions with batch norm and max pooling, then a linear layer.
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np

from tiny import nn
from tiny.nn.datasets import mnist
from tiny.nn.state import get_parameters, get_state_dict, load_state_dict, safe_load, safe_save
from tiny.tensor import Device, Tensor, TinyJit


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


def load_data(args: argparse.Namespace) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    try:
        x_train, y_train, x_test, y_test = mnist(args.data_dir, fashion=True if args.fashion else None)
    except (FileNotFoundError, ValueError) as e:
        sys.exit(f"mnist: {e}")
    return x_train.numpy(), y_train.numpy().astype(np.int32), x_test.numpy(), y_test.numpy().astype(np.int32)


def evaluate(model: MnistCNN, images: np.ndarray, labels: np.ndarray, batch: int = 1000) -> float:
    """Accuracy over the whole set, in eval mode (batch norm uses its running statistics)."""
    predict = TinyJit(lambda x: model(x).argmax(1).realize())
    correct = 0
    for start in range(0, len(images), batch):
        x = normalize(images[start : start + batch])
        pred = predict(Tensor(x)).numpy() if len(x) == batch else model(Tensor(x)).argmax(1).numpy()
        correct += int((pred == labels[start : start + batch]).sum())
    return correct / len(images)


def train(args: argparse.Namespace) -> dict[str, float | list[float]]:
    """Train, evaluate, save; returns the losses seen every step and the test accuracy."""
    x_train, y_train, x_test, y_test = load_data(args)
    Tensor.manual_seed(args.seed)
    model = MnistCNN()
    params = [p for p in get_parameters(model) if p.requires_grad]
    opt = nn.optim.Adam(params, lr=args.lr)

    @TinyJit
    def step(x: Tensor, y: Tensor) -> tuple[Tensor, Tensor]:
        with Tensor.train():
            opt.zero_grad()
            logits = model(x)
            loss = logits.cross_entropy(y)
            loss.backward()
            opt.step()
            accuracy = (logits.argmax(1) == y).float().mean()
        return loss.realize(), accuracy.realize()

    rng = np.random.default_rng(args.seed)
    steps_per_epoch = len(x_train) // args.batch
    total = args.steps or args.epochs * steps_per_epoch
    schedule = nn.optim.CosineAnnealingLR(opt, T_max=total)  # the lr falls to 0 over the run
    print(f"training on {Device.DEFAULT}: {len(x_train)} images, {total} steps of {args.batch}")
    start = time.perf_counter()
    order = rng.permutation(len(x_train))
    losses: list[float] = []
    for i in range(total):
        if i and i % steps_per_epoch == 0:
            order = rng.permutation(len(x_train))
        idx = order[(i % steps_per_epoch) * args.batch : (i % steps_per_epoch + 1) * args.batch]
        loss, acc = step(Tensor(normalize(x_train[idx])), Tensor(y_train[idx]))
        losses.append(loss.item())
        schedule.step()
        if i % 10 == 0 or i == total - 1:
            rate = (i + 1) / (time.perf_counter() - start)
            bar = "#" * (30 * (i + 1) // total)
            print(
                f"\r[{bar:<30}] {i + 1}/{total} loss {loss.item():.3f} acc {acc.item():6.1%} {rate:.2f} steps/s",
                end="",
                flush=True,
            )
    print()
    limit = args.eval_limit or len(x_test)
    test_acc = evaluate(model, x_test[:limit], y_test[:limit])
    print(f"test accuracy {test_acc:.2%}")
    safe_save(get_state_dict(model), args.checkpoint)
    print(f"saved {args.checkpoint}; evaluate it with: python -m tiny.examples.mnist --eval {args.checkpoint}")
    return {"losses": losses, "test_accuracy": test_acc}


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
    _, _, x_test, y_test = load_data(args)
    limit = args.eval_limit or len(x_test)
    print(f"test accuracy of {args.eval}: {evaluate(model, x_test[:limit], y_test[:limit]):.2%}")


def main(argv: list[str] | None = None) -> dict[str, float | list[float]] | None:
    parser = argparse.ArgumentParser(prog="python -m tiny.examples.mnist", description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--steps", type=int, default=0, help="train this many steps instead of whole epochs")
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--data-dir", default=None, help="a folder with the four IDX files (.gz or not)")
    parser.add_argument("--fashion", action="store_true", help="Fashion-MNIST even where digit MNIST is present")
    parser.add_argument("--checkpoint", default="mnist.safetensors", help="where training saves the model")
    parser.add_argument("--eval", metavar="CHECKPOINT", help="evaluate this checkpoint instead of training")
    parser.add_argument("--eval-limit", type=int, default=0, help="evaluate on the first N test images only")
    args = parser.parse_args(argv)
    if args.eval:
        evaluate_checkpoint(args)
        return None
    return train(args)


if __name__ == "__main__":
    main()
