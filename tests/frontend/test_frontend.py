"""Tests of the ONNX frontend: symbolic inputs, each converter against onnxruntime (through
the reference interpreter), and the errors a user sees for models relaxweb cannot read."""

from __future__ import annotations

from functools import partial
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from examples.make_mlp import make_mlp
from relaxweb.compiler import compile_module
from relaxweb.errors import InputShapeError, RelaxwebError, UnsupportedModelError
from relaxweb.frontend import from_onnx, import_onnx_file
from relaxweb.ir import Call, Constant, MatchCast, SizeVar, TensorStructInfo
from relaxweb.ir.interpreter import run_host_function
from relaxweb.ir.interpreter import run_module
from tests import helpers
from tests.helpers import F32_LOOSE, assert_close




@pytest.fixture(scope="module")
def mlp_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("mlp") / "mlp.onnx"
    onnx.save(make_mlp(), str(path))
    return path


# float32 models; outputs have no declared shape (onnxruntime infers it); checked by ONNX
make_model = partial(helpers.make_model, check=True)


def run_onnxruntime(model: onnx.ModelProto, inputs: dict[str, np.ndarray]) -> list[np.ndarray]:
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, inputs)


rand = partial(helpers.rand, low=-2.0, high=2.0)  # this file's data: uniform in [-2, 2)


# The example MLP -----------------------------------------------------------------------------


def test_import_mlp_annotations(mlp_path: Path) -> None:
    module = import_onnx_file(mlp_path)
    main = module.main
    assert module.attrs["source"] == "mlp.onnx"
    assert module.attrs["opset"] == 17
    assert main.input_names == ("x",)
    assert main.output_names == ("probabilities",)
    (x,) = main.params
    assert x.struct_info == TensorStructInfo((SizeVar("batch"), 64), "float32")
    assert str(x.struct_info) == "Tensor((batch, 64), float32)"
    assert str(main.ret_struct_info) == "Tensor((batch, 10), float32)"
    ops = [b.value.op for b in main.bindings()]
    assert ops == ["matmul", "add", "relu", "matmul", "add", "softmax"]
    constants = [a for b in main.bindings() for a in b.value.args if isinstance(a, Constant)]
    assert [c.name for c in constants] == ["fc1.weight", "fc1.bias", "fc2.weight_T", "fc2.bias"]
    # Gemm's transB=1 on a constant is folded at import
    assert constants[2].data.shape == (128, 10)
    text = str(module)
    assert 'def main(x: Tensor((batch, 64), "float32")) -> Tensor((batch, 10), "float32"):' in text
    assert 'probabilities: Tensor((batch, 10), "float32") = softmax(logits, axes=[1])' in text


@pytest.mark.parametrize("batch", [1, 6])
def test_mlp_interpreter_matches_onnxruntime(mlp_path: Path, batch: int) -> None:
    model = onnx.load(str(mlp_path))
    x = rand(batch, 64, seed=batch)
    (expected,) = run_onnxruntime(model, {"x": x})
    (actual,) = run_module(import_onnx_file(mlp_path), {"x": x})
    assert_close(actual, expected)


# Symbolic inputs -----------------------------------------------------------------------------


def test_shared_dim_param_is_one_size_var() -> None:
    model = make_model(
        [helper.make_node("Add", ["x", "y"], ["z"], name="add")],
        [("x", ["n", 4]), ("y", ["n", 4])],
        ["z"],
    )
    main = from_onnx(model).main
    x, y = main.params
    assert x.struct_info.shape[0] == y.struct_info.shape[0] == SizeVar("n")
    assert str(main.ret_struct_info) == "Tensor((n, 4), float32)"


def test_missing_dim_param_gets_a_fresh_var() -> None:
    model = make_model(
        [helper.make_node("Relu", ["x"], ["y"], name="relu")],
        [("x", [None, 4, None])],
        ["y"],
    )
    (x,) = from_onnx(model).main.params
    assert str(x.struct_info) == "Tensor((x_dim0, 4, x_dim2), float32)"


