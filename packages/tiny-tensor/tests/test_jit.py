"""TinyJit: replays compute what the function computes, and every way a replay could go wrong is caught."""

from __future__ import annotations

import numpy as np
import pytest

from tiny import nn
from tiny.nn.state import get_parameters
from tiny.tensor import GlobalCounters, JitError, Tensor, TinyJit, dtypes

rng = np.random.default_rng(0)


def arr(*shape: int) -> np.ndarray:
    return rng.standard_normal(shape).astype(np.float32)


def f(x: Tensor, y: Tensor) -> Tensor:
    return ((x @ y).relu() + x.sum(1, keepdim=True)).realize()


def test_replays_compute_with_new_inputs(device: str) -> None:
    jf = TinyJit(f)
    for _ in range(5):
        a, b = arr(6, 5), arr(5, 6)
        got = jf(Tensor(a, device=device), Tensor(b, device=device)).numpy()
        np.testing.assert_allclose(got, np.maximum(a @ b, 0) + a.sum(1, keepdims=True), rtol=1e-5, atol=1e-5)
    assert len(jf.recordings) == 1
    (rec,) = jf.recordings.values()
    before = GlobalCounters.kernels
    jf(Tensor(arr(6, 5), device=device), Tensor(arr(5, 6), device=device))
    assert GlobalCounters.kernels == before, "a replay runs the recorded launches, not the scheduler"
    assert len(rec.launches) >= 1


def test_a_changed_shape_dtype_or_device_captures_again() -> None:
    jf = TinyJit(lambda x: (x * 2 + 1).realize())
    for shape in [(3,), (3,), (3,), (4,), (4,), (4,), (3,)]:
        x = arr(*shape)
        np.testing.assert_allclose(jf(Tensor(x)).numpy(), x * 2 + 1)
    assert len(jf.recordings) == 2
    for _ in range(3):
        assert jf(Tensor([1, 2, 3], dtype=dtypes.int32)).tolist() == [3, 5, 7]
    assert len(jf.recordings) == 3
    for _ in range(3):
        assert jf(Tensor([1.0, 2.0], device="PYTHON")).tolist() == [3.0, 5.0]
    assert len(jf.recordings) == 4


def test_a_changed_non_tensor_argument_captures_again() -> None:
    jf = TinyJit(lambda x, scale, mode="add": ((x * scale) + (1 if mode == "add" else -1)).realize())
    x = arr(4)
    for scale in (2.0, 2.0, 2.0, 3.0, 3.0, 3.0):
        np.testing.assert_allclose(jf(Tensor(x), scale).numpy(), x * scale + 1, rtol=1e-6)
    for _ in range(3):
        np.testing.assert_allclose(jf(Tensor(x), 3.0, mode="sub").numpy(), x * 3 - 1, rtol=1e-6)
    assert len(jf.recordings) == 3


def test_unhashable_argument_is_refused() -> None:
    jf = TinyJit(lambda x, opts: (x + 1).realize())
    with pytest.raises(JitError, match="cannot be a key"):
        jf(Tensor([1.0]), {"a": set()})


def test_the_same_tensor_twice_is_its_own_signature() -> None:
    jf = TinyJit(lambda x, y: (x * y).realize())
    a, b = arr(5), arr(5)
    for _ in range(3):
        ta = Tensor(a)
        np.testing.assert_allclose(jf(ta, ta).numpy(), a * a, rtol=1e-6)
    for _ in range(3):
        np.testing.assert_allclose(jf(Tensor(a), Tensor(b)).numpy(), a * b, rtol=1e-6)
    assert len(jf.recordings) == 2


def test_an_input_that_aliases_an_output_is_refused() -> None:
    jf = TinyJit(lambda x: (x + 1).realize())
    x = Tensor([0.0, 0.0])
    for _ in range(3):
        out = jf(Tensor([0.0, 0.0]))
    with pytest.raises(JitError, match="is a buffer the jitted function writes"):
        jf(out)
    np.testing.assert_allclose(jf(out.contiguous()).numpy(), [2.0, 2.0])  # a copy is fine
    assert x.tolist() == [0.0, 0.0]


def test_reading_values_inside_is_an_error() -> None:
    jf = TinyJit(lambda x: (x * float(x.sum().item())).realize())
    jf(Tensor([1.0, 2.0]))  # the warm-up call runs the function as it is
    with pytest.raises(JitError, match="reading a tensor's values"):
        jf(Tensor([1.0, 2.0]))


def test_data_dependent_control_flow_is_an_error() -> None:
    def branchy(x: Tensor) -> Tensor:
        return (x * 2).realize() if (x.sum() > 0) else (x * 3).realize()

    jf = TinyJit(branchy)
    assert jf(Tensor([1.0])).tolist() == [2.0]
    with pytest.raises(JitError, match="reading a tensor's values"):
        jf(Tensor([-1.0]))


def test_random_numbers_inside_are_an_error() -> None:
    jf = TinyJit(lambda x: (x + Tensor.rand(*x.shape)).realize())
    jf(Tensor([1.0]))
    with pytest.raises(JitError, match="random numbers"):
        jf(Tensor([1.0]))


