"""Symbolic sizes: a bound Variable stands for a length; kernels over it are built once and TinyJit replays across
its values. Every value is checked against NumPy."""

from __future__ import annotations

import math

import numpy as np
import pytest

from tiny.tensor import Device, Tensor, TinyJit, Variable
from tiny.tensor.realize import programs

RNG = np.random.default_rng(7)


def built() -> int:
    """Kernels compiled in this process so far (each (AST, device) once)."""
    return len(programs())


def test_variable_binds_and_shapes_keep_the_symbol(device: str) -> None:
    pos = Variable("pos", 1, 10)
    b = pos.bind(4)
    x = Tensor.zeros(3, 10, device=device)[:, :b]
    assert x.shape[0] == 3 and x.shape[1] is b
    assert x.shape[1].val == 4 and repr(x.shape[1]) == "pos=4"
    y = x.reshape(3, 1, b).expand(3, 2, b)
    assert y.shape[2] is b
    assert Tensor.zeros(4, b, device=device).shape == (4, b)
    assert x.numel().val == 12
    flat = Tensor.ones(b, 4, device=device).reshape(-1)
    assert flat.shape[0].val == 16 and flat.reshape(b, -1).shape == (b, 4)
    np.testing.assert_allclose(flat.reshape(b, -1).sum(0).numpy(), [4.0] * 4)


