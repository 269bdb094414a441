"""The IR text and its parser: ``parse_module(format_module(m))`` is structurally equal to ``m``.

One hand-built module holds every kind of node (graph level, tensor programs with every
scalar expression, a library kernel, a host function with every step), once with plain
names and once with hostile ones (quotes, newlines, ``#``, backslashes, keywords): a name
is data and can neither break the text nor change its meaning.  Printing the parsed module
again gives the same text, so every name came back as it was.  Malformed text fails with
a ParseError that gives the line.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from relaxweb.ir.expr import (
    AllocStorage, AllocTensor, BindingBlock, Call, CallLibrary, CallTIR, CallTIRInto, Constant, DataflowBlock,
    DataflowVar, Function, If, MatchCast, PrimValue, SeqExpr, ShapeExpr, TensorToPrim, Tuple, TupleGetItem, Var,
    VarBinding,
)
from relaxweb.ir.host import (
    BufferRef, HostBind, HostCheck, HostDispatch, HostFunction, HostIf, HostInput, HostOutput, HostOutputShape,
    HostRead, HostSequence, HostSequenceAppend, HostSequenceClear, HostSequenceInput, HostSequencePresence, HostStorage,
    ShapeCheck,
)
from relaxweb.ir.module import IRModule
from relaxweb.ir.parser import ParseError, parse_module
from relaxweb.ir.schedule import RegisterMatmulSchedule, WorkgroupReductionSchedule
from relaxweb.ir.target_schedules import TargetSchedules
from relaxweb.ir.wasm_schedule import WindowSchedule
from relaxweb.ir.printer import format_module, module_constants
from relaxweb.ir.struct_info import (
    FuncStructInfo, ObjectStructInfo, PrimStructInfo, ShapeStructInfo, TensorStructInfo, TupleStructInfo,
)
from relaxweb.ir.structural import assert_structural_equal, structural_equal
from relaxweb.ir.symbolic import Add, FloorDiv, FloorMod, IntImm, Max, Min, Mul, SizeVar, Sub
from relaxweb.ir.tir import (
    BITWISE_OPS, Binary, BinaryOp, Buffer, Cast, Compare, CompareOp, FloatImm, Gather, IndexValue, Load, Reduce, ReduceCombiner,
    Select, TensorProgram, Unary, UnaryOp,
)
from relaxweb.compiler import compile_model, compile_module
from relaxweb.library import unique_count_kernel  # importing relaxweb.library registers its kernel builders
from relaxweb.passes import PassContext, pipeline, run_pipeline
from relaxweb.wgsl.library import library_kernel_wgsl
from tests.ops.test_control_flow import if_module, unique_module
from tests.ops.test_sequence import growing_sequence_model

HOSTILE = 'a "quoted" \'name\'\n# not a comment \\ ) + relu(x)'
PLAIN = {"var": "x", "constant": "w", "size": "n", "program": "prog", "buffer": "A", "input": "x", "op_attr": "axes",
         "function": "main", "note": "a note"}
# Each kind of name, hostile; keywords and names that only differ by sanitizing are hostile too.
HOSTILE_NAMES = {"var": "lambda", "constant": HOSTILE, "size": "n m", "program": "prog.1", "buffer": "if",
                 "input": HOSTILE, "op_attr": "a key", "function": "main fn", "note": HOSTILE}


def round_trip(module: IRModule) -> IRModule:
    """Print, parse, and check the result is structurally equal and prints the same."""
    text = format_module(module)
    parsed = parse_module(text, module_constants(module))
    assert_structural_equal(parsed, module)
    assert format_module(parsed) == text
    return parsed


# Every node kind -------------------------------------------------------------------------------


def every_program(names: dict[str, str]) -> TensorProgram:
    """A program whose body has every kind of scalar expression and every op."""
    n = SizeVar(names["size"])
    i, j, k = SizeVar("i0_"), SizeVar("i1_"), SizeVar("k_")
    a = Buffer(names["buffer"], (n, IntImm(4)), "float32")
    index = Buffer("idx", (n,), "int64")
    flag = Buffer("flag", (), "bool")
    out = Buffer("out", (n, IntImm(4)), "float32")
    x = Load(a, (i, j))
    terms = [Binary(op, x, FloatImm(0.5)) for op in BinaryOp if op not in BITWISE_OPS]
    terms += [Binary(op, Load(index, (i,)), FloatImm(6, "int64")) for op in BITWISE_OPS]  # integers only
    terms += [Unary(op, x) for op in UnaryOp if op not in (UnaryOp.IS_NAN, UnaryOp.UNPACK_HALF)]
    terms.append(Unary("unpack_half", Cast("uint32", Load(index, (i,)))))  # of a word
    terms += [Reduce(c, k, FloorDiv(Add(n, IntImm(3)), IntImm(4)), Load(a, (FloorMod(k, n), j))) for c in ReduceCombiner]
    terms.append(Gather(a, (Cast("int32", Load(index, (i,))), j)))  # a run-time index among size expressions
    terms.append(Gather(a, (i, Min(j, IntImm(3)))))  # no run-time index at all
    terms.append(Cast("float32", IndexValue(Max(i * n - 1, IntImm(0)))))
    terms += [FloatImm(float("inf")), FloatImm(-0.0), FloatImm(1e-300), FloatImm(3, "int32")]
    conditions = [Compare(op, x, FloatImm(0.0)) for op in CompareOp]
    conditions += [Unary("is_nan", x), Load(flag, ()), FloatImm(True, "bool"), FloatImm(1, "bool")]
    body = terms[0]
    for term in terms[1:]:
        body = Binary("add", body, Cast("float32", term))
    for condition in conditions:
        body = Select(condition, body, FloatImm(1.0))
    schedule = TargetSchedules(webgpu=WorkgroupReductionSchedule(), webgpu_cpu=RegisterMatmulSchedule(block=4),
                               wasm=WindowSchedule(unrolled_widths=(3,)))  # every kind of parameter
    return TensorProgram(names["program"], (a, index, flag), out, (i, j), body, schedule)


def every_graph_function(names: dict[str, str], program: str) -> Function:
    """Every graph-level node: params, dataflow and plain blocks (empty and adjacent ones),
    op calls with every kind of attribute, program and library calls, constants, shapes,
    prim values, tuples, match_cast, If, memory planning nodes, every annotation kind."""
    n = SizeVar(names["size"])
    m = SizeVar("m")
    tensor = TensorStructInfo((n, IntImm(4)), "float32")
    x = Var(names["var"], tensor)
    size_param = Var("s", ShapeStructInfo((n, Sub(m, IntImm(-2)))))
    weight = Constant(np.arange(32, dtype=np.float32).reshape(8, 4), names["constant"])
    other_weight = Constant(np.ones((8, 4), dtype=np.float32), names["constant"])  # same name, other data
    small = Constant(np.array([1.5, float("nan"), -0.0], dtype=np.float32), names["constant"] + " small")
    scalar = Constant(np.array(7, dtype=np.int64), "seven")
    indices = Constant(np.zeros(20, np.int64), "idx")
    flag = Constant(np.array(True), "flag")
    attrs = {names["op_attr"]: [1, -2], "pair": (1,), "nested": [[0.1, 1e-7], ()], "text": HOSTILE, "none": None,
             "flag": True, "eps": 9.999999747378752e-06, "inf": float("-inf"), "table": {"k": 1},
             "size": Add(Mul(n, IntImm(2)), IntImm(1)), "sinfo": "an attribute named like the keyword"}

    added = DataflowVar("added", tensor)
    parts_info = TupleStructInfo((tensor, tensor))
    parts = DataflowVar("parts", parts_info)
    first = Var("first", tensor)
    count = Var("count", TensorStructInfo((IntImm(1),), "int32"))
    read = Var("read", PrimStructInfo("int64"))
    k = SizeVar("k")
    cast = Var("cast", PrimStructInfo("int64", k))
    checked = Var("checked", tensor)  # a fact deduction assumed, with its reason
    loose = Var("loose", TensorStructInfo(None, "float32", 2))  # less specific than its value
    unknown = Var("unknown", TensorStructInfo(None, "float32", -1))
    shape = Var(names["var"], ShapeStructInfo(None, 2))  # the same name as x: another variable
    prim = Var("prim", PrimStructInfo("int64", FloorMod(n, IntImm(2))))
    nested = Var("nested", TensorStructInfo((n, IntImm(4)), "float32"))
    chosen = Var("chosen", TensorStructInfo(None, "float32", 2))
    inner = Var("inner", tensor)
    storage = Var("storage", ObjectStructInfo())
    planned = Var("planned", tensor)
    done = Var("done", TupleStructInfo(()))
    function_value = Var("callable", FuncStructInfo((tensor, ObjectStructInfo()), PrimStructInfo("int32")))

    dataflow = DataflowBlock((
        VarBinding(added, Call("add", (x, weight), attrs, tensor)),
        VarBinding(parts, Call("split", (added,), {"indices": [4]}, parts_info)),
        VarBinding(first, TupleGetItem(parts, 0)),
        VarBinding(loose, Call("call_tir", (first, other_weight, small, scalar), {}, tensor)),  # an op named like a builtin
    ))
    library = BindingBlock((
        VarBinding(count, CallLibrary("unique_count", (first,), TensorStructInfo((IntImm(1),), "int32"), ((names["size"], n),))),
        VarBinding(read, TensorToPrim(count)),
        MatchCast(cast, read, PrimStructInfo("int64", k)),
        MatchCast(checked, first, tensor, reason=names["note"].replace("\n", " ") + ": dimension 0 of input 1"),
        VarBinding(unknown, CallTIR(program, (first, indices, flag), tensor, ((names["size"], n),))),
        VarBinding(shape, ShapeExpr((n, IntImm(5)))),
        VarBinding(prim, PrimValue(FloorMod(n, IntImm(2)))),
        VarBinding(function_value, x),
    ))
    adjacent = BindingBlock((
        VarBinding(nested, Call("relu", (Call("negative", (x,), {}, tensor),), {}, tensor)),  # a nested call
    ))
    then_branch = SeqExpr((BindingBlock((VarBinding(inner, Call("exp", (nested,), {}, tensor)),)),), inner)
    else_branch = SeqExpr((BindingBlock(()),), Call("tanh", (x,), {}, tensor))
    control = BindingBlock((
        VarBinding(chosen, If(prim, then_branch, else_branch)),
        VarBinding(storage, AllocStorage(Mul(n, IntImm(16)))),
        VarBinding(planned, AllocTensor(storage, tensor)),
        VarBinding(done, CallTIRInto(program, (x, indices, flag), planned, ((names["size"], n),))),
    ))
    empty = DataflowBlock(())
    body = SeqExpr((dataflow, library, adjacent, control, empty), Tuple((first, Tuple((chosen,)), Tuple(()))))
    return Function(names["function"], (x, size_param), body, (names["input"], "sizes"), ("first", "chosen", names["input"]))


def every_host_function(names: dict[str, str], program: str) -> HostFunction:
    n = SizeVar(names["size"])
    weight = Constant(np.arange(4, dtype=np.float32), names["constant"])
    big = Constant(np.arange(64, dtype=np.float32), names["constant"])
    steps = (
        HostDispatch(program, (BufferRef("storage", 0), BufferRef("weight", 1), BufferRef("storage", 1)),
                     ((names["size"], n),), Mul(n, IntImm(4)), names["note"]),
        HostRead(1, 4, 0, "_read0", names["note"]),
        HostCheck("nonnegative", SizeVar("_read0"), None, None, 4, "is {value}"),
        HostBind("k", SizeVar("_read0"), names["note"]),
        HostCheck("bound", SizeVar("k"), None, "k", 5, "k is {value} > {expected}"),
        HostCheck("equal", SizeVar("k"), Add(n, IntImm(1)), None, 6, names["note"]),
        HostIf(FloorMod(n, IntImm(2)), (HostBind("_r_dim0", n, ""),), ()),
        HostOutputShape(0, (n, SizeVar("k"))),
        HostSequenceInput(0, names["input"], True, 7, names["note"], 8, "{value} > {expected}"),
        HostSequencePresence(0, "_present"),
        HostSequenceClear(0),
        HostSequenceAppend(0, (n, IntImm(3)), 9, names["note"]),
    )
    return HostFunction(
        "host",
        (HostInput(names["input"], "float32", (n, IntImm(4)), 0),
         HostInput("elements", "float32", (), 3, sequence=0, optional=True)),
        (HostOutput(names["input"], "float32", 1, (n, SizeVar("k")), 2), HostOutput("rank only", "int64", 2, None, 3),
         HostOutput("sequence out", "float32", 3, None, 2, sequence=0)),
        (names["size"], "k", "_read0", "_r_dim0"),
        ((names["size"], 16), ("k", None)),
        (
            ShapeCheck("ndim", 0, -1, 2, None, 1, "ndim is {value}"),
            ShapeCheck("bind", 0, 0, None, names["size"], 0, ""),
            ShapeCheck("bound", 0, 0, None, names["size"], 2, names["note"]),
            ShapeCheck("equal", 0, 1, IntImm(4), None, 3, "dim 1 is {value}"),
        ),
        (HostStorage(Mul(n, IntImm(16)), "input"), HostStorage(Max(Mul(n, IntImm(16)), IntImm(8)), "output"),
         HostStorage(IntImm(8), "intermediate")),
        (big, weight),
        steps,
        read_slots=1,
        sequences=(HostSequence(3, "_arena0", "float32", 2, 4),),
    )


def every_node_module(names: dict[str, str]) -> IRModule:
    program = every_program(names)
    kernel = unique_count_kernel("unique_count", SizeVar(names["size"]), "float32")
    return IRModule(
        {names["function"]: every_graph_function(names, program.name),
         "host": every_host_function(names, program.name)},
        {program.name: program, kernel.name: kernel},
        {"source": names["input"], "bounds": {names["size"]: 16, "m": None}, "opset": 17},
    )


@pytest.mark.parametrize("names", [PLAIN, HOSTILE_NAMES], ids=["plain names", "hostile names"])
def test_every_node_kind_round_trips(names: dict[str, str]) -> None:
    module = every_node_module(names)
    parsed = round_trip(module)
    # names that are data came back exactly
    function = parsed.functions[names["function"]]
    assert function.input_names == (names["input"], "sizes")
    assert names["program"] in parsed.programs
    assert parsed.programs[names["program"]].inputs[0].name == names["buffer"]
    assert parsed.functions["host"].symbolic_vars[0] == names["size"]
    constants = [a for b in function.bindings() if isinstance(b.value, Call) for a in b.value.args if isinstance(a, Constant)]
    assert [c.name for c in constants] == [names["constant"]] * 2 + [names["constant"] + " small", "seven"]
    assert np.array_equal(constants[2].data, np.array([1.5, float("nan"), -0.0], np.float32), equal_nan=True)
    assert np.signbit(constants[2].data[2])
    # the same constant object twice in the text is one object again; two with one name stay two
    assert constants[0] is not constants[1]
    casts = [b for b in function.bindings() if isinstance(b, MatchCast)]
    assert [c.reason for c in casts] == ["", names["note"].replace("\n", " ") + ": dimension 0 of input 1"]
    host = parsed.functions["host"]
    assert host.weights[1].name == names["constant"] and host.weights[1].data.shape == (4,)
    # the library kernel is rebuilt by its builder, targets, rendered code and numpy reference included
    kernel = parsed.programs["unique_count"]
    assert kernel == module.programs["unique_count"] and kernel.targets == ("webgpu", "wasm")
    assert library_kernel_wgsl(kernel) == library_kernel_wgsl(module.programs["unique_count"])
    assert kernel.reference([np.array([3.0, 1.0, 3.0], np.float32)]).tolist() == [2]


def test_hostile_names_are_quoted_data() -> None:
    text = format_module(every_node_module(HOSTILE_NAMES))
    assert "\n# not a comment" not in text  # every newline of a name is escaped
    assert 'const("a \\"quoted\\" \'name\'\\n# not a comment \\\\ ) + relu(x)")' in text
    assert 'size_var["n m"]' in text
    assert "(lambda_: Tensor(" in text  # a variable named by a keyword is renamed
    assert ('@tensor_program(webgpu=workgroup_reduction, webgpu_cpu=register_matmul(block=4), webgpu_f16=None, '
            'wasm=window(lanes=8, unroll=8, unrolled_widths=(3,), overreach=1024, masked_borders=True), name="prog.1")') in text
    assert 'if_: Buffer((size_var["n m"], 4), "float32", name="if")' in text
    assert '**{"a key": [1, -2]}' in text and '**{"sinfo": "an attribute named like the keyword"}' in text
    assert 'call_op("call_tir", first,' in text


def test_module_structure_survives_edits_to_a_name() -> None:
    """Two modules that differ only in a constant's name are not equal after the round trip
    (the names are compared, not lost)."""
    module = every_node_module(PLAIN)
    other = every_node_module({**PLAIN, "constant": "v"})
    assert not structural_equal(round_trip(module), round_trip(other))


def test_size_expressions_round_trip_as_written() -> None:
    n, m = SizeVar("n"), SizeVar("m")
    exprs = [Sub(n, Sub(m, IntImm(1))), FloorDiv(Add(n, IntImm(-3)), Mul(m, IntImm(2))), Mul(IntImm(-3), n),
             FloorMod(Min(n, m), Max(IntImm(1), n)), Sub(IntImm(0), FloorDiv(n, FloorDiv(m, IntImm(4))))]
    for expr in exprs:
        info = TensorStructInfo((expr,), "float32")
        x = Var("x", TensorStructInfo((n, m), "float32"))
        y = Var("y", info)
        function = Function("main", (x,), SeqExpr((BindingBlock((VarBinding(y, Call("f", (x,), {}, info)),)),), y))
        parsed = round_trip(IRModule({"main": function}))
        assert parsed.main.body.body.struct_info.shape == (expr,)  # the same tree, not just an equal one


# Control flow and data-dependent shapes through the pipeline -----------------------------------------


@pytest.mark.parametrize("opt_level", [1, 0])
@pytest.mark.parametrize(("make", "bounds"), [(lambda: if_module(same_shapes=False), {"n": 16, "m": 16}),
                                              (unique_module, {"n": 16})], ids=["if", "unique"])
def test_control_flow_round_trips_after_every_pass(make, bounds: dict[str, int], opt_level: int, tmp_path: Path) -> None:
    """If and match_cast, library kernels and read-backs, then HostIf and HostRead; the
    files ``--dump-ir`` writes are that text."""
    steps: list[IRModule] = []
    compiled = compile_module(make(), bounds, dump_ir=tmp_path, opt_level=opt_level)
    with PassContext(bounds=bounds, opt_level=opt_level):
        run_pipeline(make(), pipeline(opt_level), lambda _, module: steps.append(module))
    dumps = sorted(tmp_path.glob("*.txt"))[1:]  # the first is the imported module
    assert len(dumps) == len(steps)
    for dump, module in zip(dumps, steps):
        assert_structural_equal(parse_module(dump.read_text()), module)
    round_trip(compiled)


def test_dump_ir_of_a_sequence_model_round_trips(tmp_path: Path) -> None:
    """A model with sequence inputs, appends and outputs: its host function (sequence tables,
    sequence steps) is text too, so ``--dump-ir`` writes every pass's module."""
    model = growing_sequence_model()
    compiled = compile_model(model, {}, dump_ir=tmp_path)
    assert len(sorted(tmp_path.glob("*.txt"))) == len(pipeline(1)) + 1
    text = format_module(compiled)
    assert "sequence_append(" in text and "host_sequence(" in text
    round_trip(compiled)


