"""ONNX sequences and optionals: their annotations, their ops in the interpreter against
onnxruntime, a loop carrying a sequence, sequences on the GPU (inputs, a loop growing one,
outputs) against onnxruntime, and the build's refusal of what has no GPU lowering yet."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import relaxweb
from relaxweb.browser import run_many_in_browser
from relaxweb.compiler import compile_module, import_model, run_reference
from relaxweb.errors import InputShapeError, RelaxwebError
from relaxweb.ir.host import SEQUENCE_CAPACITY
from relaxweb.ir.interpreter import run_host_function
from relaxweb.ir.parser import parse_module
from relaxweb.ir.printer import format_module, module_constants
from relaxweb.ir.struct_info import (
    ObjectStructInfo, OptionalStructInfo, SequenceStructInfo, TensorStructInfo, is_less_specific, join,
)
from relaxweb.ir.structural import structural_equal
from relaxweb.ir.symbolic import SizeVar
from tests.helpers import assert_close, in_the_browser, load_bundle, make_model, onnx_node_cases, onnxruntime_outputs, rand

N = SizeVar("n")


def seq_value(name: str, dtype=TensorProto.FLOAT, shape=None) -> onnx.ValueInfoProto:
    return helper.make_tensor_sequence_value_info(name, dtype, shape)


def assert_sequences_equal(actual, expected) -> None:
    assert isinstance(actual, list) and len(actual) == len(expected)
    for a, e in zip(actual, expected):
        assert a.dtype == e.dtype and a.shape == e.shape
        assert_close(a, e)


# annotations ------------------------------------------------------------------------------------


def test_sequence_annotations_are_ordered_and_join() -> None:
    rank1 = SequenceStructInfo(TensorStructInfo(None, "float32", 1))
    known = SequenceStructInfo(TensorStructInfo((N,), "float32"), N + 1)
    assert is_less_specific(rank1, known) and not is_less_specific(known, rank1)
    assert join(known, SequenceStructInfo(TensorStructInfo((3,), "float32"), 2)) == rank1
    assert join(rank1, SequenceStructInfo(TensorStructInfo(None, "int64", 1))) == ObjectStructInfo()
    # an optional holding a value is that value: a sequence is an optional sequence
    assert is_less_specific(OptionalStructInfo(rank1), known)
    assert not is_less_specific(known, OptionalStructInfo(known))
    assert join(OptionalStructInfo(rank1), known) == OptionalStructInfo(rank1)


# the ops in the interpreter, against onnxruntime -------------------------------------------------


def sequence_ops_model() -> onnx.ModelProto:
    """x [n, 3] split into its rows; y inserted at the front; the second element erased; the
    rest concatenated along a new axis; the length, and element 1, as outputs too."""
    nodes = [
        helper.make_node("SplitToSequence", ["x"], ["rows"], axis=0, keepdims=0),
        helper.make_node("SequenceInsert", ["rows", "y", "zero"], ["with_y"]),
        helper.make_node("SequenceErase", ["with_y", "one"], ["erased"]),
        helper.make_node("ConcatFromSequence", ["erased"], ["stacked"], axis=0, new_axis=1),
        helper.make_node("SequenceLength", ["erased"], ["length"]),
        helper.make_node("SequenceAt", ["erased", "minus_one"], ["last"]),
        helper.make_node("SequenceConstruct", ["last", "y"], ["pair"]),
    ]
    initializers = {"zero": np.array(0, np.int64), "one": np.array(1, np.int64), "minus_one": np.array(-1, np.int64)}
    model = make_model(nodes, [("x", ["n", 3]), ("y", [3])], ["stacked", "length", "last"], initializers, opset=17)
    model.graph.output[1].CopyFrom(helper.make_tensor_value_info("length", TensorProto.INT64, []))
    model.graph.output.append(seq_value("pair"))
    return model


@pytest.mark.parametrize("rows", [2, 5])
def test_sequence_ops_match_onnxruntime_in_the_interpreter(rows: int) -> None:
    model = sequence_ops_model()
    feeds = {"x": rand(rows, 3, seed=rows), "y": rand(3, seed=9)}
    expected = onnxruntime_outputs(model, feeds)
    actual = run_reference(model, feeds)
    assert_close(actual["stacked"], expected[0])
    np.testing.assert_array_equal(actual["length"], expected[1])
    assert_close(actual["last"], expected[2])
    assert_sequences_equal(actual["pair"], expected[3])


def test_the_imported_sequence_ops_print_and_parse_back() -> None:
    module = import_model(sequence_ops_model())
    text = format_module(module)
    assert 'with_y: Sequence(Tensor((3,), "float32"), length=n + 1) = sequence_insert(' in text
    assert 'stacked: Tensor((n, 3), "float32") = concat_from_sequence(' in text
    assert structural_equal(parse_module(text, constants=module_constants(module)), module)


def test_a_sequence_input_is_a_list_of_arrays_checked_element_by_element() -> None:
    model = make_model([helper.make_node("ConcatFromSequence", ["parts"], ["whole"], axis=1)],
                       [seq_value("parts", shape=["a", "b"])], ["whole"])
    parts = [rand(2, 3, seed=1), rand(2, 1, seed=2)]
    (expected,) = onnxruntime_outputs(model, {"parts": parts})
    assert_close(run_reference(model, {"parts": parts})["whole"], expected)
    with pytest.raises(InputShapeError, match=r"input 'parts\[1\]': has 1 dimensions, expected 2"):
        run_reference(model, {"parts": [rand(2, 3), rand(4)]})
    with pytest.raises(InputShapeError, match=r"input 'parts': expected a sequence"):
        run_reference(model, {"parts": rand(2, 3)})


# a loop carrying a sequence --------------------------------------------------------------------


def growing_sequence_model() -> onnx.ModelProto:
    """ONNX's test_loop13_seq with the data an input: a loop whose trip count is read at run
    time appends ``x[:i + 1]`` to a sequence at iteration ``i``; the sequence is the output."""
    one = helper.make_tensor("one", TensorProto.INT64, [], [1])
    zero = helper.make_tensor("zero", TensorProto.INT64, [1], [0])
    axes = helper.make_tensor("axes", TensorProto.INT64, [], [0])
    body = helper.make_graph(
        [helper.make_node("Identity", ["cond_in"], ["cond_out"]),
         helper.make_node("Constant", [], ["one"], value=one),
         helper.make_node("Constant", [], ["start"], value=zero),
         helper.make_node("Constant", [], ["axes"], value=axes),
         helper.make_node("Add", ["i", "one"], ["end"]),
         helper.make_node("Unsqueeze", ["end", "axes"], ["ends"]),
         helper.make_node("Slice", ["x", "start", "ends"], ["prefix"]),
         helper.make_node("SequenceInsert", ["seq_in", "prefix"], ["seq_out"])],
        "body",
        [helper.make_tensor_value_info("i", TensorProto.INT64, []),
         helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []), seq_value("seq_in")],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []), seq_value("seq_out")])
    nodes = [helper.make_node("SequenceEmpty", [], ["empty"]),
             helper.make_node("Loop", ["trip", "cond", "empty"], ["grown"], name="grow", body=body)]
    model = make_model(nodes, [("x", ["n"]), ("trip", [], TensorProto.INT64), ("cond", [], TensorProto.BOOL)], [],
                       opset=17)
    model.graph.output.append(seq_value("grown"))
    return model


@pytest.mark.parametrize("trip", [0, 1, 4])
def test_a_loop_carrying_a_sequence_matches_onnxruntime(trip: int) -> None:
    model = growing_sequence_model()
    feeds = {"x": rand(6, seed=3), "trip": np.array(trip, np.int64), "cond": np.array(True)}
    (expected,) = onnxruntime_outputs(model, feeds)
    actual = run_reference(model, feeds)["grown"]
    assert [a.shape for a in actual] == [(i + 1,) for i in range(trip)]
    assert_sequences_equal(actual, expected)


def test_a_carried_sequence_has_no_length_and_prints_and_parses_back() -> None:
    module = import_model(growing_sequence_model())
    text = format_module(module)
    assert 'match_cast(empty, Sequence(Tensor(ndim=-1, dtype="float32")))' in text
    assert structural_equal(parse_module(text, constants=module_constants(module)), module)


def test_onnx_loop_cases_with_sequences_and_optionals_run_in_the_interpreter() -> None:
    """ONNX's test_loop13_seq and test_loop16_seq_none (an empty optional sequence carried in,
    replaced by a one-element sequence in an If inside the body, a sequence carried out)."""
    cases = {case.name: case for case in onnx_node_cases(["loop"])}
    for name in ("test_loop13_seq", "test_loop16_seq_none"):
        case = cases[name]
        ((inputs, outputs),) = case.data_sets
        feeds = {value.name: data for value, data in zip(case.model.graph.input, inputs)}
        actual = run_reference(case.model, feeds)
        assert_sequences_equal(actual[case.model.graph.output[0].name], outputs[0])


SEQUENCE_CASE_MODULES = ["sequenceinsert", "splittosequence", "sequence_map", "optionalhaselement", "optionalgetelement"]


def _as_value(value):
    """A node case's value as relaxweb takes and gives it: an array, a list (a sequence), None."""
    if value is None:
        return None
    return [np.asarray(element) for element in value] if isinstance(value, list) else np.asarray(value)


