"""schedule_programs: choose how each tensor program runs on every target of the bundle.

Code generation can lay a compute definition out in several ways on each target
(``relaxweb/ir/schedule.py``, ``relaxweb/ir/wasm_schedule.py``); this pass records the choice
for every target on each program (``relaxweb/ir/target_schedules.py``), so that it is
visible in ``--dump-ir`` and the backends and the bundle writer only follow it.  Library
kernels are hand-scheduled and left alone.

**WebGPU** (``webgpu``):

- matmul-like programs (``relaxweb.ir.pattern.analyze_matmul``: matmuls, batched matmuls,
  convolutions without groups, with fused prologues and epilogues) get ``tiled_matmul``:
  64x64 tiles with 8x8 outputs per invocation (on SwiftShader, 1.5 to 2 times the GFLOP/s of
  32x32 tiles with 4x4 at 1024^3), or 32x32 tiles with 4x4 where the rows or the columns are
  a constant below 64 (most of a 64 tile would be padding); staged 16 deep.  A symbolic
  extent counts as large: at a sequence of 8, a transformer's matmuls compute twice the
  padding they did with 32x32 tiles;
- other programs with reductions get ``workgroup_reduction`` when a reduction is long
  (a constant extent of at least 128: layer norm statistics over the hidden size) and every
  top-level reduction is computed unconditionally (workgroup barriers need uniform control
  flow) and none is an integer sum whose every step is checked (``ir/integer_checks.py``:
  it runs in order, one invocation per output).  Reductions over a symbolic extent (softmax over the sequence) keep one invocation
  per output: there are as many outputs as the reduction is long, and a workgroup per
  output wastes most of its invocations at short lengths;
- float elementwise and broadcast programs whose last dimension is a multiple of 4 get
  ``vectorized`` (four elements per invocation, 16-byte loads; ``relaxweb.ir.launch.vectorizable``
  has the exact conditions);
- everything else keeps ``element`` (one invocation per output element).

**WebGPU on a CPU adapter** (``webgpu_cpu``, the manifest's ``cpu_file``).  A workgroup
barrier is nearly free on a GPU and expensive where every invocation of a workgroup runs on
one CPU core (SwiftShader, lavapipe): there a matmul that stages its factors
(``tiled_matmul``) runs at about two thirds of the GFLOP/s of one that keeps its outputs in
registers and reads the factors straight from the buffers (``register_matmul``;
``bench/kernel_ceiling.py speed``: 1.4 against 2.1 GFLOP/s at 1024^3 on SwiftShader), while on
a GPU the staged tile reads each factor element once per workgroup instead of 8 times.  So a
tiled matmul gets ``register_matmul`` of its block (same tile, so the same dispatch size)
where its factors evaluate without branching (``relaxweb.ir.schedule_fit.branch_free``: no
reduction, selects with cheap branches: plain loads, a fused layer norm or activation, a
convolution's im2col gather with its padding test; YOLOv8n's largest convolution on
SwiftShader: 1.26 GFLOP/s this way against 0.64 staged, and with the padding test as an
if/else 0.66) and its shader stays within :data:`MAX_CPU_SHADER_BYTES`.  A register matmul
writes each factor once per block row or column, so a factor with a long prologue or long
index arithmetic makes a large shader: YOLOv8n's box-decoding convolution, a softmax and a
concatenation in its factor, made a 72 KB shader that SwiftShader's compiler lost the device
on.  The size is estimated before rendering from the factors' text
(``relaxweb.ir.schedule_fit.register_shader_bytes``).  The register shaders also compile three
to five times faster on SwiftShader (no barriers).  Every other kernel: None (the adapter
runs ``webgpu``'s shader).

**WebGPU with shader-f16** (``webgpu_f16``, ``f16_file``).  A GPU whose adapter offers
``shader-f16`` multiplies 16-bit floats at twice the rate of 32-bit ones, and a staged tile
of them takes half the workgroup memory and its traffic.  So every tiled matmul gets
``tiled_matmul_f16`` of its tiles: factors evaluated in f32 (fused prologues included),
rounded to f16 as they are staged, multiplied in f16 and summed in f32 (an f16 running sum
over K = 768 loses about 3 of the inputs' digits; ``tests/wgsl/test_f16_kernels.py`` measures
the error).  Buffers stay f32, so weights, bindings, params and the dispatch size do not
change.  Elementwise kernels get none: they are bound by the traffic of their f32 buffers.
f16's range ends at 65504: a factor beyond it becomes infinite, and ``kernels="gpu"`` is
the choice for such a model.

**WebAssembly** (``wasm``, ``kernels.wasm``):

- matmul-like programs get the matmul kinds: ``packed_matmul`` (falling back to
  ``block_matmul`` beyond its depth), preceded by ``matrix_vector`` where the second factor
  can be streamed in place or read as dot products (``relaxweb.ir.matmul_layout``:
  ``streamed_columns``, ``dot_columns``), which runs where the rows are few.  The factors
  swap roles where the second is the dear one (``cheap_columns``), and the packed kind splits
  the columns between units where the rows are few (``split_columns``);
- sliding-window reductions whose float ops all have f32x4 forms get ``window``
  (``relaxweb.ir.schedule_fit.wasm_window``: a depthwise convolution, a pool);
- float elementwise and broadcast programs WebGPU's ``vectorized`` of width 4 fits, their ops
  with f32x4 forms, get ``vectorized`` (four groups of four elements to an iteration, where
  a row has them); everything else ``element`` (four elements to an iteration, one where the
  body has a reduction, whose loops would be written out four times).

**Order.**  This pass runs once every program exists and before the host function is
lowered (which evaluates the dispatch sizes its WebGPU schedules imply): after
share_programs and after plan_memory, which adds a copy program for each value a loop carries.

- After sharing, a shared program (its members' differing literals turned into size
  variables their call sites bind) keeps the WebGPU layout its members had: WebGPU's rules
  read constant extents (the tile size, a long reduction, a multiple of 4), so its WebGPU
  schedule is chosen on the program as its call sites run it, the variables sharing
  introduced (recorded in the module's attrs, ``relaxweb.ir.shared_sizes``) bound to a call
  site's values.  share_programs grouped its members by that schedule and checked the shared
  program fits it, so every call site gives the same one (it is checked).  Matmuls of 48 and
  40 rows share their 32x32 tiles, which the program with a variable row count would not
  get.  Its other targets are chosen on the shared program itself, which is what they
  render: the wasm kinds those variables allow (a weight of variable shape is not split by
  columns), the CPU adapter's shader by the size of the shared program's factors.  (This is
  what sharing scheduled programs gave, when this pass ran before share_programs and the
  bundle writer chose the second shaders and the wasm kinds.)
- After plan_memory, a loop's carried-value copies are scheduled like any other program
  (before, they were made after scheduling: the element layout on WebGPU, their wasm kind
  picked by the renderer); plan_memory merges a copy with an identical program of the
  module (a model's own ``identity``) before either has a schedule.

**Opt level 0** (``--opt-level 0``, what the optimizations are measured against): WebGPU
runs ``element`` everywhere and no second shader; WebAssembly keeps the kinds above, as it
always had (its element form is no reference: ``kernels.wasm`` at level 0 is as before).
"""