def test_two_missing_dim_params_are_different_vars() -> None:
    """Unnamed dims are separate variables; the Add needs them equal, which is checked at run
    time (a match_cast naming the node), not refused and not assumed silently."""
    model = make_model(
        [helper.make_node("Add", ["x", "y"], ["z"], name="the_add")],
        [("x", [None, 4]), ("y", [None, 4])],
        ["z"],
    )
    module = from_onnx(model)
    x, y = module.main.params
    assert x.struct_info.shape[0] != y.struct_info.shape[0]
    (cast,) = [b for b in module.main.bindings() if isinstance(b, MatchCast)]
    assert cast.reason == "Add node 'the_add': dimension 0 of input 1 ('y')"
    (z,) = run_module(module, {"x": rand(3, 4, seed=1), "y": rand(3, 4, seed=2)})
    assert z.shape == (3, 4)
    with pytest.raises(InputShapeError, match=r"^Add node 'the_add': dimension 0 of input 1 \('y'\) is 2, expected 3"):
        run_module(module, {"x": rand(3, 4, seed=1), "y": rand(2, 4, seed=2)})


def test_dim_param_names_are_sanitized() -> None:
    model = make_model(
        [helper.make_node("Relu", ["x"], ["y"], name="relu")],
        [("x", ["batch size", "2n"])],
        ["y"],
    )
    (x,) = from_onnx(model).main.params
    assert [d.name for d in x.struct_info.shape] == ["batch_size", "d2n"]


# Reshape -------------------------------------------------------------------------------------


def reshape_model(input_shape: list, target: list[int], check: bool = True) -> onnx.ModelProto:
    return make_model(
        [helper.make_node("Reshape", ["x", "shape"], ["y"], name="reshape")],
        [("x", input_shape)],
        ["y"],
        {"shape": np.array(target, dtype=np.int64)},
        check=check,
    )


@pytest.mark.parametrize(
    ("target", "expected"),
    [
        ([0, -1], "Tensor((n, 768), float32)"),
        ([-1, 64], "Tensor((n * 12, 64), float32)"),
        ([0, 3, 4, -1], "Tensor((n, 3, 4, 64), float32)"),
        ([0, 0, 8, 8], "Tensor((n, 12, 8, 8), float32)"),
    ],
)
def test_reshape_resolves_zero_and_minus_one_symbolically(target: list[int], expected: str) -> None:
    main = from_onnx(reshape_model(["n", 12, 64], target)).main
    assert str(main.ret_struct_info) == expected


def test_reshape_minus_one_that_is_not_provably_divisible() -> None:
    """``3n`` elements into ``(2, -1)``: inferred as ``3n // 2``, and the divisibility is
    checked at run time (``count_checked``); a count never divisible is refused."""
    module = from_onnx(reshape_model(["n", 3], [2, -1]))
    assert str(module.main.ret_struct_info) == "Tensor((2, n * 3 // 2), float32)"
    assert module.main.bindings()[-1].value.attrs["count_checked"] is True
    (y,) = run_module(module, {"x": rand(4, 3, seed=1)})
    assert y.shape == (2, 6)
    with pytest.raises(InputShapeError, match=r"Reshape node 'reshape': the element count of input 0 \('x'\) is 9, "
                                              r"expected 8"):
        run_module(module, {"x": rand(3, 3, seed=1)})
    with pytest.raises(RelaxwebError, match=r"reshape: cannot infer -1 \(target dim 1\): 15 elements are never a "
                                            r"multiple of 4"):
        from_onnx(reshape_model([3, 5], [4, -1], check=False))


def test_reshape_zero_beyond_the_input_rank_is_a_user_error() -> None:
    """A 0 in the target copies the input dim at that position; past the input's rank the
    model is invalid, which is the user's problem (RelaxwebError), not a crash."""
    with pytest.raises(RelaxwebError, match="Reshape node 'reshape': target dim 2 is 0"):
        from_onnx(reshape_model(["n", 4], [2, 0, 0, -1], check=False))


@pytest.mark.gpu
def test_reshape_with_a_run_time_target_runs_in_the_interpreter_and_on_the_gpu(tmp_path) -> None:
    """A target shape given as data: the rank is deduced and the result's dims are fresh size
    variables (a match_cast), the interpreter runs it, and the GPU build reads the target back
    mid-run."""
    model = make_model(
        [helper.make_node("Reshape", ["x", "shape"], ["y"], name="reshape")],
        [("x", ["n", 4])],
        ["y"],
        check=False,
    )
    model.graph.input.append(helper.make_tensor_value_info("shape", TensorProto.INT64, [2]))
    module = from_onnx(model)
    assert str(module.main.bindings()[-1].var.struct_info) == "Tensor((y_dim0, y_dim1), float32)"
    x = rand(3, 4, seed=5)
    (y,) = run_module(module, {"x": x, "shape": np.array([2, 6], np.int64)})
    np.testing.assert_array_equal(y, x.reshape(2, 6))
    from tests.gpu_kernels import run_compiled

    (y,) = run_compiled(module, {"x": x, "shape": np.array([2, 6], np.int64)}, tmp_path / "bundle")
    np.testing.assert_array_equal(y, x.reshape(2, 6))


