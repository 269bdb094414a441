"""What a scheduled tensor program needs to run, and which programs a schedule fits.

Target-neutral facts about the schedules of ``schedule.py``, used on both sides of the
bundle: :func:`dispatch_count` is evaluated by the host module at run time (from the size
variables), :func:`workgroup_storage_bytes` goes into the manifest's required limits, and
the applicability checks (:func:`vectorizable`, :func:`matmul_info`) are what
``schedule_programs`` decides with and what the WGSL backend lays the shader out by.
"""

from __future__ import annotations

from .access import flat_offset
from .dtype import DTYPES
from .expr import Constant
from .pattern import MatmulInfo, analyze_matmul, top_level_reductions
from .schedule import (
    MATMUL_SCHEDULES, WORKGROUP_SIZE, ElementSchedule, HalfTiledMatmulSchedule, RegisterMatmulSchedule,
    TiledMatmulSchedule, VectorizedSchedule, WebGpuSchedule, WorkgroupReductionSchedule,
)
from .symbolic import IntImm, PrimExpr, SizeVar, free_vars, product, simplify
from .target_schedules import schedules_of
from .tir import (
    Binary, Cast, Compare, FloatImm, IndexValue, Load, ScalarExpr, Select, TensorProgram, Unary, UnaryOp, scalar_children,
    scalar_nodes,
)

VECTOR = "vector"  # a buffer read along the last axis, ``width`` elements at a time
SPLAT = "splat"  # a buffer constant along the last axis: one element for the whole vector
LANES = "lanes"  # (wasm) a buffer read elsewhere for each lane: ``width`` loads of one element


