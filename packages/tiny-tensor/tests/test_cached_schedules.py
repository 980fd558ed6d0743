"""Tensors computed through the schedule cache (tiny.ir.schedule.cache) on every device under test.

Each case runs three times on new inputs: the first schedules its graph, the later ones take that schedule from
the cache. With SCHEDULE_CACHE=2 every later run also schedules anew and fails unless the cached schedule is the
computed one; with the cache on (the default) the values are compared with NumPy, as computed from the cache.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from tensor_helpers import assert_matches, small

from tiny.ir.config import Context
from tiny.ir.schedule import cache
from tiny.ir.schedule.cache import SCHEDULES
from tiny.tensor import Tensor, dtypes

Case = tuple[Callable[..., Tensor], Callable[..., np.ndarray], tuple[tuple[int, ...], ...]]

# name -> (tiny function, NumPy function, input shapes)
CASES: dict[str, Case] = {
    "add a scalar": (lambda x: x + 1, lambda x: x + 1, ((4,),)),
    "broadcast": (lambda x, y: x * y - 2, lambda x, y: x * y - 2, ((3, 1, 5), (4, 5))),
    "one input twice": (lambda x: x * x + x, lambda x: x * x + x, ((6,),)),
    "sum of an axis": (lambda x: x.sum(axis=1), lambda x: x.sum(axis=1), ((5, 7),)),
    "max after a permute": (lambda x: x.permute(1, 0).max(axis=0), lambda x: x.T.max(axis=0), ((4, 6),)),
    "a big sum (two kernels)": (lambda x: x.sum(), lambda x: x.sum(), ((1 << 16,),)),
    "softmax": (
        lambda x: x.softmax(axis=-1),
        lambda x: np.exp(x - x.max(-1, keepdims=True)) / np.exp(x - x.max(-1, keepdims=True)).sum(-1, keepdims=True),
        ((3, 8),),
    ),
    "matmul": (lambda x, y: x @ y, lambda x, y: x @ y, ((5, 6), (6, 3))),
    "pad, shrink and flip": (
        lambda x: x.pad(((1, 0), (0, 2)))[1:, ::-1] + 1,
        lambda x: np.pad(x, ((1, 0), (0, 2)))[1:, ::-1] + 1,
        ((3, 4),),
    ),
    "cat": (lambda x, y: x.cat(y, dim=0) * 2, lambda x, y: np.concatenate([x, y]) * 2, ((2, 3), (4, 3))),
    "where": (lambda x, y: (x > y).where(x, y), np.maximum, ((9,), (9,))),
    "cast": (lambda x: (x * 10).cast(dtypes.int32) // 3, lambda x: (x * 10).astype(np.int32) // 3, ((7,),)),
    "cumsum": (lambda x: x.cumsum(axis=0), lambda x: x.cumsum(axis=0), ((6, 2),)),
    "contiguous transpose": (lambda x: x.T.contiguous() + 1, lambda x: x.T + 1, ((3, 5),)),
}


def _inputs(shapes: tuple[tuple[int, ...], ...], seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.uniform(0.5, 2.0, s).astype(np.float32) for s in shapes]


def _run_three_times(device: str, case: Case) -> None:
    tiny_fn, np_fn, shapes = case
    for seed in range(3):
        arrays = _inputs(shapes, seed)
        out = tiny_fn(*(Tensor(a, device=device) for a in arrays))
        assert_matches(out, np_fn(*arrays), out.dtype, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("mode", [1, 2], ids=["cached", "checked"])
@pytest.mark.parametrize("name", list(CASES))
def test_a_cached_schedule_computes_the_same_values(device: str, name: str, mode: int) -> None:
    if name == "a big sum (two kernels)" and small(device, False, True):
        pytest.skip("65536 elements take long on an interpreter")
    hits = SCHEDULES.hits
    with Context(SCHEDULE_CACHE=mode):
        _run_three_times(device, CASES[name])
    assert SCHEDULES.hits > hits  # the later runs took schedules from the cache


def test_a_chain_recorded_op_by_op_is_keyed_without_the_walk(device: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A chain of new nodes, each over one new source and known ones (x * 1.0 + 0.5, again and again, over a tensor
    realized before), is keyed by following it down: longer than the general walk would key (NEW_NODES_LIMIT), it is
    looked up without that walk, and takes the cached schedule from its second run."""
    start = Tensor([1.0, 2.0], device=device).realize()
    (start * 1.0 + 0.5).realize()  # (a short chain first: the constants' structures, known from now on)
    length = cache.NEW_NODES_LIMIT + 44
    monkeypatch.setattr(cache, "_new_nodes", lambda targets: pytest.fail("walked the graph to key it"))
    hits = SCHEDULES.hits
    for _ in range(2):
        x = start
        for _ in range(length):
            x = x * 1.0 + 0.5
        assert x.tolist() == [1.0 + 0.5 * length, 2.0 + 0.5 * length]
    assert SCHEDULES.hits == hits + 1


