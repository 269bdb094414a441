"""Per-kernel profiles: the cost the compiler ships per kernel (ir/cost.py), and
``Session.profile`` / ``model.profile`` on a small model (rows for every kernel, calls equal to
the dispatches, a matmul's FLOPs 2*M*N*K exactly, outputs the same as without profiling), timed
both ways each runtime can.  Cost trees evaluated and validated alike by both runtimes: the
conformance corpus (tests/conformance/cost_trees.json, manifest_problems.json)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import numpy as np
import pytest
from onnx import helper

import relaxweb
from relaxweb.browser import open_runner_page
from relaxweb.ir.cost import program_cost
from relaxweb.ir.symbolic import SizeVar, simplify
from relaxweb.ir.tir import Buffer, FloatImm, IndexValue, Load, Reduce, TensorProgram, exp, maximum, select
from relaxweb.runtime.profile import SUBMITS, TIMESTAMPS, KernelRow, Profile
from relaxweb.runtime.webgpu import TIMESTAMP_QUERY, Session, default_adapter
from tests.helpers import in_the_browser, make_model, onnxruntime_outputs, rand
from tests.ops.test_loop import loop_feeds, loop_model

ROOT = Path(__file__).resolve().parents[2]
K, N = 16, 24


def three_matmuls() -> object:
    """x[m, 16] @ W1 -> relu -> @ W2 -> relu -> @ W3 (W2 and W3 both 24 x 24: one kernel, two calls)."""
    nodes = [("x", "w1", "h1"), ("r1", "w2", "h2"), ("r2", "w3", "y")]
    graph_nodes = []
    for index, (a, b, out) in enumerate(nodes):
        graph_nodes.append(helper.make_node("MatMul", [a, b], [out], name=f"mm{index}"))
        if out != "y":
            graph_nodes.append(helper.make_node("Relu", [out], [f"r{index + 1}"], name=f"relu{index}"))
    weights = {"w1": rand(K, N, seed=1), "w2": rand(N, N, seed=2), "w3": rand(N, N, seed=3)}
    return make_model(graph_nodes, [("x", ["m", K])], ["y"], weights)


@pytest.fixture(scope="module")
def bundle(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("profile") / "bundle"
    # opt level 0: one kernel per op, so a matmul kernel computes exactly the product
    relaxweb.build(three_matmuls(), out, bounds={"m": 64}, opt_level=0)
    return out


def manifest(bundle: Path) -> dict:
    return json.loads((bundle / "manifest.json").read_text())


# The cost the compiler writes -------------------------------------------------------------------


def test_the_cost_of_a_matmul_is_2mnk_and_its_buffers() -> None:
    m, k = SizeVar("m"), SizeVar("k_")
    a, b, out = Buffer("A", (m, K), "float32"), Buffer("B", (K, N), "float32"), Buffer("out", (m, N), "float32")
    i, j = SizeVar("i"), SizeVar("j")
    body = Reduce("sum", k, K, Load(a, (i, k)) * Load(b, (k, j)))
    cost = program_cost(TensorProgram("matmul", (a, b), out, (i, j), body))
    assert cost.flops == simplify(2 * m * N * K)
    assert cost.bytes == simplify(4 * (m * K + K * N + m * N))


def test_a_repeated_subexpression_counts_once_and_a_select_its_dearer_branch() -> None:
    x, out = Buffer("x", (SizeVar("n"),), "float32"), Buffer("out", (SizeVar("n"),), "float32")
    i = SizeVar("i")
    e = exp(Load(x, (i,)))  # 1 op, computed once (the emitter's let)
    body = select(Load(x, (i,)).lt(0.0), e * e, e + FloatImm(1.0))  # compare 1 + max(1 + 1, 1 + 1)
    assert program_cost(TensorProgram("p", (x,), out, (i,), body)).flops == simplify(3 * SizeVar("n"))


def test_a_matmul_counts_its_prologue_once_per_input_element_and_its_epilogue_once_per_output() -> None:
    """``relu(sum_k(relu(x[i, k]) * w[k, j]) + b[j])``: 2 operations a product, the first
    factor's maximum once per element of x (m x K), the bias and ReLU once per output."""
    m = SizeVar("m")
    x, w, b = Buffer("x", (m, K), "float32"), Buffer("w", (K, N), "float32"), Buffer("b", (N,), "float32")
    out = Buffer("out", (m, N), "float32")
    i, j, k = SizeVar("i"), SizeVar("j"), SizeVar("k_")
    product = maximum(Load(x, (i, k)), FloatImm(0.0)) * Load(w, (k, j))
    body = maximum(Reduce("sum", k, K, product) + Load(b, (j,)), FloatImm(0.0))
    cost = program_cost(TensorProgram("mlp", (x, w, b), out, (i, j), body))
    assert cost.flops == simplify(2 * m * N * K + m * K + 2 * m * N)


