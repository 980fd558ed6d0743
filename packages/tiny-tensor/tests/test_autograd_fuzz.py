"""Random autograd graphs against PyTorch (CPU): every sink's value and every leaf's gradient.

Each graph is 3 to 10 ops drawn from the whole op table (elementwise, reductions and scans, movement, matmul and
attention, convolutions and pooling, indexing and gather, norms, losses, casts, `.realize()`), on values used
several times: tied weights, residual connections, one tensor feeding two convolutions, a value read before and
after it was realized. Shapes are random and small; dtypes float32 and float64, mixed by casts. The seeds are
fixed: 40 graphs by default, `pytest --autograd-fuzz=N` runs N (and from another first seed with
--autograd-fuzz-seed). A failing graph prints its seed and a script that rebuilds it, shrunk to the ops that still
fail. The generator is in autograd_fuzz.py.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
from autograd_fuzz import (
    TOLERANCE,
    UNARY,
    Leaf,
    Program,
    Step,
    chains_a_conv_weight,
    check_seed,
    draw,
    fails,
    generate,
    limited,
    mismatches,
    run,
    shrink,
)

from tiny.tensor import Tensor, dtypes

torch = pytest.importorskip("torch")

# graphs drawn with shared_conv_weight whose convolutions share a weight (test_shared_seeds_share_a_weight)
SHARED_CONV_SEEDS = (56, 132, 154)


# seeds whose graphs show a bug that is still open: strict xfails, each with the test that reproduces it
KNOWN_BAD_SEEDS: dict[int, str] = {}


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "fuzz_seed" in metafunc.fixturenames:
        first = metafunc.config.getoption("--autograd-fuzz-seed")
        count = metafunc.config.getoption("--autograd-fuzz")
        xfail = {s: pytest.mark.xfail(strict=True, reason=why) for s, why in KNOWN_BAD_SEEDS.items()}
        seeds = range(first, first + count)
        metafunc.parametrize("fuzz_seed", [pytest.param(s, marks=xfail.get(s, ())) for s in seeds])


def test_random_graph(fuzz_seed: int) -> None:
    report = check_seed(fuzz_seed)
    assert report is None, report


# ---------------------------------------------------------------- the harness can fail


def _program(*steps: tuple[str, tuple[str, ...], str, str, tuple[int, ...]], leaves: dict[str, tuple]) -> Program:
    """A hand-written graph: leaves by name and shape, steps as (out, inputs, tiny code, torch code, shape)."""
    return Program(
        7,
        tuple(Leaf(name, shape, "float32") for name, shape in leaves.items()),
        tuple(Step(out, out, ins, (tiny, theirs), shape, "float32") for out, ins, tiny, theirs, shape in steps),
    )


def test_a_wrong_rule_is_found_and_shrunk() -> None:
    """A step computed differently in tiny (a stand-in for a wrong rule) is reported and is the one step kept."""
    program = _program(
        ("v2", ("v0", "v1"), "({0} @ {1})", "({0} @ {1})", (3, 4)),
        ("v3", ("v2",), "{0}.tanh()", "{0}.tanh()", (3, 4)),
        ("v4", ("v3",), "({0} * 1.01)", "({0} * 1.0)", (3, 4)),
        ("v5", ("v4", "v2"), "({0} + {1}).sum(1)", "({0} + {1}).sum(1)", (3,)),
        leaves={"v0": (3, 5), "v1": (5, 4)},
    )
    assert any(line.startswith("gradient of v0") for line in mismatches(program))
    small = shrink(program)
    assert [s.out for s in small.steps] == ["v2", "v4"]  # the tanh bypassed, the sum dropped
    assert fails(small)
    assert "x4 = (x2 * 1.01)" in small.source()


def test_matching_programs_pass() -> None:
    program = _program(
        (
            "v1",
            ("v0",),
            "{0}.conv2d({0}[:, :, :2, :2].permute(1, 0, 2, 3))",
            "F.conv2d({0}, {0}[:, :, :2, :2].permute(1, 0, 2, 3))",
            (2, 2, 4, 4),
        ),
        leaves={"v0": (2, 2, 5, 5)},
    )
    assert mismatches(program) == []


def test_float32_tolerance_is_tight_enough() -> None:
    """A relative error of 1% in one gradient is far outside float32's tolerance."""
    assert TOLERANCE["float32"][0] < 1e-2 / 4 and TOLERANCE["float64"][0] < 1e-6


def test_default_graphs_never_chain_a_conv_weight() -> None:
    """Issue 24.1's shape (a convolution's input computed through a convolution with the same weight) is left out."""
    for seed in range(300):
        program = generate(seed)
        assert not chains_a_conv_weight(program.steps), f"seed {seed}:\n{program.source()}"


