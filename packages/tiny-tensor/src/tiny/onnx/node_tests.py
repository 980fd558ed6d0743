"""ONNX's own backend node tests (onnx.backend.test) run through tiny.onnx, and a report per op.

The onnx wheel ships the tests' generators (`onnx.backend.test.case.node`), which build each test's model and its
inputs and expected outputs in memory, the same data its `data/node/*/model.onnx` files hold where those are shipped.

    python -m tiny.onnx.node_tests [--op Relu] [--device CPU] [-v]

prints passed / failed / skipped per op and in total; -v adds each failure's message.
"""

from __future__ import annotations

import argparse
import sys
import time
import warnings
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx
from onnx import numpy_helper
from onnx.backend.test.case import node as node_cases

from tiny.onnx import load
from tiny.onnx.model import DEFAULT_DOMAINS, MAX_OPSET, ONNX_DTYPES, OPS


@dataclass(frozen=True)
class NodeTest:
    name: str
    op: str  # the op the test is named for: its model's last node (the first for a function's expansion)
    model: onnx.ModelProto
    inputs: list[np.ndarray]
    outputs: list[np.ndarray]
    rtol: float
    atol: float


def node_tests() -> list[NodeTest]:
    """Every node test onnx ships, with its first data set, sorted by name. A test of a function's expansion
    (`..._expanded`) counts for its op as `Op (expanded)`."""
    with warnings.catch_warnings():  # (the generators' NumPy warnings: divisions by zero they mean)
        warnings.simplefilter("ignore")
        cases = [case for case in node_cases.collect_testcases(None) if case.data_sets]
    op_of = {case.name: case.model.graph.node[-1].op_type for case in cases if "_expanded" not in case.name}
    tests = []
    for case in cases:
        if "_expanded" in case.name:
            base = case.name[: case.name.index("_expanded")]
            op = f"{op_of.get(base, base)} (expanded)"
        else:
            op = op_of[case.name]
        inputs, outputs = ([_array(a) for a in arrays] for arrays in case.data_sets[0])
        tests.append(NodeTest(case.name, op, case.model, inputs, outputs, case.rtol, case.atol))
    return sorted(tests, key=lambda t: t.name)


def _array(a: Any) -> Any:
    """A test's input or output as a NumPy array where it is a tensor (a NumPy scalar, a TensorProto)."""
    if isinstance(a, np.generic):
        return np.asarray(a)
    if isinstance(a, onnx.TensorProto):
        return numpy_helper.to_array(a)
    return a


_NUMPY_NAMES = {dt.name for dt in ONNX_DTYPES.values()}  # NumPy's names for them (bfloat16: ml_dtypes')


def skip_reason(test: NodeTest) -> str | None:
    """Why tiny cannot run this test (an op it lacks, a type it has no dtype for), or None."""
    graph = test.model.graph
    for imp in test.model.opset_import:
        if imp.domain in DEFAULT_DOMAINS and imp.version > MAX_OPSET:
            return f"opset {imp.version} is newer than tiny.onnx's {MAX_OPSET}"
    for node in graph.node:
        if node.domain not in DEFAULT_DOMAINS:
            return f"operator domain {node.domain!r} not implemented"
        if node.op_type not in OPS:
            return f"op {node.op_type} not implemented"
    for vi in [*graph.input, *graph.output]:
        kind = vi.type.WhichOneof("value")
        if kind != "tensor_type":
            return f"{kind} values (tiny.onnx takes tensors)"
        code = vi.type.tensor_type.elem_type
        if code not in ONNX_DTYPES:
            return f"dtype {onnx.TensorProto.DataType.Name(code)} tiny lacks"
    for arr in [*test.inputs, *test.outputs]:
        if not isinstance(arr, np.ndarray) or arr.dtype.name not in _NUMPY_NAMES:
            return f"{type(arr).__name__} of dtype {getattr(arr, 'dtype', '?')} not convertible to a tiny tensor"
    return None


