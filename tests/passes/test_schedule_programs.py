"""schedule_programs: every target's schedule chosen on each tensor program (WebGPU, WebGPU on
a CPU adapter, WebGPU with shader-f16, wasm), as IR text before and expected after (parsed,
the pass run, compared structurally, both run through the reference interpreter); the order
with share_programs; opt level 0; ``--dump-ir``.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from relaxweb.compiler import compile_module
from relaxweb.ir.parser import parse_module
from relaxweb.ir.schedule import HalfTiledMatmulSchedule, RegisterMatmulSchedule, TiledMatmulSchedule
from relaxweb.ir.symbolic import IntImm, SizeVar
from relaxweb.ir.tir import Binary, BinaryOp, Buffer, Compare, CompareOp, FloatImm, Load, Reduce, Select, TensorProgram
from relaxweb.ir.wasm_schedule import MatrixVectorSchedule, PackedMatmulSchedule
from relaxweb.passes import PassContext, schedule_programs, share_programs
from relaxweb.wgsl.shader import emit_wgsl
from relaxweb.passes.schedule_programs import LARGE_TILES, MAX_CPU_SHADER_BYTES, choose_schedules
from tests.helpers import rand
from tests.passes.rewrite import check_rewrite
from tests.passes.graphs import mlp_module

SMALL_TILES = "tiled_matmul(tile=32, depth=16, block=4)"


def targets(webgpu: str = "element", cpu: str = "None", f16: str = "None",
            wasm: str = "element(elements_per_unit=64)") -> str:
    """A scheduled program's decorator arguments: every target's schedule."""
    return f"(webgpu={webgpu}, webgpu_cpu={cpu}, webgpu_f16={f16}, wasm={wasm})"


def tiled(wasm: str) -> str:
    """A small-tiled matmul's decorator arguments: the staged shader, the register one for
    CPU adapters, the f16 one, and ``wasm``."""
    return targets(SMALL_TILES, "register_matmul(block=4)", "tiled_matmul_f16(tile=32, depth=16, block=4)", wasm)


def packed(swap: bool = False, split: bool = False) -> str:
    return (f"packed_matmul(swap_factors={swap}, panel_rows=32, micro_rows=4, panel_columns=8, max_depth=4608, "
            f"chunk=256, panel_bytes=1048576, units_wanted=8, split_columns={split}, split_bytes=1048576, "
            f"beyond=block_matmul(swap_factors={swap}, rows=4, columns=16))")


def matrix_vector(otherwise: str, swap: bool = False, dot: bool = False) -> str:
    return (f"matrix_vector(swap_factors={swap}, max_rows=8, columns=512, steps=8, max_depth=36896, "
            f"dot_products={dot}, dot_columns=4, dot_rows=4, otherwise={otherwise})")


PROGRAMS = '''
@tensor_program{relu}
def relu(A: Buffer((n, 4), "float32"), out: Buffer((n, 4), "float32")):
    out[i0_, i1_] = maximum(A[i0_, i1_], float32(0.0))

@tensor_program{matmul}
def matmul(A: Buffer((n, 4), "float32"), B: Buffer((4, 8), "float32"), out: Buffer((n, 8), "float32")):
    out[i0_, i1_] = sum((A[i0_, k_] * B[k_, i1_]) for k_ in range(4))

@tensor_program{negative}
def negative(A: Buffer((n, 3), "float32"), out: Buffer((n, 3), "float32")):
    out[i0_, i1_] = negative(A[i0_, i1_])

@tensor_program{row_sum}
def row_sum(A: Buffer((n, 256), "float32"), out: Buffer((n,), "float32")):
    out[i0_] = sum(A[i0_, r_] for r_ in range(256))

@function(inputs=["x", "odd", "wide"], outputs=["y", "z", "s"])
def main(x: Tensor((n, 4), "float32"), odd: Tensor((n, 3), "float32"), wide: Tensor((n, 256), "float32")) -> Tuple(Tensor((n, 8), "float32"), Tensor((n, 3), "float32"), Tensor((n,), "float32")):
    with dataflow():
        a: Tensor((n, 4), "float32") = call_tir("relu", (x,), sizes={{"n": n}})
        y: Tensor((n, 8), "float32") = call_tir("matmul", (a, const("w")), sizes={{"n": n}})
        z: Tensor((n, 3), "float32") = call_tir("negative", (odd,), sizes={{"n": n}})
        s: Tensor((n,), "float32") = call_tir("row_sum", (wide,), sizes={{"n": n}})
        output(y, z, s)
    return (y, z, s)
'''
PROGRAM_INPUTS = {"x": rand(3, 4), "odd": rand(3, 3, seed=2), "wide": rand(3, 256, seed=3)}
UNSCHEDULED = PROGRAMS.format(relu="", matmul="", negative="", row_sum="")


def test_every_target_is_chosen_by_pattern() -> None:
    """An elementwise program whose last dimension is a multiple of 4: vectorized on both
    targets.  A matmul: staged tiles, with register and f16 second shaders; on wasm the
    matrix-vector kind for few rows (its weight read in place), else packed panels that
    split the weight's columns, else blocks.  A last dimension of 3: the element kind
    everywhere (on wasm four elements to an iteration; one with a reduction).  A long
    constant reduction: a workgroup per output element on WebGPU."""
    expected = PROGRAMS.format(relu=targets("vectorized(width=4)", wasm="vectorized(elements_per_unit=64, unroll=4)"),
                               matmul=tiled(matrix_vector(packed(split=True))),
                               negative=targets(wasm="element(elements_per_unit=64, unroll=4)"),
                               row_sum=targets("workgroup_reduction"))
    check_rewrite(schedule_programs, UNSCHEDULED, expected, PROGRAM_INPUTS, {"w": rand(4, 8, seed=1)})


def test_wasm_kinds_follow_the_factors_layout() -> None:
    """The second factor is evaluated per column of a block, so where it is the computed one
    (a ReLU of the weight) the factors swap: the input's rows are then columns, each
    contiguous along the reduction (a dot product each); not with fewer rows than a block
    has columns (4: no block would be whole), which also leaves no weight to read in place.
    Both packed kinds split the columns where the rows are few (their first factors cost
    about a copy to pack).  A depthwise window: WebGPU's element layout, wasm's window kind."""
    before = '''
@tensor_program{relu_weight}
def relu_weight(A: Buffer((n, 4), "float32"), B: Buffer((4, 8), "float32"), out: Buffer((n, 8), "float32")):
    out[i0_, i1_] = sum((A[i0_, k_] * maximum(B[k_, i1_], float32(0.0))) for k_ in range(4))

@tensor_program{few_rows}
def few_rows(A: Buffer((4, 4), "float32"), B: Buffer((4, n), "float32"), out: Buffer((4, n), "float32")):
    out[i0_, i1_] = sum((A[i0_, k_] * maximum(B[k_, i1_], float32(0.0))) for k_ in range(4))

@tensor_program{depthwise}
def depthwise(A: Buffer((c, 10), "float32"), W: Buffer((c, 3), "float32"), out: Buffer((c, 8), "float32")):
    out[i0_, i1_] = sum((A[i0_, (i1_ + k_)] * W[i0_, k_]) for k_ in range(3))

@function(inputs=["x", "w", "y"], outputs=["a", "b", "d"])
def main(x: Tensor((n, 4), "float32"), w: Tensor((4, n), "float32"), y: Tensor((c, 10), "float32")) -> Tuple(Tensor((n, 8), "float32"), Tensor((4, n), "float32"), Tensor((c, 8), "float32")):
    with dataflow():
        a: Tensor((n, 8), "float32") = call_tir("relu_weight", (x, const("w")), sizes={{"n": n}})
        b: Tensor((4, n), "float32") = call_tir("few_rows", (const("v"), w), sizes={{"n": n}})
        d: Tensor((c, 8), "float32") = call_tir("depthwise", (y, const("k")), sizes={{"c": c}})
        output(a, b, d)
    return (a, b, d)
'''
    window = "window(lanes=8, unroll=8, unrolled_widths=(3, 5, 7), overreach=1024, masked_borders=True)"
    expected = before.format(relu_weight=tiled(matrix_vector(packed(swap=True, split=True), swap=True, dot=True)),
                             few_rows=tiled(packed(split=True)), depthwise=targets(wasm=window))
    constants = {"w": rand(4, 8, seed=1), "v": rand(4, 4, seed=2), "k": rand(2, 3, seed=3)}
    inputs = {"x": rand(5, 4), "w": rand(4, 5, seed=4), "y": rand(2, 10, seed=5)}
    check_rewrite(schedule_programs, before.format(relu_weight="", few_rows="", depthwise=""), expected, inputs,
                  constants)


SHARED = '''
@tensor_program{decorator}
def {name}(A: Buffer((n, {k}), "float32"), B: Buffer(({k}, 8), "float32"), out: Buffer((n, 8), "float32")):
    out[i0_, i1_] = sum((A[i0_, k_] * B[k_, i1_]) for k_ in range({k}))
'''
SHARED_SIZES = "attrs = {{\"shared_sizes\": {}}}\n"  # the variables sharing introduced, by program
SHARED_MAIN = '''
@function(inputs=["x", "y"], outputs=["a", "b"])
def main(x: Tensor((n, 4), "float32"), y: Tensor((n, 6), "float32")) -> Tuple(Tensor((n, 8), "float32"), Tensor((n, 8), "float32")):
    with dataflow():
        a: Tensor((n, 8), "float32") = call_tir("matmul", (x, const("w")), sizes={{"n": n{first}}})
        b: Tensor((n, 8), "float32") = call_tir("{second}", (y, const("v")), sizes={{"n": n{other}}})
        output(a, b)
    return (a, b)
'''


def test_shared_programs_are_scheduled_as_shared() -> None:
    """share_programs runs first: two matmuls that differ in their depth become one, whose
    weight has a variable shape; its packed kind still splits the columns where the rows are
    few (its first factor is a plain load), and WebGPU keeps the tiles both members get."""
    before = (SHARED.format(decorator="", name="matmul", k=4) + SHARED.format(decorator="", name="matmul1", k=6)
              + SHARED_MAIN.format(first="", second="matmul1", other=""))
    expected = (SHARED_SIZES.format('{"matmul": ("constant0",)}')
                + SHARED.format(decorator=tiled(matrix_vector(packed(split=True))), name="matmul", k="constant0")
                + SHARED_MAIN.format(first=', "constant0": 4', second="matmul", other=', "constant0": 6'))

    def share_then_schedule(module):
        return schedule_programs(share_programs(module))

    constants = {"w": rand(4, 8, seed=2), "v": rand(6, 8, seed=3)}
    check_rewrite(share_then_schedule, before, expected, {"x": rand(3, 4), "y": rand(3, 6, seed=1)}, constants)
    alone = parse_module(before, constants).programs["matmul"]
    assert choose_schedules(alone).wasm.otherwise.split_columns  # type: ignore[union-attr]


ROWS = '''
@tensor_program{decorator}
def {name}(A: Buffer(({rows}, 4), "float32"), B: Buffer((4, n), "float32"), out: Buffer(({rows}, n), "float32")):
    out[i0_, i1_] = sum((A[i0_, k_] * B[k_, i1_]) for k_ in range(4))
'''
ROWS_MAIN = '''
@function(inputs=["x", "y", "w"], outputs=["a", "b"])
def main(x: Tensor((48, 4), "float32"), y: Tensor(({other}, 4), "float32"), w: Tensor((4, n), "float32")) -> Tuple(Tensor((48, n), "float32"), Tensor(({other}, n), "float32")):
    with dataflow():
        a: Tensor((48, n), "float32") = call_tir("first", (x, w), sizes={{"n": n{first}}})
        b: Tensor(({other}, n), "float32") = call_tir("{second}", (y, w), sizes={{"n": n{second_sizes}}})
        output(a, b)
    return (a, b)
'''


def test_a_shared_program_keeps_its_members_tiles() -> None:
    """Matmuls of 48 and 40 rows take 32x32 tiles (most of a 64 tile would be padding).
    They share one program whose row count is a variable, which alone would take 64x64
    tiles; its WebGPU schedule is chosen as its call sites run it (48 and 40 rows): the
    members' 32x32 tiles, and so their dispatch sizes.  The other targets are chosen on the
    shared program (the wasm kinds read the row count as a variable)."""
    before = (ROWS.format(decorator="", name="first", rows=48) + ROWS.format(decorator="", name="second", rows=40)
              + ROWS_MAIN.format(other=40, first="", second="second", second_sizes=""))
    expected = (SHARED_SIZES.format('{"first": ("constant0",)}')
                + ROWS.format(decorator=tiled(matrix_vector(packed(split=True))), name="first", rows="constant0")
                + ROWS_MAIN.format(other=40, first=', "constant0": 48', second="first",
                                   second_sizes=', "constant0": 40'))

    def share_then_schedule(module):
        return schedule_programs(share_programs(module))

    inputs = {"x": rand(48, 4), "y": rand(40, 4, seed=1), "w": rand(4, 5, seed=2)}
    shared = check_rewrite(share_then_schedule, before, expected, inputs)
    alone = shared.programs["first"]
    assert choose_schedules(replace(alone, schedule=None)).webgpu == LARGE_TILES  # what it would get alone


def test_call_sites_that_disagree_on_a_shared_programs_tiles_are_refused() -> None:
    """A shared program whose call sites would lay it out differently on WebGPU (48 rows: 32x32
    tiles; 100 rows: 64x64) is none share_programs makes; the pass says so."""
    text = (SHARED_SIZES.format('{"first": ("constant0",)}') + ROWS.format(decorator="", name="first", rows="constant0")
            + ROWS_MAIN.format(other=100, first=', "constant0": 48', second="first", second_sizes=', "constant0": 100'))
    with pytest.raises(ValueError, match="call sites would lay it out as"):
        schedule_programs(parse_module(text))


def test_opt_level_zero_lays_webgpu_out_by_element() -> None:
    """At opt level 0 every WebGPU shader runs one output element per invocation and there
    is no second shader; the wasm kernels keep their kinds (as kernels.wasm always had)."""
    level_one = schedule_programs(parse_module(UNSCHEDULED, {"w": rand(4, 8, seed=1)}))
    expected = PROGRAMS.format(**{name: targets(wasm=str(program.schedule.wasm))
                                  for name, program in level_one.programs.items()})
    with PassContext(opt_level=0):
        check_rewrite(schedule_programs, UNSCHEDULED, expected, PROGRAM_INPUTS, {"w": rand(4, 8, seed=1)})


def matmul_of(factor_a, a_shape: tuple = (SizeVar("n"), IntImm(8))) -> TensorProgram:
    """``out[i, j] = sum(factor_a(A, i, k) * B[k, j] for k)`` over (n x 8) @ (8 x 8); A of
    ``a_shape``, ``factor_a(A, i, k)`` by default ``A[i, k]``."""
    n, i, j, k = SizeVar("n"), SizeVar("i0_"), SizeVar("i1_"), SizeVar("k_")
    a, b = Buffer("A", a_shape, "float32"), Buffer("B", (IntImm(8), IntImm(8)), "float32")
    body = Reduce("sum", k, IntImm(8), Binary(BinaryOp.MULTIPLY, factor_a(a, i, k), Load(b, (k, j))))
    return TensorProgram("matmul", (a, b), Buffer("out", (n, IntImm(8)), "float32"), (i, j), body)


def test_a_cpu_adapter_shader_needs_cheap_factors_and_a_small_shader() -> None:
    """A register matmul evaluates each factor once per row or column of its block: not
    where a factor branches (a select with a dear branch), nor where its shader would pass
    MAX_CPU_SHADER_BYTES, estimated before rendering: a factor that sums 96 elements of a row
    of variable width renders a shader within it, one that sums 160 a larger one (the
    estimate decides as the rendered WGSL's size would).  The f16 shader does not care."""
    def chain(x, links: int):
        for link in range(links):
            x = Binary(BinaryOp.ADD, Binary(BinaryOp.MULTIPLY, x, FloatImm(1.0 + link / 1000)), FloatImm(link / 7))
        return x

    def row_sum(terms: int):
        """A[i, 3k] + A[i, 3k + 1] + ... (terms of them, summed pairwise)."""
        def factor(a, i, k):
            values = [Load(a, (i, k * 3 + t)) for t in range(terms)]
            while len(values) > 1:
                values = [Binary(BinaryOp.ADD, *values[p:p + 2]) if p + 1 < len(values) else values[p]
                          for p in range(0, len(values), 2)]
            return values[0]
        return matmul_of(factor, (SizeVar("n"), SizeVar("width")))

    plain = matmul_of(lambda a, i, k: Load(a, (i, k)))
    branching = matmul_of(lambda a, i, k: Select(Compare(CompareOp.GT, Load(a, (i, k)), FloatImm(0.0)),
                                                 chain(Load(a, (i, k)), 8), FloatImm(0.0)))
    small, large = row_sum(96), row_sum(160)
    half = HalfTiledMatmulSchedule(tile=32, depth=16, block=4)
    for program, register in ((plain, True), (branching, False), (small, True), (large, False)):
        schedules = choose_schedules(program)
        assert schedules.webgpu == TiledMatmulSchedule() and schedules.webgpu_f16 == half
        assert (schedules.webgpu_cpu is not None) == register, program.body
    for program, fits in ((small, True), (large, False)):
        shader = emit_wgsl(program, {}, RegisterMatmulSchedule(block=4)).source
        assert (len(shader.encode()) <= MAX_CPU_SHADER_BYTES) == fits


def test_dump_ir_shows_every_target_after_scheduling(tmp_path) -> None:
    """``--dump-ir``: no schedule before the pass, every target's after it."""
    compile_module(mlp_module(), {}, dump_ir=tmp_path)
    [before] = tmp_path.glob("*_share_programs.txt")
    [after] = tmp_path.glob("*_schedule_programs.txt")
    assert "@tensor_program(" not in before.read_text()
    decorators = [line for line in after.read_text().splitlines() if line.startswith("@tensor_program")]
    assert decorators and all(all(f"{target}=" in line for target in ("webgpu", "webgpu_cpu", "webgpu_f16", "wasm"))
                              for line in decorators)


def test_a_matrix_vector_kind_fits_the_scratch_of_the_kind_it_falls_back_to() -> None:
    """The matrix-vector kind packs its first factor into the scratch the packed kind sizes:
    its depth is the most that fits, and a deeper one is refused."""
    packed_kind = PackedMatmulSchedule(panel_bytes=1 << 16)
    fitting = MatrixVectorSchedule(otherwise=packed_kind)
    assert fitting.own_scratch_bytes <= packed_kind.scratch_bytes == fitting.scratch_bytes
    assert MatrixVectorSchedule().max_depth == 36896
    with pytest.raises(ValueError, match="fits the scratch"):
        replace(fitting, max_depth=fitting.max_depth + 4)


def test_a_loops_carried_copies_are_scheduled_too() -> None:
    """plan_memory adds a copy program for each value a loop carries; scheduling comes after
    it, so every program of the compiled module has its schedules (a running sum of 8 floats
    carried by a Scan: WebGPU's vectorized layout, as any such copy)."""
    from onnx import TensorProto, helper

    from relaxweb.compiler import compile_model
    from tests.helpers import make_model

    body = helper.make_graph([helper.make_node("Add", ["h", "x"], ["h_next"]),
                              helper.make_node("Relu", ["h_next"], ["h_out"])], "step",
                             [helper.make_tensor_value_info("h", TensorProto.FLOAT, [8]),
                              helper.make_tensor_value_info("x", TensorProto.FLOAT, [8])],
                             [helper.make_tensor_value_info("h_next", TensorProto.FLOAT, [8]),
                              helper.make_tensor_value_info("h_out", TensorProto.FLOAT, [8])])
    scan = helper.make_node("Scan", ["h0", "xs"], ["h_last", "hs"], body=body, num_scan_inputs=1)
    module = compile_model(make_model([scan], [("h0", [8]), ("xs", ["T", 8])], ["h_last", "hs"], {}, opset=16))
    programs = [p for p in module.programs.values() if isinstance(p, TensorProgram)]
    assert programs and all(p.schedule is not None for p in programs)
    [carry] = [p for p in programs if p.name == "loop_carry"]
    assert str(carry.schedule.webgpu) == "vectorized(width=4)" and str(carry.schedule.wasm).startswith("vectorized")