def test_a_read_of_one_buffer_twice_is_not_a_read_of_two(device: str) -> None:
    """x + x and x + y differ only in which buffers they read: the schedule of one must not serve the other."""
    for _ in range(2):
        x = Tensor([1.0, 2.0, 3.0], device=device).realize()
        y = Tensor([10.0, 20.0, 30.0], device=device).realize()
        assert (x + x).tolist() == [2.0, 4.0, 6.0]
        assert (x + y).tolist() == [11.0, 22.0, 33.0]


def test_a_realized_input_is_not_an_unrealized_one(device: str) -> None:
    for _ in range(2):
        x = Tensor([1.0, 2.0], device=device).realize()
        lazy = x * 3  # the same shape, but a graph: its kernel computes x * 3 first
        assert (x + 1).tolist() == [2.0, 3.0]
        assert (lazy + 1).tolist() == [4.0, 7.0]


def test_assign_writes_each_new_target(device: str) -> None:
    with Context(SCHEDULE_CACHE=2):
        for start in (1.0, 5.0, 9.0):
            x = Tensor([start, start + 1], device=device).realize()
            x.assign(x * 2).realize()
            x.assign(x + 1).realize()
            assert x.tolist() == [2 * start + 1, 2 * start + 3]


def test_inplace_updates_in_a_loop(device: str) -> None:
    x = Tensor([0.0, 1.0], device=device).realize()
    for _ in range(5):
        x += 1
        x.realize()
    assert x.tolist() == [5.0, 6.0]


def test_gradients_through_cached_schedules(device: str) -> None:
    """Realized buffers remember the graph that computed them (autograd reads it): from the cache too."""
    with Context(SCHEDULE_CACHE=2):
        for seed in range(3):
            a = _inputs(((4,),), seed)[0]
            w = Tensor(a, device=device, requires_grad=True)
            h = (w * w).realize()  # a buffer whose gradient flows back through w * w
            (h.sum() * 3).backward()
            assert w.grad is not None
            np.testing.assert_allclose(w.grad.numpy(), 6 * a, rtol=1e-5)


def test_copies_between_devices(device: str, python_device: str) -> None:
    with Context(SCHEDULE_CACHE=2):
        for start in (1.0, 4.0, 7.0):
            x = Tensor([start, start + 1], device=device) * 2
            assert (x.to(python_device) + 1).tolist() == [2 * start + 1, 2 * start + 3]


def test_tensors_on_disk_bypass_the_cache(device: str, tmp_path: Path) -> None:
    """Values on DISK become views of the file's buffer: the scheduler makes those every time."""
    for i in range(3):
        path = tmp_path / f"w{i}.bin"
        np.arange(4, dtype=np.float32).tofile(path)
        looked_up = SCHEDULES.hits + SCHEDULES.misses
        on_disk = Tensor(path).bitcast(dtypes.float32)[1:3]
        assert on_disk.to(device).tolist() == [1.0, 2.0]
        assert SCHEDULES.hits + SCHEDULES.misses == looked_up  # not even looked up