def test_reshape_target_from_a_constant_node() -> None:
    """The converter's own message says a Constant node is an accepted source of the target."""
    model = make_model(
        [
            helper.make_node("Constant", [], ["shape"], name="shape_const",
                             value=numpy_helper.from_array(np.array([0, -1], np.int64))),
            helper.make_node("Reshape", ["x", "shape"], ["y"], name="reshape"),
        ],
        [("x", ["n", 3, 4])],
        ["y"],
    )
    module = from_onnx(model)
    assert str(module.main.ret_struct_info) == "Tensor((n, 12), float32)"


# Gemm ----------------------------------------------------------------------------------------

GEMM_CASES = {
    "plain": dict(attrs={}, b_shape=(8, 5), c_shape=(5,)),
    "transB_alpha_beta": dict(attrs=dict(transB=1, alpha=0.5, beta=2.0), b_shape=(5, 8), c_shape=(5,)),
    "transA_transB": dict(attrs=dict(transA=1, transB=1, alpha=1.5), b_shape=(5, 8), c_shape=(1, 5)),
    "no_c": dict(attrs=dict(alpha=3.0), b_shape=(8, 5), c_shape=None),
    "beta_zero": dict(attrs=dict(beta=0.0), b_shape=(8, 5), c_shape=(5,)),
}


def gemm_model(attrs: dict, b_shape: tuple, c_shape: tuple | None, b_is_input: bool = False,
               c_is_input: bool = False) -> tuple[onnx.ModelProto, list]:
    x_shape = [8, "batch"] if attrs.get("transA") else ["batch", 8]
    inputs = [("x", x_shape)]
    initializers = {}
    node_inputs = ["x", "B"]
    if b_is_input:
        inputs.append(("B", list(b_shape)))
    else:
        initializers["B"] = rand(*b_shape, seed=11)
    if c_shape is not None:
        node_inputs.append("C")
        if c_is_input:
            inputs.append(("C", ["batch", 5]))
        else:
            initializers["C"] = rand(*c_shape, seed=12)
    node = helper.make_node("Gemm", node_inputs, ["y"], name="gemm", **attrs)
    return make_model([node], inputs, ["y"], initializers), inputs


def feeds_for(inputs: list, batch: int) -> dict[str, np.ndarray]:
    return {
        name: rand(*(batch if d == "batch" else d for d in shape), seed=index + 3 * batch)
        for index, (name, shape) in enumerate(inputs)
    }


@pytest.mark.parametrize("case", sorted(GEMM_CASES))
@pytest.mark.parametrize("batch", [1, 7])
def test_gemm_matches_onnxruntime(case: str, batch: int) -> None:
    model, inputs = gemm_model(**GEMM_CASES[case])
    feeds = feeds_for(inputs, batch)
    (expected,) = run_onnxruntime(model, feeds)
    (actual,) = run_module(from_onnx(model), feeds)
    assert actual.shape == expected.shape == (batch, 5)
    assert_close(actual, expected, F32_LOOSE)  # K = 8 terms up to |alpha * x * B| ~ 12


@pytest.mark.parametrize("batch", [2, 5])
def test_gemm_with_computed_b_and_c_matches_onnxruntime(batch: int) -> None:
    model, inputs = gemm_model(dict(transB=1, alpha=2.0, beta=0.5), (5, 8), (5,), b_is_input=True, c_is_input=True)
    feeds = feeds_for(inputs, batch)
    module = from_onnx(model)
    ops = [b.value.op for b in module.main.bindings()]
    assert ops == ["transpose", "multiply", "multiply", "matmul", "add"]
    (expected,) = run_onnxruntime(model, feeds)
    (actual,) = run_module(module, feeds)
    assert_close(actual, expected, F32_LOOSE)  # K = 8 terms up to |alpha * x * B| ~ 12