def _assert_value(actual, expected, what: str) -> None:
    if expected is None or isinstance(expected, list):
        assert (actual is None) if expected is None else isinstance(actual, list), what
        for position, (a, e) in enumerate(zip(actual or [], expected or [])):
            _assert_value(a, e, f"{what}[{position}]")
        assert expected is None or len(actual) == len(expected), what
        return
    expected = np.asarray(expected)
    assert actual.shape == expected.shape and actual.dtype == expected.dtype, what
    assert_close(actual, expected, err_msg=what)


@pytest.mark.parametrize("case", onnx_node_cases(SEQUENCE_CASE_MODULES), ids=lambda case: case.name)
def test_onnx_sequence_and_optional_cases_run_in_the_interpreter(case) -> None:
    for inputs, outputs in case.data_sets:
        feeds = {value.name: _as_value(data) for value, data in zip(case.model.graph.input, inputs)}
        actual = run_reference(case.model, feeds)
        for value, expected in zip(case.model.graph.output, outputs):
            _assert_value(actual[value.name], _as_value(expected), f"{case.name} {value.name}")


# the build ---------------------------------------------------------------------------------------


def test_building_a_model_with_optional_tensors_is_one_error_naming_them() -> None:
    case = {case.name: case for case in onnx_node_cases(["optionalhaselement"])}["test_optional_has_element_optional_input"]
    with pytest.raises(RelaxwebError, match=r"no GPU lowering yet for optional tensors: input 'optional_input' "
                                            r"\(Optional\(Tensor\(ndim=1, float32\)\)\)"):
        compile_module(import_model(case.model))


