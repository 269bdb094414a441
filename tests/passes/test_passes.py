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


# plan_memory ---------------------------------------------------------------------------------


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
    optimize = ["canonicalize_bindings", "fold_scalar_constants", "fuse_ops", "schedule_programs", "share_programs"]
    assert [p.__name__ for p in PIPELINE] == ["compress_weights", "fuse_attention", "place_kv_caches", "legalize_ops", *optimize,
                                              "plan_memory", "lower_shapes_to_host"]
    assert [p.__name__ for p in pipeline(0)] == ["compress_weights", "legalize_ops", "plan_memory", "lower_shapes_to_host"]
    with pytest.raises(ValueError, match="opt level 3 does not exist"):
        pipeline(3)
    steps: list[tuple[str, object]] = []
    result = run_pipeline(mlp_module(), on_step=lambda name, module: steps.append((name, type(module.main).__name__)))
    assert steps == [("compress_weights", "Function"), ("fuse_attention", "Function"), ("place_kv_caches", "Function"),
                     ("legalize_ops", "Function"), *((name, "Function") for name in optimize),
                     ("plan_memory", "Function"), ("lower_shapes_to_host", "HostFunction")]
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
                                                    "lower_shapes_to_host"]
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
