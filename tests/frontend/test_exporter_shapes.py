"""Input annotations and shape computations as exporters write them.

1. Annotations: ``dim_value`` -1, ``?``, missing names, ``p2o.DynamicDimension.0``,
   ``unk__214``, ``batch_size*2``, ``N``, names with spaces: symbolic, sanitized for the IR,
   shown as written (messages, ``inspect``, the manifest, ``--bound``); a name on several dims
   is one variable unless the graph refutes it; output annotations are ignored.
2. Shape subgraphs in each exporter's style (tf2onnx and jax2tf: Shape -> Cast -> Slice to
   INT64_MAX -> Concat -> Reshape; paddle2onnx: Shape -> Gather -> Unsqueeze -> Concat;
   ConstantOfShape / Range / Expand / Tile of computed sizes; float arithmetic cast back;
   Shape with start/end; Size; Squeeze/Unsqueeze, Min/Max/Where of shape values): the
   deduced shapes use the inputs' variables only (no fresh variable where the shape is known),
   and one build matches onnxruntime at several shapes on wgpu.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import relaxweb
from relaxweb.errors import InputShapeError, RelaxwebError
from relaxweb.frontend import from_onnx
from relaxweb.frontend.onnx import symbolic_vars
from relaxweb.ir.expr import MatchCast, PrimValue
from relaxweb.ir.interpreter import run_module
from tests.helpers import assert_close, build_once, load_bundle, make_model, onnxruntime_outputs, rand

ROOT = Path(__file__).resolve().parents[2]
INT64_MAX = 2**63 - 1


def ints(**arrays) -> dict[str, np.ndarray]:
    """int64 initializers (a list is 1-D, an int 0-d)."""
    return {name: np.array(value, np.int64) for name, value in arrays.items()}




def feeds_of(shapes: dict[str, tuple[int, ...]], seed: int = 0) -> dict[str, np.ndarray]:
    return {name: rand(shape, seed=seed + i) for i, (name, shape) in enumerate(shapes.items())}


# Annotations ------------------------------------------------------------------------------------

ANNOTATED_DIMS = ["?", -1, None, "p2o.DynamicDimension.0", "unk__214", "batch_size*2", "N", "batch size", 3]


def annotated_model() -> onnx.ModelProto:
    """One input with a dim of each kind an exporter writes (None: no name, no value)."""
    dims = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1] * len(ANNOTATED_DIMS))]
    shape = dims[0].type.tensor_type.shape
    for dim, written in zip(shape.dim, ANNOTATED_DIMS):
        dim.Clear()
        if isinstance(written, str):
            dim.dim_param = written
        elif written is not None:
            dim.dim_value = written
    return make_model([helper.make_node("Relu", ["x"], ["y"], name="relu")], dims, ["y"])


def test_every_dim_that_is_not_a_size_is_symbolic_and_named_as_written() -> None:
    module = from_onnx(annotated_model())
    (x,) = module.main.params
    assert [str(d) for d in x.struct_info.shape] == [
        "x_dim0", "x_dim1", "x_dim2", "p2o_DynamicDimension_0", "unk__214", "batch_size_2", "N", "batch_size", "3",
    ]
    assert module.attrs["size_var_names"] == {
        "p2o_DynamicDimension_0": "p2o.DynamicDimension.0", "batch_size_2": "batch_size*2", "batch_size": "batch size",
    }
    x = rand(2, 1, 3, 1, 2, 1, 2, 1, 3, seed=1)
    (y,) = run_module(module, {"x": x})
    assert_close(y, np.maximum(x, 0))


def test_names_that_sanitize_alike_stay_apart() -> None:
    model = make_model([helper.make_node("Concat", ["a", "b"], ["c"], axis=0, name="cat")],
                       [("a", ["batch size", 2]), ("b", ["batch_size", 2])], ["c"])
    module = from_onnx(model)
    assert str(module.main.ret_struct_info) == "Tensor((batch_size + batch_size_2, 2), float32)"
    assert module.attrs["size_var_names"] == {"batch_size": "batch size", "batch_size_2": "batch_size"}


def test_names_are_shown_as_the_model_wrote_them(device, tmp_path: Path) -> None:
    model = make_model([helper.make_node("Add", ["x", "y"], ["z"], name="add")],
                       [("x", ["p2o.DynamicDimension.0", "batch size"]), ("y", ["p2o.DynamicDimension.0", "cols"])],
                       ["z"])
    bundle = relaxweb.build(model, tmp_path / "dist", bounds={"p2o.DynamicDimension.0": 8})  # by the model's name
    assert bundle.manifest["symbolic_vars"] == [
        {"name": "p2o_DynamicDimension_0", "bound": 8, "model_name": "p2o.DynamicDimension.0"},
        {"name": "batch_size", "bound": None, "model_name": "batch size"},
        {"name": "cols", "bound": None},
    ]
    assert "var p2o_DynamicDimension_0 (bound: 8, the model's 'p2o.DynamicDimension.0')" in str(bundle)
    assert "p2o_DynamicDimension_0 (the model's 'p2o.DynamicDimension.0')" in str(relaxweb.inspect(model))
    session = bundle.load()
    with pytest.raises(InputShapeError) as caught:
        session.run({"x": rand(9, 4), "y": rand(9, 4)})
    assert str(caught.value) == ("input 'x': dimension 0 (p2o.DynamicDimension.0) is 9, above its bound "
                                 "p2o.DynamicDimension.0 <= 8")
    with pytest.raises(InputShapeError) as caught:
        session.run({"x": rand(3, 4), "y": rand(3, 5)})
    assert str(caught.value) == ("Add node 'add': dimension 1 of input 1 ('y') is 5, expected 4 "
                                 "(batch size; batch size from input 'x' dimension 1)")
    assert_close(session.run({"x": rand(3, 4, seed=1), "y": rand(3, 4, seed=2)})["z"],
                 rand(3, 4, seed=1) + rand(3, 4, seed=2))


def test_names_are_data_in_the_generated_code(tmp_path: Path) -> None:
    """A dim name that reads as code in every language of the bundle is only data there: the
    host module, the kernels and the runtime never hold it."""
    hostile = '*/ }) ;; (unreachable) "\n<script>alert(1)</script> ${x}'
    model = make_model([helper.make_node("Relu", ["x"], ["y"], name="relu")], [("x", [hostile, 4])], ["y"])
    bundle = relaxweb.build(model, tmp_path / "dist")
    assert bundle.manifest["symbolic_vars"][0]["model_name"] == hostile
    for path in (tmp_path / "dist").rglob("*"):
        if path.is_file() and path.suffix in (".wat", ".wgsl", ".js"):
            text = path.read_text()
            assert "<script>" not in text and "unreachable)" not in text, path


def test_a_dim_written_as_a_sum_of_other_dims_is_that_sum() -> None:
    """optimum's decoders name the mask's length ``past_sequence_length + sequence_length``
    before the inputs that name the two: it is their sum (so the sizes it makes are bounded by
    theirs), checked against them at run time; ``batch_size*2`` above, of a name no dim has
    alone, stays a name."""
    model = make_model([helper.make_node("Concat", ["past", "x"], ["joined"], axis=1, name="cat"),
                        helper.make_node("Add", ["mask", "joined"], ["y"], name="add")],
                       [("mask", ["batch", "past_sequence_length + sequence_length"]),
                        ("past", ["batch", "past_sequence_length"]), ("x", ["batch", "sequence_length"])], ["y"])
    module = from_onnx(model)
    assert str(module.main.params[0].struct_info) == "Tensor((batch, past_sequence_length + sequence_length), float32)"
    assert symbolic_vars(module.main) == ["batch", "past_sequence_length", "sequence_length"]
    feeds = feeds_of({"mask": (2, 5), "past": (2, 3), "x": (2, 2)})
    (y,) = run_module(module, feeds)
    assert_close(y, feeds["mask"] + np.concatenate([feeds["past"], feeds["x"]], axis=1))
    with pytest.raises(InputShapeError, match=r"input 'mask': dimension 1 is 6, expected 5"):
        run_module(module, {**feeds, "mask": rand(2, 6)})


def test_a_shared_name_is_one_variable_checked_at_the_input() -> None:
    model = make_model([helper.make_node("MatMul", ["q", "k"], ["scores"], name="scores")],
                       [("q", ["batch", "seq", 8]), ("k", ["batch", 8, "seq"])], ["scores"])
    module = from_onnx(model)
    assert symbolic_vars(module.main) == ["batch", "seq"]
    with pytest.raises(InputShapeError, match=r"input 'k': dimension 0 is 3, expected 2 \(batch\)"):
        run_module(module, {"q": rand(2, 5, 8), "k": rand(3, 8, 5)})


def test_a_shared_name_the_graph_refutes_becomes_two_variables() -> None:
    """x and y are both annotated ``[N, 4]``, but the graph adds x with one more row to y:
    trusting the name, N + 1 against N is impossible, so each occurrence is its own variable
    and the graph's own check relates them (y has one more row than x).  As for every such
    check, the more complex extent (``N + 1``, of 'longer') is checked against the simpler
    (``N_2``, y's), so the result keeps the simpler shape."""
    model = make_model(
        [helper.make_node("Concat", ["x", "row"], ["longer"], axis=0, name="grow"),
         helper.make_node("Add", ["longer", "y"], ["z"], name="add")],
        [("x", ["N", 4]), ("y", ["N", 4])], ["z"], {"row": rand(1, 4, seed=3)},
    )
    module = from_onnx(model)
    assert [str(p.struct_info) for p in module.main.params] == ["Tensor((N, 4), float32)", "Tensor((N_2, 4), float32)"]
    assert module.attrs["size_var_names"] == {"N_2": "N"}
    feeds = {"x": rand(2, 4, seed=1), "y": rand(3, 4, seed=2)}
    assert_close(run_module(module, feeds)[0], onnxruntime_outputs(model, feeds)[0])
    with pytest.raises(InputShapeError, match=r"^Add node 'add': dimension 0 of input 0 \('longer'\) is 3, expected 2"):
        run_module(module, {"x": rand(2, 4, seed=1), "y": rand(2, 4, seed=2)})


def test_output_annotations_are_ignored() -> None:
    """An exporter's impossible output shape (and dtype-less outputs) changes nothing."""
    model = make_model([helper.make_node("Relu", ["x"], ["y"], name="relu")], [("x", ["n", 4])],
                       [("y", [7, "unrelated", 0, 2])])
    module = from_onnx(model)
    assert str(module.main.ret_struct_info) == "Tensor((n, 4), float32)"


def test_a_zero_dim_value_is_an_empty_dim_as_onnxruntime_takes_it() -> None:
    model = make_model([helper.make_node("Relu", ["x"], ["y"], name="relu")], [("x", [0, 4])], ["y"])
    (x,) = from_onnx(model).main.params
    assert str(x.struct_info) == "Tensor((0, 4), float32)"
    with pytest.raises(Exception, match="Expected: 0"):
        onnxruntime_outputs(model, {"x": rand(3, 4)})


@pytest.mark.slow
def test_the_cli_takes_a_bound_by_the_models_name(tmp_path: Path) -> None:
    onnx.save(annotated_model(), str(tmp_path / "model.onnx"))
    done = subprocess.run([sys.executable, "-m", "relaxweb", "build", str(tmp_path / "model.onnx"), "-o",
                           str(tmp_path / "dist"), "--bound", "batch_size*2=5", "--bound", "nothing=3"],
                          capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines()[-1] == (
        "error: --bound names nothing, but the model's symbolic variables are: x_dim0, x_dim1, x_dim2, "
        "p2o.DynamicDimension.0, unk__214, batch_size*2, N, batch size"
    )


# Shape subgraphs in each exporter's style ---------------------------------------------------------


def tf2onnx_flatten():
    """Reshape(x, Concat([-1], Slice(Cast(Shape(x), int32), 1, INT64_MAX))) in int32, cast back."""
    nodes = [
        helper.make_node("Shape", ["x"], ["shape"]),
        helper.make_node("Cast", ["shape"], ["shape32"], to=TensorProto.INT32),
        helper.make_node("Slice", ["shape32", "one", "end"], ["rest"]),
        helper.make_node("ReduceProd", ["rest"], ["inner"], keepdims=1),
        helper.make_node("Concat", ["minus_one", "inner"], ["target32"], axis=0),
        helper.make_node("Cast", ["target32"], ["target"], to=TensorProto.INT64),
        helper.make_node("Reshape", ["x", "target"], ["y"]),
    ]
    initializers = {**ints(one=[1], end=[INT64_MAX]), "minus_one": np.array([-1], np.int32)}
    return make_model(nodes, [("x", ["unk__0", "unk__1", 8])], ["y"], initializers)


def jax2tf_float_shape():
    """jax2tf computes a size in float: Cast(Shape) -> Gather -> Mul by 0.5 -> Cast back."""
    nodes = [
        helper.make_node("Shape", ["x"], ["shape"]),
        helper.make_node("Cast", ["shape"], ["shape_f"], to=TensorProto.FLOAT),
        helper.make_node("Gather", ["shape_f", "one"], ["cols"], axis=0),
        helper.make_node("Mul", ["cols", "half"], ["half_cols"]),
        helper.make_node("Cast", ["half_cols"], ["half_cols_i"], to=TensorProto.INT64),
        helper.make_node("Unsqueeze", ["half_cols_i", "zero_v"], ["half_v"]),
        helper.make_node("Concat", ["minus_one", "half_v"], ["target"], axis=0),
        helper.make_node("Reshape", ["x", "target"], ["y"]),
    ]
    initializers = {**ints(one=1, zero_v=[0], minus_one=[-1]), "half": np.array(0.5, np.float32)}
    return make_model(nodes, [("x", ["N", 6])], ["y"], initializers)


def paddle_gather_concat():
    """paddle2onnx: Shape -> Gather([0]) (1-D) and Gather(1) -> Unsqueeze -> Concat -> Reshape."""
    nodes = [
        helper.make_node("Shape", ["x"], ["shape"]),
        helper.make_node("Gather", ["shape", "first"], ["batch"], axis=0),
        helper.make_node("Gather", ["shape", "second"], ["rows"], axis=0),
        helper.make_node("Unsqueeze", ["rows", "zero_v"], ["rows_v"]),
        helper.make_node("Concat", ["batch", "rows_v", "minus_one"], ["target"], axis=0),
        helper.make_node("Reshape", ["x", "target"], ["y"]),
    ]
    return make_model(nodes, [("x", ["p2o.DynamicDimension.0", "p2o.DynamicDimension.1", 2, 3])], ["y"],
                      ints(first=[0], second=1, zero_v=[0], minus_one=[-1]))


def computed_sizes():
    """ConstantOfShape, Range, Expand and Tile of sizes taken from x's shape."""
    nodes = [
        helper.make_node("Shape", ["x"], ["shape"]),
        helper.make_node("ConstantOfShape", ["shape"], ["ones"],
                         value=helper.make_tensor("one", TensorProto.FLOAT, [1], [1.0])),
        helper.make_node("Gather", ["shape", "one"], ["cols"], axis=0),
        helper.make_node("Range", ["zero", "cols", "one"], ["positions"]),
        helper.make_node("Cast", ["positions"], ["positions_f"], to=TensorProto.FLOAT),
        helper.make_node("Expand", ["positions_f", "shape"], ["grid"]),
        helper.make_node("Slice", ["shape", "zero_v", "one_v"], ["rows_v"]),
        helper.make_node("Concat", ["rows_v", "one_v"], ["repeats"], axis=0),
        helper.make_node("Tile", ["row", "repeats"], ["tiled"]),
        helper.make_node("Add", ["x", "ones"], ["shifted"]),
        helper.make_node("Mul", ["shifted", "grid"], ["scaled"]),
        helper.make_node("Add", ["scaled", "tiled"], ["y"]),
    ]
    initializers = {**ints(zero=0, one=1, zero_v=[0], one_v=[1])}
    return make_model(nodes, [("x", ["rows", "cols"]), ("row", [1, "cols"])], ["y"], initializers)


def float_size_arithmetic():
    """Resize to (Floor(H / 4.0), Ceil(W / 4.0)) computed in float, cast back to int64."""
    nodes = [
        helper.make_node("Shape", ["x"], ["shape"]),
        helper.make_node("Cast", ["shape"], ["shape_f"], to=TensorProto.FLOAT),
        helper.make_node("Gather", ["shape_f", "two"], ["height"], axis=0),
        helper.make_node("Gather", ["shape_f", "three"], ["width"], axis=0),
        helper.make_node("Div", ["height", "four"], ["height_q"]),
        helper.make_node("Div", ["width", "four"], ["width_q"]),
        helper.make_node("Floor", ["height_q"], ["height_f"]),
        helper.make_node("Ceil", ["width_q"], ["width_c"]),
        helper.make_node("Concat", ["height_f", "width_c"], ["sizes_f"], axis=0),
        helper.make_node("Cast", ["sizes_f"], ["sizes_hw"], to=TensorProto.INT64),
        helper.make_node("Concat", ["batch_channels", "sizes_hw"], ["sizes"], axis=0),
        helper.make_node("Resize", ["x", "", "", "sizes"], ["y"], mode="nearest"),
    ]
    initializers = {**ints(two=[2], three=[3], batch_channels=[1, 2]), "four": np.array(4.0, np.float32)}
    return make_model(nodes, [("x", [1, 2, "H", "W"])], ["y"], initializers)


def shape_start_end_and_size():
    """Shape(start=1, end=-1) and Size: Reshape(x, [Shape(x, end=1), ReduceProd(Shape(x, 1, -1)), -1])
    and x flattened to Size(x), added to Range(Size(x))."""
    nodes = [
        helper.make_node("Shape", ["x"], ["head"], end=1),
        helper.make_node("Shape", ["x"], ["middle"], start=1, end=-1),
        helper.make_node("ReduceProd", ["middle"], ["middle_size"], keepdims=1),
        helper.make_node("Concat", ["head", "middle_size", "minus_one"], ["target"], axis=0),
        helper.make_node("Reshape", ["x", "target"], ["y"]),
        helper.make_node("Size", ["x"], ["count"]),
        helper.make_node("Reshape", ["count", "minus_one"], ["count_v"]),
        helper.make_node("Reshape", ["x", "count_v"], ["flat"]),
        helper.make_node("Range", ["zero_f", "count_f", "one_f"], ["ramp"]),
        helper.make_node("Cast", ["count"], ["count_f"], to=TensorProto.FLOAT),
        helper.make_node("Add", ["flat", "ramp"], ["z"]),
    ]
    nodes = nodes[:8] + [nodes[9], nodes[8], nodes[10]]
    initializers = {**ints(minus_one=[-1]), "zero_f": np.array(0.0, np.float32), "one_f": np.array(1.0, np.float32)}
    return make_model(nodes, [("x", ["b", "h", "w", 3])], ["y", "z"], initializers, opset=18)


def squeeze_min_max_where():
    """Squeeze/Unsqueeze of shape values; the rows kept: Where(n > 3, Min(n, 4), Max(n, 2))."""
    nodes = [
        helper.make_node("Shape", ["x"], ["shape"]),
        helper.make_node("Slice", ["shape", "zero_v", "one_v"], ["rows_v"]),
        helper.make_node("Squeeze", ["rows_v", "zero_v"], ["rows"]),
        helper.make_node("Min", ["rows", "four"], ["at_most_4"]),
        helper.make_node("Max", ["rows", "two"], ["at_least_2"]),
        helper.make_node("Greater", ["rows", "three"], ["long"]),
        helper.make_node("Where", ["long", "at_most_4", "at_least_2"], ["kept"]),
        helper.make_node("Unsqueeze", ["kept", "zero_v"], ["kept_v"]),
        helper.make_node("Slice", ["x", "zero_v", "kept_v", "zero_v"], ["y"]),
    ]
    return make_model(nodes, [("x", ["n", 3])], ["y"], ints(zero_v=[0], one_v=[1], two=2, three=3, four=4))


# model -> (its maker, the annotations of its results, the input shapes it runs at)
EXPORTER_MODELS = {
    "tf2onnx flatten": (tf2onnx_flatten, ["Tensor((unk__0, unk__1 * 8), float32)"],
                        [{"x": (2, 3, 8)}, {"x": (1, 5, 8)}]),
    "jax2tf float shape": (jax2tf_float_shape, ["Tensor((N * 2, 3), float32)"],
                           [{"x": (2, 6)}, {"x": (5, 6)}]),
    "paddle gather concat": (paddle_gather_concat,
                             ["Tensor((p2o_DynamicDimension_0, p2o_DynamicDimension_1, 6), float32)"],
                             [{"x": (2, 3, 2, 3)}, {"x": (4, 1, 2, 3)}]),
    "computed sizes": (computed_sizes, ["Tensor((rows, cols), float32)"],
                       [{"x": (2, 3), "row": (1, 3)}, {"x": (4, 1), "row": (1, 1)}]),
    "float size arithmetic": (float_size_arithmetic, ["Tensor((1, 2, H // 4, (W + 3) // 4), float32)"],
                              [{"x": (1, 2, 16, 8)}, {"x": (1, 2, 18, 13)}, {"x": (1, 2, 7, 5)}]),
    "shape start end and size": (shape_start_end_and_size,
                                 ["Tensor((b, h * w, 3), float32)", "Tensor((b * h * w * 3), float32)"],
                                 [{"x": (2, 3, 4, 3)}, {"x": (1, 5, 2, 3)}]),
    "squeeze min max where": (squeeze_min_max_where, [None], [{"x": (1, 3)}, {"x": (3, 3)}, {"x": (6, 3)}]),
}


@pytest.mark.parametrize("name", EXPORTER_MODELS)
def test_shape_subgraphs_stay_symbolic(name: str) -> None:
    make, annotations, runs = EXPORTER_MODELS[name]
    model = make()
    module = from_onnx(model)
    results = module.main.ret_struct_info
    results = results.fields if hasattr(results, "fields") else (results,)
    for result, expected in zip(results, annotations):
        if expected is not None:
            assert str(result) == expected
    inputs = {n for shapes in runs for n in shapes}
    # only the inputs' own variables: nothing fresh, nothing read back
    assert set(symbolic_vars(module.main)) == {str(d) for p in module.main.params for d in p.struct_info.shape
                                              if not str(d).isdigit()}, inputs
    # no tensor cast (a prim check reads nothing back: a -1 inferred where the other dims are not 0)
    assert not any(isinstance(b, MatchCast) and not isinstance(b.value, PrimValue) for b in module.main.bindings())
    for index, shapes in enumerate(runs):
        feeds = feeds_of(shapes, seed=index)
        for actual, expected in zip(run_module(module, feeds), onnxruntime_outputs(model, feeds)):
            assert_close(actual, expected)


def test_kept_rows_are_a_symbolic_select() -> None:
    (result,) = [from_onnx(squeeze_min_max_where()).main.ret_struct_info]
    assert str(result.shape[1]) == "3" and "n" in str(result.shape[0])


@pytest.mark.parametrize("name", EXPORTER_MODELS)
def test_shape_subgraphs_match_onnxruntime_from_one_build(backend, name: str, tmp_path: Path) -> None:
    make, _, runs = EXPORTER_MODELS[name]
    model = make()
    session = load_bundle(build_once(model, tmp_path / "dist"), backend)
    assert session.manifest["read_slots"] == 0  # nothing read back from the GPU
    for index, shapes in enumerate(runs):
        feeds = feeds_of(shapes, seed=index)
        for actual, expected in zip(session.run(feeds).values(), onnxruntime_outputs(model, feeds)):
            assert_close(actual, expected)


def test_a_ratio_is_never_taken_for_an_integer() -> None:
    """H / 3 (not floored) used as a Reshape target is not an integer: not folded into the
    target; the shape is then data (read back at run time), never a bogus constant."""
    nodes = [
        helper.make_node("Shape", ["x"], ["shape"]),
        helper.make_node("Cast", ["shape"], ["shape_f"], to=TensorProto.FLOAT),
        helper.make_node("Div", ["shape_f", "three"], ["thirds"]),
        helper.make_node("Add", ["x", "thirds"], ["y"]),
    ]
    model = make_model(nodes, [("x", ["n"])], ["y"], {"three": np.array(3.0, np.float32)})
    module = from_onnx(model)
    for n in (3, 4):
        feeds = {"x": rand(n, seed=n)}
        assert_close(run_module(module, feeds)[0], onnxruntime_outputs(model, feeds)[0])


def test_a_refuted_fact_in_shape_arithmetic_is_an_error_not_a_wrong_shape() -> None:
    with pytest.raises(RelaxwebError, match="cannot infer -1"):
        from_onnx(make_model([helper.make_node("Reshape", ["x", "target"], ["y"], name="r")], [("x", [3, 5])], ["y"],
                             ints(target=[4, -1])))


def test_a_sentinel_slice_end_is_clamped_not_taken_for_the_extent(backend, tmp_path: Path) -> None:
    """jax2tf + tf2onnx slice "to the end" with an end of 1000000000 on a symbolic dim, then
    reshape to a shape computed from the input: the extent is min(1000000000, n), never the
    constant 1000000000 (which made the Reshape's element counts differ)."""
    nodes = [
        helper.make_node("Slice", ["x", "zero_v", "sentinel", "zero_v"], ["all_rows"]),
        helper.make_node("Shape", ["x"], ["shape"]),
        helper.make_node("Reshape", ["all_rows", "shape"], ["y"], name="back"),
    ]
    model = make_model(nodes, [("x", ["n", 4])], ["y"], ints(zero_v=[0], sentinel=[1_000_000_000]))
    module = from_onnx(model)
    sliced = next(b.var for b in module.main.bindings() if "all_rows" in b.var.name)
    assert str(sliced.struct_info) == "Tensor((min(1000000000, n), 4), float32)"
    session = load_bundle(build_once(model, tmp_path / "dist"), backend)
    for n in (1, 3):
        feeds = {"x": rand(n, 4, seed=n)}
        assert_close(run_module(module, feeds)[0], onnxruntime_outputs(model, feeds)[0])
        assert_close(session.run(feeds)["y"], onnxruntime_outputs(model, feeds)[0])


# Facts the published models assume (silero-vad's, checked against the real files by hand) --------


def silero_decoder_model():
    """What Silero VAD's decoder does with a symbolic dim that is 1 for every valid input:
    ``frames = (n + 320) // 512`` (a strided conv's output length), squeezed directly, and
    through torch's export of ``squeeze(dim)``: If(dim == 1, Squeeze, Identity), whose branches
    differ in rank."""
    frames = [helper.make_node("Unsqueeze", ["x", "one_axis"], ["x3"], name="channels"),
              helper.make_node("Conv", ["x3", "kernel"], ["conv"], name="frames", strides=[512], pads=[0, 320]),
              helper.make_node("Squeeze", ["conv", "two"], ["squeezed"], name="squeeze"),
              helper.make_node("Shape", ["conv"], ["shape"], name="shape"),
              helper.make_node("Gather", ["shape", "two_scalar"], ["frame_count"], name="frame_count", axis=0),
              helper.make_node("Equal", ["frame_count", "one"], ["is_one"], name="is_one")]
    then_branch = helper.make_graph([helper.make_node("Squeeze", ["conv", "two"], ["then_out"])], "then", [],
                                    [helper.make_tensor_value_info("then_out", TensorProto.FLOAT, None)])
    else_branch = helper.make_graph([helper.make_node("Identity", ["conv"], ["else_out"])], "else", [],
                                    [helper.make_tensor_value_info("else_out", TensorProto.FLOAT, None)])
    nodes = [*frames,
             helper.make_node("If", ["is_one"], ["maybe_squeezed"], name="squeeze_if_one", then_branch=then_branch,
                              else_branch=else_branch),
             helper.make_node("Add", ["squeezed", "maybe_squeezed"], ["y"], name="sum")]
    constants = {"one_axis": np.array([1], np.int64), "two": np.array([2], np.int64),
                 "two_scalar": np.array(2, np.int64), "one": np.array(1, np.int64),
                 "kernel": rand(4, 1, 576, seed=3)}
    return make_model(nodes, [("x", ["batch", "n"])], ["y"], constants, opset=17)


@pytest.mark.gpu
def test_a_dim_a_model_needs_to_be_1_is_checked_at_run_time(tmp_path) -> None:
    """Squeeze of ``(n + 320) // 512`` and an If on it being 1 whose branches differ in rank:
    built (the then-branch taken), matching onnxruntime where the dim is 1, and stopping with
    one error naming the node where it is not."""
    model = silero_decoder_model()
    relaxweb.build(model, tmp_path / "bundle")
    session = relaxweb.load(tmp_path / "bundle")
    for batch, n in ((1, 512), (3, 300)):
        feeds = {"x": rand(batch, n, seed=n)}
        assert_close(session.run(feeds)["y"], onnxruntime_outputs(model, feeds)[0], err_msg=f"n = {n}")
    with pytest.raises(InputShapeError, match=r"^Squeeze node 'squeeze': dimension 2 of input 0 \('conv'\) is 2, expected 1"):
        session.run({"x": rand(1, 1024)})


@pytest.mark.gpu
def test_a_recurrent_state_with_its_own_batch_name_is_checked_at_run_time(tmp_path) -> None:
    """Silero VAD leaves its state's batch unnamed ([2, ?, 128]) and its input's too: the
    LSTM's initial state batch is checked against the input's at run time, not refused."""
    hidden = 8
    node = helper.make_node("LSTM", ["x", "W", "R", "", "", "h0"], ["y"], name="rnn", hidden_size=hidden)
    weights = {"W": rand(1, 4 * hidden, 5, seed=1), "R": rand(1, 4 * hidden, hidden, seed=2)}
    model = make_model([node], [("x", ["steps", "batch", 5]), ("h0", [1, None, hidden])], ["y"], weights, opset=14)
    relaxweb.build(model, tmp_path / "bundle")
    session = relaxweb.load(tmp_path / "bundle")
    feeds = {"x": rand(4, 2, 5, seed=3), "h0": rand(1, 2, hidden, seed=4)}
    assert_close(session.run(feeds)["y"], onnxruntime_outputs(model, feeds)[0])
    with pytest.raises(InputShapeError, match=r"^LSTM node 'rnn': dimension 1 of input 5 \('h0'\) is 3, expected 2"):
        session.run({"x": rand(4, 2, 5, seed=3), "h0": rand(1, 3, hidden, seed=4)})
