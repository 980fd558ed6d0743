"""A short tour: build tensors, compute with them, and see the kernels tiny generated and ran.

Run: python -m tiny.examples.demo   (DEVICE=PYTHON python -m tiny.examples.demo runs it on the emulator)
"""

from __future__ import annotations

import numpy as np

from tiny.ir.config import Context
from tiny.tensor import Device, Tensor


def section(title: str) -> None:
    print(f"\n== {title}")


def main() -> None:
    print(f"tiny demo on device {Device.DEFAULT}")
    Tensor.manual_seed(0)
    a = Tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    b = Tensor([10.0, 20.0, 30.0])

    with Context(DEBUG=2):  # one line per kernel that runs: name, time, GFLOPS, GB/s
        section("broadcasting add: one elementwise kernel")
        print((a + b).numpy())

        section("a fused chain ((a*b+c).relu()*d).sum(): one kernel")
        x, y, c, d = (Tensor.randn(64, 64) for _ in range(4))
        x.realize(y, c, d)  # the inputs first (one kernel each), so that the next line shows the fused one alone
        fused = ((x * y + c).relu() * d).sum()
        print(f"{fused.item():.4f}  (NumPy: {((x.numpy() * y.numpy() + c.numpy()).clip(0) * d.numpy()).sum():.4f})")

        section("matmul: one reduce kernel")
        m = Tensor.arange(6, dtype="float32").reshape(2, 3) @ Tensor.ones(3, 4)
        print(m.numpy())

        section("softmax over the last axis: three kernels")
        logits = Tensor([[1.0, 2.0, 3.0], [1.0, 1.0, 1.0]])
        print(logits.softmax(-1).numpy().round(4))

        section("movement ops are free: transpose, flip and slice then add")
        t = Tensor(np.arange(12, dtype=np.float32).reshape(3, 4))
        print((t.T.flip(0)[1:, ::2] + 100).numpy())

    section("the C source of one kernel (DEBUG=4 prints it for every kernel)")
    with Context(DEBUG=4):
        (Tensor.ones(4, 4) * 3 + Tensor.ones(4, 1)).realize()


if __name__ == "__main__":
    main()