def test_a_padded_convolution_costs_two_operations_a_product() -> None:
    """Its bounds checks compare index values (free, as addresses are), and its sums over
    channels and the window's rows and columns combine once a step: 2 * C * 3 * 3 a pixel."""
    channels, height, width = 8, SizeVar("h"), SizeVar("w")
    x, w = Buffer("x", (channels, height, width), "float32"), Buffer("w", (channels, 3, 3), "float32")
    out = Buffer("out", (height, width), "float32")
    i, j, c, r, s = (SizeVar(name) for name in ("i", "j", "c", "r", "s"))
    row, column = IndexValue(i + r - 1), IndexValue(j + s - 1)
    inside = select(row.ge(IndexValue(0)), select(row.lt(IndexValue(height)), select(
        column.ge(IndexValue(0)), select(column.lt(IndexValue(width)), Load(x, (c, i + r - 1, j + s - 1)) * Load(w, (c, r, s)),
                                         FloatImm(0.0)), FloatImm(0.0)), FloatImm(0.0)), FloatImm(0.0))
    body = Reduce("sum", c, channels, Reduce("sum", r, 3, Reduce("sum", s, 3, inside)))
    cost = program_cost(TensorProgram("conv", (x, w), out, (i, j), body))
    assert cost.flops == simplify(2 * channels * 9 * height * width)


def test_the_manifest_gives_each_generated_kernel_its_params_and_cost(bundle: Path) -> None:
    kernels = {kernel["name"]: kernel for kernel in manifest(bundle)["kernels"]}
    matmul = kernels["matmul"]
    assert matmul["params"] == ["element_count", "m"]
    assert matmul["cost"] == {"flops": ["mul", "m", 2 * K * N], "bytes": ["add", ["mul", "m", 4 * (K + N)], 4 * K * N]}
    assert all("cost" in kernel for kernel in kernels.values())


# The table --------------------------------------------------------------------------------------


def test_the_table_shows_the_top_kernels_then_the_others() -> None:
    rows = [KernelRow(f"k{i:02d}", 2, 20.0 - i, 0.0, 1000 * i, 100 * i) for i in range(17)]
    rows.append(KernelRow("library", 1, 0.5, 0.0, None, None))
    table = Profile(TIMESTAMPS, 35, rows).table().splitlines()
    assert table[0].startswith("profile: 35 dispatches of 18 kernels") and "method: timestamp queries" in table[0]
    assert table[1].split() == ["kernel", "calls", "total", "ms", "%", "GFLOP/s", "GB/s"]
    assert [line.split()[0] for line in table[2:17]] == [f"k{i:02d}" for i in range(15)]
    others = table[17].split()
    assert others[:5] == ["others", "(3", "kernels)", "5", f"{5.0 + 4.0 + 0.5:.3f}"]
    assert others[-2:] == ["-", "-"]  # the library kernel has no cost: none for the sum either
    assert table[2].split()[-2:] == ["0.000", "0.000"] and table[3].split()[-2:] == [f"{1000 / 19e6:.3f}", f"{100 / 19e6:.3f}"]


# On the GPU -------------------------------------------------------------------------------------


def check_profile(profile: Profile, bundle: Path, dispatches: int, m: int, method: str) -> None:
    plain = manifest(bundle)
    assert profile.method == method
    assert profile.dispatches == dispatches == sum(row.calls for row in profile.rows)
    assert sorted(row.kernel for row in profile.rows) == sorted(kernel["name"] for kernel in plain["kernels"])
    rows = {row.kernel: row for row in profile.rows}
    assert rows["matmul"].calls == 1 and rows["matmul"].flops == 2 * m * N * K
    assert rows["matmul"].bytes == 4 * (m * K + K * N + m * N)
    assert rows["matmul1"].calls == 2 and rows["matmul1"].flops == 2 * (2 * m * N * N)
    assert [row.ms for row in profile.rows] == sorted((row.ms for row in profile.rows), reverse=True)
    assert all(row.ms >= 0 for row in profile.rows) and profile.total_ms > 0
    assert abs(sum(row.percent for row in profile.rows) - 100) < 1e-6


@pytest.mark.gpu
@pytest.mark.parametrize("profiling", [True, False], ids=["timestamps", "submits"])
def test_session_profile_gives_every_kernel_its_calls_time_and_flops(bundle: Path, profiling: bool) -> None:
    session = relaxweb.load(bundle, profiling=profiling)
    # lavapipe offers timestamp queries: requested only when profiling
    assert (TIMESTAMP_QUERY in session.device.features) == (profiling and TIMESTAMP_QUERY in default_adapter().features)
    x = rand(5, K)
    expected = session.run({"x": x})
    dispatches = session.last_dispatch_count
    profile = session.profile({"x": x})
    assert session.last_dispatch_count == dispatches
    check_profile(profile, bundle, dispatches, 5, TIMESTAMPS if TIMESTAMP_QUERY in session.device.features else SUBMITS)
    np.testing.assert_array_equal(profile.outputs["y"], expected["y"])
    np.testing.assert_allclose(expected["y"], onnxruntime_outputs(three_matmuls(), {"x": x})[0], rtol=1e-4, atol=1e-5)
    assert "matmul1" in profile.table()