# ---------------------------------------------------------------- known bugs, found by the fuzz


def test_shared_seeds_chain_a_conv_weight() -> None:
    for seed in SHARED_CONV_SEEDS:
        assert chains_a_conv_weight(draw(seed, shared_conv_weight=True)[0].steps), f"seed {seed}"


@pytest.mark.parametrize("seed", SHARED_CONV_SEEDS)
def test_random_graph_sharing_a_conv_weight(seed: int) -> None:
    report = check_seed(seed, shared_conv_weight=True)
    assert report is None, report


def test_conv_weight_used_twice() -> None:
    """x.conv2d(w).conv2d(w): the weight's gradient counted the inner path twice."""
    program = _program(
        ("v2", ("v0", "v1"), "{0}.conv2d({1})", "F.conv2d({0}, {1})", (1, 2, 4, 4)),
        ("v3", ("v2", "v1"), "{0}.conv2d({1})", "F.conv2d({0}, {1})", (1, 2, 2, 2)),
        leaves={"v0": (1, 2, 6, 6), "v1": (2, 2, 3, 3)},
    )
    assert mismatches(program) == []


@pytest.mark.parametrize("op", ["atan", "elu", "erf", "gelu", "mish", "selu", "tanh"])
def test_float64_gradient_is_float64_accurate(op: str) -> None:
    """These gradients were off from PyTorch's by 2e-8 to 2e-7 relative in float64 (series and polynomials made for
    float32, used for float64 too), and the fuzz held a float64 graph with one of them to a looser tolerance."""
    a = np.random.default_rng(0).uniform(-2, 2, (256,))
    ours, theirs = Tensor(a, dtype=dtypes.float64, requires_grad=True), torch.tensor(a, requires_grad=True)
    tiny_code, torch_code = UNARY[op]
    eval(tiny_code.format("ours")).sum().backward()  # noqa: S307
    eval(torch_code.format("theirs"), {"F": torch.nn.functional, "theirs": theirs}).sum().backward()  # noqa: S307
    np.testing.assert_allclose(ours.grad.numpy(), theirs.grad.numpy(), rtol=1e-10, atol=1e-12)


def test_float64_adaptive_avg_pool_over_uneven_windows_is_float64_accurate() -> None:
    """Found by the fuzz (seed 127, shrunk): (1, 3, 7, 6) -> adaptive_avg_pool2d((4, 6)) in float64 is off by 2e-8
    (windows of 2 and 3 rows: _apply_matrix built its 1/3 in float32, then cast it)."""
    a = np.random.default_rng([127, 0]).uniform(-1, 1, (1, 3, 7, 6))
    ours = Tensor(a, dtype=dtypes.float64).adaptive_avg_pool2d((4, 6)).numpy()
    np.testing.assert_allclose(ours, torch.nn.functional.adaptive_avg_pool2d(torch.tensor(a), (4, 6)), rtol=1e-12)


@pytest.mark.parametrize("fn", ["std", "std_mean"])
def test_std_of_equal_values_has_a_zero_gradient(fn: str) -> None:
    """Found by the fuzz (seeds 1028 and 1342): std over values that are all equal (a gather of one column, a
    softmax over one element) had a nan gradient (sqrt's 1 / (2 * 0) times the variance's 0), PyTorch's is 0."""
    a = np.array([[0.3, 0.3, 0.3, 0.3], [0.5, -0.1, 0.2, 0.9]])
    w = np.array([0.7, -1.3])
    ours, theirs = (
        Tensor(a, dtype=dtypes.float32, requires_grad=True),
        torch.tensor(a, dtype=torch.float32, requires_grad=True),
    )
    (getattr(ours, fn)(1)[0] if fn == "std_mean" else ours.std(1)).mul(Tensor(w, dtype=dtypes.float32)).sum().backward()
    (getattr(torch, fn)(theirs, 1)[0] if fn == "std_mean" else theirs.std(1)).mul(
        torch.tensor(w, dtype=torch.float32)
    ).sum().backward()
    np.testing.assert_allclose(ours.grad.numpy(), theirs.grad.numpy(), rtol=1e-5, atol=1e-6)
    assert np.isnan(Tensor([float("nan"), 1.0]).std().item())  # (a nan's standard deviation stays nan)