def test_a_sequence_read_again_after_it_grows_is_refused_by_name() -> None:
    """A sequence grows in place on the GPU: a model that reads the old value afterwards has no
    lowering yet (never a wrong result)."""
    nodes = [helper.make_node("SequenceInsert", ["s", "t"], ["grown"]), helper.make_node("Identity", ["s"], ["old"])]
    model = make_model(nodes, [("t", [2])], [], opset=17)
    model.graph.input.insert(0, seq_value("s"))
    model.graph.output.extend([seq_value("grown"), seq_value("old")])
    with pytest.raises(RelaxwebError, match=r"'grown': the sequence 's' is read again after elements are inserted"):
        compile_module(import_model(model))


def test_an_if_whose_branch_grows_the_sequence_it_builds_is_refused_by_name() -> None:
    """An If returning a sequence builds it into the table of the outer sequence the other
    branch keeps; a branch that appends to what it built has no lowering yet."""
    then_branch = helper.make_graph(
        [helper.make_node("SequenceConstruct", ["t"], ["built"]), helper.make_node("SequenceInsert", ["built", "t"], ["grown"])],
        "then", [], [seq_value("grown")])
    else_branch = helper.make_graph([helper.make_node("OptionalGetElement", ["s"], ["kept"])], "else", [], [seq_value("kept")])
    nodes = [helper.make_node("OptionalHasElement", ["s"], ["has"]), helper.make_node("Not", ["has"], ["none"]),
             helper.make_node("If", ["none"], ["chosen"], then_branch=then_branch, else_branch=else_branch)]
    model = make_model(nodes, [("t", [2])], [], opset=18)
    model.graph.input.insert(0, helper.make_value_info("s", helper.make_optional_type_proto(
        helper.make_sequence_type_proto(helper.make_tensor_type_proto(TensorProto.FLOAT, [2])))))
    model.graph.output.append(seq_value("chosen"))
    with pytest.raises(RelaxwebError, match=r"If 'chosen': no GPU lowering yet for a branch that builds a sequence "
                                            r"and then inserts into it"):
        compile_module(import_model(model))