# Pass-test style text ----------------------------------------------------------------------------


def test_hand_written_text_parses_with_a_constants_table() -> None:
    text = '''
@function(inputs=["x"], outputs=["y"])
def main(x: Tensor((n, 4), "float32")) -> Tensor((n, 4), "float32"):
    with dataflow():
        y: Tensor((n, 4), "float32") = add(x, const("bias"))
        output(y)
    return y
'''
    module = parse_module(text, {"bias": np.ones(4, np.float32)})
    binding = module.main.bindings()[0]
    assert isinstance(binding.var, Var) and not isinstance(binding.var, DataflowVar)
    assert binding.value.op == "add" and binding.value.args[1].name == "bias"
    assert binding.value.struct_info == TensorStructInfo((SizeVar("n"), 4), "float32")


def test_dataflow_variables_are_those_not_in_output() -> None:
    module = parse_module('''
@function
def main(x: Tensor((2,), "float32")) -> Tensor((2,), "float32"):
    with dataflow():
        a: Tensor((2,), "float32") = relu(x)
        b: Tensor((2,), "float32") = exp(a)
        output(b)
    return b
''')
    a, b = (binding.var for binding in module.main.bindings())
    assert type(a) is DataflowVar and type(b) is Var


# Errors --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("text", "line", "message"), [
    ("@function\ndef main(x: Tensor((n,), \"float32\")) -> Object:\n    return x +\n", 3, "not valid IR text"),
    ("@function\ndef main(x: Tensor((n,), \"float32\")) -> Tensor((n,), \"float32\"):\n    return y\n", 3,
     "undefined variable 'y'"),
    ("@kernel\ndef main():\n    pass\n", 1, "unknown decorator"),
    ("@function\ndef main(x: Tensor((n,), \"float32\")) -> Tensor((n,), \"float32\"):\n"
     "    y: Tensor((n,), \"float32\") = add(x, const(\"missing\"))\n    return y\n", 3,
     "constant 'missing' is not in the constants table"),
    ("@function\ndef main(x: Tensr((n,), \"float32\")) -> Object:\n    return x\n", 2, "expected an annotation"),
    ("@function\ndef main(x: Tensor((n,), \"float32\")) -> Tensor((n,), \"float32\"):\n"
     "    y: Tensor((n,), \"float32\") = relu(x)\n", 3, "a function ends with 'return value'"),
    ("@function\ndef main(x: Tensor((n,), \"float32\")) -> Tensor((n,), \"int32\"):\n    return x\n", 2,
     "return annotation differs"),
    ("@tensor_program\ndef p(A: Buffer((4,), \"float32\"), out: Buffer((4,), \"float32\")):\n"
     "    out[i] = cosh(A[i])\n", 3, "unknown scalar function cosh()"),
    ("@tensor_program\ndef p(A: Buffer((4,), \"float32\"), out: Buffer((4,), \"float32\")):\n"
     "    out[i] = B[i]\n", 3, "unknown buffer"),
    ("@tensor_program(webgpu=fast)\ndef p(out: Buffer((4,), \"float32\")):\n    out[i] = float32(0.0)\n", 1,
     "unknown webgpu schedule"),
    ("@tensor_program(webgpu=tiled_matmul(tile=7))\ndef p(out: Buffer((4,), \"float32\")):\n    out[i] = float32(0.0)\n",
     1, "schedule tiled_matmul"),
    ("@tensor_program(wasm=tiled_matmul)\ndef p(out: Buffer((4,), \"float32\")):\n    out[i] = float32(0.0)\n", 1,
     "unknown wasm schedule"),
    ("@tensor_program(webgpu=None)\ndef p(out: Buffer((4,), \"float32\")):\n    out[i] = float32(0.0)\n", 1,
     "unknown webgpu schedule"),
    ("@tensor_program(wasm=packed_matmul(beyond=block_matmul(swap_factors=True)))\n"
     "def p(out: Buffer((4,), \"float32\")):\n    out[i] = float32(0.0)\n", 1, "orient the factors alike"),
    ("@tensor_program(wasm=window(lanes=8.5))\ndef p(out: Buffer((4,), \"float32\")):\n    out[i] = float32(0.0)\n",
     1, "a schedule's parameter is an integer"),
    ("@library_kernel(builder=\"unique_count\", args={\"name\": \"u\", \"length\": sym(n), \"dtype\": \"float32\"})\n"
     "def u(values: Buffer((n,), \"float32\"), out: Buffer((2,), \"int32\")): ...\n", 2, "the signature differs"),
    ("@library_kernel(builder=\"unique_count\", args={\"name\": \"u\", \"length\": sym(n), \"dtype\": \"float32\"}, "
     "targets=(\"webgpu\",))\ndef u(values: Buffer((n,), \"float32\"), out: Buffer((1,), \"int32\")): ...\n", 1,
     "the targets differ"),
    ("@library_kernel(builder=\"sort\", args={})\ndef u(out: Buffer((2,), \"int32\")): ...\n", 1,
     "no library kernel builder named 'sort'"),
    ("@host_function\ndef main():\n    dispatch(\"p\", (storage(0),), count=n)\n    launch()\n", 4,
     "expected a host step"),
    ("@function\ndef main(x: Tensor((n,), \"float32\")) -> Tensor((n,), \"float32\"):\n"
     "    return relu(x)\n", 3, "needs its annotation (sinfo=...)"),
])
def test_malformed_text_fails_with_its_line(text: str, line: int, message: str) -> None:
    with pytest.raises(ParseError) as caught:
        parse_module(text, {})
    assert caught.value.line == line
    assert message in str(caught.value)
    assert f"line {line}, column" in str(caught.value)