def test_gemm_folds_constant_transpose_and_scaling() -> None:
    model, _ = gemm_model(**GEMM_CASES["transB_alpha_beta"])
    bindings = from_onnx(model).main.bindings()
    assert [b.value.op for b in bindings] == ["matmul", "add"]  # nothing left to compute on B or C
    b = bindings[0].value.args[1]
    assert isinstance(b, Constant) and b.data.shape == (8, 5)
    assert_close(b.data, rand(5, 8, seed=11).T * 0.5)


# Softmax -------------------------------------------------------------------------------------


def softmax_model(opset: int, **attrs) -> onnx.ModelProto:
    return make_model(
        [helper.make_node("Softmax", ["x"], ["y"], name="softmax", **attrs)],
        [("x", ["batch", 3, 4])],
        ["y"],
        opset=opset,
    )


@pytest.mark.parametrize(
    ("opset", "attrs", "axes"),
    [
        (11, {}, [1, 2]),  # default axis 1, flattened: normalise over dims 1 and 2
        (11, {"axis": 2}, [2]),
        (11, {"axis": -2}, [1, 2]),
        (13, {}, [2]),  # default axis -1
        (13, {"axis": -1}, [2]),
        (13, {"axis": 2}, [2]),
    ],
)
@pytest.mark.parametrize("batch", [1, 3])
def test_softmax_opset_semantics(opset: int, attrs: dict, axes: list[int], batch: int) -> None:
    model = softmax_model(opset, **attrs)
    module = from_onnx(model)
    (binding,) = module.main.bindings()
    assert binding.value.attrs["axes"] == axes
    x = rand(batch, 3, 4, seed=batch, low=-4, high=4)
    (expected,) = run_onnxruntime(model, {"x": x})
    (actual,) = run_module(module, {"x": x})
    assert_close(actual, expected)


# Every supported op against onnxruntime ------------------------------------------------------

W = rand(6, 5, seed=21)
V = rand(5, seed=22)
POSITIVE = rand(5, seed=23, low=0.5, high=2.0)

# name -> (nodes, inputs, initializers); the output is always "y"
OP_CASES: dict[str, tuple[list, list, dict]] = {
    "MatMul": ([helper.make_node("MatMul", ["x", "W"], ["y"], name="mm")], [("x", ["batch", 6])], {"W": W}),
    "MatMul_3d_by_2d": ([helper.make_node("MatMul", ["x", "W"], ["y"], name="mm")], [("x", ["batch", 3, 6])], {"W": W}),
    "MatMul_batched_inputs": (
        [helper.make_node("MatMul", ["x", "z"], ["y"], name="mm")],
        [("x", ["batch", 2, 6]), ("z", ["batch", 6, 3])], {},
    ),
    "Gemm": ([helper.make_node("Gemm", ["x", "W", "V"], ["y"], name="gemm", alpha=0.25, beta=-1.0)],
             [("x", ["batch", 6])], {"W": W, "V": V}),
    "Add": ([helper.make_node("Add", ["x", "V"], ["y"], name="add")], [("x", ["batch", 5])], {"V": V}),
    "Add_two_inputs": ([helper.make_node("Add", ["x", "z"], ["y"], name="add")], [("x", ["batch", 5]), ("z", [1, 5])], {}),
    "Sub": ([helper.make_node("Sub", ["V", "x"], ["y"], name="sub")], [("x", ["batch", 5])], {"V": V}),
    "Mul": ([helper.make_node("Mul", ["x", "x"], ["y"], name="mul")], [("x", ["batch", 5])], {}),
    "Div": ([helper.make_node("Div", ["x", "P"], ["y"], name="div")], [("x", ["batch", 5])], {"P": POSITIVE}),
    "Relu": ([helper.make_node("Relu", ["x"], ["y"], name="relu")], [("x", ["batch", 5])], {}),
    "Sigmoid": ([helper.make_node("Sigmoid", ["x"], ["y"], name="sigmoid")], [("x", ["batch", 5])], {}),
    "Tanh": ([helper.make_node("Tanh", ["x"], ["y"], name="tanh")], [("x", ["batch", 5])], {}),
    "Exp": ([helper.make_node("Exp", ["x"], ["y"], name="exp")], [("x", ["batch", 5])], {}),
    "Neg": ([helper.make_node("Neg", ["x"], ["y"], name="neg")], [("x", ["batch", 5])], {}),
    "Softmax": ([helper.make_node("Softmax", ["x"], ["y"], name="softmax")], [("x", ["batch", 5])], {}),
    "Reshape": ([helper.make_node("Reshape", ["x", "S"], ["y"], name="reshape")],
                [("x", ["batch", 3, 4])], {"S": np.array([0, -1, 2], np.int64)}),
    "Reshape_flatten_batch": ([helper.make_node("Reshape", ["x", "S"], ["y"], name="reshape")],
                              [("x", ["batch", 3, 4])], {"S": np.array([-1, 4], np.int64)}),
    "Transpose": ([helper.make_node("Transpose", ["x"], ["y"], name="transpose", perm=[2, 0, 1])],
                  [("x", ["batch", 3, 4])], {}),
    "Transpose_default": ([helper.make_node("Transpose", ["x"], ["y"], name="transpose")], [("x", ["batch", 3, 4])], {}),
    "Identity": ([helper.make_node("Identity", ["x"], ["y"], name="identity")], [("x", ["batch", 5])], {}),
    "Identity_of_weight": ([helper.make_node("Identity", ["V"], ["v2"], name="identity"),
                            helper.make_node("Add", ["x", "v2"], ["y"], name="add")], [("x", ["batch", 5])], {"V": V}),
    "chain": (
        [
            helper.make_node("MatMul", ["x", "W"], ["h"], name="mm"),
            helper.make_node("Add", ["h", "V"], ["h2"], name="add"),
            helper.make_node("Tanh", ["h2"], ["h3"], name="tanh"),
            helper.make_node("Reshape", ["h3", "S"], ["h4"], name="reshape"),
            helper.make_node("Transpose", ["h4"], ["h5"], name="transpose", perm=[0, 2, 1]),
            helper.make_node("Sigmoid", ["h5"], ["h6"], name="sigmoid"),
            helper.make_node("Mul", ["h6", "h5"], ["h7"], name="mul"),
            helper.make_node("Softmax", ["h7"], ["y"], name="softmax"),
        ],
        [("x", ["batch", 6])], {"W": W, "V": V, "S": np.array([0, 5, 1], np.int64)},
    ),
}