# on the GPU, against onnxruntime -----------------------------------------------------------------


@pytest.fixture(scope="module")
def growing_bundle(tmp_path_factory) -> Path:
    return relaxweb.build(growing_sequence_model(), tmp_path_factory.mktemp("growing")).path


def test_a_loop_growing_a_sequence_runs_on_each_backend(backend, growing_bundle: Path) -> None:
    """One build; trip counts 0, 1 and 4 (the sequence's arena grows between iterations)."""
    model = load_bundle(growing_bundle, backend)
    for trip in (0, 1, 4):
        feeds = {"x": rand(6, seed=3), "trip": np.array(trip, np.int64), "cond": np.array(True)}
        (expected,) = onnxruntime_outputs(growing_sequence_model(), feeds)
        assert_sequences_equal(model.run(feeds)["grown"], expected)


def appending_model() -> onnx.ModelProto:
    """A sequence input of rank-2 elements (any shapes), ``t`` appended, then ``t * 2``."""
    nodes = [helper.make_node("SequenceInsert", ["s", "t"], ["with_t"]),
             helper.make_node("Add", ["t", "t"], ["twice"]),
             helper.make_node("SequenceInsert", ["with_t", "twice"], ["grown"])]
    model = make_model(nodes, [("t", ["n", 2])], [], opset=17)
    model.graph.input.insert(0, seq_value("s", shape=["a", "b"]))
    model.graph.output.append(seq_value("grown"))
    return model


def test_the_host_function_of_sequences_runs_in_the_interpreter() -> None:
    """run_host_function (numpy, no GPU) keeps the tables and arenas as the host module does."""
    compiled = compile_module(import_model(appending_model()))
    feeds = {"s": [rand(2, 3, seed=1), rand(0, 4, seed=2)], "t": rand(3, 2, seed=9)}
    (expected,) = onnxruntime_outputs(appending_model(), feeds)
    assert_sequences_equal(run_host_function(compiled.main, compiled.programs, feeds)[0], expected)
    case = {case.name: case for case in onnx_node_cases(["loop"])}["test_loop16_seq_none"]
    compiled = compile_module(import_model(case.model))
    for feeds in optional_loop_runs():
        actual = run_host_function(compiled.main, compiled.programs, feeds)[0]
        expected = run_reference(case.model, feeds)["seq_res"]
        assert (actual is None) == (expected is None), feeds
        if expected is not None:
            assert_sequences_equal(actual, expected)


def test_a_sequence_input_of_0_1_and_3_elements_runs_on_each_backend(backend, tmp_path: Path) -> None:
    model = load_bundle(relaxweb.build(appending_model(), tmp_path).path, backend)
    shapes = [(2, 3), (1, 1), (0, 4)]
    for count in (0, 1, 3):
        feeds = {"s": [rand(*shape, seed=i) for i, shape in enumerate(shapes[:count])], "t": rand(3, 2, seed=9)}
        (expected,) = onnxruntime_outputs(appending_model(), feeds)
        assert_sequences_equal(model.run(feeds)["grown"], expected)
    with pytest.raises(InputShapeError, match=r"input 's': element 0 has 1 dimensions \(shape \[3\]\), expected 2"):
        model.run({"s": [rand(3)], "t": rand(3, 2)})


@pytest.mark.slow
def test_an_insert_past_the_capacity_is_one_error(device, growing_bundle: Path) -> None:
    model = relaxweb.load(growing_bundle, device=device)
    feeds = {"x": rand(6, seed=3), "trip": np.array(SEQUENCE_CAPACITY + 1, np.int64), "cond": np.array(True)}
    with pytest.raises(InputShapeError, match=rf"sequence_insert: the sequence has {SEQUENCE_CAPACITY + 1} elements, "
                                              rf"the most a sequence can hold is {SEQUENCE_CAPACITY}$"):
        model.run(feeds)
    feeds["trip"] = np.array(SEQUENCE_CAPACITY, np.int64)
    assert len(model.run(feeds)["grown"]) == SEQUENCE_CAPACITY


