"""ONNX Loop and Scan (``frontend/converters/control_flow.py``), the IR ``Loop`` and its
host loop (``HostLoop``: one stage per iteration, ``relaxweb/ops/loop.py`` and
``relaxweb/library/loop.py`` write the carried and stacked storages).

- ONNX's node cases for Loop and Scan that use only tensors pass on wgpu; those with
  sequence or optional types are one clear unsupported-op error; each compiled check runs on
  wgpu and on kernels.wasm (the ``backend`` fixture).
- A Scan whose length is symbolic (a simple RNN over the scan axis, reading its weights from
  the outer scope; every direction and axis attribute) is built once and matches
  onnxruntime at three lengths, in the interpreter, the host function, on wgpu and in
  Chromium.
- A Loop whose trip count and condition are graph inputs (read back from the GPU) matches
  onnxruntime at several trip counts, 0 included; its body gathers the input's row at the
  iteration.  A Loop over an input's rows (the trip count a shape value) reads nothing back.
- The IR text prints and parses a loop back, before and after memory planning.
- What is not supported (a condition computed by the body, no trip count, a carried value
  whose shape changes, a loop inside an If branch or another loop) is one clear error.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import relaxweb
from relaxweb.compiler import compile_module, import_model
from relaxweb.errors import InputShapeError, RelaxwebError
from relaxweb.ir.host import HostDispatch, HostLoop, HostRead, walk_steps
from relaxweb.ir.interpreter import run_host_function, run_module
from relaxweb.ir.parser import parse_module
from relaxweb.ir.printer import format_module, module_constants
from relaxweb.ir.structural import structural_equal
from relaxweb.ir.well_formed import check_well_formed
from relaxweb.passes import legalize_ops, plan_memory
from tests.helpers import F32_LOOSE, ONNX_CASE, assert_close, build_once, in_the_browser, load_bundle, make_model, onnx_node_cases, onnxruntime_outputs, rand

HIDDEN, FEATURES = 3, 2
LENGTHS = (4, 1, 7)  # one build, three scan lengths (1: a single iteration)




# Scan ------------------------------------------------------------------------------------------------


def scan_model(*, input_axis: int = 0, input_reverse: int = 0, output_axis: int = 0,
               output_reverse: int = 0) -> onnx.ModelProto:
    """A simple RNN written as a Scan over a symbolic length ``T``: ``h = tanh(x W + h U)``,
    the weights read from the outer scope; outputs the last ``h`` and every step's ``h`` and
    ``x + 1`` (a second scan output, so the axes and directions of two outputs are checked)."""
    body = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W"], ["xw"]),
         helper.make_node("MatMul", ["h", "U"], ["hu"]),
         helper.make_node("Add", ["xw", "hu"], ["pre"]),
         helper.make_node("Tanh", ["pre"], ["h_next"]),
         helper.make_node("Identity", ["h_next"], ["h_step"]),
         helper.make_node("Add", ["x", "one"], ["x_plus_one"])],
        "rnn_step",
        [helper.make_tensor_value_info("h", TensorProto.FLOAT, [HIDDEN]),
         helper.make_tensor_value_info("x", TensorProto.FLOAT, [FEATURES])],
        [helper.make_tensor_value_info("h_next", TensorProto.FLOAT, [HIDDEN]),
         helper.make_tensor_value_info("h_step", TensorProto.FLOAT, [HIDDEN]),
         helper.make_tensor_value_info("x_plus_one", TensorProto.FLOAT, [FEATURES])])
    node = helper.make_node(
        "Scan", ["h0", "xs"], ["h_last", "hs", "xs_plus_one"], name="rnn_scan", body=body, num_scan_inputs=1,
        scan_input_axes=[input_axis], scan_input_directions=[input_reverse],
        scan_output_axes=[output_axis, output_axis], scan_output_directions=[output_reverse, 0])
    xs_dims = [FEATURES, "T"] if input_axis else ["T", FEATURES]
    weights = {"W": rand(FEATURES, HIDDEN, seed=1), "U": rand(HIDDEN, HIDDEN, seed=2) * 0.5,
               "one": np.ones(FEATURES, np.float32)}
    return make_model([node], [("h0", [HIDDEN]), ("xs", xs_dims)], ["h_last", "hs", "xs_plus_one"], weights, opset=16)


SCAN_CONFIGS = {
    "forward": {},
    "reverse-input": {"input_reverse": 1},
    "input-axis-1": {"input_axis": 1},
    "output-axis-1": {"output_axis": 1},
    "reverse-output": {"output_reverse": 1},
    "everything": {"input_axis": 1, "input_reverse": 1, "output_axis": 1, "output_reverse": 1},
}


def scan_feeds(model: onnx.ModelProto, length: int) -> dict[str, np.ndarray]:
    input_axis = model.graph.input[1].type.tensor_type.shape.dim[0].dim_param != "T"
    shape = (FEATURES, length) if input_axis else (length, FEATURES)
    return {"h0": rand(HIDDEN, seed=length), "xs": rand(*shape, seed=10 + length)}


@pytest.mark.parametrize("config", sorted(SCAN_CONFIGS))
def test_scan_keeps_its_length_symbolic_and_matches_onnxruntime_in_the_interpreter(config: str) -> None:
    model = scan_model(**SCAN_CONFIGS[config])
    module = import_model(model)
    check_well_formed(module)
    shapes = [str(info) for info in module.main.ret_struct_info.fields]
    assert any("T" in shape for shape in shapes), shapes
    compiled = compile_module(module)
    assert any(isinstance(step, HostLoop) for step in compiled.main.steps)
    for length in LENGTHS:
        feeds = scan_feeds(model, length)
        expected = onnxruntime_outputs(model, feeds)
        for actual in (run_module(module, feeds), run_host_function(compiled.main, compiled.programs, feeds)):
            for got, want in zip(actual, expected):
                assert got.shape == want.shape
                assert_close(got, want, F32_LOOSE, err_msg=f"{config} at T={length}")


@pytest.mark.parametrize("config", sorted(SCAN_CONFIGS))
def test_scan_one_build_matches_onnxruntime_at_three_lengths_on_each_backend(backend, tmp_path, config: str) -> None:
    model = scan_model(**SCAN_CONFIGS[config])
    bundle = relaxweb.build(model, tmp_path)
    assert set(bundle.symbolic_vars) == {"T", "rnn_scan_iteration"}  # the host counts the iterations
    session = load_bundle(tmp_path, backend)
    for length in LENGTHS:
        feeds = scan_feeds(model, length)
        actual = session.run(feeds)
        for output, want in zip(model.graph.output, onnxruntime_outputs(model, feeds)):
            assert actual[output.name].shape == want.shape
            assert_close(actual[output.name], want, F32_LOOSE, err_msg=f"{config} {output.name} at T={length}")


def _loop_body_programs(compiled) -> list[str]:
    (loop,) = [step for step in compiled.main.steps if isinstance(step, HostLoop)]
    return [step.program for step in walk_steps(loop.steps) if isinstance(step, HostDispatch)]


def test_a_loop_body_is_fused_like_a_dataflow_block() -> None:
    """Each launch fusion saves in a body is saved at every iteration; the values the loop
    carries or stacks keep their kernels (their storages are the loop's)."""
    module = import_model(scan_model())
    fused, unfused = (_loop_body_programs(compile_module(module, opt_level=level)) for level in (1, 0))
    assert len(fused) < len(unfused)
    assert any("tanh" in name and name.startswith("fused_") for name in fused), fused
    feeds = scan_feeds(scan_model(), 5)
    compiled = compile_module(module)
    for got, want in zip(run_host_function(compiled.main, compiled.programs, feeds), run_module(module, feeds)):
        assert_close(got, want, F32_LOOSE)




@in_the_browser
def test_scan_in_the_browser(tmp_path) -> None:
    """The browser runtime follows the host's loop (a resume record after each iteration)."""
    from relaxweb.browser import run_many_in_browser

    model = scan_model(**SCAN_CONFIGS["everything"])
    relaxweb.build(model, tmp_path)
    runs = [scan_feeds(model, length) for length in LENGTHS]
    for length, run, got in zip(LENGTHS, runs, run_many_in_browser(tmp_path, runs)):
        for output, want in zip(model.graph.output, onnxruntime_outputs(model, run)):
            assert_close(got[output.name], want, F32_LOOSE, err_msg=f"{output.name} at T={length} in Chromium")


# Loop ------------------------------------------------------------------------------------------------


def loop_model(*, condition_from_body: bool = False, trip_from_shape: bool = False) -> onnx.ModelProto:
    """``for i in range(trip) while cond``: ``y += x[i] * i`` (``x[i]`` a Gather at the
    iteration), stacking each ``y``; ``trip`` and ``cond`` are graph inputs, read back, or
    (``trip_from_shape``) ``trip`` is ``x``'s row count ``N`` and ``cond`` a constant, as
    torch exports a loop over a tensor's rows."""
    i_as_float = helper.make_node("Cast", ["i"], ["i_float"], to=TensorProto.FLOAT)
    nodes = [
        helper.make_node("Gather", ["x", "i"], ["x_i"], axis=0),
        i_as_float,
        helper.make_node("Mul", ["x_i", "i_float"], ["scaled"]),
        helper.make_node("Add", ["y", "scaled"], ["y_next"]),
        helper.make_node("Identity", ["y_next"], ["y_row"]),
    ]
    if condition_from_body:
        nodes.append(helper.make_node("Less", ["i", "two"], ["cond_out"]))
    else:
        nodes.append(helper.make_node("Identity", ["cond"], ["cond_out"]))
    constants = [helper.make_tensor("two", TensorProto.INT64, [], [2])]
    body = helper.make_graph(
        nodes, "loop_body",
        [helper.make_tensor_value_info("i", TensorProto.INT64, []),
         helper.make_tensor_value_info("cond", TensorProto.BOOL, []),
         helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
         helper.make_tensor_value_info("y_next", TensorProto.FLOAT, [4]),
         helper.make_tensor_value_info("y_row", TensorProto.FLOAT, [4])],
        initializer=constants)
    node = helper.make_node("Loop", ["trip", "cond", "y0"], ["y_last", "ys"], name="accumulate", body=body)
    if trip_from_shape:
        rows = [helper.make_node("Shape", ["x"], ["x_shape"]),
                helper.make_node("Gather", ["x_shape", "first"], ["trip"], axis=0)]
        constants = {"first": np.array(0, np.int64), "cond": np.array(True)}
        return make_model([*rows, node], [("y0", [4]), ("x", ["N", 4])], ["y_last", "ys"], constants, opset=16)
    return make_model([node], [("trip", TensorProto.INT64, []), ("cond", TensorProto.BOOL, []), ("y0", [4]),
                               ("x", ["N", 4])], ["y_last", "ys"], opset=16)


def loop_feeds(trip: int, cond: bool = True) -> dict[str, np.ndarray]:
    return {"trip": np.array(trip, np.int64), "cond": np.array(cond), "y0": rand(4, seed=trip), "x": rand(8, 4, seed=1)}


LOOP_RUNS = [(3, True), (8, True), (5, False), (0, True)]


def test_loop_with_a_trip_count_read_back_matches_onnxruntime(backend, tmp_path) -> None:
    model = loop_model()
    module = import_model(model)
    check_well_formed(module)
    compiled = compile_module(module)
    steps = walk_steps(compiled.main.steps)
    assert sum(isinstance(step, HostRead) for step in steps) == 2  # the trip count and the condition
    assert any(isinstance(step, HostLoop) for step in steps)
    relaxweb.build(model, tmp_path)
    session = load_bundle(tmp_path, backend)
    for trip, cond in LOOP_RUNS:
        feeds = loop_feeds(trip, cond)
        expected = onnxruntime_outputs(model, feeds)
        interpreted = run_module(module, feeds)
        hosted = run_host_function(compiled.main, compiled.programs, feeds)
        compiled_run = session.run(feeds)
        for position, (output, want) in enumerate(zip(model.graph.output, expected)):
            for where, got in (("interpreter", interpreted[position]), ("host", hosted[position]),
                               (backend, compiled_run[output.name])):
                assert got.shape == want.shape, f"{output.name} ({where}) at trip={trip}, cond={cond}"
                assert_close(got, want, err_msg=f"{output.name} ({where}) at trip={trip}, cond={cond}")


def test_loop_over_the_rows_of_an_input_needs_no_read_back(backend, tmp_path) -> None:
    model = loop_model(trip_from_shape=True)
    compiled = compile_module(import_model(model))
    loops = [step for step in compiled.main.steps if isinstance(step, HostLoop)]
    assert len(loops) == 1 and str(loops[0].count) == "N"
    assert not any(isinstance(step, HostRead) for step in walk_steps(compiled.main.steps))
    relaxweb.build(model, tmp_path)
    session = load_bundle(tmp_path, backend)
    for rows in (3, 6, 1):
        feeds = {"y0": rand(4, seed=rows), "x": rand(rows, 4, seed=1)}
        actual = session.run(feeds)
        for output, want in zip(model.graph.output, onnxruntime_outputs(model, feeds)):
            assert actual[output.name].shape == want.shape
            assert_close(actual[output.name], want, err_msg=f"{output.name} at N={rows}")
    assert session.last_read_count == 0


# The IR text -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("stage", ["imported", "planned"])
def test_a_loop_prints_and_parses_back(stage: str) -> None:
    module = import_model(scan_model(**SCAN_CONFIGS["everything"]))
    if stage == "planned":
        module = plan_memory(legalize_ops(module))
    text = format_module(module)
    assert " in loop(" in text
    parsed = parse_module(text, module_constants(module))
    assert structural_equal(parsed, module)
    feeds = scan_feeds(scan_model(**SCAN_CONFIGS["everything"]), 5)
    for got, want in zip(run_module(parsed, feeds), run_module(module, feeds)):
        np.testing.assert_array_equal(got, want)


# What is not supported -------------------------------------------------------------------------------


def test_a_condition_the_body_computes_is_one_error_naming_the_node() -> None:
    with pytest.raises(RelaxwebError, match=r"Loop node 'accumulate'.*the body computes the loop condition"):
        import_model(loop_model(condition_from_body=True))


def test_a_loop_without_a_trip_count_is_one_error_naming_the_node() -> None:
    model = loop_model()
    model.graph.node[0].input[0] = ""
    with pytest.raises(RelaxwebError, match=r"Loop node 'accumulate'.*without a trip count"):
        import_model(model)


def test_a_carried_value_whose_shape_changes_is_one_error_naming_it() -> None:
    body = helper.make_graph(
        [helper.make_node("Concat", ["s", "s"], ["s_next"], axis=0)], "grow",
        [helper.make_tensor_value_info("s", TensorProto.FLOAT, None),
         helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("s_next", TensorProto.FLOAT, None)])
    node = helper.make_node("Scan", ["s0", "xs"], ["s_last"], name="grower", body=body, num_scan_inputs=1)
    model = make_model([node], [("s0", [2]), ("xs", ["T", 2])], ["s_last"], opset=16)
    with pytest.raises(RelaxwebError, match=r"Scan node 'grower'.*carried value 's'"):
        import_model(model)


def _nested_scan_model(around: str) -> onnx.ModelProto:
    """The Scan of ``scan_model`` inside an If's then-branch, or inside a Loop's body."""
    inner = scan_model()
    scan, weights = inner.graph.node[0], list(inner.graph.initializer)
    relu = helper.make_node("Relu", ["h_last"], ["h_out"])
    h_out = helper.make_tensor_value_info("h_out", TensorProto.FLOAT, [HIDDEN])
    if around == "If":
        then = helper.make_graph([scan, relu], "then", [], [h_out])
        other = helper.make_graph([helper.make_node("Relu", ["h0"], ["h_out"])], "else", [], [h_out])
        node = helper.make_node("If", ["flag"], ["h_final"], name="choose", then_branch=then, else_branch=other)
        return make_model([node], [("flag", TensorProto.BOOL, []), ("h0", [HIDDEN]), ("xs", ["T", FEATURES])],
                          ["h_final"], weights, opset=16)
    condition = helper.make_tensor_value_info("c", TensorProto.BOOL, [])
    body = helper.make_graph([scan, relu], "outer_body",
                             [helper.make_tensor_value_info("i", TensorProto.INT64, []), condition,
                              helper.make_tensor_value_info("h0", TensorProto.FLOAT, [HIDDEN])], [condition, h_out])
    node = helper.make_node("Loop", ["trip", "", "h_init"], ["h_final"], name="outer", body=body)
    trip = helper.make_tensor("trip", TensorProto.INT64, [], [2])
    return make_model([node], [("h_init", [HIDDEN]), ("xs", ["T", FEATURES])], ["h_final"], [*weights, trip], opset=16)


@pytest.mark.parametrize("around", ["If", "Loop"])
def test_a_loop_inside_an_if_branch_or_a_loop_is_one_clear_error(tmp_path, around: str) -> None:
    with pytest.raises(RelaxwebError, match=r"'rnn_scan_loop': a loop inside an If branch or another loop is not supported"):
        relaxweb.build(_nested_scan_model(around), tmp_path)


def _broadcast_carry_model() -> onnx.ModelProto:
    """A Loop (two iterations) whose carried ``y: [1]`` comes back as ``Expand(y, shape(x)) + 1``,
    ``[N]``: the same as ``[1]`` only when ``N`` is 1, which no build-time proof can show; it
    also stacks an identity of it."""
    condition = helper.make_tensor_value_info("c", TensorProto.BOOL, [])
    body = helper.make_graph(
        [helper.make_node("Shape", ["x"], ["x_shape"]),
         helper.make_node("Expand", ["y", "x_shape"], ["y_wide"]),
         helper.make_node("Add", ["y_wide", "one"], ["y_next"]),
         helper.make_node("Identity", ["y_next"], ["y_row"])], "widen",
        [helper.make_tensor_value_info("i", TensorProto.INT64, []), condition,
         helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])],
        [condition, helper.make_tensor_value_info("y_next", TensorProto.FLOAT, None),
         helper.make_tensor_value_info("y_row", TensorProto.FLOAT, None)],
        initializer=[helper.make_tensor("one", TensorProto.FLOAT, [1], [1.0])])
    node = helper.make_node("Loop", ["trip", "", "y0"], ["y_last", "ys"], name="widen_loop", body=body)
    trip = helper.make_tensor("trip", TensorProto.INT64, [], [2])
    return make_model([node], [("y0", [1]), ("x", ["N"])], ["y_last", "ys"], [trip], opset=16)


