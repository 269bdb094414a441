"""The pass pipeline (relaxweb/passes/pipeline.py) and the PassContext it runs under.

The order of the passes at each opt level, the module after each step, verification naming
the pass that broke a module, the context's settings reaching the passes.  Each pass's own
tests are in tests/passes/test_<pass>.py (``test_every_pass_has_ir_text_tests`` below
keeps it so).
"""

from __future__ import annotations

import ast
from dataclasses import replace
from pathlib import Path

import pytest

import relaxweb.passes
from relaxweb.ir import FunctionBuilder, IRModule, Reduce, TensorStructInfo, Unary
from relaxweb.ir.expr import DataflowVar, SeqExpr
from relaxweb.ir.host import HostFunction
from relaxweb.ir.well_formed import WellFormedError
from relaxweb.ops import call_op
from relaxweb.passes import PIPELINE, PassContext, legalize_ops, pipeline, plan_memory, run_pipeline
from tests.passes.graphs import chain_module, mlp_module, module_of, n

#: The modules of relaxweb/passes/ that are not passes.
NOT_PASSES = {"__init__", "context", "pipeline"}
#: Passes whose test file may be missing (none: every pass has one).
AWAITING_TEST_FILE: set[str] = set()


def test_pipeline_order_and_steps() -> None:
    optimize = ["canonicalize_bindings", "fold_scalar_constants", "fuse_ops", "prove_integer_checks", "share_programs"]
    lower = ["plan_memory", "schedule_programs", "lower_shapes_to_host"]
    assert [p.__name__ for p in PIPELINE] == ["gather_before_transpose", "compress_weights", "fuse_attention", "place_kv_caches", "page_kv_caches", "split_wide_concats", "split_wide_einsums", "legalize_ops", *optimize,
                                              *lower]
    assert [p.__name__ for p in pipeline(0)] == ["compress_weights", "split_wide_concats", "split_wide_einsums", "legalize_ops", "prove_integer_checks", *lower]
    with pytest.raises(ValueError, match="opt level 3 does not exist"):
        pipeline(3)
    steps: list[tuple[str, object]] = []
    result = run_pipeline(mlp_module(), on_step=lambda name, module: steps.append((name, type(module.main).__name__)))
    assert steps == [("gather_before_transpose", "Function"), ("compress_weights", "Function"), ("fuse_attention", "Function"), ("place_kv_caches", "Function"),
                     ("page_kv_caches", "Function"), ("split_wide_concats", "Function"), ("split_wide_einsums", "Function"), ("legalize_ops", "Function"), *((name, "Function") for name in optimize),
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
        assert [p.__name__ for p in pipeline()] == ["compress_weights", "split_wide_concats", "split_wide_einsums", "legalize_ops",
                                                    "prove_integer_checks", "plan_memory", "schedule_programs",
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


def test_every_pass_has_ir_text_tests() -> None:
    """Each module of relaxweb/passes/ (but pipeline, context and __init__) is a pass of the
    pipeline, and tests/passes/test_<pass>.py tests it with before/expected IR text
    (``check_rewrite``, tests/passes/rewrite.py): a new pass cannot land without them."""
    modules = sorted(path.stem for path in Path(relaxweb.passes.__file__).parent.glob("*.py") if path.stem not in NOT_PASSES)
    assert modules == sorted(step.__name__ for step in pipeline(1))
    for name in modules:
        tests = Path(__file__).parent / f"test_{name}.py"
        if name in AWAITING_TEST_FILE and not tests.exists():
            continue
        assert tests.exists(), f"the pass {name} has no tests/passes/test_{name}.py"
        calls = [node for node in ast.walk(ast.parse(tests.read_text()))
                 if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "check_rewrite"]
        assert calls, f"tests/passes/test_{name}.py has no before/expected IR-text test (check_rewrite)"