def dispatch_count(program: TensorProgram, schedule: WebGpuSchedule | None = None) -> PrimExpr:
    """Invocations a dispatch of ``program`` needs under ``schedule`` (by default its WebGPU
    one, which every shader of the kernel keeps), over its size variables."""
    schedule = schedules_of(program).webgpu if schedule is None else schedule
    outputs = product(program.output.shape)
    if isinstance(schedule, VectorizedSchedule):
        return simplify(outputs // schedule.width)
    if isinstance(schedule, WorkgroupReductionSchedule):
        return simplify(outputs * WORKGROUP_SIZE)
    if isinstance(schedule, MATMUL_SCHEDULES):
        rows, columns, batch = matmul_extents(program, matmul_info(program))
        tile = schedule.tile
        tiles = ((rows + (tile - 1)) // tile) * ((columns + (tile - 1)) // tile)
        return simplify(batch * tiles * WORKGROUP_SIZE)
    if isinstance(schedule, ElementSchedule):
        return outputs
    raise NotImplementedError(f"{program.name}: no dispatch size for the schedule {schedule} (relaxweb/ir/launch.py)")


def workgroup_storage_bytes(program: TensorProgram, schedule: WebGpuSchedule | None = None) -> int:
    """Bytes of workgroup memory ``schedule`` (by default the program's WebGPU one) uses (the
    bundle requires at least this ``maxComputeWorkgroupStorageSize``)."""
    schedule = schedules_of(program).webgpu if schedule is None else schedule
    if isinstance(schedule, TiledMatmulSchedule):
        staged_bytes = 2 if isinstance(schedule, HalfTiledMatmulSchedule) else 4
        return 2 * schedule.tile * schedule.depth * staged_bytes  # both factors' staged slices
    if isinstance(schedule, WorkgroupReductionSchedule):
        return len(set(top_level_reductions(program.body))) * WORKGROUP_SIZE * 4  # one partial per invocation
    if isinstance(schedule, (ElementSchedule, VectorizedSchedule, RegisterMatmulSchedule)):
        return 0
    raise NotImplementedError(f"{program.name}: no workgroup memory size for the schedule {schedule} (relaxweb/ir/launch.py)")


# -- tiled matmul ---------------------------------------------------------------------------------


def matmul_info(program: TensorProgram) -> MatmulInfo:
    """The matmul-like split of a program scheduled as a tiled matmul."""
    info = analyze_matmul(program)
    if info is None:
        raise ValueError(f"{program.name} is scheduled as a tiled matmul but is not matmul-like")
    return info


def matmul_extents(program: TensorProgram, info: MatmulInfo) -> tuple[PrimExpr, PrimExpr, PrimExpr]:
    """(rows, columns, batch): the products of the output extents of each group of axes."""
    shape = program.output.shape
    return (product(shape[p] for p in info.rows), product(shape[p] for p in info.columns),
            product(shape[p] for p in info.batch))


# -- vectorized -----------------------------------------------------------------------------------


def vectorizable(program: TensorProgram, width: int = 4, wasm: bool = False) -> bool:
    """Whether the vectorized schedule of ``width`` can run ``program``: float32 elementwise
    arithmetic (loads, constants, binary and unary ops; no selects, casts or comparisons), an
    output whose last dimension is a multiple of ``width``, and every buffer read either along
    the last axis (at it plus a multiple of ``width``, from a last dimension that is a
    multiple of ``width``) or never along it.  With ``wasm``, what WebAssembly's kind takes
    besides (:func:`vector_access`: reads at any offset, selects by an index)."""
    if program.output.dtype != "float32" or not program.axes:
        return False
    if not _multiple_of(program.output.shape[-1], width):
        return False
    return vector_access(program, width, wasm) is not None


def vector_access(program: TensorProgram, width: int, wasm: bool = False) -> dict[str, str] | None:
    """How the vectorized schedule reads each loaded buffer (:data:`VECTOR`, :data:`SPLAT` or,
    on wasm, :data:`LANES`), by name; None when the program does not fit it.

    With ``wasm`` (WebAssembly's f32x4, ``relaxweb/cpu/schedules/vectorized.py``): a buffer is
    read wherever its flat offset is the last axis plus anything, since ``v128.load`` reads
    any address: along its last dim, or over several dims (``[..., x // 2, x % 2]`` of a
    ``[..., W, 2]`` buffer: a reshape that split the axis); read otherwise, one element per
    lane (:data:`LANES`: a transposed convolution's interleaved tiles, ``[..., x % 2, ...,
    x // 2]``), so that the math after such a read still runs on f32x4.  WGSL indexes an
    array of vec4s: there only the last dim may read the axis, and the offset and the
    buffer's last dimension must be multiples of ``width``.  With ``wasm`` a select is taken
    where its condition is the same for the ``width`` lanes (:func:`lane_invariant`: a
    concatenation's piece chosen by an index), as a branch around f32x4 values."""
    last = program.axes[-1].name
    kinds: dict[str, str] = {}

    def fits(node: ScalarExpr) -> bool:
        if wasm and isinstance(node, Select):
            return lane_invariant(node.condition, last) and fits(node.a) and fits(node.b)
        if not isinstance(node, (Load, Binary, Unary, FloatImm)):
            return False
        if isinstance(node, Unary) and node.op in (UnaryOp.IS_NAN, UnaryOp.IS_FINITE):
            return False
        if isinstance(node, FloatImm) and node.dtype != "float32":
            return False
        if isinstance(node, Load) and not load_fits(node):
            return False
        return all(fits(child) for child in scalar_children(node))

    def load_fits(node: Load) -> bool:
        if node.buffer.dtype != "float32":
            return False
        uses_last = [last in {v.name for v in free_vars(i)} for i in node.indices]
        if not any(uses_last):
            kind = SPLAT
        elif wasm:  # the flat offset is the last axis plus anything (one or several dims read it), else lane by lane
            rest = simplify(flat_offset(node.buffer, node.indices) - SizeVar(last))
            kind = LANES if last in {v.name for v in free_vars(rest)} else VECTOR
        else:
            offset = simplify(node.indices[-1] - SizeVar(last))
            if any(uses_last[:-1]) or last in {v.name for v in free_vars(offset)}:
                return False
            if simplify(offset % width) != IntImm(0) or not _multiple_of(node.buffer.shape[-1], width):
                return False
            kind = VECTOR
        return kinds.setdefault(node.buffer.name, kind) == kind

    return kinds if fits(program.body) else None


def lane_invariant(condition: ScalarExpr, last: str) -> bool:
    """Whether a select's condition is one value for every lane of a vector along the axis
    ``last``: integer and boolean logic over index values (compares, casts, arithmetic) that
    never names that axis and reads no buffer."""
    for node in scalar_nodes(condition):
        if not isinstance(node, (IndexValue, Compare, Cast, Binary, Unary)) or node.dtype == "float32":
            return False
        if isinstance(node, IndexValue) and last in {v.name for v in free_vars(node.value)}:
            return False
    return True


def _multiple_of(extent: PrimExpr, width: int) -> bool:
    return simplify(extent % width) == IntImm(0)


# -- tensors larger than one binding -------------------------------------------------------------

# WebGPU's guaranteed maxStorageBufferBindingSize (128 MiB): a device may offer no more, so a
# weight above it is bound as several parts (docs/bundle-format.md, "Weights in parts").
BINDING_PART_BYTES = 128 * 1024 * 1024
# WebGPU's default maxStorageBuffersPerShaderStage: the storage bindings a kernel may have
# (fusion keeps within it; a weight in too many parts for it is a build error).
MAX_STORAGE_BINDINGS = 8
# WebGPU's default limits (the spec's, which every adapter offers) that a bundle's
# ``required_limits`` can exceed: the build warns where a bundle needs more at its bounds
# (``bundle.limit_warnings``), since such a bundle loads only on adapters offering more (or on
# wasm).  Dispatches are laid out on a 2-D grid, so maxComputeWorkgroupsPerDimension (65535)
# binds only past 65535^2 workgroups, beyond any storage a device can hold.
WEBGPU_DEFAULT_LIMITS = {
    "maxStorageBufferBindingSize": BINDING_PART_BYTES,
    "maxBufferSize": 256 * 1024 * 1024,
    "maxStorageBuffersPerShaderStage": MAX_STORAGE_BINDINGS,
    "maxComputeWorkgroupStorageSize": 16384,
    "maxComputeInvocationsPerWorkgroup": 256,
    "maxComputeWorkgroupSizeX": 256,
}
# Every part but the last holds a multiple of this many bytes (WebGPU's
# minStorageBufferOffsetAlignment, and a whole number of vec4s).
PART_ALIGNMENT = 256


def binding_parts(nbytes: int, split_bytes: int = BINDING_PART_BYTES) -> int:
    """How many bindings a kernel gives a tensor of ``nbytes`` device bytes: one up to
    ``split_bytes``, else enough parts of ``split_bytes`` each for a device that binds no more."""
    return max(1, -(-nbytes // split_bytes))


def argument_bindings(args, split_bytes: int = BINDING_PART_BYTES) -> int:
    """The storage bindings a kernel gives the arguments ``args``: one each, a constant above
    ``split_bytes`` one per part (a dtype with no GPU form counts one: the build refuses it later)."""
    return sum(binding_parts(_device_bytes(arg.data), split_bytes) if isinstance(arg, Constant) else 1 for arg in args)


def _device_bytes(data) -> int:
    info = DTYPES.get(str(data.dtype))
    return data.size * info.device_bytes if info is not None and info.on_gpu else 0


def smallest_part_bytes(nbytes: int, parts: int) -> int:
    """The smallest binding size (a multiple of :data:`PART_ALIGNMENT`) at which ``parts``
    parts hold ``nbytes`` bytes: what a device must offer for a weight bound in ``parts``."""
    if parts == 1:
        return nbytes
    share = -(-nbytes // parts)
    return -(-share // PART_ALIGNMENT) * PART_ALIGNMENT