def op_case_model(case: str) -> tuple[onnx.ModelProto, list]:
    nodes, inputs, initializers = OP_CASES[case]
    return make_model(nodes, inputs, ["y"], initializers), inputs


@pytest.mark.parametrize("case", sorted(OP_CASES))
def test_op_interpreter_matches_onnxruntime(case: str) -> None:
    model, inputs = op_case_model(case)
    module = from_onnx(model)
    for batch in (1, 4):
        feeds = feeds_for(inputs, batch)
        (expected,) = run_onnxruntime(model, feeds)
        (actual,) = run_module(module, feeds)
        assert actual.shape == expected.shape, (case, batch)
        assert actual.dtype == np.float32
        assert_close(actual, expected, err_msg=f"{case} at batch {batch}")


@pytest.mark.parametrize("case", sorted(OP_CASES))
def test_op_after_the_whole_pipeline_matches_onnxruntime(case: str) -> None:
    """legalize_ops + plan_memory + lower_shapes_to_host, run by the host-function interpreter."""
    model, inputs = op_case_model(case)
    module = compile_module(from_onnx(model), {"batch": 8})
    for batch in (1, 4):
        feeds = feeds_for(inputs, batch)
        (expected,) = run_onnxruntime(model, feeds)
        (actual,) = run_host_function(module.main, module.programs, feeds)
        assert_close(actual, expected, err_msg=f"{case} at batch {batch}")


def test_supported_op_list_is_what_the_tests_cover() -> None:
    from relaxweb.frontend.converters import CONVERTERS

    covered = {node.op_type for nodes, _, _ in OP_CASES.values() for node in nodes}
    covered.add("Constant")  # test_reshape_target_from_a_constant_node
    # the original skeleton's ops; later families have their own test files
    original = {"MatMul", "Gemm", "Add", "Sub", "Mul", "Div", "Relu", "Sigmoid", "Tanh", "Softmax", "Reshape",
                "Transpose", "Identity"}
    assert original <= covered
    assert original <= set(CONVERTERS)


# Models relaxweb cannot read -----------------------------------------------------------------