from __future__ import annotations

from dataclasses import replace

from ..ir.expr import CallTIR, CallTIRInto, Function
from ..ir.functor import post_order_visit
from ..ir.launch import matmul_extents, matmul_info, vectorizable
from ..ir.matmul_layout import cheap_columns, dot_columns, oriented, split_columns, streamed_columns
from ..ir.module import IRModule
from ..ir.pattern import MatmulInfo, Pattern, analyze_matmul, program_pattern, top_level_reductions
from ..ir.schedule import (
    ElementSchedule, HalfTiledMatmulSchedule, RegisterMatmulSchedule, TiledMatmulSchedule, VectorizedSchedule,
    WebGpuSchedule, WorkgroupReductionSchedule,
)
from ..ir.schedule_fit import branch_free, register_shader_bytes, wasm_vectorizable, wasm_window
from ..ir.shared_sizes import at_call_site, shared_sizes
from ..ir.symbolic import as_int
from ..ir.target_schedules import TargetSchedules
from ..ir.tir import Reduce, Select, TensorProgram, scalar_children, scalar_nodes
from ..ir.wasm_schedule import (
    BlockMatmulSchedule, MatrixVectorSchedule, PackedMatmulSchedule, WasmElementSchedule, WasmSchedule,
    WasmVectorizedSchedule, WindowSchedule,
)
from .context import PassContext

