"""Facts deduction needs but cannot prove, checked at run time instead of refused.

1. Deciding: provably equal extents agree, provably unequal ones are refused with the node
   named, and the rest become an ``AssumptionError`` that says which argument and dim to
   check against what (the more complex extent is the one checked).
2. Each kind of fact through the ONNX frontend (broadcasting, Concat, MatMul's inner dim,
   Einsum, Reshape's element count and its -1): the model imports with a ``match_cast``
   whose reason names the node and the input, matches onnxruntime at a valid shape, and a
   shape that breaks the fact stops with one error naming the node and both values.
3. The host function: a check the bounds prove is no step; one they refute is a build error.
4. A feature-pyramid network and a U-Net exported with torch.onnx (``tests/pyramid_models.py``'s
   exports, committed in ``tests/data/pyramids/``): one build each, on wgpu, matching
   onnxruntime at every valid size; an invalid size is ``InputShapeError`` in Python, exit 2
   from the CLI, a rejected promise in Chromium.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import helper

import relaxweb
from relaxweb.compiler import compile_module
from relaxweb.errors import InputShapeError, RelaxwebError
from relaxweb.frontend import from_onnx
from relaxweb.ir import FunctionBuilder, IntImm, IRModule, SizeVar, TensorStructInfo
from relaxweb.ir.expr import MatchCast, ShapeExpr, Var
from relaxweb.ir.host import HostCheck, walk_steps
from relaxweb.ir.interpreter import run_module
from relaxweb.ir.op_registry import AssumptionError, DeductionError
from relaxweb.ops import call_op
from relaxweb.ops.common import DimOf, require_equal
from tests.helpers import F32_LOOSE, MODEL, assert_close, in_the_browser, load_bundle, make_model, onnxruntime_outputs, rand

ROOT = Path(__file__).resolve().parents[2]
n, m, h = SizeVar("n"), SizeVar("m"), SizeVar("h")


def casts(module: IRModule) -> list[MatchCast]:
    return [b for b in module.main.bindings() if isinstance(b, MatchCast)]




# Deciding --------------------------------------------------------------------------------------


def test_provably_equal_provably_unequal_and_unknown() -> None:
    require_equal(DimOf(n * 4 // 4, 0, 0), DimOf(n, 1, 0), "equal")  # provably equal: nothing to check
    for a, b in [(IntImm(3), IntImm(4)), (n, n + 1), ((h + 15) // 16, (h + 15) // 16 + 1)]:
        with pytest.raises(DeductionError, match="^never") as caught:
            require_equal(DimOf(a, 0, 0), DimOf(b, 1, 2), "never")
        assert not isinstance(caught.value, AssumptionError)
    with pytest.raises(AssumptionError) as caught:
        require_equal(DimOf((h + 15) // 16, 0, 2), DimOf((h + 31) // 32 * 2, 1, 2), "maybe")
    needed = caught.value  # the more complex extent is checked against the simpler one
    assert (needed.argument, needed.dim, needed.actual, needed.expected) == (1, 2, (h + 31) // 32 * 2, (h + 15) // 16)
    with pytest.raises(AssumptionError) as caught:
        require_equal(DimOf(n, 0, 1), DimOf(m, 1, 0), "tie")
    assert (caught.value.argument, caught.value.dim, caught.value.expected) == (1, 0, n)  # a tie: the later one
    with pytest.raises(AssumptionError) as caught:
        require_equal(DimOf(n, 0, 0), DimOf(IntImm(100), 1, 0), "constant")
    assert (caught.value.argument, caught.value.expected) == (0, IntImm(100))  # a constant is kept
    with pytest.raises(AssumptionError) as caught:
        require_equal(DimOf(m * 2, None, 0), DimOf(n, 0, 0), "target")
    assert (caught.value.argument, caught.value.expected) == (0, m * 2)  # a target shape is never the one cast
    with pytest.raises(DeductionError, match="^neither"):
        require_equal(DimOf(m, None, 0), DimOf(n, None, 1), "neither")


def test_without_a_builder_checking_assumptions_it_is_a_deduction_error() -> None:
    x = Var("x", TensorStructInfo((n, 4), "float32"))
    y = Var("y", TensorStructInfo((m, 4), "float32"))
    with pytest.raises(AssumptionError, match=r"add: cannot broadcast dimension 0 of the result: n vs m "
                                              r"\(dim 0 of argument 0 vs dim 0 of argument 1\) \(not provably equal"):
        call_op("add", x, y)


def test_the_builder_binds_the_check_and_deduces_again() -> None:
    builder = FunctionBuilder("main")
    image = builder.add_param("image", TensorStructInfo((1, 4, (h + 15) // 16), "float32"))
    up = builder.add_param("up", TensorStructInfo((1, 4, (h + 31) // 32 * 2), "float32"))
    target = builder.emit_op("broadcast_to", up, ShapeExpr((1, 4, m)), name_hint="expanded")
    total = builder.emit_op("add", image, up, name_hint="total")
    again = builder.emit_op("multiply", image, up, name_hint="again")
    bindings = builder.bindings
    assert [type(b).__name__ for b in bindings] == ["MatchCast", "VarBinding", "MatchCast", "VarBinding", "VarBinding"]
    assert bindings[0].reason == "binding 'expanded': dimension 2 of argument 0"
    assert str(target.struct_info) == "Tensor((1, 4, m), float32)"
    assert bindings[2].reason == "binding 'total': dimension 2 of argument 1"
    assert str(bindings[2].struct_info) == "Tensor((1, 4, (h + 15) // 16), float32)"
    assert str(total.struct_info) == str(again.struct_info) == "Tensor((1, 4, (h + 15) // 16), float32)"
    assert bindings[4].value.args[1] is bindings[2].var  # the same check of the same value is bound once


def test_a_reshape_count_is_checked_as_a_prim_value() -> None:
    builder = FunctionBuilder("main")
    x = builder.add_param("x", TensorStructInfo((n, 3), "float32"))
    y = builder.emit_op("reshape", x, ShapeExpr((m, 3)), name_hint="y")
    check, call = builder.bindings
    assert str(check.value.value) == "n * 3" and str(check.struct_info) == "Prim(m * 3)"
    assert check.reason == "binding 'y': the element count of argument 0"
    assert call.value.attrs == {"count_checked": True}
    assert str(y.struct_info) == "Tensor((m, 3), float32)"


# Each kind of fact through the frontend --------------------------------------------------------


def _einsum_model():
    return make_model([helper.make_node("Einsum", ["a", "b"], ["y"], equation="ij,kj->ik", name="pairs")],
                      [("a", ["n", "k"]), ("b", ["m", "k2"])], ["y"])


CASES = {
    # name: (model, a valid feed's shapes, an invalid feed's shapes, the error's start)
    "broadcast": (
        lambda: make_model([helper.make_node("Add", ["x", "y"], ["z"], name="/fpn/Add")],
                           [("x", ["batch", 4]), ("y", ["rows", 4])], ["z"]),
        {"x": (3, 4), "y": (3, 4)}, {"x": (3, 4), "y": (2, 4)},
        "Add node '/fpn/Add': dimension 0 of input 1 ('y') is 2, expected 3 (batch; batch from input 'x' dimension 0)",
    ),
    "concat": (
        lambda: make_model([helper.make_node("Concat", ["x", "y"], ["z"], axis=1, name="cat")],
                           [("x", ["n", 2]), ("y", ["m", 5])], ["z"]),
        {"x": (3, 2), "y": (3, 5)}, {"x": (3, 2), "y": (4, 5)},
        "Concat node 'cat': dimension 0 of input 1 ('y') is 4, expected 3 (n; n from input 'x' dimension 0)",
    ),
    "matmul": (
        lambda: make_model([helper.make_node("MatMul", ["a", "b"], ["c"], name="mm")],
                           [("a", ["n", "k"]), ("b", ["j", 4])], ["c"]),
        {"a": (2, 5), "b": (5, 4)}, {"a": (2, 5), "b": (6, 4)},
        "MatMul node 'mm': dimension 0 of input 1 ('b') is 6, expected 5 (k; k from input 'a' dimension 1)",
    ),
    "einsum": (
        _einsum_model, {"a": (2, 3), "b": (4, 3)}, {"a": (2, 3), "b": (4, 2)},
        "Einsum node 'pairs': dimension 1 of input 1 ('b') is 2, expected 3 (k; k from input 'a' dimension 1)",
    ),
    "reshape count": (
        lambda: make_model([helper.make_node("Reshape", ["x", "shape"], ["y"], name="flat")],
                           [("x", ["n", 6])], ["y"], {"shape": np.array([2, 3, 4], np.int64)}),
        {"x": (4, 6)}, {"x": (5, 6)},
        "Reshape node 'flat': the element count of input 0 ('x') is 30, expected 24",
    ),
    "reshape -1": (
        lambda: make_model([helper.make_node("Reshape", ["x", "shape"], ["y"], name="heads")],
                           [("x", ["batch", "seq", 12])], ["y"], {"shape": np.array([0, -1, 8], np.int64)}),
        {"x": (2, 6, 12)}, {"x": (2, 5, 12)},
        "Reshape node 'heads': the element count of input 0 ('x') is 120, expected 112 (batch * (seq * 3 // 2) * 8; "
        "batch from input 'x' dimension 0, seq from input 'x' dimension 1)",
    ),
}


@pytest.mark.parametrize("case", CASES)
def test_each_kind_of_fact_is_checked_in_the_interpreter(case: str) -> None:
    make, valid, invalid, error = CASES[case]
    model = make()
    module = from_onnx(model)
    # (a -1 beside a symbolic dim is also checked for the other dims being 0: tests/e2e/test_numeric_edge_cases.py)
    checks = [cast for cast in casts(module) if "inferred only where" not in cast.reason]
    assert len(checks) == 1 and checks[0].reason.startswith(error.split(" is ")[0])
    feeds = {name: rand(shape, seed=i) for i, (name, shape) in enumerate(valid.items())}
    for actual, expected in zip(run_module(module, feeds), onnxruntime_outputs(model, feeds)):
        assert_close(actual, expected)
    with pytest.raises(InputShapeError) as caught:
        run_module(module, {name: rand(shape, seed=i) for i, (name, shape) in enumerate(invalid.items())})
    assert str(caught.value).startswith(error.split(" (")[0])


@pytest.mark.parametrize("case", CASES)
def test_each_kind_of_fact_is_checked_by_the_host_module(case: str, device, tmp_path: Path) -> None:
    make, valid, invalid, error = CASES[case]
    model = make()
    onnx.save(model, str(tmp_path / "model.onnx"))
    session = relaxweb.build(tmp_path / "model.onnx", tmp_path / "dist").load()
    feeds = {name: rand(shape, seed=i) for i, (name, shape) in enumerate(valid.items())}
    for actual, expected in zip(session.run(feeds).values(), onnxruntime_outputs(model, feeds)):
        assert_close(actual, expected, F32_LOOSE)
    with pytest.raises(InputShapeError) as caught:
        session.run({name: rand(shape, seed=i) for i, (name, shape) in enumerate(invalid.items())})
    assert str(caught.value).startswith(error)
    assert "\n" not in str(caught.value)


def test_provably_unequal_extents_are_refused_with_the_node_named() -> None:
    """``n`` against ``n + 1`` (x next to x with one more row): no input can satisfy it."""
    model = make_model(
        [helper.make_node("Concat", ["x", "row"], ["longer"], axis=0, name="grow"),
         helper.make_node("Add", ["x", "longer"], ["z"], name="mismatch")],
        [("x", ["n", 4])], ["z"], {"row": np.zeros((1, 4), np.float32)},
    )
    with pytest.raises(RelaxwebError, match=r"^Add node 'mismatch' \(binding 'z'\): add: cannot broadcast dimension 0 "
                                            r"of the result: n vs n \+ 1 \(dim 0 of argument 0 vs dim 0 of argument 1\)$"):
        from_onnx(model)


# The host function: checks the bounds decide ----------------------------------------------------


def _truncated_positions_model() -> onnx.ModelProto:
    """``positions[:min(seq, 16)] + x``: equal shapes exactly when seq <= 16."""
    nodes = [
        helper.make_node("Shape", ["x"], ["shape"], name="shape"),
        helper.make_node("Gather", ["shape", "zero"], ["seq"], axis=0, name="seq"),
        helper.make_node("Min", ["seq", "sixteen"], ["rows"], name="rows"),
        helper.make_node("Unsqueeze", ["rows", "zeros"], ["end"], name="end"),
        helper.make_node("Slice", ["positions", "zeros", "end", "zeros"], ["used"], name="used"),
        helper.make_node("Add", ["x", "used"], ["y"], name="add_positions"),
    ]
    initializers = {"zero": np.array(0, np.int64), "sixteen": np.array(16, np.int64), "zeros": np.array([0], np.int64),
                    "positions": rand(16, 4, seed=9)}
    return make_model(nodes, [("x", ["seq", 4])], ["y"], initializers)


def _assumption_checks(module: IRModule) -> list[HostCheck]:
    return [s for s in walk_steps(module.main.steps) if isinstance(s, HostCheck) and s.message.startswith("Add node")]


def test_a_check_the_bounds_prove_costs_nothing() -> None:
    module = from_onnx(_truncated_positions_model())
    (cast,) = casts(module)
    assert cast.reason == "Add node 'add_positions': dimension 0 of input 1 ('used')"
    (check,) = _assumption_checks(compile_module(module))
    assert check.message == ("Add node 'add_positions': dimension 0 of input 1 ('used') is {value}, expected "
                             "{expected} (seq; seq from input 'x' dimension 0)")
    assert _assumption_checks(compile_module(module, {"seq": 16})) == []  # min(seq, 16) == seq for seq <= 16
    (y,) = run_module(module, {"x": rand(5, 4, seed=1)})
    assert_close(y, onnxruntime_outputs(_truncated_positions_model(), {"x": rand(5, 4, seed=1)})[0])


def test_a_check_the_bounds_refute_is_a_build_error() -> None:
    model = make_model([helper.make_node("Add", ["x", "w"], ["y"], name="add_w")], [("x", ["n", 4])], ["y"],
                       {"w": rand(100, 4, seed=1)})
    module = from_onnx(model)  # x's rows are checked to be 100
    assert casts(module)[0].reason == "Add node 'add_w': dimension 0 of input 0 ('x')"
    with pytest.raises(RelaxwebError, match=r"^Add node 'add_w': dimension 0 of input 0 \('x'\) is n, which is never "
                                            r"100 for any input within the bounds \(n <= 64\)$"):
        compile_module(module, {"n": 64})


# A feature pyramid and a U-Net exported with torch.onnx -------------------------------------------


@pytest.fixture(scope="module")
def pyramid_models() -> Path:
    """The folder of the models as torch.onnx wrote them (committed: tests/data/pyramids/README.md)."""
    return ROOT / "tests" / "data" / "pyramids"


def _image(height: int, width: int) -> np.ndarray:
    return rand(1, 3, height, width, seed=height * 1000 + width)


# (model, sizes that satisfy its fact, a size that breaks it, the error)
PYRAMIDS = {
    "fpn_legacy": ([(64, 64), (96, 128), (128, 96)], (48, 64),
                   "Add node '/Add': dimension 2 of input 1 ('/Resize_output_0') is 4, expected 3 "
                   "((height + 15) // 16; height from input 'image' dimension 2)"),
    "fpn_dynamo": ([(64, 64), (96, 128), (128, 96)], (48, 64),
                   "Add node 'node_add_52': dimension 2 of input 1 ('upsample_nearest2d') is 4, expected 3 "
                   "((height + 15) // 16; height from input 'image' dimension 2)"),
    "unet_legacy": ([(64, 64), (96, 128), (30, 18)], (33, 18),
                    "Concat node '/Concat': dimension 2 of input 0 ('/up/ConvTranspose_output_0') is 34, "
                    "expected 33 (height; height from input 'image' dimension 2)"),
}


@pytest.fixture(scope="module")
def pyramid_bundles(pyramid_models: Path, tmp_path_factory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("pyramid_bundles")
    return {name: relaxweb.build(pyramid_models / f"{name}.onnx", folder / name).path for name in PYRAMIDS}


@pytest.mark.slow
@pytest.mark.parametrize("name", PYRAMIDS)
def test_pyramids_build_once_and_match_onnxruntime(backend, name: str, pyramid_models: Path, pyramid_bundles) -> None:
    sizes, wrong, error = PYRAMIDS[name]
    model_path = str(pyramid_models / f"{name}.onnx")
    session = load_bundle(pyramid_bundles[name], backend)
    reference = ort.InferenceSession(model_path, providers=["CPUExecutionProvider"])
    for height, width in sizes:
        image = _image(height, width)
        assert_close(session.run({"image": image})["out"], reference.run(None, {"image": image})[0], MODEL)
    with pytest.raises(InputShapeError) as caught:
        session.run({"image": _image(*wrong)})
    assert str(caught.value) == error
    with pytest.raises(Exception):  # noqa: B017 - onnxruntime refuses it too, with its own error
        reference.run(None, {"image": _image(*wrong)})


@pytest.mark.slow
def test_the_cli_exits_2_with_one_line_naming_the_node_and_both_values(pyramid_bundles, tmp_path: Path) -> None:
    inputs = tmp_path / "in.npz"
    np.savez(inputs, image=_image(48, 64))
    done = subprocess.run([sys.executable, "-m", "relaxweb", "run", str(pyramid_bundles["fpn_legacy"]),
                           "--inputs", str(inputs)], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [f"error: {PYRAMIDS['fpn_legacy'][2]}"]




@pytest.mark.slow
@in_the_browser
def test_the_browser_rejects_the_run_with_the_same_message(pyramid_models: Path, pyramid_bundles) -> None:
    bundle = pyramid_bundles["fpn_legacy"]
    image = _image(64, 64)
    expected = ort.InferenceSession(str(pyramid_models / "fpn_legacy.onnx"), providers=["CPUExecutionProvider"]).run(
        None, {"image": image})[0]
    assert_close(relaxweb.run_in_browser(bundle, {"image": image})["out"], expected, MODEL)
    with pytest.raises(InputShapeError) as caught:
        relaxweb.run_in_browser(bundle, {"image": _image(48, 64)})
    assert str(caught.value) == PYRAMIDS["fpn_legacy"][2]
