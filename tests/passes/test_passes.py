"""Tests of the passes: legalize_ops, plan_memory, lower_shapes_to_host (and the pipeline).

Each pass is checked twice: on the structure of its result, and by running the module
before and after through the reference interpreter on the same inputs.  Tests against
expected modules written as IR text are in tests/passes/test_pass_rewrites.py.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from relaxweb.errors import InputShapeError, RelaxwebError, UnsupportedModelError
from relaxweb.ir import (
    AllocStorage, AllocTensor, Binary, Buffer, Call, CallTIR, CallTIRInto, Constant, FloatImm,
    FunctionBuilder, IRModule, IntImm, Load, Reduce, ShapeExpr, SizeVar, TensorProgram,
    TensorStructInfo, Unary, Var,
)
from relaxweb.ir.expr import BindingBlock, DataflowBlock, DataflowVar, Function, SeqExpr, VarBinding
from relaxweb.ir.host import HostFunction
from relaxweb.ir.interpreter import run_host_function, run_shape_checks
from relaxweb.ir.interpreter import run_module
from relaxweb.ir.symbolic import evaluate, format_expr, prove_equal
from relaxweb.ir.well_formed import WellFormedError
from relaxweb.ops import call_op
from relaxweb.passes import (
    PIPELINE, PassContext, legalize_ops, lower_shapes_to_host, pipeline, plan_memory, run_pipeline,
)
from tests.helpers import assert_close, rand

n = SizeVar("n")
m = SizeVar("m")
I0, I1 = SizeVar("i0_"), SizeVar("i1_")


def module_of(builder: FunctionBuilder, outputs: list[Var], names: list[str], **attrs) -> IRModule:
    return IRModule({"main": builder.finish(outputs, names)}, attrs=dict(attrs))


def mlp_module() -> IRModule:
    """x[n, 4] -> matmul -> add -> relu -> matmul -> add -> softmax."""
    builder = FunctionBuilder("main")
    x = builder.add_param("x", TensorStructInfo((n, 4), "float32"))
    h = builder.emit(call_op("matmul", x, Constant(rand(4, 8, seed=1), "w1")), "h")
    h = builder.emit(call_op("add", h, Constant(rand(8, seed=2), "b1")), "h_bias")
    h = builder.emit(call_op("relu", h), "h_relu")
    h = builder.emit(call_op("matmul", h, Constant(rand(8, 3, seed=3), "w2")), "logits")
    h = builder.emit(call_op("add", h, Constant(rand(3, seed=4), "b2")), "logits_bias")
    y = builder.emit(call_op("softmax", h, axes=[1]), "y", output=True)
    return module_of(builder, [y], ["y"])


def chain_module() -> IRModule:
    """Four elementwise ops in a chain: relu -> tanh -> exp -> negative."""
    builder = FunctionBuilder("main")
    x = builder.add_param("x", TensorStructInfo((n, 4), "float32"))
    a = builder.emit(call_op("relu", x), "a")
    b = builder.emit(call_op("tanh", a), "b")
    c = builder.emit(call_op("exp", b), "c")
    d = builder.emit(call_op("negative", c), "d", output=True)
    return module_of(builder, [d], ["d"])


def all_call_values(function: Function) -> list:
    return [b.value for b in function.bindings()]


# legalize_ops --------------------------------------------------------------------------------


def test_legalize_replaces_every_call() -> None:
    before = mlp_module()
    after = legalize_ops(before)
    values = all_call_values(after.main)
    assert not any(isinstance(v, Call) for v in values)
    assert all(isinstance(v, CallTIR) for v in values)
    # softmax becomes three programs, each call keeps its output annotation
    assert [v.program for v in values] == [
        "matmul", "add", "relu", "matmul1", "add1", "softmax_max", "softmax_sum", "softmax_normalize",
    ]
    assert set(after.programs) == {v.program for v in values}
    for binding in after.main.bindings():
        assert binding.var.struct_info == binding.value.struct_info
        program = after.programs[binding.value.program]
        assert prove_equal(program.output.shape[0], binding.value.struct_info.shape[0])
        assert len(program.inputs) == len(binding.value.args)
    assert dict(values[0].size_var_values) == {"n": n}
    # the input module is unchanged
    assert all(isinstance(v, Call) for v in all_call_values(before.main))
    assert before.programs == {}


def test_legalize_deduplicates_identical_programs() -> None:
    builder = FunctionBuilder("main")
    x = builder.add_param("x", TensorStructInfo((n, 4), "float32"))
    y = builder.add_param("y", TensorStructInfo((n, 4), "float32"))
    a = builder.emit(call_op("add", x, y), "a")
    b = builder.emit(call_op("add", a, x), "b")  # same shapes: the same program
    c = builder.emit(call_op("relu", b), "c")
    d = builder.emit(call_op("relu", c), "d")
    e = builder.emit(call_op("add", d, Constant(rand(4), "bias")), "e", output=True)  # [n,4] + [4]: another
    after = legalize_ops(module_of(builder, [e], ["e"]))
    assert [v.program for v in all_call_values(after.main)] == ["add", "add", "relu", "relu", "add1"]
    assert sorted(after.programs) == ["add", "add1", "relu"]
    assert after.programs["add1"].inputs[1].shape == (IntImm(4),)


def test_legalize_reuses_and_avoids_programs_already_in_the_module() -> None:
    relu = legalize_ops(chain_module()).programs["relu"]
    builder = FunctionBuilder("main")
    x = builder.add_param("x", TensorStructInfo((n, 4), "float32"))
    r = builder.emit(call_op("relu", x), "r")
    t = builder.emit(call_op("tanh", r), "t", output=True)
    clash = TensorProgram("tanh", relu.inputs, relu.output, relu.axes, FloatImm(7.0))  # same name, other body
    before = IRModule({"main": builder.finish([t], ["t"])}, programs={"relu": relu, "tanh": clash})
    after = legalize_ops(before)
    assert [v.program for v in all_call_values(after.main)] == ["relu", "tanh1"]
    assert after.programs["tanh"] is clash
    assert isinstance(after.programs["tanh1"].body, Unary)


@pytest.mark.parametrize("rows", [1, 6])
def test_legalize_preserves_results(rows: int) -> None:
    before = mlp_module()
    after = legalize_ops(before)
    x = rand(rows, 4, seed=rows)
    (expected,) = run_module(before, {"x": x})
    (actual,) = run_module(after, {"x": x})
    assert_close(actual, expected)


def test_legalize_reshape_and_transpose_preserve_results() -> None:
    builder = FunctionBuilder("main")
    x = builder.add_param("x", TensorStructInfo((n, 6, 4), "float32"))
    r = builder.emit(call_op("reshape", x, ShapeExpr((n * 3, 8))), "r")
    t = builder.emit(call_op("transpose", r, axes=[1, 0]), "t")
    s = builder.emit(call_op("reshape", t, ShapeExpr((4, 2, n * 3))), "s", output=True)
    before = module_of(builder, [s], ["s"])
    after = legalize_ops(before)
    assert [v.program for v in all_call_values(after.main)] == ["reshape", "transpose", "reshape1"]
    for rows in (1, 5):
        x_value = rand(rows, 6, 4, seed=rows)
        expected = x_value.reshape(rows * 3, 8).T.reshape(4, 2, rows * 3)
        np.testing.assert_array_equal(run_module(before, {"x": x_value})[0], expected)
        np.testing.assert_array_equal(run_module(after, {"x": x_value})[0], expected)


# plan_memory ---------------------------------------------------------------------------------


def storages_of(function: Function) -> dict[Var, AllocStorage]:
    return {b.var: b.value for b in function.bindings() if isinstance(b.value, AllocStorage)}


def tensor_storage(function: Function) -> dict[Var, Var]:
    return {b.var: b.value.storage for b in function.bindings() if isinstance(b.value, AllocTensor)}


def assert_no_call_shares_storage_between_input_and_output(function: Function) -> None:
    placed = tensor_storage(function)
    for binding in function.bindings():
        if isinstance(binding.value, CallTIRInto):
            output_storage = placed[binding.value.output]
            for arg in binding.value.args:
                if isinstance(arg, Var) and arg in placed:
                    assert placed[arg] is not output_storage, (
                        f"{binding.value.output.name} is written into the storage of its input {arg.name}"
                    )


def test_plan_chain_of_four_uses_two_storages() -> None:
    planned = plan_memory(legalize_ops(chain_module()))
    main = planned.main
    storages = storages_of(main)
    assert len(storages) == 2
    assert [format_expr(s.size) for s in storages.values()] == ["n * 16", "n * 16"]
    placed = tensor_storage(main)
    names = {var.name: storage for var, storage in placed.items()}
    first, second = list(storages)
    assert [names[k] for k in "abcd"] == [first, second, first, second]
    assert_no_call_shares_storage_between_input_and_output(main)
    # the storages come first, then (alloc_tensor, call_tir_into) per call
    kinds = [type(b.value).__name__ for b in main.bindings()]
    assert kinds == ["AllocStorage"] * 2 + ["AllocTensor", "CallTIRInto"] * 4
    assert not isinstance(main.body.blocks[0], DataflowBlock)
    assert isinstance(main.body.blocks[0], BindingBlock)


def test_plan_mlp_storages() -> None:
    planned = plan_memory(legalize_ops(mlp_module()))
    main = planned.main
    sizes = [format_expr(s.size) for s in storages_of(main).values()]
    # h (n*32) and h_bias (n*32) are both alive at once; later tensors reuse their storages
    # (logits: a provably larger one), softmax_sum and y need new ones because everything
    # they read is still alive.
    assert sizes == ["n * 32", "n * 32", "n * 4", "n * 12"]
    assert_no_call_shares_storage_between_input_and_output(main)
    storage_index = {var: index for index, var in enumerate(storages_of(main))}
    placed = {var.name: storage_index[storage] for var, storage in tensor_storage(main).items()}
    assert placed == {
        "h": 0, "h_bias": 1, "h_relu": 0, "logits": 1, "logits_bias": 0,
        "softmax_max": 1, "softmax_sum": 2, "y": 3,
    }


def test_plan_tensor_never_lives_in_a_storage_too_small() -> None:
    planned = plan_memory(legalize_ops(mlp_module()))
    sizes = {var: s.size for var, s in storages_of(planned.main).items()}
    for binding in planned.main.bindings():
        if isinstance(binding.value, AllocTensor):
            info = binding.value.struct_info
            for rows in (0, 1, 7, 100):
                needed = int(np.prod([evaluate(d, {"n": rows}) for d in info.shape])) * 4
                assert evaluate(sizes[binding.value.storage], {"n": rows}) >= needed


def test_plan_grows_a_free_storage_to_the_larger_size() -> None:
    builder = FunctionBuilder("main")
    x = builder.add_param("x", TensorStructInfo((n, 8), "float32"))
    a = builder.emit(call_op("matmul", x, Constant(rand(8, 2), "w1")), "a")  # n * 8 bytes
    b = builder.emit(call_op("relu", a), "b")  # n * 8
    c = builder.emit(call_op("matmul", b, Constant(rand(2, 16), "w2")), "c")  # n * 64: reuses a's
    d = builder.emit(call_op("relu", c), "d", output=True)
    planned = plan_memory(legalize_ops(module_of(builder, [d], ["d"])))
    storages = list(storages_of(planned.main).values())
    assert len(storages) == 2
    for storage in storages:
        for rows in (0, 1, 9):
            assert evaluate(storage.size, {"n": rows}) == 64 * rows
    assert_no_call_shares_storage_between_input_and_output(planned.main)


def test_plan_keeps_two_inputs_of_one_call_apart() -> None:
    builder = FunctionBuilder("main")
    x = builder.add_param("x", TensorStructInfo((n, 4), "float32"))
    a = builder.emit(call_op("relu", x), "a")
    b = builder.emit(call_op("tanh", x), "b")
    c = builder.emit(call_op("add", a, b), "c")
    d = builder.emit(call_op("multiply", c, c), "d", output=True)
    planned = plan_memory(legalize_ops(module_of(builder, [d], ["d"])))
    placed = {v.name: s for v, s in tensor_storage(planned.main).items()}
    assert placed["a"] is not placed["b"]
    assert len({placed["a"], placed["b"], placed["c"]}) == 3
    assert placed["d"] in (placed["a"], placed["b"])  # a and b are dead by then
    assert_no_call_shares_storage_between_input_and_output(planned.main)


def test_plan_unused_value_is_freed_at_once() -> None:
    builder = FunctionBuilder("main")
    x = builder.add_param("x", TensorStructInfo((n, 4), "float32"))
    builder.emit(call_op("exp", x), "unused")
    a = builder.emit(call_op("relu", x), "a")
    y = builder.emit(call_op("tanh", a), "y", output=True)
    planned = plan_memory(legalize_ops(module_of(builder, [y], ["y"])))
    assert len(storages_of(planned.main)) == 2
    placed = {v.name: s for v, s in tensor_storage(planned.main).items()}
    assert placed["unused"] is placed["a"]


@pytest.mark.parametrize("rows", [1, 5])
def test_plan_preserves_results(rows: int) -> None:
    legalized = legalize_ops(mlp_module())
    planned = plan_memory(legalized)
    x = rand(rows, 4, seed=10 + rows)
    (expected,) = run_module(legalized, {"x": x})
    (actual,) = run_module(planned, {"x": x})
    assert_close(actual, expected)


def test_interpreter_catches_a_wrong_storage_reuse() -> None:
    """The planned form runs on real bytes: two live tensors in one storage give wrong numbers."""
    builder = FunctionBuilder("main")
    x = builder.add_param("x", TensorStructInfo((n, 4), "float32"))
    a = builder.emit(call_op("relu", x), "a")
    b = builder.emit(call_op("tanh", x), "b")
    c = builder.emit(call_op("add", a, b), "c", output=True)
    legalized = legalize_ops(module_of(builder, [c], ["c"]))
    planned = plan_memory(legalized)
    main = planned.main
    bindings = list(main.bindings())
    a_storage = next(b.value.storage for b in bindings if isinstance(b.value, AllocTensor) and b.var.name == "a")
    broken = [
        VarBinding(b.var, AllocTensor(a_storage, b.value.struct_info))
        if isinstance(b.value, AllocTensor) and b.var.name == "b" else b
        for b in bindings
    ]
    broken_module = planned.with_function(
        Function("main", main.params, SeqExpr((BindingBlock(tuple(broken)),), main.body.body),
                 main.input_names, main.output_names)
    )
    x_value = rand(3, 4, seed=5)
    (good,) = run_module(planned, {"x": x_value})
    (bad,) = run_module(broken_module, {"x": x_value})
    assert_close(good, np.maximum(x_value, 0) + np.tanh(x_value))
    assert not np.allclose(bad, good)


def test_plan_rejects_unlegalized_functions() -> None:
    with pytest.raises(ValueError, match="expects legalized functions"):
        plan_memory(chain_module())


# lower_shapes_to_host ------------------------------------------------------------------------


def two_input_module() -> IRModule:
    """x[n, 4], y[n, m] -> z = (x @ w)[n, 1] + y, and a second output x * 2 + b (b used twice)."""
    builder = FunctionBuilder("main")
    x = builder.add_param("x", TensorStructInfo((n, 4), "float32"))
    y = builder.add_param("y", TensorStructInfo((n, m), "float32"))
    w = Constant(rand(4, 1, seed=7), "w")
    b = Constant(rand(4, seed=8), "b")
    xw = builder.emit(call_op("matmul", x, w), "xw")
    z = builder.emit(call_op("add", xw, y), "z", output=True)
    t = builder.emit(call_op("add", x, b), "t")
    u = builder.emit(call_op("add", t, b), "u", output=True)
    return module_of(builder, [z, u], ["z", "u"])


def lowered(module: IRModule, **bounds: int) -> IRModule:
    with PassContext(bounds=bounds):
        return lower_shapes_to_host(plan_memory(legalize_ops(module)))


def test_host_function_checks() -> None:
    host = lowered(two_input_module(), n=8).main
    assert isinstance(host, HostFunction)
    assert host.symbolic_vars == ("n", "m")
    assert host.bounds == (("n", 8), ("m", None))
    summary = [(c.kind, c.input, c.dim, c.variable, c.code) for c in host.checks]
    assert summary == [
        ("ndim", 0, -1, None, 1),
        ("bind", 0, 0, "n", 0),
        ("bound", 0, 0, "n", 2),
        ("equal", 0, 1, None, 3),
        ("ndim", 1, -1, None, 4),
        ("equal", 1, 0, None, 5),
        ("bind", 1, 1, "m", 0),
        ("bound", 1, 1, "m", 6),
    ]
    messages = {c.code: c.message for c in host.checks if c.code}
    assert messages[1] == "input 'x' has {value} dimensions, expected {expected}"
    assert messages[2] == "input 'x': dimension 0 (n) is {value}, above its bound n <= {expected}"
    assert messages[3] == "input 'x': dimension 1 is {value}, expected {expected}"
    assert messages[5] == "input 'y': dimension 0 is {value}, expected {expected} (n; n from input 'x' dimension 0)"
    assert host.checks[3].expected == IntImm(4)
    assert host.checks[5].expected == n


def test_host_function_storages_weights_and_dispatches() -> None:
    module = lowered(two_input_module(), n=8)
    host = module.main
    roles = [s.role for s in host.storages]
    sizes = [format_expr(s.size) for s in host.storages]
    assert roles[:2] == ["input", "input"]
    assert sizes[:2] == ["n * 16", "m * n * 4"]
    assert [i.storage for i in host.inputs] == [0, 1]
    assert roles.count("output") == 2
    assert [o.name for o in host.outputs] == ["z", "u"]
    assert [format_expr(d) for d in host.outputs[0].shape] == ["n", "m"]
    assert {host.storages[o.storage].role for o in host.outputs} == {"output"}
    # b is used by two calls but is one weight
    assert [w.name for w in host.weights] == ["w", "b"]
    programs = [d.program for d in host.dispatches]
    assert programs == ["matmul", "add", "add1", "add1"]
    first = host.dispatches[0]
    assert [(r.kind, r.index) for r in first.buffers][:2] == [("storage", 0), ("weight", 0)]
    assert format_expr(first.element_count) == "n"
    assert format_expr(host.dispatches[1].element_count) == "m * n"
    assert dict(host.dispatches[1].size_var_values) == {"n": n, "m": m}
    assert first.note == 'xw = matmul(x, const("w"))'
    # every storage a dispatch writes is large enough at a few sizes
    for dispatch in host.dispatches:
        program = module.programs[dispatch.program]
        out_ref = dispatch.buffers[-1]
        assert out_ref.kind == "storage" and out_ref.index >= 2
        for env in ({"n": 1, "m": 1}, {"n": 3, "m": 7}):
            count = evaluate(dispatch.element_count, env)
            assert count == int(np.prod([evaluate(d, env) for d in program.output.shape]))
            assert evaluate(host.storages[out_ref.index].size, env) >= count * 4


@pytest.mark.parametrize(("rows", "cols"), [(1, 1), (3, 5), (8, 2)])
def test_host_function_preserves_results(rows: int, cols: int) -> None:
    before = two_input_module()
    after = lowered(before, n=8)
    inputs = {"x": rand(rows, 4, seed=rows), "y": rand(rows, cols, seed=cols)}
    expected = run_module(before, inputs)
    actual = run_host_function(after.main, after.programs, inputs)
    assert len(actual) == len(expected) == 2
    for a, e in zip(actual, expected):
        assert a.shape == e.shape
        assert_close(a, e)


@pytest.mark.parametrize("rows", [1, 5])
def test_host_function_of_mlp_preserves_results(rows: int) -> None:
    before = mlp_module()
    after = lowered(before)
    x = rand(rows, 4, seed=20 + rows)
    assert_close(run_host_function(after.main, after.programs, {"x": x})[0], run_module(before, {"x": x})[0])


@pytest.mark.parametrize(
    ("shapes", "message"),
    [
        ([(9, 4), (9, 2)], "input 'x': dimension 0 (n) is 9, above its bound n <= 8"),
        ([(2, 4, 1), (2, 2)], "input 'x' has 3 dimensions, expected 2"),
        ([(2, 5), (2, 2)], "input 'x': dimension 1 is 5, expected 4"),
        ([(2, 4), (3, 2)], "input 'y': dimension 0 is 3, expected 2 (n; n from input 'x' dimension 0)"),
        ([(2, 4), (2,)], "input 'y' has 1 dimensions, expected 2"),
    ],
)
def test_host_shape_checks_fail_with_their_message(shapes, message: str) -> None:
    host = lowered(two_input_module(), n=8).main
    with pytest.raises(InputShapeError) as caught:
        run_shape_checks(host, shapes)
    assert str(caught.value) == message


def test_host_shape_checks_bind_the_variables() -> None:
    host = lowered(two_input_module(), n=8).main
    assert run_shape_checks(host, [(8, 4), (8, 100)]) == {"n": 8, "m": 100}
    unbounded = lowered(two_input_module()).main
    assert unbounded.bounds == (("n", None), ("m", None))
    assert run_shape_checks(unbounded, [(1000, 4), (1000, 3)]) == {"n": 1000, "m": 3}


def test_host_dtype_and_missing_input() -> None:
    after = lowered(two_input_module(), n=8)
    with pytest.raises(InputShapeError, match="missing input 'y'"):
        run_host_function(after.main, after.programs, {"x": rand(2, 4)})
    with pytest.raises(InputShapeError, match="input 'x': dtype is float64, expected float32"):
        run_host_function(after.main, after.programs, {"x": np.zeros((2, 4)), "y": rand(2, 2)})


def test_lower_rejects_a_bound_on_an_unknown_variable() -> None:
    with pytest.raises(RelaxwebError) as caught:
        lowered(two_input_module(), n=8, batch=4)
    assert str(caught.value) == "--bound names batch, but the model's symbolic variables are: n, m"


def test_lower_rejects_a_compound_dimension_before_its_variable() -> None:
    builder = FunctionBuilder("main")
    x = builder.add_param("x", TensorStructInfo((n * 2, 4), "float32"))
    y = builder.emit(call_op("relu", x), "y", output=True)
    with pytest.raises(UnsupportedModelError, match="dimension 0 is n \\* 2; size variables must first appear alone"):
        lowered(module_of(builder, [y], ["y"]))


def test_lower_checks_a_compound_dimension_after_its_variable() -> None:
    builder = FunctionBuilder("main")
    x = builder.add_param("x", TensorStructInfo((n, 4), "float32"))
    y = builder.add_param("y", TensorStructInfo((n * 2,), "float32"))
    r = builder.emit(call_op("reshape", x, ShapeExpr((n * 2, 2))), "r")
    y2 = builder.emit(call_op("reshape", y, ShapeExpr((n * 2, 1))), "y2")
    z = builder.emit(call_op("add", r, y2), "z", output=True)
    after = lowered(module_of(builder, [z], ["z"]))
    (check,) = [c for c in after.main.checks if c.kind == "equal" and c.input == 1]
    assert format_expr(check.expected) == "n * 2"
    assert check.message == "input 'y': dimension 0 is {value}, expected {expected} (n * 2; n from input 'x' dimension 0)"
    with pytest.raises(InputShapeError, match="input 'y': dimension 0 is 5, expected 6"):
        run_shape_checks(after.main, [(3, 4), (5,)])
    x_value, y_value = rand(3, 4, seed=1), rand(6, seed=2)
    (actual,) = run_host_function(after.main, after.programs, {"x": x_value, "y": y_value})
    assert_close(actual, x_value.reshape(6, 2) + y_value.reshape(6, 1))


def test_lower_rejects_an_input_returned_as_output() -> None:
    builder = FunctionBuilder("main")
    x = builder.add_param("x", TensorStructInfo((n, 4), "float32"))
    y = builder.emit(call_op("relu", x), "y", output=True)
    module = IRModule({"main": builder.finish([y, x], ["y", "x_again"])})
    with pytest.raises(UnsupportedModelError, match="output 'x_again' must be computed by the model"):
        lowered(module)


def test_lower_rejects_an_unplanned_function() -> None:
    with pytest.raises(ValueError, match="expects a planned function"):
        lower_shapes_to_host(legalize_ops(chain_module()))


# The pipeline --------------------------------------------------------------------------------


def test_pipeline_order_and_steps() -> None:
    optimize = ["canonicalize_bindings", "fold_scalar_constants", "fuse_ops", "share_programs"]
    lower = ["plan_memory", "schedule_programs", "lower_shapes_to_host"]
    assert [p.__name__ for p in PIPELINE] == ["compress_weights", "fuse_attention", "place_kv_caches", "legalize_ops", *optimize,
                                              *lower]
    assert [p.__name__ for p in pipeline(0)] == ["compress_weights", "legalize_ops", *lower]
    with pytest.raises(ValueError, match="opt level 3 does not exist"):
        pipeline(3)
    steps: list[tuple[str, object]] = []
    result = run_pipeline(mlp_module(), on_step=lambda name, module: steps.append((name, type(module.main).__name__)))
    assert steps == [("compress_weights", "Function"), ("fuse_attention", "Function"), ("place_kv_caches", "Function"),
                     ("legalize_ops", "Function"), *((name, "Function") for name in optimize),
                     ("plan_memory", "Function"), ("schedule_programs", "Function"), ("lower_shapes_to_host", "HostFunction")]
    assert isinstance(result.main, HostFunction)
    assert set(result.programs) == {d.program for d in result.main.dispatches}


def test_the_test_suite_verifies_every_pass() -> None:
    assert PassContext.current().verify  # tests/conftest.py turns verification on


def test_run_pipeline_names_the_pass_that_breaks_the_module() -> None:
    def forget_programs(module: IRModule) -> IRModule:
        return module.replace(programs={})

    with PassContext(verify=True):
        with pytest.raises(WellFormedError, match=(
            "pass forget_programs produced an ill-formed module:\n"
            "  main: h: calls program 'matmul', which is not in the module\n"
        )):
            run_pipeline(mlp_module(), [legalize_ops, forget_programs, plan_memory])
    with PassContext(verify=False):  # the same mistake goes unnoticed until something runs the module
        broken = run_pipeline(mlp_module(), [legalize_ops, forget_programs])
    assert broken.programs == {}


def test_run_pipeline_checks_the_module_it_is_given() -> None:
    builder = FunctionBuilder("main")
    x = builder.add_param("x", TensorStructInfo((n, 4), "float32"))
    y = builder.emit(call_op("relu", x), "y", output=True)
    module = module_of(builder, [y], ["y"])
    escaped = DataflowVar("escaped", y.struct_info)  # used outside the dataflow block that would define it
    ill_formed = module.with_function(replace(module.main, body=SeqExpr(module.main.body.blocks, escaped)))
    with PassContext(verify=True), pytest.raises(WellFormedError, match="the module given to the pipeline is ill-formed"):
        run_pipeline(ill_formed)


def test_pass_context_settings_reach_the_passes() -> None:
    assert PassContext.current().bounds == {} and PassContext.current().opt_level == 1
    with PassContext(bounds={"n": 8}, opt_level=0, storage_reuse=False) as outer:
        assert PassContext.current() is outer
        assert [p.__name__ for p in pipeline()] == ["compress_weights", "legalize_ops", "plan_memory",
                                                    "schedule_programs", "lower_shapes_to_host"]
        host = run_pipeline(chain_module()).main
        with PassContext(opt_level=0) as inner:
            assert PassContext.current() is inner
            reused = run_pipeline(chain_module()).main
        assert PassContext.current() is outer
    assert host.bounds == (("n", 8),)  # lower_shapes_to_host enforces the bounds
    assert reused.bounds == (("n", None),)
    assert len(host.storages) == 5 and len(reused.storages) == 3  # one per tensor, or reused across dead ones
    with pytest.raises(TypeError):
        outer.bounds["n"] = 16  # type: ignore[index]
    with pytest.raises(ValueError, match="opt level 2 does not exist"):
        PassContext(opt_level=2)


def test_pipeline_reduce_program_is_kept_intact() -> None:
    result = run_pipeline(mlp_module())
    body = result.programs["softmax_sum"].body
    assert isinstance(body, Reduce) and body.combiner == "sum"
    assert isinstance(body.body, Unary) and body.body.op == "exp"


def test_legalize_ops_matches_a_hand_written_expected_module_up_to_renaming() -> None:
    """before: y = relu(x); expected: y = call_tir(relu, (x,)) with the program written out,
    using other variable names (structural equality renames them)."""
    from relaxweb.ir import Buffer, SizeVar, TensorProgram
    from relaxweb.ir.expr import CallTIR, Var
    from relaxweb.ir.structural import assert_structural_equal
    from relaxweb.ir.tir import Binary, FloatImm, Load

    n = SizeVar("n")
    builder = FunctionBuilder("main")
    x = builder.add_param("x", TensorStructInfo((n, 4), "float32"))
    y = builder.emit(call_op("relu", x), "y", output=True)
    before = IRModule({"main": builder.finish([y], ["y"])})

    rows = SizeVar("rows")
    i, j = SizeVar("i0_"), SizeVar("i1_")
    source = Buffer("A", (rows, 4), "float32")
    program = TensorProgram("relu", (source,), Buffer("out", (rows, 4), "float32"), (i, j),
                            Binary("maximum", Load(source, (i, j)), FloatImm(0.0)))
    data = Var("data", TensorStructInfo((rows, 4), "float32"))
    result = Var("result", TensorStructInfo((rows, 4), "float32"))
    call = CallTIR("relu", (data,), TensorStructInfo((rows, 4), "float32"), (("rows", rows),))
    expected = IRModule(
        {"main": Function("main", (data,), SeqExpr((DataflowBlock((VarBinding(result, call),)),), result), ("x",), ("y",))},
        {"relu": program},
    )
    after = legalize_ops(before)
    assert_structural_equal(after, expected)
    value = rand(3, 4, seed=3)
    assert_close(run_module(after, {"x": value})[0], run_module(before, {"x": value})[0])
    assert_close(run_module(expected, {"x": value})[0], np.maximum(value, 0))


def test_plan_memory_reuses_the_best_fitting_free_storage() -> None:
    """The smallest free storage that is large enough; else the largest too small, grown."""
    from relaxweb.ir.symbolic import Analyzer
    from relaxweb.passes.plan_memory import _Planner, _Storage

    planner = _Planner(mlp_module().main, Analyzer())
    planner.storages = [_Storage(n * 4), _Storage(n * 32), _Storage(n * 16), _Storage(n * 2)]
    assert planner.take_storage([0, 1, 2, 3], n * 8) == 2  # n*16 fits with the least to spare
    assert planner.take_storage([0, 3], n * 8) == 0  # nothing fits: n*4 grows (n*2 would waste more)
    assert format_expr(planner.storages[0].size) == "n * 8"
    planner.storages.append(_Storage(m * 4))
    index = planner.take_storage([4], n * 4)  # incomparable sizes: grown to the max of both
    assert index == 4 and format_expr(planner.storages[4].size) in ("max(m * 4, n * 4)", "max(n * 4, m * 4)")
    assert planner.take_storage([], n) == 5  # no free storage: a new one