@pytest.mark.gpu
@pytest.mark.parametrize("profiling", [True, False], ids=["timestamps", "submits"])
def test_a_loop_with_values_read_back_is_profiled_step_by_step(tmp_path: Path, profiling: bool) -> None:
    """Several steps (two values read back, one submit per iteration), a call site dispatched at
    each iteration with its params rewritten, and library kernels (no cost: "-")."""
    relaxweb.build(loop_model(), tmp_path)
    session = relaxweb.load(tmp_path, profiling=profiling)
    feeds = loop_feeds(5)
    expected = session.run(feeds)
    dispatches = session.last_dispatch_count
    profile = session.profile(feeds)
    assert profile.dispatches == dispatches == sum(row.calls for row in profile.rows) > 5
    for name, want in expected.items():
        np.testing.assert_array_equal(profile.outputs[name], want)
    kernels = {kernel["name"]: kernel for kernel in manifest(tmp_path)["kernels"]}
    library = [row for row in profile.rows if "cost" not in kernels[row.kernel]]
    assert library and all(row.flops is None and row.gflops_per_s is None for row in library)
    assert any(row.calls == 5 and row.flops is not None for row in profile.rows)  # the body, once per iteration


@pytest.mark.gpu
def test_sessions_that_do_not_profile_never_get_timestamp_queries(bundle: Path) -> None:
    assert TIMESTAMP_QUERY not in relaxweb.load(bundle).device.features
    assert TIMESTAMP_QUERY not in Session(bundle).device.features


@pytest.mark.slow
def test_the_command_line_prints_the_table(bundle: Path, tmp_path: Path) -> None:
    np.savez(tmp_path / "in.npz", x=rand(3, K))
    result = subprocess.run(["python3", "-m", "relaxweb.cli", "run", str(bundle), "--inputs", str(tmp_path / "in.npz"),
                             "--profile"], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[1].startswith("profile: 5 dispatches of 3 kernels") and "method: " in lines[1]
    assert {line.split()[0] for line in lines[3:6]} == {"matmul", "matmul1", "relu"}


# In the browser ---------------------------------------------------------------------------------

PROFILE_IN_PAGE = """\
async ({ x, profile }) => {
  const model = await window.relaxweb.load("/bundle/", { profile });
  const inputs = { x: { data: new Float32Array(x), shape: [x.length / 16, 16] } };
  const plain = await model.run(inputs);
  const dispatches = model.lastDispatchCount;
  const profiled = await model.profile(inputs);
  const adapter = await navigator.gpu.requestAdapter();
  return { plain: Array.from(plain.y.data), profiled: Array.from(profiled.outputs.y.data), dispatches,
           features: [...model.device.features], adapterFeatures: [...adapter.features], profile: profiled.profile };
}
"""


@in_the_browser
@pytest.mark.parametrize("profiling", [True, False], ids=["timestamps", "submits"])
def test_model_profile_in_the_browser(bundle: Path, profiling: bool) -> None:
    x = rand(4, K)
    with open_runner_page(bundle) as page:
        result = page.evaluate(PROFILE_IN_PAGE, {"x": x.reshape(-1).tolist(), "profile": profiling})
    # SwiftShader offers timestamp queries (with --enable-unsafe-webgpu): requested only when profiling
    timestamps = "timestamp-query" in result["features"]
    assert timestamps == (profiling and "timestamp-query" in result["adapterFeatures"])
    rows = result["profile"]["rows"]
    profile = Profile(result["profile"]["method"], result["profile"]["dispatches"],
                      [KernelRow(r["kernel"], r["calls"], r["totalMs"], r["percent"], r["flops"], r["bytes"]) for r in rows])
    check_profile(profile, bundle, result["dispatches"], 4, TIMESTAMPS if timestamps else SUBMITS)
    assert result["profiled"] == result["plain"]
    np.testing.assert_allclose(np.array(result["plain"], np.float32).reshape(4, N),
                               onnxruntime_outputs(three_matmuls(), {"x": x})[0], rtol=1e-4, atol=1e-5)


@in_the_browser
def test_profile_in_browser_gives_the_table_of_the_python_runtime(bundle: Path) -> None:
    x = rand(3, K)
    profile = relaxweb.profile_in_browser(bundle, {"x": x})
    check_profile(profile, bundle, 5, 3, profile.method)
    np.testing.assert_array_equal(profile.outputs["y"], relaxweb.run_in_browser(bundle, {"x": x})["y"])
