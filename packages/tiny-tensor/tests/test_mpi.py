"""Data-parallel training across processes (tiny.nn.mpi): jobs started by Open MPI's mpirun in a subprocess give the
losses of one process with the whole batch, and a process that dies stops the others with an error instead of
leaving them waiting. The jobs skip, saying why, without mpirun or mpi4py (`apt-get install openmpi-bin
libopenmpi-dev`, `pip install 'tiny-tensor[mpi]'`); the errors without them are tested everywhere."""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tiny import nn
from tiny.examples import mnist as job
from tiny.nn import mpi
from tiny.nn.datasets import mnist
from tiny.nn.state import get_state_dict, safe_load
from tiny.tensor import Tensor

JOB = Path(__file__).with_name("mpi_job.py")
# Open MPI refuses to start as root unless told; --oversubscribe starts more processes than this machine has cores
ROOT_OK = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}


@pytest.fixture(scope="module")
def mpirun() -> list[str]:
    if shutil.which("mpirun") is None:
        pytest.skip("no mpirun here (apt-get install openmpi-bin libopenmpi-dev)")
    if importlib.util.find_spec("mpi4py") is None:
        pytest.skip("no mpi4py here (pip install 'tiny-tensor[mpi]')")
    return ["mpirun", "--oversubscribe"]


def run(cmd: list[str], timeout: float = 240) -> subprocess.CompletedProcess:
    """The command's result; a job still running after `timeout` seconds fails the test (a hang, not a wait)."""
    env = {**os.environ, **ROOT_OK, "PYTHONPATH": os.pathsep.join(sys.path)}
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env, stdin=subprocess.DEVNULL)


def losses(printed: str) -> list[float]:
    return [float(line) for line in printed.split()]


@pytest.mark.parametrize("bn", [False, True])
@pytest.mark.parametrize("processes", [2, 3])
def test_processes_give_the_losses_of_one_process_with_the_whole_batch(mpirun, processes, bn) -> None:  # noqa: ANN001
    """An MLP and SGD on a batch of 10 (3 processes: shares of 4, 3 and 3): the same losses, step after step, as one
    process on the whole batch; the ranks start from different seeds, so the broadcast is what makes them agree.
    With a batch norm between the layers (SyncBatchNorm under MPI): its statistics are the whole batch's, forward and
    backward, and so are the running statistics (the last line); without the sync the losses were 0.5-8% apart."""
    flags = ["--bn"] if bn else []
    one = run([sys.executable, str(JOB), *flags])
    several = run([*mpirun, "-n", str(processes), sys.executable, str(JOB), "--mpi", *flags])
    assert one.returncode == 0 and several.returncode == 0, (one.stderr, several.stderr)
    assert len(losses(one.stdout)) == 4 + 4 * bn
    np.testing.assert_allclose(losses(several.stdout), losses(one.stdout), rtol=1e-5)


@pytest.mark.parametrize(
    ("how", "said"),
    [
        ("exit", "tiny.nn.mpi: process 1 of 2 exited with status 3; stopping the other processes"),
        ("raise", "tiny.nn.mpi: process 1 of 2 failed with RuntimeError: rank 1 broke on purpose; stopping"),
        ("kill", "exited on signal 9"),  # (mpirun's own message: no code runs in a killed process)
        ("finalize", "tiny.nn.mpi: process 0 of 2 waited 3 s in an all-reduce and the other processes"),
    ],
)
def test_a_process_that_dies_stops_the_others_with_an_error(mpirun, how, said) -> None:  # noqa: ANN001
    """Rank 1 stops at step 2 of 4 (an exit, an exception, SIGKILL, or a clean end that finalizes MPI while rank 0
    still trains): the job ends non-zero, well before the test's timeout, saying what happened."""
    cmd = [*mpirun, "-n", "2", sys.executable, str(JOB), "--mpi", "--die-at", "2", "--die-how", how, "--timeout", "3"]
    done = run(cmd, timeout=120)
    assert done.returncode != 0, (done.stdout, done.stderr)
    assert said in done.stderr + done.stdout, done.stderr
    assert len(losses(done.stdout)) == 2  # the steps before rank 1 stopped, and no more


def test_world_outside_mpirun_is_an_error(monkeypatch) -> None:  # noqa: ANN001
    for name in mpi.LAUNCHER_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(mpi.MPIError, match=r"not started by mpirun .* run it as `mpirun -n 2 python \.\.\.`"):
        mpi.world()
    with pytest.raises(SystemExit, match=r"mnist: --mpi: this process was not started by mpirun"):
        job.main(["--mpi", "--steps", "1"])


def test_world_without_mpi4py_is_an_error(monkeypatch) -> None:  # noqa: ANN001
    monkeypatch.setenv("OMPI_COMM_WORLD_SIZE", "2")
    monkeypatch.setitem(sys.modules, "mpi4py", None)  # (an import of it then fails, as where it is not installed)
    with pytest.raises(mpi.MPIError, match=r"needs mpi4py.*pip install 'tiny-tensor\[mpi\]'"):
        mpi.world()