def test_a_carried_shape_not_provably_kept_is_checked_at_run_time(backend, tmp_path) -> None:
    """As Relax answers what deduction cannot prove: a match_cast, checked at every iteration."""
    model = _broadcast_carry_model()
    relaxweb.build(model, tmp_path)
    session = load_bundle(tmp_path, backend)
    feeds = {"y0": np.array([0.5], np.float32), "x": np.zeros(1, np.float32)}
    actual = session.run(feeds)
    for output, want in zip(model.graph.output, onnxruntime_outputs(model, feeds)):
        assert actual[output.name].shape == want.shape
        assert_close(actual[output.name], want)
    with pytest.raises(InputShapeError, match=r"'widen_loop_y_next.*': dimension 0 is 3, expected 1"):
        session.run(dict(feeds, x=np.zeros(3, np.float32)))


# ONNX's node cases ----------------------------------------------------------------------------------


def _node_cases() -> dict:
    return {case.name: case for case in onnx_node_cases(["loop", "scan"])}


#: Node cases that carry sequence or optional values: tests/ops/test_sequence.py runs them (on the
#: GPU too: their outputs are lists).
SEQUENCE_CASES = ("test_loop13_seq", "test_loop16_seq_none")


@pytest.mark.parametrize("name", sorted(set(_node_cases()) - set(SEQUENCE_CASES)))
def test_onnx_node_case_on_each_backend(backend, tmp_path: Path, name: str) -> None:
    case = _node_cases()[name]
    session = load_bundle(build_once(case.model, tmp_path), backend)
    for inputs, outputs in case.data_sets:
        feeds = {value.name: np.asarray(array) for value, array in zip(case.model.graph.input, inputs)}
        actual = session.run(feeds)
        for value, want in zip(case.model.graph.output, outputs):
            assert actual[value.name].shape == want.shape
            assert_close(actual[value.name], want, ONNX_CASE, err_msg=f"{name} {value.name}")