def test_unsupported_ops_are_all_listed_at_once() -> None:
    # Standard-domain ops relaxweb does not plan to support (string processing).
    model = make_model(
        [
            helper.make_node("StringNormalizer", ["x"], ["a"], name="normalize_a"),
            helper.make_node("TfIdfVectorizer", ["a"], ["b"], name="tfidf_1"),
            helper.make_node("Relu", ["b"], ["c"], name="relu_ok"),
            helper.make_node("StringNormalizer", ["c"], ["y"], name="normalize_b"),
        ],
        [("x", ["batch", 8])],
        ["y"],
        check=False,
    )
    with pytest.raises(UnsupportedModelError) as caught:
        from_onnx(model)
    message = str(caught.value)
    assert "relu_ok" not in message
    assert message == (
        "the model uses 2 unsupported op type(s): StringNormalizer (nodes: normalize_a, normalize_b); "
        "TfIdfVectorizer (nodes: tfidf_1)"
    )


def test_unsupported_custom_domain_and_unnamed_node() -> None:
    model = make_model(
        [
            helper.make_node("Relu", ["x"], ["a"], name="relu"),
            helper.make_node("FusedGemm", ["a"], ["y"], domain="com.microsoft"),
        ],
        [("x", ["batch", 4])],
        ["y"],
        check=False,
    )
    with pytest.raises(UnsupportedModelError, match=r"com\.microsoft\.FusedGemm \(nodes: #1 \(unnamed\)\)"):
        from_onnx(model)


def test_truncated_file(mlp_path: Path, tmp_path: Path) -> None:
    data = mlp_path.read_bytes()
    truncated = tmp_path / "truncated.onnx"
    truncated.write_bytes(data[: len(data) // 2])
    with pytest.raises(RelaxwebError) as caught:
        import_onnx_file(truncated)
    message = str(caught.value)
    assert message.startswith(f"{truncated}: not a readable ONNX model")
    assert "\n" not in message


def test_text_file(tmp_path: Path) -> None:
    text = tmp_path / "notes.onnx"
    text.write_text("this is not a model\nbut some notes\n")
    with pytest.raises(RelaxwebError) as caught:
        import_onnx_file(text)
    assert str(caught.value).startswith(f"{text}: not a")
    assert "ONNX model" in str(caught.value)


def test_empty_file_missing_file_and_directory(tmp_path: Path) -> None:
    empty = tmp_path / "empty.onnx"
    empty.write_bytes(b"")
    with pytest.raises(RelaxwebError, match="not an ONNX model"):
        import_onnx_file(empty)
    with pytest.raises(RelaxwebError, match="no such file"):
        import_onnx_file(tmp_path / "missing.onnx")
    with pytest.raises(RelaxwebError, match="is a directory"):
        import_onnx_file(tmp_path)


def test_input_without_a_shape_is_rejected() -> None:
    model = make_model([helper.make_node("Relu", ["x"], ["y"], name="relu")], [("x", None)], ["y"], check=False)
    with pytest.raises(UnsupportedModelError, match="input 'x': its rank is unknown"):
        from_onnx(model)


def test_deduction_errors_name_the_node() -> None:
    model = make_model(
        [helper.make_node("MatMul", ["x", "W"], ["y"], name="bad_matmul")],
        [("x", ["batch", 5])],
        ["y"],
        {"W": W},  # 6 x 5: K mismatch
        check=False,
    )
    with pytest.raises(RelaxwebError) as caught:
        from_onnx(model)
    message = str(caught.value)
    assert message.startswith("MatMul node 'bad_matmul' (binding 'y'): matmul: reduction dims differ")


def test_imported_calls_carry_deduced_annotations() -> None:
    model, _ = op_case_model("chain")
    for binding in from_onnx(model).main.bindings():
        assert isinstance(binding.value, Call)
        assert binding.var.struct_info == binding.value.struct_info
    assert str(from_onnx(model).main.ret_struct_info) == "Tensor((batch, 1, 5), float32)"


def test_unsupported_ops_inside_if_branches_are_listed() -> None:
    then_branch = helper.make_graph([helper.make_node("TfIdfVectorizer", ["x"], ["t"], name="inner")], "then", [],
                                    [helper.make_tensor_value_info("t", TensorProto.FLOAT, None)])
    else_branch = helper.make_graph([helper.make_node("Relu", ["x"], ["e"], name="relu")], "else", [],
                                    [helper.make_tensor_value_info("e", TensorProto.FLOAT, None)])
    model = make_model([helper.make_node("If", ["c"], ["y"], then_branch=then_branch, else_branch=else_branch, name="if")],
                       [("c", TensorProto.BOOL, []), ("x", ["n"])], ["y"], check=False)
    with pytest.raises(UnsupportedModelError, match=r"^the model uses 1 unsupported op type\(s\): TfIdfVectorizer \(nodes: inner\)$"):
        from_onnx(model)