def test_bad_arguments_are_errors() -> None:
    with pytest.raises(ValueError, match=r"positive number of seconds, got 0"):
        mpi.world(timeout=0)
    with pytest.raises(SystemExit, match=r"--mpi and --devices: give one of them"):
        job.main(["--mpi", "--devices", "CPU:0,CPU:1"])
    with pytest.raises(SystemExit, match=r"--mpi trains; --eval evaluates a checkpoint in one process"):
        job.main(["--mpi", "--eval", "mnist.safetensors"])
    with pytest.raises(ValueError, match=r"a batch of 2 rows cannot be split over 3 processes"):
        mpi.World(rank=0, size=3, comm=None).share(2)


@pytest.mark.parametrize(("n", "size"), [(10, 3), (12, 4), (5, 5), (7, 2)])
def test_shares_are_contiguous_and_cut_as_array_split(n, size) -> None:  # noqa: ANN001
    rows = np.arange(n)
    shares = [rows[mpi.World(rank=r, size=size, comm=None).share(n)] for r in range(size)]
    for got, want in zip(shares, np.array_split(rows, size), strict=True):
        np.testing.assert_array_equal(got, want)


@pytest.mark.slow  # (the processes compile the CNN's kernels: about a minute and a half on 2 cores)
def test_mnist_over_processes(mpirun, tmp_path) -> None:  # noqa: ANN001
    """`python -m tiny.examples.mnist --mpi` against one process without MPI, same seed and batches. Under `mpirun
    -n 1` the step is the same arithmetic in three parts (the gradients, the host all-reduce, the update), so the
    saved weights agree within float rounding. Under `-n 2` the batch norms are synchronized (SyncBatchNorm: the
    statistics of the 32 images, not of each process's 16, which put the losses 1.1 to 2.3% apart), so the printed
    losses are one process's; the weights are not compared there: Adam's first steps move each weight by about lr
    whatever the size of its gradient, so a gradient rounded differently (the CNN's agree within 2e-4 of the largest)
    can move a weight the other way."""
    try:
        mnist()
    except FileNotFoundError as e:
        pytest.skip(f"no MNIST data here: {e}")
    common = ["--steps", "3", "--batch", "32", "--eval-limit", "100"]
    one = job.main([*common, "--save", str(tmp_path / "one.safetensors")])
    assert one is not None
    cmd = [sys.executable, "-m", "tiny.examples.mnist", "--mpi", *common]
    alone = run([*mpirun, "-n", "1", *cmd, "--save", str(tmp_path / "alone.safetensors")])
    assert alone.returncode == 0, alone.stderr
    want, got = safe_load(str(tmp_path / "one.safetensors")), safe_load(str(tmp_path / "alone.safetensors"))
    assert want.keys() == got.keys()
    for name in want:  # (a weight whose gradient is near 0 moves with its rounding: 1e-5 is 1% of a step of lr 1e-3)
        np.testing.assert_allclose(got[name].numpy(), want[name].numpy(), rtol=1e-4, atol=1e-5, err_msg=name)
    two = run([*mpirun, "-n", "2", *cmd, "--save", str(tmp_path / "two.safetensors")])
    assert two.returncode == 0, two.stderr
    assert "on 2 MPI processes (each on" in two.stdout and (tmp_path / "two.safetensors").exists()
    printed = [float(v) for v in re.findall(r"step [13]/3 loss ([0-9.]+)", two.stdout)]  # (the steps it prints)
    np.testing.assert_allclose(printed, [one["losses"][0], one["losses"][2]], atol=1.5e-3)  # (printed to 3 places)


def test_sync_batch_norm_takes_the_layers_place_over_its_tensors() -> None:
    """convert() puts a SyncBatchNorm in place of each batch norm (attributes, lists, dicts) over the layer's own
    tensors: the state dict keeps its names and tensors, and out of training it is the layer (running statistics)."""
    model = job.MnistCNN()
    before = get_state_dict(model)
    x = Tensor(np.random.default_rng(0).standard_normal((2, 1, 28, 28)).astype(np.float32))
    want = model(x).numpy()
    world = mpi.World(rank=0, size=1, comm=None)
    mpi.SyncBatchNorm.convert(model, world)
    assert isinstance(model.bn1, mpi.SyncBatchNorm) and isinstance(model.bn2, mpi.SyncBatchNorm)
    after = get_state_dict(model)
    assert list(after) == list(before) and all(after[k] is before[k] for k in before)
    np.testing.assert_array_equal(model(x).numpy(), want)
    held = [nn.BatchNorm1d(3), {"norm": nn.BatchNorm2d(2)}]
    mpi.SyncBatchNorm.convert(held, world)
    assert isinstance(held[0], mpi.SyncBatchNorm) and isinstance(held[1]["norm"], mpi.SyncBatchNorm)  # type: ignore[index]
