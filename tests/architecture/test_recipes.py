"""The "How to add things" recipes of docs/architecture.md, checked: for each kind of new
member (an op, a scalar operation, a schedule kind, a pass, a dtype), every table it must
appear in is listed here, every existing member is in each of them, and the recipe names
each table, so a member added to one table and forgotten in another fails here, and so does
a recipe that forgets a table."""

from __future__ import annotations

import importlib
import json
import re
import subprocess
from pathlib import Path

import pytest

import relaxweb.ops  # noqa: F401  (registers the ops)
from relaxweb.cpu import emit as cpu_emit
from relaxweb.cpu.schedules import RENDERERS as WASM_RENDERERS
from relaxweb.ir import interpreter, schedule_fit
from relaxweb.ir.dtype import DTYPES
from relaxweb.ir.launch import dispatch_count, workgroup_storage_bytes
from relaxweb.ir.op_registry import OPS
from relaxweb.ir.schedule import WEBGPU_SCHEDULE_KINDS, HalfTiledMatmulSchedule, TiledMatmulSchedule
from relaxweb.ir.symbolic import IntImm, SizeVar
from relaxweb.ir.target_schedules import TARGET_SCHEDULE_KINDS
from relaxweb.ir.tir import COMPARE_OPS, BinaryOp, Buffer, CompareOp, Load, Reduce, ReduceCombiner, TensorProgram, UnaryOp
from relaxweb.ir.wasm_schedule import WASM_SCHEDULE_KINDS, WasmSchedule
from relaxweb.runtime import manifest as python_manifest
from relaxweb.wgsl import emit as wgsl_emit
from relaxweb.wgsl.schedules import RENDERERS as WGSL_RENDERERS

ROOT = Path(__file__).resolve().parents[2]
ARCHITECTURE = ROOT / "docs" / "architecture.md"


def recipe(title: str) -> str:
    """The paragraph of docs/architecture.md's "How to add things" that starts with ``**title**``."""
    text = ARCHITECTURE.read_text()
    section = text[text.index("## How to add things"):]
    section = section[:section.index("\n## ", 3)]
    for paragraph in re.split(r"\n\s*\n", section):
        if paragraph.startswith(f"**{title}"):
            return " ".join(paragraph.split())
    raise AssertionError(f"docs/architecture.md has no recipe '{title}' under 'How to add things'")


def assert_recipe_names(title: str, names: list[str]) -> None:
    text = recipe(title)
    missing = [name for name in names if name not in text]
    assert not missing, f"the recipe '{title}' in docs/architecture.md does not name {missing}"


# A scalar operation -------------------------------------------------------------------------------

ENUMS = (BinaryOp, UnaryOp, CompareOp, ReduceCombiner)
#: Every table that needs an entry for every member of an op enum, by the name the recipe uses.
SCALAR_TABLES = {
    "wgsl/emit.py BINARY_RENDERINGS": (wgsl_emit.BINARY_RENDERINGS, BinaryOp),
    "wgsl/emit.py UNARY_RENDERINGS": (wgsl_emit.UNARY_RENDERINGS, UnaryOp),
    "wgsl/emit.py COMPARE_RENDERINGS": (wgsl_emit.COMPARE_RENDERINGS, CompareOp),
    "wgsl/emit.py COMBINER_RENDERINGS": (wgsl_emit.COMBINER_RENDERINGS, ReduceCombiner),
    "cpu/emit.py BINARY_RENDERINGS": (cpu_emit.BINARY_RENDERINGS, BinaryOp),
    "cpu/emit.py UNARY_RENDERINGS": (cpu_emit.UNARY_RENDERINGS, UnaryOp),
    "cpu/emit.py COMPARE_RENDERINGS": (cpu_emit.COMPARE_RENDERINGS, CompareOp),
    "cpu/emit.py COMBINER_RENDERINGS": (cpu_emit.COMBINER_RENDERINGS, ReduceCombiner),
    "ir/interpreter.py BINARY_FUNCTIONS": (interpreter.BINARY_FUNCTIONS, BinaryOp),
    "ir/interpreter.py UNARY_FUNCTIONS": (interpreter.UNARY_FUNCTIONS, UnaryOp),
    "ir/interpreter.py COMPARE_FUNCTIONS": (interpreter.COMPARE_FUNCTIONS, CompareOp),
    "ir/interpreter.py COMBINER_FUNCTIONS": (interpreter.COMBINER_FUNCTIONS, ReduceCombiner),
    "ir/tir.py COMPARE_OPS": (COMPARE_OPS, CompareOp),
}
#: The f32x4 forms: a member may have none, then it keeps programs out of the f32x4 kinds; the
#: ops the kinds accept (ir/schedule_fit.py) must each have one.
VECTOR_TABLES = {
    "VECTOR_BINARY_OPS": (schedule_fit.VECTOR_BINARY_OPS, cpu_emit.VECTOR_BINARY_RENDERINGS),
    "VECTOR_UNARY_OPS": (schedule_fit.VECTOR_UNARY_OPS, cpu_emit.VECTOR_UNARY_RENDERINGS),
    "VECTOR_COMPARE_OPS": (schedule_fit.VECTOR_COMPARE_OPS, cpu_emit.VECTOR_COMPARE_RENDERINGS),
}