def test_internal_buffers_are_planned() -> None:
    def chain(x: Tensor) -> Tensor:
        for _ in range(6):
            x = (x * 1.5 + 1).contiguous()  # each step a kernel and a buffer of its own
        return x.realize()

    jf = TinyJit(chain)
    x = arr(64)
    for _ in range(4):
        got = jf(Tensor(x)).numpy()
    want = x.copy()
    for _ in range(6):
        want = want * 1.5 + 1
    np.testing.assert_allclose(got, want, rtol=1e-5)
    (rec,) = jf.recordings.values()
    out = jf(Tensor(x))._buffer()
    memory = {b.base if b.base is not None else b for ln in rec.launches for b in ln.buffers}
    internal = memory - set(rec.inputs) - {out}
    # two allocations take turns (the scheduler's planner shares them within the step's schedule, TinyJit's across
    # the schedules of a capture)
    assert sum(b.nbytes for b in internal) == 2 * 64 * 4, [b.nbytes for b in internal]


def test_jitted_training_matches_eager() -> None:
    def run(jit: bool) -> list[float]:
        Tensor.manual_seed(0)
        model = [nn.Conv2d(1, 4, 3), nn.BatchNorm2d(4), nn.Linear(4 * 6 * 6, 3)]
        opt = nn.optim.Adam([p for p in get_parameters(model) if p.requires_grad], lr=1e-2)

        def step(x: Tensor, y: Tensor) -> Tensor:
            with Tensor.train():
                opt.zero_grad()
                h = model[1](model[0](x).relu()).flatten(1)
                loss = model[2](h).cross_entropy(y)
                loss.backward()
                opt.step()
            return loss.realize()

        fn = TinyJit(step) if jit else step
        data = np.random.default_rng(1)
        losses = []
        for _ in range(5):
            x = data.standard_normal((8, 1, 8, 8)).astype(np.float32)
            y = data.integers(0, 3, 8).astype(np.int32)
            losses.append(fn(Tensor(x), Tensor(y)).item())
        return losses

    np.testing.assert_allclose(run(jit=True), run(jit=False), rtol=1e-4, atol=1e-5)


def test_lazy_state_writes_happen_in_every_replay() -> None:
    """A function that updates state with assign and never reads it (batch norm's running statistics) still
    updates it on every replay, once per call."""
    state = Tensor([0.0]).contiguous().realize()

    def count(x: Tensor) -> Tensor:
        state.assign(state + 1)  # lazy: nothing inside reads it
        return (x * 2).realize()

    jf = TinyJit(count)
    for _ in range(5):
        jf(Tensor([1.0]))
    assert state.item() == 5.0


def test_state_assigned_between_calls_is_seen_by_the_replay() -> None:
    scale = Tensor([1.0]).contiguous().realize()
    jf = TinyJit(lambda x: (x * scale).realize())
    for i in range(1, 6):
        scale.assign(Tensor([float(i)]))  # lazy: nothing realizes it before the call
        assert jf(Tensor([2.0])).tolist() == [2.0 * i]


def test_a_capture_gives_back_what_its_launches_alone_hold(device: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each step's buffer that no tensor holds any more goes back to its allocator while the capture goes on (the
    recording plans it again): a pass of many steps, each one's output read by the next alone, takes new memory for
    a few of them, not for every one (every buffer of a language model's prompt, held to the end, was 53 MB more).
    The replays compute what the function computes."""
    from tiny.tensor import Device

    def steps(x: Tensor) -> Tensor:
        for i in range(8):
            x = (x * 1.5 + i).contiguous().realize()  # (a schedule each: its input is then no tensor's)
        return x

    allocator = Device[device].allocator
    news: list[int] = []
    alloc = allocator._alloc
    jf = TinyJit(steps)
    x = arr(64, 1024)
    want = x.copy()
    for i in range(8):
        want = want * np.float32(1.5) + np.float32(i)
    np.testing.assert_allclose(jf(Tensor(x, device=device)).numpy(), want, rtol=1e-6)  # (warm-up)
    allocator.free_cache()
    monkeypatch.setattr(allocator, "_alloc", lambda size: news.append(size) or alloc(size))
    np.testing.assert_allclose(jf(Tensor(x, device=device)).numpy(), want, rtol=1e-6)  # (captured)
    assert 0 < len([n for n in news if n >= x.nbytes]) <= 5, news  # (held to the end: 9)
    for _ in range(2):
        np.testing.assert_allclose(jf(Tensor(x + 1, device=device)).numpy(), want + 1.5**8, rtol=1e-5)


def test_a_replay_hands_back_an_input_it_returns_and_looks_up_no_buffer(monkeypatch: pytest.MonkeyPatch) -> None:
    """A function that returns one of its inputs beside a result gets the very tensor passed in back; which results
    are inputs is worked out once, when recorded: a replay asks no tensor for its buffer (each ask was a realize()
    and a lookup on every call)."""

    @TinyJit
    def both(x: Tensor, y: Tensor) -> tuple[Tensor, list[Tensor]]:
        return (x + y).realize(), [y, x]

    for _ in range(2):
        both(Tensor(arr(4)), Tensor(arr(4)))
    (rec,) = both.recordings.values()
    assert rec.given == (None, 1, 0)
    x, y = Tensor(arr(4)).realize(), Tensor(arr(4)).realize()
    monkeypatch.setattr(Tensor, "_buffer", lambda self: pytest.fail("a replay looked up a tensor's buffer"))
    total, (back_y, back_x) = both(x, y)
    monkeypatch.undo()
    assert back_y is y and back_x is x
    np.testing.assert_allclose(total.numpy(), x.numpy() + y.numpy())