# the 2-byte floats are compared within about two units in their last place (the tests' rtol of 1e-3 is one unit of
# float16 and an eighth of one of bfloat16: a sum in another order misses it)
HALF_RTOL = {"float16": 2e-3, "bfloat16": 1.6e-2}


def run_node_test(test: NodeTest, device: str | None = None, as_constants: bool = False) -> None:
    """Run one test through tiny.onnx; AssertionError where an output differs (value, shape or dtype).
    as_constants: the inputs become Constant nodes, so ops with a host form (shape computations) run on the host."""
    proto = test.model
    if as_constants:
        proto = onnx.ModelProto()
        proto.CopyFrom(test.model)
        names = [vi.name for vi in proto.graph.input]
        del proto.graph.input[:]
        constants = [
            onnx.helper.make_node("Constant", [], [n], value=numpy_helper.from_array(a, n))
            for n, a in zip(names, test.inputs)
        ]
        nodes = [*constants, *proto.graph.node]
        del proto.graph.node[:]
        proto.graph.node.extend(nodes)
    model = load(proto, device=device)
    feed = dict(zip(model.input_names, test.inputs))
    results = model(feed)
    for name, want in zip(model.output_names, test.outputs):
        got = results[name].numpy()
        if want.dtype.name == "bfloat16":  # (tiny reads bfloat16 back as float32)
            if results[name].dtype.name != "bfloat16":
                raise AssertionError(f"output {name!r}: dtype {results[name].dtype.name}, expected bfloat16")
            want = want.astype(np.float32)
        elif got.dtype != want.dtype:
            raise AssertionError(f"output {name!r}: dtype {got.dtype}, expected {want.dtype}")
        rtol = max(test.rtol, HALF_RTOL.get(results[name].dtype.name, 0.0))
        np.testing.assert_allclose(got, want, rtol=rtol, atol=test.atol, err_msg=f"output {name!r}")


def results(tests: list[NodeTest], device: str | None = None) -> Iterator[tuple[NodeTest, str, str]]:
    """(test, 'passed' | 'failed' | 'skipped', message) for each test."""
    for test in tests:
        reason = skip_reason(test)
        if reason is not None:
            yield test, "skipped", reason
            continue
        try:
            run_node_test(test, device)
        except Exception as e:  # noqa: BLE001  (a report: every way a test fails is counted as failed)
            yield test, "failed", f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:300]
        else:
            yield test, "passed", ""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tiny.onnx.node_tests", description=__doc__.splitlines()[0])
    parser.add_argument("--op", action="append", help="only the tests of this op type (repeatable)")
    parser.add_argument("--device", help="the device to run on (default: the default device)")
    parser.add_argument("-v", "--verbose", action="store_true", help="print each failure and skip reason")
    args = parser.parse_args(argv)
    tests = [t for t in node_tests() if not args.op or t.op in args.op]
    per_op: dict[str, dict[str, int]] = defaultdict(lambda: {"passed": 0, "failed": 0, "skipped": 0})
    reasons: dict[str, Any] = defaultdict(int)
    start = time.perf_counter()
    for test, outcome, message in results(tests, args.device):
        per_op[test.op][outcome] += 1
        if outcome == "skipped":
            reasons[message.split(" (")[0]] += 1
        if args.verbose and outcome != "passed":
            print(f"{outcome:7} {test.name}: {message}", flush=True)
    print(f"{'op':32} {'passed':>6} {'failed':>6} {'skipped':>7}")
    totals = {"passed": 0, "failed": 0, "skipped": 0}
    for op in sorted(per_op):
        row = per_op[op]
        print(f"{op:32} {row['passed']:6} {row['failed']:6} {row['skipped']:7}")
        for k in totals:
            totals[k] += row[k]
    print(f"{'total':32} {totals['passed']:6} {totals['failed']:6} {totals['skipped']:7}")
    ran = totals["passed"] + totals["failed"]
    if ran:
        print(
            f"passed {totals['passed']} of the {ran} tests whose ops and dtypes tiny supports "
            f"({100 * totals['passed'] / ran:.1f}%) in {time.perf_counter() - start:.0f} s"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