@pytest.mark.parametrize("table_name", list(SCALAR_TABLES))
def test_every_scalar_table_has_every_member(table_name: str) -> None:
    table, enum = SCALAR_TABLES[table_name]
    assert set(table) == set(enum), f"{table_name} lacks {sorted(set(enum) - set(table))}"


@pytest.mark.parametrize("fit_name", list(VECTOR_TABLES))
def test_every_op_the_f32x4_kinds_accept_has_an_f32x4_form(fit_name: str) -> None:
    accepted, forms = VECTOR_TABLES[fit_name]
    assert accepted <= set(forms), f"ir/schedule_fit.py {fit_name} accepts {sorted(accepted - set(forms))} without a form"


def test_the_scalar_operation_recipe_names_every_table() -> None:
    names = sorted({part for key in SCALAR_TABLES for part in key.split()} | set(VECTOR_TABLES)
                   | {"ir/schedule_fit.py", "VECTOR_BINARY_RENDERINGS", "cpu/math.py"})
    assert_recipe_names("A scalar operation", names)


# A schedule kind -----------------------------------------------------------------------------------

def _sample_programs() -> list[TensorProgram]:
    """An elementwise, a long reduction and a matmul-like program: each WebGPU kind fits one."""
    n, k = SizeVar("n"), SizeVar("k")
    a = Buffer("A", (n, 64), "float32")
    b = Buffer("B", (64, 64), "float32")
    i0, i1 = SizeVar("i0"), SizeVar("i1")
    return [
        TensorProgram("relu", (a,), Buffer("out", (n, 64), "float32"), (i0, i1), Load(a, (i0, i1)) * 2.0),
        TensorProgram("row_sum", (a,), Buffer("out", (n,), "float32"), (i0,),
                      Reduce("sum", k, IntImm(64), Load(a, (i0, k)))),
        TensorProgram("matmul", (a, b), Buffer("out", (n, 64), "float32"), (i0, i1),
                      Reduce("sum", k, IntImm(64), Load(a, (i0, k)) * Load(b, (k, i1)))),
    ]


@pytest.mark.parametrize("kind", list(WEBGPU_SCHEDULE_KINDS))
def test_every_webgpu_kind_has_a_renderer_and_launch_facts(kind: str) -> None:
    schedule_class = WEBGPU_SCHEDULE_KINDS[kind]
    assert schedule_class in WGSL_RENDERERS, f"wgsl/schedules.py RENDERERS has no {kind}"
    schedule = schedule_class()
    fits = []
    for program in _sample_programs():
        try:
            fits.append((dispatch_count(program, schedule), workgroup_storage_bytes(program, schedule)))
        except (NotImplementedError, ValueError):
            continue
    assert fits, f"ir/launch.py gives no dispatch count or workgroup memory for {kind} on any sample program"


@pytest.mark.parametrize("kind", list(WASM_SCHEDULE_KINDS))
def test_every_wasm_kind_has_a_renderer_and_says_what_it_needs(kind: str) -> None:
    schedule_class = WASM_SCHEDULE_KINDS[kind]
    assert schedule_class in WASM_RENDERERS, f"cpu/schedules/__init__.py RENDERERS has no {kind}"
    assert schedule_class.units is not WasmSchedule.units, f"{kind} must say its units (its $units count)"
    schedule_class().scratch_bytes  # the scratch one thread needs (0 unless the kind says otherwise)


def test_the_renderer_tables_hold_only_known_kinds() -> None:
    assert set(WGSL_RENDERERS) == set(WEBGPU_SCHEDULE_KINDS.values())
    assert set(WASM_RENDERERS) == set(WASM_SCHEDULE_KINDS.values())
    assert {kind for kinds in TARGET_SCHEDULE_KINDS.values() for kind in kinds.values()} == \
        set(WEBGPU_SCHEDULE_KINDS.values()) | set(WASM_SCHEDULE_KINDS.values())