def test_fifty_lengths_build_each_kernel_once(device: str) -> None:
    a = RNG.standard_normal((4, 64)).astype(np.float32)
    x = Tensor(a, device=device)
    pos = Variable("n", 1, 64)
    first = None
    for n in range(1, 51):
        y = x[:, : pos.bind(n)]
        s, m, mean = (y * 2 + 1).sum(1), y.max(1), y.mean(1)
        np.testing.assert_allclose(s.numpy(), (a[:, :n] * 2 + 1).sum(1), rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(m.numpy(), a[:, :n].max(1))
        np.testing.assert_allclose(mean.numpy(), a[:, :n].mean(1), rtol=1e-5, atol=1e-6)
        if n == 1:
            first = built()
    assert built() == first, "a new length compiled a new kernel"


def test_softmax_matmul_padding_and_slicing_against_numpy(device: str) -> None:
    a = RNG.standard_normal((4, 32)).astype(np.float32)
    w = RNG.standard_normal((32, 5)).astype(np.float32)
    x, wt = Tensor(a, device=device), Tensor(w, device=device)
    pos = Variable("k", 2, 32)
    for n in (2, 9, 32):
        b = pos.bind(n)
        y = x[:, :b]
        e = np.exp(a[:, :n] - a[:, :n].max(1, keepdims=True))
        np.testing.assert_allclose(y.softmax(1).numpy(), e / e.sum(1, keepdims=True), rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose((y @ wt[:b]).numpy(), a[:, :n] @ w[:n], rtol=1e-4, atol=1e-5)  # symbolic inner dim
        padded = np.pad(a[:, :n], ((0, 0), (1, 2)), constant_values=3.0)
        np.testing.assert_allclose(y.pad(((0, 0), (1, 2)), value=3.0).numpy(), padded)
        np.testing.assert_allclose(x[:, 1:b].numpy(), a[:, 1:n])
        np.testing.assert_allclose(x[:, b - 2 : b].numpy(), a[:, n - 2 : n])
        np.testing.assert_allclose(y.reshape(2, 2, b).sum(0).numpy(), a[:, :n].reshape(2, 2, n).sum(0), rtol=1e-5)
        np.testing.assert_allclose((y + Tensor.ones(4, b, device=device)).numpy(), a[:, :n] + 1)
        np.testing.assert_allclose(Tensor.arange(b, device=device).numpy(), np.arange(n))
        assert Tensor(b, device=device).item() == n


def test_a_kernel_of_fixed_size_that_reads_a_variable(device: str) -> None:
    """Padding a symbolic slice back to a fixed size: a kernel of fixed shape whose mask reads the Variable."""
    a = RNG.standard_normal((4, 30, 3)).astype(np.float32)
    x = Tensor(a, device=device)
    pos = Variable("pos", 1, 30)
    for n in (1, 17, 30):
        b = pos.bind(n)
        y = x[:, :b].pad(((0, 0), (0, 30 - b), (0, 0)))
        assert y.shape == (4, 30, 3)
        np.testing.assert_allclose((y * 2).numpy(), np.pad(a[:, :n] * 2, ((0, 0), (0, 30 - n), (0, 0))))


def test_a_threaded_cpu_kernel_takes_the_variable_and_its_thread_number_apart() -> None:
    """A CPU kernel big enough to run on several threads, reading a Variable: the C kernel took the thread's number
    where the Variable was (and the other way round) and read out of bounds."""
    if Device["CPU"].threads < 2:  # type: ignore[attr-defined]
        pytest.skip("one CPU thread here: no threaded kernel")
    a = RNG.standard_normal((128, 300, 64)).astype(np.float32)
    x = Tensor(a, device="CPU")
    pos = Variable("pos", 1, 300)
    for n in (1, 150):
        y = x[:, : pos.bind(n)].pad(((0, 0), (0, 300 - pos.bind(n)), (0, 0))) * 2
        np.testing.assert_allclose(y.numpy(), np.pad(a[:, :n] * 2, ((0, 0), (0, 300 - n), (0, 0))))


def _attention_reference(q: np.ndarray, k: np.ndarray, v: np.ndarray) -> np.ndarray:
    s = q @ k.transpose(0, 2, 1) / np.sqrt(q.shape[-1])
    e = np.exp(s - s.max(-1, keepdims=True))
    return (e / e.sum(-1, keepdims=True)) @ v


def test_kv_cache_step_is_one_capture(device: str) -> None:
    heads, dim, most = 2, 8, 64
    cache_k = Tensor.zeros(1, heads, most, dim, device=device).contiguous().realize()
    cache_v = Tensor.zeros(1, heads, most, dim, device=device).contiguous().realize()
    ks, vs, qs = (RNG.standard_normal((most, heads, dim)).astype(np.float32) for _ in range(3))
    pos = Variable("pos", 0, most - 1)

    def step(q: Tensor, k: Tensor, v: Tensor, p: object) -> Tensor:
        cache_k[:, :, p : p + 1] = k
        cache_v[:, :, p : p + 1] = v
        return q.scaled_dot_product_attention(cache_k[:, :, : p + 1], cache_v[:, :, : p + 1]).realize()

    jitted = TinyJit(step)
    for i in range(most):
        q, k, v = (Tensor(a[i].reshape(1, heads, 1, dim), device=device) for a in (qs, ks, vs))
        out = jitted(q, k, v, pos.bind(i))
        assert out.shape == (1, heads, 1, dim)
        ref = _attention_reference(qs[i][:, None], ks[: i + 1].transpose(1, 0, 2), vs[: i + 1].transpose(1, 0, 2))
        np.testing.assert_allclose(out.numpy().reshape(heads, 1, dim), ref, rtol=1e-4, atol=1e-5)
    assert len(jitted.recordings) == 1 and jitted.replays == most - 2


def test_a_replayed_kernel_over_a_variable_is_launched_with_its_value(
    device: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A kernel whose grid does not depend on its Variables (a decode step's attention over the cache) replays through
    its launcher, given this call's values after its buffers (Program.launcher's n_vals), not through the runner's
    general call (on the CPU a few microseconds a launch: 64 a step of a 1B model). (The device's graph executor,
    where it has one, replays the whole capture instead: here it is set aside, so the launchers are what replays.)"""
    from tiny.ir.device import Compiled
    from tiny.tensor.realize import Launch

    monkeypatch.setattr(type(Device[device]), "graph", Compiled.graph)
    a = RNG.standard_normal((4, 64)).astype(np.float32)
    x = Tensor(a, device=device).realize()
    n = Variable("n", 1, 64)

    @TinyJit
    def f(m: object) -> Tensor:
        return (x[:, :m] * 2).sum(1).realize()

    for i in (5, 9):
        f(n.bind(i))
    (rec,) = f.recordings.values()
    launches = [ln for ln in rec.launches if ln.program is not None and ln.program.var_names]
    assert launches and all(ln.with_values for ln in launches)
    for ln in launches:  # (a frozen dataclass: its runner's general call swapped for one that refuses)
        refuse = type("Refusing", (), {"__call__": lambda *args, **kw: pytest.fail("launched through the runner")})
        object.__setattr__(ln, "runner", refuse())
    for i in (1, 17, 64):
        np.testing.assert_allclose(f(n.bind(i)).numpy(), (a[:, :i] * 2).sum(1), rtol=1e-5, atol=1e-5)
    assert isinstance(launches[0], Launch)


def test_jit_replays_across_values_and_rebinds_its_outputs(device: str) -> None:
    a = RNG.standard_normal((3, 50)).astype(np.float32)
    x = Tensor(a, device=device).realize()
    n = Variable("n", 1, 50)

    @TinyJit
    def f(m: object) -> Tensor:
        return (x[:, :m] * 3).sum(1, keepdim=True).expand(3, m).contiguous().realize()

    before = None
    for i in range(1, 51):
        out = f(n.bind(i))
        assert out.shape[1].val == i
        ref = np.repeat((a[:, :i] * 3).sum(1, keepdims=True), i, 1)
        np.testing.assert_allclose(out.numpy(), ref, rtol=1e-5, atol=1e-5)
        if i == 2:
            before = built()
    assert f.replays == 48 and built() == before


def test_causal_attention_with_a_position_offset(device: str) -> None:
    """Prefill of q queries at positions start..start+q-1 over a cache of start+q keys: query i sees keys <= start+i."""
    heads, dim, q_len = 2, 4, 3
    start = Variable("start", 0, 20)
    ks, vs = (RNG.standard_normal((heads, 23, dim)).astype(np.float32) for _ in range(2))
    qs = RNG.standard_normal((heads, q_len, dim)).astype(np.float32)
    keys, values = Tensor(ks, device=device), Tensor(vs, device=device)
    for s0 in (0, 5, 20):
        b = start.bind(s0)
        total = b + q_len
        rows = Tensor.arange(q_len, device=device).reshape(q_len, 1) + Tensor(b, device=device)
        mask = rows >= Tensor.arange(total, device=device).reshape(1, total)
        out = Tensor(qs, device=device).scaled_dot_product_attention(keys[:, :total], values[:, :total], mask)
        n = s0 + q_len
        sc = qs @ ks[:, :n].transpose(0, 2, 1) / np.sqrt(dim)
        sc = np.where(np.arange(q_len)[:, None] + s0 >= np.arange(n)[None, :], sc, -np.inf)
        e = np.exp(sc - sc.max(-1, keepdims=True))
        np.testing.assert_allclose(out.numpy(), (e / e.sum(-1, keepdims=True)) @ vs[:, :n], rtol=1e-4, atol=1e-5)


def test_bad_symbolic_input_is_a_clear_error() -> None:
    pos = Variable("pos", 1, 8)
    with pytest.raises(ValueError, match="takes values from 1 to 8, got 9"):
        pos.bind(9)
    with pytest.raises(TypeError, match="bound to an int"):
        pos.bind(2.5)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="identifier"):
        Variable("not a name", 0, 3)
    with pytest.raises(ValueError, match="lo <= hi"):
        Variable("m", 5, 2)
    x = Tensor.zeros(4, 8)
    with pytest.raises(ValueError, match="cannot broadcast"):
        x[:, : pos.bind(3)] + Tensor.ones(4, 3)  # noqa: B018  (a symbolic size and a concrete one)
    with pytest.raises(ValueError, match="not bound"):
        x[:, :pos].numpy()  # an unbound Variable: no values to read
    with pytest.raises(ValueError, match="do not fit"):
        Tensor.zeros(4, 5)[:, : pos.bind(3)]  # pos may reach 8 > 5
    with pytest.raises(ValueError, match="bound to 3 and to 4"):
        (x[:, : pos.bind(3)].sum() + x[:, : pos.bind(4)].sum()).numpy()


def test_debug_shows_the_values_of_each_launch(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    x = Tensor(np.arange(12, dtype=np.float32).reshape(3, 4)).realize()
    pos = Variable("pos", 1, 4)
    monkeypatch.setenv("DEBUG", "2")
    (x[:, : pos.bind(3)] * 2).sum(1).realize()
    out = capsys.readouterr().out
    assert "r_3_pos" in out and "with pos=3" in out, out


def test_the_schedule_cache_keys_on_structure_not_values() -> None:
    from tiny.ir.schedule.cache import SCHEDULES

    x = Tensor(np.arange(40, dtype=np.float32).reshape(4, 10)).realize()
    pos = Variable("pos", 1, 10)
    (x[:, : pos.bind(2)] + 1).sum(1).realize()
    hits = SCHEDULES.hits
    for n in range(3, 8):
        out = (x[:, : pos.bind(n)] + 1).sum(1).numpy()
        np.testing.assert_allclose(out, (np.arange(40).reshape(4, 10)[:, :n] + 1).sum(1))
    assert SCHEDULES.hits - hits == 5


def test_a_changed_structure_captures_again() -> None:
    pos = Variable("pos", 1, 16)
    x4, x6 = Tensor.ones(4, 16).realize(), Tensor.ones(6, 16).realize()

    @TinyJit
    def f(x: Tensor, p: object) -> Tensor:
        return x[:, :p].sum(1).realize()

    for n in (1, 2, 3):
        assert f(x4, pos.bind(n)).tolist() == [float(n)] * 4
    assert len(f.recordings) == 1
    for n in (4, 5, 6):
        assert f(x6, pos.bind(n)).tolist() == [float(n)] * 6  # another shape: another recording
    assert len(f.recordings) == 2 and f.replays == 2


def test_a_variable_bound_outside_the_jitted_function_is_refused() -> None:
    from tiny.tensor import JitError

    pos = Variable("pos", 1, 16)
    x = Tensor.ones(4, 16).realize()
    outside = {"p": pos.bind(3)}

    @TinyJit
    def f(y: Tensor) -> Tensor:
        return (y[:, : outside["p"]] * 2).sum(1).realize()

    f(x)
    with pytest.raises(JitError, match="bound outside it"):
        f(x)


def test_is_causal_over_a_symbolic_key_length(device: str) -> None:
    q_all = RNG.standard_normal((2, 8, 4)).astype(np.float32)
    kv = RNG.standard_normal((2, 8, 4)).astype(np.float32)
    n = Variable("n", 1, 8)
    for length in (1, 5, 8):
        b = n.bind(length)
        q, k = Tensor(q_all, device=device)[:, :b], Tensor(kv, device=device)[:, :b]
        out = q.scaled_dot_product_attention(k, k, is_causal=True).numpy()
        qq, kk = q_all[:, :length], kv[:, :length]
        s = qq @ kk.transpose(0, 2, 1) / 2.0
        s = np.where(np.tril(np.ones((length, length), bool)), s, -np.inf)
        e = np.exp(s - s.max(-1, keepdims=True))
        np.testing.assert_allclose(out, (e / e.sum(-1, keepdims=True)) @ kk, rtol=1e-4, atol=1e-5)


def test_the_variable_is_a_kernel_parameter(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    x = Tensor(np.arange(12, dtype=np.float32).reshape(3, 4), device="CPU:C").realize()
    pos = Variable("pos", 1, 4)
    monkeypatch.setenv("DEBUG", "4")
    (x[:, : pos.bind(2)] * 5).sum(1).realize()
    src = capsys.readouterr().out
    assert "int pos" in src and "pos" in src.split("{", 1)[1], src


def test_beam_times_a_symbolic_kernel_at_the_largest_value(tmp_path, capsys) -> None:  # noqa: ANN001
    from tiny.codegen.opt.beam import beam_search
    from tiny.ir.config import Context

    x = Tensor(RNG.standard_normal((16, 200)).astype(np.float32), device="CPU").realize()
    pos = Variable("pos", 1, 200)
    (item,) = (x[:, : pos.bind(50)] * 2).sum(1).schedule()
    with Context(CACHEDB=str(tmp_path / "cache.db"), CACHELEVEL=2):
        beam_search(item.ast, Device["CPU"], width=2, budget_s=5)
        assert "(timed at pos=200)" in capsys.readouterr().err
        with Context(BEAM=2, BEAM_BUDGET=5):
            out = (x[:, : pos.bind(50)] * 2).sum(1).numpy()
    np.testing.assert_allclose(out, (x.numpy()[:, :50] * 2).sum(1), rtol=1e-5, atol=1e-5)


def test_a_symbolic_size_is_a_grid_dim_on_gpus() -> None:
    """On a device with workgroups a size over a Variable is a hardware index, its workgroup count computed at each
    launch; one whose largest value would need a folded grid stays a loop."""
    from tiny.codegen import get_program

    x = Tensor(RNG.standard_normal((8, 300)).astype(np.float32), device="PYTHON").realize()
    pos = Variable("pos", 1, 300)
    (item,) = (x[:, : pos.bind(5)] * 3).schedule()
    prog = get_program(item.ast, Device["PYTHON"])
    assert any(type(g) is not int for g in prog.global_size), prog.global_size
    assert prog.var_names == ("pos",)
    assert [math.prod(prog.grid((n,))) for n in (1, 5, 300)] == [math.prod(prog.grid((1,))) * n for n in (1, 5, 300)]
    for n in (1, 17, 300):
        np.testing.assert_allclose((x[:, : pos.bind(n)] * 3).numpy(), x.numpy()[:, :n] * 3, rtol=1e-6)

    big = Variable("big", 1, 70000)
    y = Tensor.ones(70000, device="PYTHON").contiguous().realize()
    (item,) = (y[: big.bind(3)] + 1).schedule()
    prog = get_program(item.ast, Device["PYTHON"])
    assert all(type(g) is int for g in prog.global_size), prog.global_size
    assert " RANGE " in prog.src, prog.src  # (the PYTHON device's source lists its UOps)
    np.testing.assert_allclose((y[: big.bind(3)] + 1).numpy(), [2, 2, 2])


def test_a_reduction_over_a_symbolic_size_is_shared_by_a_workgroup() -> None:
    """GROUP pads a symbolic reduce dim to a multiple of its threads (the padding adds the identity): the rules
    choose it on a GPU for a long reduction, and every length is right, a multiple of the threads or not."""
    from tiny.codegen.opt import Kernel, KernelOptError, Opt, OptOps
    from tiny.codegen.opt.heuristic import hand_opts

    a = RNG.standard_normal((4, 600)).astype(np.float32)
    x = Tensor(a, device="PYTHON").realize()
    pos = Variable("pos", 1, 600)
    (item,) = x[:, : pos.bind(3)].max(1).schedule()
    caps = Device["PYTHON"].renderer.caps
    assert any(o.op is OptOps.GROUP for o in hand_opts(Kernel(item.ast, caps))), hand_opts(Kernel(item.ast, caps))
    with pytest.raises(KernelOptError, match="symbolic size"):
        Kernel(item.ast, caps).apply(Opt(OptOps.UNROLL, 1, 4))
    for n in (1, 63, 64, 65, 600):
        np.testing.assert_allclose(x[:, : pos.bind(n)].max(1).numpy(), a[:, :n].max(1))
        np.testing.assert_allclose(x[:, : pos.bind(n)].sum(1).numpy(), a[:, :n].sum(1), rtol=1e-5, atol=1e-5)


def test_a_symbolic_size_known_to_be_a_multiple_is_cut_by_its_factors(device: str) -> None:
    """A size that is a multiple of a number for every value of its Variable (a prompt chunk's keys so far, (chunk +
    1) x 32) is cut by UPCAST and UNROLL in amounts that divide that number: the rules put vectors along it, where
    such a dim stayed a scalar loop (a 1B float16 model's 512-token prompt 88 -> 99 tokens/s); other amounts are
    refused. Every chunk's values are NumPy's, on every device."""
    from tiny.codegen.opt import Kernel, KernelOptError, Opt, OptOps
    from tiny.codegen.opt.heuristic import hand_opts

    a = RNG.standard_normal((4, 256)).astype(np.float32)
    x = Tensor(a, device=device).realize()
    chunk = Variable("chunk", 0, 7)

    def keys(c: int) -> Tensor:
        return x[:, : (chunk.bind(c) + 1) * 32]

    for c in (0, 3, 7):
        n = (c + 1) * 32
        np.testing.assert_allclose((keys(c).exp() * 2).numpy(), np.exp(a[:, :n]) * 2, rtol=1e-5)
        np.testing.assert_allclose(keys(c).max(1).numpy(), a[:, :n].max(1))
        np.testing.assert_allclose(keys(c).sum(1).numpy(), a[:, :n].sum(1), rtol=1e-5, atol=1e-5)
        masked = (keys(c) > 0).where(keys(c) < 1, keys(c) < -1).where(keys(c), -1.0)  # (a vector of bool choices)
        np.testing.assert_allclose(masked.numpy(), np.where(np.where(a > 0, a < 1, a < -1), a, -1.0)[:, :n])
    if Device[device].renderer.caps.language != "C":
        return
    caps = Device[device].renderer.caps
    (elementwise,) = (keys(2).exp() * 2).schedule()
    (summed,) = keys(2).sum(1).schedule()
    assert any(o.op is OptOps.UPCAST and o.axis == 1 for o in hand_opts(Kernel(elementwise.ast, caps)))
    assert any(o.op is OptOps.UNROLL for o in hand_opts(Kernel(summed.ast, caps)))
    Kernel(summed.ast, caps).apply(Opt(OptOps.UNROLL, 1, 32))
    with pytest.raises(KernelOptError, match="does not split the symbolic size"):
        Kernel(summed.ast, caps).apply(Opt(OptOps.UNROLL, 1, 3))
    with pytest.raises(KernelOptError, match="does not split the symbolic size"):
        Kernel(summed.ast, caps).apply(Opt(OptOps.UNROLL, 1, 64))


def test_a_dot_product_over_a_symbolic_cache_reads_whole_vectors_on_the_cpu() -> None:
    """A decode step's scores (one query against each cached key): the keys are symbolic, so no output vector forms;
    the rules take a whole hardware vector of the head dim a step (4 lanes of a 16-float vector stayed scalars), and
    at least a cache line of each key (a matrix-vector product's rows: two vectors of 8 floats)."""
    from dataclasses import replace

    from tiny.codegen.opt import Kernel, OptOps
    from tiny.codegen.opt.heuristic import hand_opts

    keys = Tensor(RNG.standard_normal((1, 4, 64, 64)).astype(np.float32), device="CPU").realize()
    q = Tensor(RNG.standard_normal((1, 4, 1, 64)).astype(np.float32), device="CPU").realize()
    pos = Variable("pos", 1, 64)
    (item,) = (q * keys[:, :, : pos.bind(9)]).sum(-1).schedule()
    for width in (8, 16):
        caps = replace(Device["CPU"].renderer.caps, vector_width=width)
        unrolls = [o.arg for o in hand_opts(Kernel(item.ast, caps)) if o.op is OptOps.UNROLL]
        assert unrolls == [max(width, 16)], (width, unrolls)
    for n in (1, 9, 64):
        got = (q * keys[:, :, : pos.bind(n)]).sum(-1).numpy()
        np.testing.assert_allclose(got, (q.numpy() * keys.numpy()[:, :, :n]).sum(-1), rtol=1e-5, atol=1e-5)


def test_a_decode_steps_probabilities_are_computed_once_for_the_head_dim_on_the_cpu() -> None:
    """A decode step's attention (one query a head, 4 query heads a key/value head, over a symbolic cache): the
    softmax's exp of each score is fused into the product with the values, where the head dim does not index it.
    The rules take the whole head dim in one tile, so each is computed once, not once for each tile of 16 along it
    (48 -> 26 us a layer at 96 keys on 2 AVX2 cores); the values those of NumPy."""
    from tiny.codegen.opt import Kernel, OptOps
    from tiny.codegen.opt.heuristic import hand_opts
    from tiny.ir.uop import Ops

    q = Tensor(RNG.standard_normal((1, 8, 1, 64)).astype(np.float32), device="CPU").realize()
    cache = [Tensor(RNG.standard_normal((1, 2, 96, 64)).astype(np.float32), device="CPU").realize() for _ in "kv"]
    pos = Variable("pos", 1, 96)

    def attention(n: int) -> Tensor:
        k, v = (c[:, :, : pos.bind(n)] for c in cache)
        return q.scaled_dot_product_attention(k, v, enable_gqa=True)

    caps = Device["CPU"].renderer.caps
    (values,) = [i for i in attention(40).schedule() if any(u.op is Ops.EXP2 for u in i.ast.toposort)][-1:]
    kernel = Kernel(values.ast, caps)
    head = next(i for i, p in enumerate(kernel.axes) if p.size == 64)
    assert any(o.op is OptOps.UPCAST and o.axis == head and o.arg == 0 for o in hand_opts(kernel))
    for n in (1, 40, 96):
        k, v = (c.numpy()[:, :, :n].repeat(4, axis=1) for c in cache)
        scores = q.numpy() @ k.transpose(0, 1, 3, 2) / 8
        p = np.exp(scores - scores.max(-1, keepdims=True))
        np.testing.assert_allclose(attention(n).numpy(), p / p.sum(-1, keepdims=True) @ v, rtol=1e-4, atol=1e-5)


def test_a_graph_of_fixed_sizes_is_not_walked_for_bound_variables_again(device: str) -> None:
    """Once a Variable was bound anywhere, each schedule looks for sizes over one in its graph. The answer is kept
    on each node: a fixed-size graph asked again (a quantized model's lazy weights, read by every schedule of a
    prompt) is not walked, and one over a bound size is still found and unbound."""
    from tiny.ir.schedule import scheduler

    Variable("seen", 1, 8).bind(3)  # (a bind made: schedules look)
    weight = Tensor(RNG.standard_normal((4, 8)).astype(np.float32), device=device).realize() * 2  # lazy, fixed
    assert scheduler._unbind([weight.uop]) is None
    assert weight.uop.__dict__[scheduler._SIZES] is False  # the answer, kept
    n = Variable("n", 1, 8).bind(5)
    rows = weight[:, :n]
    plain, _, values = scheduler._unbind([rows.uop])
    assert rows.uop.__dict__[scheduler._SIZES] is True and list(values.values()) == [5]
    np.testing.assert_allclose(rows.sum(1).numpy(), weight.numpy()[:, :5].sum(1), rtol=1e-5)


@pytest.mark.parametrize("reduce", ["max", "sum"])
def test_a_reduction_over_a_symbolic_length_takes_rows_side_by_side(device: str, reduce: str) -> None:
    """A reduction read along a symbolic dim (a prompt chunk's softmax over the keys so far), which no action cuts:
    on a CPU the rules take a vector of rows instead (each row's chain of maxima a lane of it, where one scalar chain
    ran after another: 4.5x faster); the values those of NumPy on every device."""
    from tiny.codegen.opt.actions import OptOps
    from tiny.codegen.program import rules_actions
    from tiny.ir.uop import Ops

    xn = np.random.default_rng(3).standard_normal((48, 64)).astype(np.float32)
    n = Variable("n", 1, 64).bind(37)
    out = getattr(Tensor(xn, device=device)[:, :n], reduce)(axis=1)
    renderer = Device[device].renderer
    items = [i.ast for i in out.schedule() if i.ast.op is Ops.SINK]
    assert len(items) == 1
    opts = rules_actions(items[0], renderer).opts
    if not renderer.caps.has_local:
        assert any(o.op is OptOps.UPCAST for o in opts), opts
    np.testing.assert_allclose(out.numpy(), getattr(xn[:, :37], reduce)(axis=1), rtol=1e-5, atol=1e-5)
