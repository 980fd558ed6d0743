"""BEAM search on the CPU: it picks a legal action list whose program computes the right answer, shows its
progress, and caches the winner on disk so a second search does not run. (How fast the winner is, the benchmark
suite reports; tests never assert times.)"""

from __future__ import annotations

import re

import numpy as np
import pytest

from tiny.codegen import Kernel
from tiny.codegen.opt.beam import beam_search
from tiny.codegen.opt.heuristic import hand_opts
from tiny.ir.config import Context
from tiny.ir.device import Device
from tiny.tensor import Tensor
from tiny.tensor.realize import capture


@pytest.fixture
def fresh_cache(tmp_path):  # noqa: ANN001, ANN201
    with Context(CACHEDB=str(tmp_path / "cache.db"), CACHELEVEL=2):
        yield


def test_beam_finds_a_correct_faster_matmul_and_caches_it(fresh_cache, capsys) -> None:  # noqa: ANN001
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((64, 48)).astype(np.float32), rng.standard_normal((48, 40)).astype(np.float32)
    ta, tb = Tensor(a, device="CPU").realize(), Tensor(b, device="CPU").realize()
    (item,) = (ta @ tb).schedule()
    dev = Device["CPU"]
    opts = beam_search(item.ast, dev, width=2, budget_s=20)
    assert "BEAM r_64_40_48" in capsys.readouterr().err
    Kernel(item.ast, dev.renderer.caps).apply_opts(opts)  # a legal sequence
    with Context(BEAM=2, BEAM_BUDGET=20):
        out = (ta @ tb).numpy()
    np.testing.assert_allclose(out, a @ b, rtol=1e-4, atol=1e-4)
    assert beam_search(item.ast, dev, width=2, budget_s=0) == opts, "the second search is the cached answer"
    assert capsys.readouterr().err == "", "and runs nothing"


def test_a_winner_cached_by_another_code_generator_is_searched_again(fresh_cache, monkeypatch, capsys) -> None:  # noqa: ANN001
    """A cached action list is the winner only for the code generator that timed it: the digest of the codegen
    package's source is part of the key."""
    from tiny.codegen.opt import beam

    ta = Tensor(np.ones((32, 24), np.float32), device="CPU").realize()
    tb = Tensor(np.ones((24, 16), np.float32), device="CPU").realize()
    (item,) = (ta @ tb).schedule()
    dev = Device["CPU"]
    monkeypatch.setattr(beam, "_codegen_digest", lambda: "an older tiny.codegen")
    beam_search(item.ast, dev, width=2, budget_s=5)
    capsys.readouterr()
    assert beam_search(item.ast, dev, width=2, budget_s=5) is not None and capsys.readouterr().err == ""
    monkeypatch.undo()
    beam_search(item.ast, dev, width=2, budget_s=5)
    assert "BEAM r_32_16_24" in capsys.readouterr().err, "searched again, not taken from the older cache"


def test_the_flags_in_force_choose_the_program_of_a_kernel_built_before(fresh_cache, capsys) -> None:  # noqa: ANN001
    """NOOPT=1 runs a kernel as it was lowered, and BEAM searches it, also where the same kernel was built (under
    other flags) earlier in the process: programs are kept per NOOPT and BEAM."""
    rng = np.random.default_rng(1)  # (a kernel of its own: the first test built its program under BEAM=2)
    a, b = rng.standard_normal((56, 48)).astype(np.float32), rng.standard_normal((48, 40)).astype(np.float32)
    ta, tb = Tensor(a, device="CPU").realize(), Tensor(b, device="CPU").realize()

    def source() -> str:
        with capture() as launches:
            out = (ta @ tb).realize()
        np.testing.assert_allclose(out.numpy(), a @ b, rtol=1e-4, atol=1e-4)
        (kernel,) = [launch.program for launch in launches if launch.program is not None]
        return kernel.src

    def accumulators(src: str) -> int:  # C names them acc0, acc1 ...; LLVM IR holds each in a phi of a loop
        return len(set(re.findall(r"%acc\d+ = phi <?\d*", src) or re.findall(r"\bacc\d+\b", src)))

    tiled = source()
    assert accumulators(tiled) > 1, "the heuristics tile a matmul"
    with Context(NOOPT=1):
        assert accumulators(source()) == 1, "one accumulator: the loops as lowered"
    capsys.readouterr()
    with Context(BEAM=2, BEAM_BUDGET=20):
        source()
    assert "BEAM r_56_40_48" in capsys.readouterr().err
    assert source() == tiled, "and the heuristics' program again once the flags are back"


def test_a_spent_budget_ends_the_search_with_the_rules_choice_or_none(fresh_cache, capsys) -> None:  # noqa: ANN001
    """With no time left after the two seeds (the heuristics' actions and none) are timed, no round runs: the
    answer is the faster seed."""
    ta = Tensor(np.ones((40, 24), np.float32), device="CPU").realize()
    tb = Tensor(np.ones((24, 16), np.float32), device="CPU").realize()
    (item,) = (ta @ tb).schedule()
    dev = Device["CPU"]
    opts = beam_search(item.ast, dev, width=2, budget_s=0)
    assert "round" not in capsys.readouterr().err
    assert opts in (hand_opts(Kernel(item.ast, dev.renderer.caps)), [])


def test_the_timer_writes_every_buffer_before_it_times() -> None:
    """A CPU's fresh allocation that nothing wrote reads as one shared page of zeros, always in cache: timing a
    candidate over it times reads that never reach memory (a 128 MB sum read 17% faster). The timer writes each
    buffer it allocates once."""
    from tiny.codegen.opt.beam import _Timer

    ta = Tensor(np.ones((32, 24), np.float32), device="CPU").realize()
    (item,) = (ta.sum(1)).schedule()
    dev = Device["CPU"]
    written: list[tuple[int, int]] = []
    real_copyin = dev.allocator.copyin

    class Spy:
        def __getattr__(self, name: str):  # noqa: ANN204
            return getattr(dev.allocator, name)

        def copyin(self, dest, src) -> None:  # noqa: ANN001
            written.append((dest, src.nbytes))
            real_copyin(dest, src)

    class Device_:
        allocator = Spy()

    timer = _Timer(item.ast, Device_())  # type: ignore[arg-type]
    assert sorted(written) == sorted(zip(timer.bufs, timer.sizes))
    timer.close()