def test_every_kind_is_chosen_by_the_scheduling_pass() -> None:
    """The pass constructs each kind somewhere (a kind it never builds is never chosen)."""
    source = (ROOT / "relaxweb" / "passes" / "schedule_programs.py").read_text()
    never = [cls.__name__ for cls in (*WEBGPU_SCHEDULE_KINDS.values(), *WASM_SCHEDULE_KINDS.values())
             if not re.search(rf"\b{cls.__name__}\(", source)]
    assert not never, f"passes/schedule_programs.py never builds {never}"
    assert issubclass(HalfTiledMatmulSchedule, TiledMatmulSchedule)  # what launch.py's tiled facts cover


def test_the_schedule_recipe_names_every_table() -> None:
    assert_recipe_names("A schedule", ["ir/schedule.py", "WEBGPU_SCHEDULE_KINDS", "ir/wasm_schedule.py",
                                       "WASM_SCHEDULE_KINDS", "ir/launch.py", "dispatch_count", "workgroup_storage_bytes",
                                       "scratch_bytes", "units", "wgsl/schedules.py", "cpu/schedules/__init__.py",
                                       "RENDERERS", "passes/schedule_programs.py"])


# A pass ------------------------------------------------------------------------------------------------

PASS_LISTS = ("SIMPLIFY", "COMPRESS", "FUSE_OPS", "PLACE_CACHES", "LOWER_OPS", "OPTIMIZE", "PROVE_CHECKS", "SHARE",
              "LOWER_TO_HOST")
pipeline_module = importlib.import_module("relaxweb.passes.pipeline")


def test_every_pass_module_is_in_a_pipeline_list_with_a_docstring() -> None:
    listed = {step.__name__: step for name in PASS_LISTS for step in getattr(pipeline_module, name)}
    modules = {path.stem for path in (ROOT / "relaxweb" / "passes").glob("*.py")} - {"__init__", "context", "pipeline"}
    assert modules == set(listed), f"passes not in a list of passes/pipeline.py: {sorted(modules - set(listed))}"
    assert all(len((step.__doc__ or "").split()) >= 5 for step in listed.values())


def test_the_pass_recipe_names_every_table() -> None:
    assert_recipe_names("A pass", ["relaxweb/passes/", "passes/pipeline.py", "tests/passes/test_<pass>.py",
                                   "check_rewrite", "tests/passes/test_pipeline.py"])


# An op -----------------------------------------------------------------------------------------------


def test_every_op_keeps_its_knowledge_in_one_family_module() -> None:
    """Deduction, legalization and reference side by side: all three from one module of ops/."""
    scattered = {}
    for name, op in OPS.items():
        modules = {getattr(function, "__module__", "?") for function in (op.deduce, op.legalize, op.reference)
                   if function is not None}
        if len(modules) != 1 or not next(iter(modules)).startswith("relaxweb.ops."):
            scattered[name] = sorted(modules)
    assert not scattered, f"ops whose deduce / legalize / reference live apart: {scattered}"


def test_the_op_recipe_names_every_table() -> None:
    assert_recipe_names("An op", ["relaxweb/ops/", "register_op", "deduce", "legalize", "reference",
                                  "frontend/converters/", "@converter", "tests/ops/test_ops.py"])


# A dtype ----------------------------------------------------------------------------------------------


def _js_dtype_tables() -> dict[str, list[str]]:
    script = ("import('./relaxweb/runtime_js/host.js').then((host) => console.log(JSON.stringify("
              "{typed: Object.keys(host.TYPED_ARRAY_OF_DTYPE)})))")
    done = subprocess.run(["node", "-e", script], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    tables = json.loads(done.stdout)
    manifest_js = (ROOT / "relaxweb" / "runtime_js" / "manifest.js").read_text()
    literal = manifest_js[manifest_js.index("const DTYPE_BYTES = {"):]
    tables["bytes"] = re.findall(r"(\w+): \d+", literal[:literal.index("};")])
    return tables


def test_every_dtype_the_gpu_holds_is_known_to_both_runtimes() -> None:
    on_gpu = {name for name, info in DTYPES.items() if info.on_gpu}
    assert set(python_manifest._DTYPE_BYTES) == on_gpu
    assert all(python_manifest._DTYPE_BYTES[name] == DTYPES[name].bytes for name in on_gpu)
    schema = json.loads((ROOT / "relaxweb" / "runtime_js" / "manifest-schema.json").read_text())
    pattern = schema["manifest"]["required"]["dtypes"]["keys_pattern"]
    assert {name for name in DTYPES if re.fullmatch(pattern, name)} == on_gpu
    tables = _js_dtype_tables()
    assert set(tables["typed"]) == on_gpu and set(tables["bytes"]) == on_gpu


def test_the_dtype_recipe_names_every_table() -> None:
    assert_recipe_names("A dtype", ["ir/dtype.py", "runtime/manifest.py", "runtime_js/manifest.js",
                                    "manifest-schema.json", "TYPED_ARRAY_OF_DTYPE"])