def test_adaptive_pool_gradient_through_a_clang_slp_miscompile() -> None:
    """Found by the fuzz (seed 1438): adaptive_avg_pool2d (1, 3, 5, 3) -> (4, 3) had 4 of 30 gradient values wrong.
    Its gradient kernel (a 2 x 3 x 5 product summed over 4, all written out as vectors) was right C that clang 19's SLP
    vectorizer miscompiled for AVX-512 at -O2; the CPU compiles with -fno-slp-vectorize under clang now."""
    rng = np.random.default_rng([1438, 0])
    a, w = rng.uniform(-1, 1, (1, 3, 5, 3)), rng.uniform(-1, 1, (1, 3, 4, 3))
    ours = Tensor(a, dtype=dtypes.float32, requires_grad=True)
    (ours.adaptive_avg_pool2d((4, 3)) * Tensor(w, dtype=dtypes.float32)).sum().backward()
    theirs = torch.tensor(a, dtype=torch.float32, requires_grad=True)
    (torch.nn.functional.adaptive_avg_pool2d(theirs, (4, 3)) * torch.tensor(w, dtype=torch.float32)).sum().backward()
    np.testing.assert_allclose(ours.grad.numpy(), theirs.grad.numpy(), rtol=1e-5, atol=1e-6)


# ---------------------------------------------------------------- wrong gradients the fuzz found (fixed)
# A max's gradient goes to the elements equal to the max: its input, computed again in the backward's kernel, must
# round as it did in the max's kernel. The CPU compiled with -ffp-contract=fast, and clang fused a product into the
# sum after it (one rounding) in one kernel and not in the other, as the kernel around it made it: in a log_softmax,
# x - max - log(sum) * ln2. Now the CPU rounds after each op everywhere; only a reduction's accumulator fuses.


def max_of_log_softmax_gradients(seed: int, conv: bool) -> list[tuple[np.ndarray, np.ndarray]]:
    """x.log_softmax(1).max(2) (x (1, 3, 4, 4)), or with conv x (1, 1, 4, 4).conv2d(w (3, 1, 1, 1)) in place of x:
    the leaves' gradients, ours and PyTorch's."""
    rng = np.random.default_rng(seed)
    leaves = (
        [rng.uniform(-1, 1, (1, 1, 4, 4)), rng.uniform(-1, 1, (3, 1, 1, 1))]
        if conv
        else [rng.uniform(-1, 1, (1, 3, 4, 4))]
    )
    ours = [Tensor(a, dtype=dtypes.float32, requires_grad=True) for a in leaves]
    (ours[0].conv2d(ours[1]) if conv else ours[0]).log_softmax(1).max(2).sum().backward()
    theirs = [torch.tensor(a, dtype=torch.float32, requires_grad=True) for a in leaves]
    (torch.nn.functional.conv2d(*theirs) if conv else theirs[0]).log_softmax(1).amax(2).sum().backward()
    return [(a.grad.numpy(), b.grad.numpy()) for a, b in zip(ours, theirs)]


@pytest.mark.parametrize("seed", [2, 8, 10, 11])
def test_max_over_a_log_softmax_of_a_convolution_gradient(seed: int) -> None:
    """Found by the fuzz (seed 37, shrunk by hand): x (1, 1, 4, 4).conv2d(w (3, 1, 1, 1)).log_softmax(1).max(2),
    backward: with data seed 8, x's and w's gradients were off by 0.18 and 1.4 (no near ties)."""
    for got, want in max_of_log_softmax_gradients(seed, conv=True):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_max_over_a_log_softmax_gradient() -> None:
    """The same without the convolution: with data seed 10 two maxima took no gradient (off by 1.0)."""
    ((got, want),) = max_of_log_softmax_gradients(10, conv=False)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


# ---------------------------------------------------------------- scheduler hangs the fuzz found (fixed)
# The scheduler's lift_reshapes rule moved a reshape off a reduction onto a sibling source that held a reduction in
# the op's own shape (reductions over size-1 axes make such shapes), and lifted it back from there, for ever.


def test_sum_over_the_one_column_of_a_matmul_finishes() -> None:
    """Found by the fuzz (attention over one key: its softmax sums one value). m = x (3, 2) @ w (2, 1), then
    m + m.sum(-1, keepdim=True): create_schedule's rewrites (at lift_reshapes) ran on without end."""
    a, b = np.arange(6.0).reshape(3, 2), np.array([[2.0], [1.0]])
    m = Tensor(a, dtype=dtypes.float32) @ Tensor(b, dtype=dtypes.float32)
    out = limited(lambda: (m + m.sum(-1, keepdim=True)).numpy(), seconds=30)
    np.testing.assert_allclose(out, 2 * (a @ b))