LONG_REDUCTION = 128  # a constant extent from which a workgroup per output element pays off
LARGE_TILES = TiledMatmulSchedule(tile=64, depth=16, block=8)
SMALL_TILES = TiledMatmulSchedule(tile=32, depth=16, block=4)
MAX_CPU_SHADER_BYTES = 32_768
"""The largest CPU adapter's shader written, by its estimated size
(``schedule_fit.register_shader_bytes``).  YOLOv8n's box-decoding convolution made a 72 KB
register shader that SwiftShader's compiler lost the device on (42 KB now, still left out).
The bound is the one the bundle writer applied to the rendered text before this pass chose
the schedules, and the estimate decides as that did on every kernel of the test corpus, the
real models and the ONNX node models: the largest shader written is YOLOv8n's 27.7 KB (27.4
KB estimated), the smallest left out a ShuffleNet channel shuffle's 34.0 KB (35.4 KB
estimated; 34 to 382 KB, long index arithmetic in the factor)."""

# The wasm kinds' parameters (``relaxweb/ir/wasm_schedule.py`` says what each means and why).
BLOCKS = BlockMatmulSchedule()
PACKED = PackedMatmulSchedule()
MATRIX_VECTOR = MatrixVectorSchedule()


def schedule_programs(module: IRModule) -> IRModule:
    """Set ``schedule`` on every tensor program of the module (every target; at opt level
    0 WebGPU's element layout, see the module doc)."""
    optimize = PassContext.current().opt_level >= 1
    call_sites = _shared_call_sites(module)
    programs = {}
    for name, program in module.programs.items():
        if isinstance(program, TensorProgram):
            webgpu = _shared_webgpu_schedule(program, call_sites[name]) if name in call_sites else None
            program = replace(program, schedule=choose_schedules(program, optimize, webgpu))
        programs[name] = program
    return module.replace(programs=programs)


def choose_schedules(program: TensorProgram, optimize: bool = True,
                     webgpu: WebGpuSchedule | None = None) -> TargetSchedules:
    """The program's schedule on every target; ``optimize`` False: WebGPU's element layout.
    ``webgpu``: the WebGPU schedule where it was chosen on another form of the program (a
    shared program's, on its call sites' form); by default chosen on ``program``."""
    if not optimize:
        webgpu = ElementSchedule()
    elif webgpu is None:
        webgpu = webgpu_schedule(program)
    return TargetSchedules(webgpu, cpu_adapter_schedule(program, webgpu), f16_schedule(webgpu), wasm_schedule(program))


def _shared_call_sites(module: IRModule) -> dict[str, list[dict[str, int]]]:
    """For each shared program, the values its call sites bind to the size variables sharing
    introduced, one dict per distinct binding."""
    introduced = shared_sizes(module.attrs)
    sites: dict[str, list[dict[str, int]]] = {}

    def note(expr) -> None:
        if isinstance(expr, (CallTIR, CallTIRInto)) and expr.program in introduced:
            bound = dict(expr.size_var_values)
            values = {name: as_int(bound[name]) for name in introduced[expr.program]}
            if None in values.values():
                raise ValueError(f"a call of {expr.program} binds a size variable sharing introduced to a non-constant: "
                                 f"{expr.size_var_values}")
            if values not in sites.setdefault(expr.program, []):
                sites[expr.program].append(values)

    for function in module.functions.values():
        if isinstance(function, Function):
            post_order_visit(function, note)
    return sites


def _shared_webgpu_schedule(program: TensorProgram, call_sites: list[dict[str, int]]) -> WebGpuSchedule:
    """A shared program's WebGPU schedule: its members', chosen on the program as each call
    site runs it (share_programs grouped them so that all agree)."""
    schedules = {webgpu_schedule(at_call_site(program, values)) for values in call_sites}
    if len(schedules) != 1:
        raise ValueError(f"{program.name}: its call sites would lay it out as {sorted(map(str, schedules))} on WebGPU; "
                         "share_programs groups programs of one WebGPU schedule")
    return schedules.pop()


# -- WebGPU ---------------------------------------------------------------------------------------