@in_the_browser
def test_a_sequence_output_is_a_javascript_array_of_tensors_in_the_browser(growing_bundle: Path) -> None:
    """The browser runtime: a sequence input is an array of {data, shape}, and so is a
    sequence output (run_in_browser's page encodes a JS array as a list)."""
    runs = [{"x": rand(6, seed=3), "trip": np.array(trip, np.int64), "cond": np.array(True)} for trip in (0, 3)]
    for feeds, outputs in zip(runs, run_many_in_browser(growing_bundle, runs)):
        (expected,) = onnxruntime_outputs(growing_sequence_model(), feeds)
        assert_sequences_equal(outputs["grown"], expected)


@in_the_browser
def test_a_sequence_input_is_a_javascript_array_of_tensors_in_the_browser(tmp_path: Path) -> None:
    bundle = relaxweb.build(appending_model(), tmp_path).path
    feeds = {"s": [rand(2, 3, seed=1), rand(0, 4, seed=2)], "t": rand(3, 2, seed=9)}
    (expected,) = onnxruntime_outputs(appending_model(), feeds)
    assert_sequences_equal(relaxweb.run_in_browser(bundle, feeds)["grown"], expected)


@pytest.fixture(scope="module")
def optional_loop_bundle(tmp_path_factory) -> Path:
    """ONNX's test_loop16_seq_none: an optional sequence carried in (none: a one-element
    sequence replaces it, in an If the host decides), appended to at each iteration."""
    case = {case.name: case for case in onnx_node_cases(["loop"])}["test_loop16_seq_none"]
    return relaxweb.build(case.model, tmp_path_factory.mktemp("optional_loop")).path


def optional_loop_runs() -> list[dict]:
    return [{"trip_count": np.array(trip, np.int64), "cond": np.array(True), "opt_seq": given}
            for trip, given in ((0, None), (3, None), (2, [np.array(7.0, np.float32)]), (0, []))]


def test_a_loop_carrying_an_optional_sequence_runs_on_each_backend(backend, optional_loop_bundle: Path) -> None:
    """None and a sequence given, from one build, against the interpreter (onnxruntime's Python
    API cannot feed an empty optional)."""
    case = {case.name: case for case in onnx_node_cases(["loop"])}["test_loop16_seq_none"]
    model = load_bundle(optional_loop_bundle, backend)
    for feeds in optional_loop_runs():
        expected = run_reference(case.model, feeds)["seq_res"]
        actual = model.run(feeds)["seq_res"]
        assert (actual is None) == (expected is None), feeds
        if expected is not None:
            assert_sequences_equal(actual, expected)


@in_the_browser
def test_an_optional_sequence_is_null_or_an_array_in_the_browser(optional_loop_bundle: Path) -> None:
    case = {case.name: case for case in onnx_node_cases(["loop"])}["test_loop16_seq_none"]
    runs = optional_loop_runs()
    for feeds, outputs in zip(runs, run_many_in_browser(optional_loop_bundle, runs)):
        expected = run_reference(case.model, feeds)["seq_res"]
        assert (outputs["seq_res"] is None) == (expected is None), feeds
        if expected is not None:
            assert_sequences_equal(outputs["seq_res"], expected)


def test_onnx_node_cases_with_sequences_pass_on_each_backend(backend, tmp_path: Path) -> None:
    cases = {case.name: case for case in onnx_node_cases(["loop", "sequenceinsert"])}
    for name in ("test_loop13_seq", "test_loop16_seq_none", "test_sequence_insert_at_back"):
        case = cases[name]
        model = load_bundle(relaxweb.build(case.model, tmp_path / name).path, backend)
        for inputs, outputs in case.data_sets:
            feeds = {value.name: _as_value(data) for value, data in zip(case.model.graph.input, inputs)}
            actual = model.run(feeds)
            for value, expected in zip(case.model.graph.output, outputs):
                _assert_value(actual[value.name], _as_value(expected), f"{name} {value.name}")


def test_building_a_model_with_sequence_ops_inside_is_one_error_listing_them() -> None:
    nodes = [helper.make_node("SplitToSequence", ["x"], ["rows"], axis=0),
             helper.make_node("ConcatFromSequence", ["rows"], ["y"], axis=1)]
    model = make_model(nodes, [("x", ["n", 3])], ["y"])
    with pytest.raises(RelaxwebError, match=r"no GPU lowering yet for 2 op\(s\): concat_from_sequence, split_to_sequence"):
        compile_module(import_model(model))