def test_log_softmax_over_a_size_one_axis_of_a_mean_finishes() -> None:
    """Found by the fuzz (seed 1007, shrunk): x (1, 1, 3) -> mean(2) (1, 1) -> log_softmax(1) -> nll_loss, backward."""
    program = Program(
        1007,
        (Leaf("v0", (1, 1, 3), "float64"),),
        (
            Step("v2", "mean", ("v0",), ("{0}.mean(2)", "{0}.mean(2)"), (1, 1), "float64"),
            Step(
                "v3",
                "nll_loss",
                ("v2",),
                (
                    "{0}.log_softmax(1).nll_loss(Tensor([0]), reduction='none')",
                    "F.nll_loss({0}.log_softmax(1), torch.tensor([0]), reduction='none')",
                ),
                (1,),
                "float64",
            ),
        ),
    )
    limited(lambda: run(program, "tiny"), seconds=30)
    assert mismatches(program) == []


def test_chained_one_channel_conv1d_finishes() -> None:
    """Found by the fuzz with 1-channel convolutions allowed (seed 27, shrunk): x.conv1d(w).conv1d(w2), both with
    one output channel, and the inner one read again; forward and backward against PyTorch."""
    rng = np.random.default_rng(27)
    x, w, w2 = rng.uniform(-1, 1, (2, 1, 5)), rng.uniform(-1, 1, (1, 1, 1)), rng.uniform(-1, 1, (1, 1, 3))
    weights = rng.uniform(-1, 1, (2, 1, 1)), rng.uniform(-1, 1, (2, 1, 3))

    def grads(conv1d: Callable, leaf: Callable) -> list[np.ndarray]:
        xs = [leaf(a) for a in (x, w, w2)]
        inner = conv1d(xs[0], xs[1], stride=2, dilation=2)
        outer = conv1d(inner, xs[2], stride=2, padding=1, dilation=2)
        read_again = inner / (xs[2].square() + 0.5)
        ((outer * leaf(weights[0], False)).sum() + (read_again * leaf(weights[1], False)).sum()).backward()
        return [outer.detach().numpy(), *(t.grad.numpy() for t in xs)]

    ours = limited(lambda: grads(Tensor.conv1d, lambda a, g=True: Tensor(a, dtype=dtypes.float32, requires_grad=g)), 30)
    theirs = grads(torch.nn.functional.conv1d, lambda a, g=True: torch.tensor(a, dtype=torch.float32, requires_grad=g))
    for got, want in zip(ours, theirs):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


# each: (leaf shapes, f(*leaves)) with f written in the methods tiny and PyTorch share
SIZE_ONE_AXES: dict[str, tuple[tuple[tuple[int, ...], ...], Callable]] = {
    "one column plus its row sums": (((3, 2), (2, 1)), lambda x, w: (x @ w) + (x @ w).sum(-1, keepdim=True)),
    "one row plus its column sums": (((1, 2), (2, 3)), lambda x, w: (x @ w) * (x @ w).sum(0, keepdim=True)),
    "matvec seen as a column": (
        ((3, 2), (2,)),
        lambda x, v: (x @ v).reshape(3, 1) - (x @ v).reshape(3, 1).mean(1, True),
    ),
    "softmax over one column": (((4, 3), (3, 1)), lambda x, w: (x @ w).softmax(-1) + (x @ w).log_softmax(1)),
    "sum over a size-1 axis of a sum": (((2, 1, 3),), lambda x: x.sum(2).sum(1, keepdim=True).reshape(2, 1, 1) * x),
    "mean, then a size-1 reduction broadcast back": (
        ((2, 3, 1),),
        lambda x: (x.mean(1) + x.mean(1).sum(-1, keepdim=True)).reshape(2, 1, 1).expand(2, 3, 1) * x,
    ),
    "attention over one key": (
        ((1, 1, 3, 2), (1, 1, 1, 2), (1, 1, 1, 1)),
        lambda q, k, v: (q @ k.transpose(-1, -2)).softmax(-1) @ v,
    ),
}


@pytest.mark.parametrize("case", sorted(SIZE_ONE_AXES))
def test_size_one_axes_schedule_and_match_torch(case: str) -> None:
    """Graphs whose reductions run over (or leave) size-1 axes, then reshape or broadcast: each schedules within the
    time limit, and its value and gradients match PyTorch's."""
    shapes, f = SIZE_ONE_AXES[case]
    arrays = [np.random.default_rng(len(case)).uniform(-1, 1, s) for s in shapes]

    def values(leaf: Callable) -> list[np.ndarray]:
        leaves = [leaf(a) for a in arrays]
        out = f(*leaves)
        (out * out).sum().backward()
        return [out.detach().numpy(), *(t.grad.numpy() for t in leaves)]

    ours = limited(lambda: values(lambda a: Tensor(a, dtype=dtypes.float32, requires_grad=True)), seconds=30)
    theirs = values(lambda a: torch.tensor(a, dtype=torch.float32, requires_grad=True))
    for got, want in zip(ours, theirs):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