def webgpu_schedule(program: TensorProgram) -> WebGpuSchedule:
    """The kernel's shader's schedule, from the program's pattern (see the module doc)."""
    pattern = program_pattern(program)
    if pattern is Pattern.MATMUL:
        return _tiled_matmul(program)
    if pattern is Pattern.REDUCTION and _cooperative_reductions_allowed(program):
        return WorkgroupReductionSchedule()
    vectorized = VectorizedSchedule()
    elementwise = pattern in (Pattern.ELEMENTWISE, Pattern.BROADCAST, Pattern.INJECTIVE)
    if elementwise and vectorizable(program, vectorized.width):
        return vectorized
    return ElementSchedule()


def cpu_adapter_schedule(program: TensorProgram, webgpu: WebGpuSchedule) -> WebGpuSchedule | None:
    """The second shader's schedule for CPU adapters, or None where ``webgpu``'s is the best
    known there too (see the module doc)."""
    if not isinstance(webgpu, TiledMatmulSchedule):
        return None
    info = matmul_info(program)
    register = RegisterMatmulSchedule(block=webgpu.block)
    if register.tile != webgpu.tile:  # the dispatch size must not change
        return None
    if not (branch_free(info.a) and branch_free(info.b)):
        return None
    return register if register_shader_bytes(program, info, register.block) <= MAX_CPU_SHADER_BYTES else None


def f16_schedule(webgpu: WebGpuSchedule) -> WebGpuSchedule | None:
    """The second shader's schedule for adapters with ``shader-f16``, or None where f16 does
    not pay (see the module doc)."""
    if type(webgpu) is not TiledMatmulSchedule:
        return None
    return HalfTiledMatmulSchedule(tile=webgpu.tile, depth=webgpu.depth, block=webgpu.block)


def _tiled_matmul(program: TensorProgram) -> TiledMatmulSchedule:
    rows, columns, _ = matmul_extents(program, matmul_info(program))
    small = [e for e in (as_int(rows), as_int(columns)) if e is not None and e < LARGE_TILES.tile]
    return SMALL_TILES if small else LARGE_TILES


def _cooperative_reductions_allowed(program: TensorProgram) -> bool:
    reductions = top_level_reductions(program.body)
    if _reduction_under_select(program.body) or _checked_reduction(program.body):
        return False
    return any(as_int(r.extent) is not None and as_int(r.extent) >= LONG_REDUCTION for r in reductions)


def _checked_reduction(expr) -> bool:
    """Whether a reduction's every step is checked (an int64 sum: ``ir/integer_checks.py``):
    it runs serially, in the order the check sees its partial results."""
    return any(node.scalar_kind == "checked_integer" and node.value.scalar_kind == "reduce" for node in scalar_nodes(expr))


def _reduction_under_select(expr) -> bool:
    if isinstance(expr, Select):
        return bool(any(top_level_reductions(child) for child in scalar_children(expr)))
    if isinstance(expr, Reduce):  # what is inside a reduction runs serially anyway
        return False
    return any(_reduction_under_select(child) for child in scalar_children(expr))


# -- WebAssembly ----------------------------------------------------------------------------------


def wasm_schedule(program: TensorProgram) -> WasmSchedule:
    """The kernel's schedule in ``kernels.wasm`` (see the module doc)."""
    info = analyze_matmul(program)
    if info is not None:
        return _wasm_matmul(program, info)
    if wasm_window(program) is not None:
        return WindowSchedule()
    if wasm_vectorizable(program):
        return WasmVectorizedSchedule()
    # elements four to an iteration where each is a short expression: a reduction's loop
    # written out four times would grow the kernel for little
    reduces = any(isinstance(node, Reduce) for node in scalar_nodes(program.body))
    return WasmElementSchedule(unroll=1 if reduces else 4)


def _wasm_matmul(program: TensorProgram, info: MatmulInfo) -> WasmSchedule:
    swap = cheap_columns(info, program, BLOCKS.columns, PACKED.panel_columns)
    info = oriented(info, swap)
    packed = replace(PACKED, swap_factors=swap, split_columns=split_columns(info),
                     beyond=replace(BLOCKS, swap_factors=swap))
    streamed = streamed_columns(info, program)
    if not (streamed or dot_columns(info)):
        return packed
    depth = MatrixVectorSchedule.deepest(MATRIX_VECTOR.max_rows, MATRIX_VECTOR.columns, packed)  # all its scratch holds
    return replace(MATRIX_VECTOR, swap_factors=swap, dot_products=not streamed, max_depth=depth, otherwise=packed)
