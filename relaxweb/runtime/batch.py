"""Batches: many inputs of different sizes in one run (``Session.run_batch``), the part that
does not depend on the backend.

A batch runs every instance's host module on its own shapes (each instance may have its own
values of the model's symbolic sizes), then proceeds in rounds: in each round every instance
still running has a command list (the whole run, or the part before its next read), and the
dispatches of all of them are merged (:func:`merge_dispatches`) so that one dispatch of a
kernel's ragged form (``relaxweb/wgsl/ragged.py``) serves every instance that runs that call
site: instances that took different branches of an ``If`` share the dispatches before and
after the branch and run the branch's own per group of instances that took it.

Every storage holds each instance's slice one after another, each as large as that instance
needs (:class:`SliceLayout`), so nothing is padded to the longest instance and the memory is
the packed total.  Everything is sized and checked before any GPU work: an instance outside
the model's bounds, or a batch whose total exceeds a device limit, is refused with a message
naming the instance and the size.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from relaxweb.errors import InputShapeError, RelaxwebError, RunCheckError
from relaxweb.runtime.host import Dispatch
from relaxweb.runtime.profile import evaluate_tree, params_fields

#: Instances one ragged dispatch serves (``wgsl/ragged.MAX_INSTANCES``, the batch table's length).
MAX_INSTANCES = 64
#: Instances of one batch at most (each keeps a host module instance of its own).
MAX_BATCH_INSTANCES = 1024
#: Alignment of each instance's slice of a storage (minStorageBufferOffsetAlignment's default).
SLICE_ALIGNMENT = 256
#: Bytes of the batch table's header (the instance count, padded to 16).
TABLE_HEADER_BYTES = 16
#: Workgroups along one dimension of a grid (the runtimes' 2-D grid; WebGPU's default limit).
MAX_GRID_DIMENSION = 65535

ONE_BY_ONE = "one by one"
RAGGED = "ragged"


@dataclass
class BatchReport:
    """How the last batch ran: ``mode`` is ``"ragged"`` (one dispatch per call site for all
    its instances) or ``"one by one"`` (``reason`` says why), with the dispatches it made, its
    rounds (one per step: reads of values computed on the GPU end a round) and the instances'
    symbolic sizes."""

    mode: str = RAGGED
    reason: str = ""
    instances: int = 0
    dispatches: int = 0
    rounds: int = 0
    var_values: list[dict[str, int]] = field(default_factory=list)
    #: output elements the ragged dispatches computed, summed over instances (each over its own
    #: sizes: exactly what the instances need); None when a kernel's count is not in the manifest
    elements: int | None = 0

    def add_elements(self, count: int | None) -> None:
        self.elements = None if count is None or self.elements is None else self.elements + count


def call_elements(manifest: Mapping[str, Any], call_site_index: int, params: bytes) -> int | None:
    """Output elements of one call of a call site with this params buffer (the kernel's
    ``elements`` tree over its params fields), None where the manifest does not say."""
    call_site = manifest["call_sites"][call_site_index]
    kernel = manifest["kernels"][call_site["kernel"]]
    if "elements" not in kernel:
        return None
    return evaluate_tree(kernel["elements"], dict(zip(kernel.get("params", []), params_fields(params, call_site))))


def check_instance_count(count: int) -> None:
    """Refuse a batch of more than :data:`MAX_BATCH_INSTANCES` instances."""
    if count > MAX_BATCH_INSTANCES:
        raise RelaxwebError(f"a batch has at most {MAX_BATCH_INSTANCES} instances (each keeps a host module "
                            f"instance), got {count}: split the batch")


def one_by_one_reason(manifest: Mapping[str, Any], inputs: Sequence[Mapping[str, Any]]) -> str:
    """Why this bundle (and these inputs) cannot run as one ragged batch, or ``""``."""
    missing = [kernel["name"] for kernel in manifest["kernels"] if "batch_file" not in kernel]
    if missing:
        return f"kernel(s) {', '.join(missing[:5])}{' ...' if len(missing) > 5 else ''} have no ragged form"
    if manifest.get("caches"):
        return "the model keeps KV caches between runs"
    if any(entry.get("kind") in ("sequence", "optional_sequence") for entry in (*manifest["inputs"], *manifest["outputs"])):
        return "the model has sequence inputs or outputs"
    for instance in inputs:
        if any(not hasattr(value, "shape") or type(value).__name__ == "GpuTensor" for value in instance.values()):
            return "an instance has an input that is not an array (a GpuTensor or a sequence)"
    return ""


def instance_error(index: int, error: Exception) -> RelaxwebError:
    """``error`` (an input check, the host module's refusal or a kernel's check) for instance
    ``index`` of a batch: the same class, the message prefixed with the instance."""
    message = f"instance {index} of the batch: {error}"
    for kind in (InputShapeError, RunCheckError):
        if isinstance(error, kind):
            return kind(message)
    return RelaxwebError(message)


def aligned(byte_size: int) -> int:
    """``byte_size`` rounded up to a slice boundary (at least one slice: every instance's
    slice starts on its own boundary, even an empty one)."""
    return max(SLICE_ALIGNMENT, -(-byte_size // SLICE_ALIGNMENT) * SLICE_ALIGNMENT)


@dataclass
class SliceLayout:
    """Where each instance's slice of each storage lies: ``offsets[s][i]`` and ``capacities[s][i]``
    bytes; ``totals[s]`` is the storage's packed size."""

    offsets: list[list[int]]
    capacities: list[list[int]]

    @classmethod
    def of(cls, sizes: Sequence[Sequence[int]]) -> SliceLayout:
        """The packed layout of per-instance storage sizes (``sizes[i][s]``)."""
        storages = len(sizes[0]) if sizes else 0
        capacities = [[aligned(sizes[i][s]) for i in range(len(sizes))] for s in range(storages)]
        return cls(_prefix_sums(capacities), capacities)

    @property
    def totals(self) -> list[int]:
        return [sum(capacities) for capacities in self.capacities]

    def grown(self, sizes: Sequence[Sequence[int]]) -> tuple[SliceLayout, list[int]]:
        """The layout after instances' storages grew to ``sizes`` (each slice keeps at least its
        capacity) and the storages whose layout changed."""
        capacities = [[max(self.capacities[s][i], aligned(sizes[i][s])) for i in range(len(sizes))]
                      for s in range(len(self.capacities))]
        changed = [s for s in range(len(capacities)) if capacities[s] != self.capacities[s]]
        return SliceLayout(_prefix_sums(capacities), capacities), changed


def _prefix_sums(capacities: list[list[int]]) -> list[list[int]]:
    offsets = []
    for row in capacities:
        starts, total = [], 0
        for capacity in row:
            starts.append(total)
            total += capacity
        offsets.append(starts)
    return offsets


def check_totals(manifest: Mapping[str, Any], layout: SliceLayout, sizes: Sequence[Sequence[int]],
                 var_values: Sequence[Mapping[str, int]], largest: int, limit_name: str) -> None:
    """Refuse a batch whose packed storage exceeds the device's buffer limit, naming the
    storage and the instance that takes it past the limit, before any GPU work."""
    for storage, capacities in enumerate(layout.capacities):
        total = 0
        for instance, capacity in enumerate(capacities):
            total += capacity
            if total > largest:
                # the model's sizes (the host's own, for values read back, start with "_")
                sizes_text = ", ".join(f"{name} = {value}" for name, value in var_values[instance].items()
                                       if not name.startswith("_"))
                raise RelaxwebError(
                    f"the batch is too large for this device: {storage_name(manifest, storage)} needs "
                    f"{sum(capacities)} bytes for its {len(capacities)} instances; instance {instance} "
                    f"({sizes_text}; {sizes[instance][storage]} bytes) takes it to {total}, above the device's "
                    f"WebGPU limit {limit_name} = {largest}. Split the batch."
                )


def storage_name(manifest: Mapping[str, Any], index: int) -> str:
    """How a message names storage ``index``: the input or output it holds, else its role."""
    for kind in ("input", "output"):
        for entry in manifest[f"{kind}s"]:
            if entry.get("storage") == index:
                return f"{kind} '{entry['name']}' (storage {index})"
    return f"storage {index} ({manifest['storages'][index]['role']})"


def merge_dispatches(lists: Mapping[int, Sequence[Dispatch]]) -> list[tuple[int, list[tuple[int, Dispatch]]]]:
    """One round's dispatches of every instance (``lists``: instance -> its dispatches, in
    order) as batched dispatches ``(call_site, [(instance, dispatch), ...])``.

    Each instance's own order is kept (its dispatches depend on each other); instances do
    not depend on each other (each has its own slices).  Greedily, the next batched dispatch
    is the call site that most instances run next, preferring one that no other instance is
    still waiting to run later: so where instances took different branches, each branch's
    own dispatches run (per group) before the dispatches after the join, which then run for
    all of them at once.
    """
    position = {instance: 0 for instance in lists}
    merged: list[tuple[int, list[tuple[int, Dispatch]]]] = []
    while True:
        live = [instance for instance in lists if position[instance] < len(lists[instance])]
        if not live:
            return merged
        next_of = {instance: lists[instance][position[instance]].call_site for instance in live}
        candidates = sorted(set(next_of.values()))

        def waiting(call_site: int) -> int:
            return sum(1 for instance in live if next_of[instance] != call_site and any(
                d.call_site == call_site for d in lists[instance][position[instance] + 1:]))

        def score(call_site: int) -> tuple[int, int, int]:
            return (waiting(call_site) == 0, sum(1 for c in next_of.values() if c == call_site), -call_site)

        chosen = max(candidates, key=score)
        members = [(instance, lists[instance][position[instance]]) for instance in live if next_of[instance] == chosen]
        for instance, _ in members:
            position[instance] += 1
        merged.append((chosen, members))


def chunks(members: Sequence[Any], size: int = MAX_INSTANCES) -> list[Sequence[Any]]:
    """``members`` in runs of at most ``size`` (one ragged dispatch each)."""
    return [members[start:start + size] for start in range(0, len(members), size)]


def base_rows(buffer_count: int) -> int:
    """vec4 rows of bases in a batch-table entry (``wgsl/ragged.py``)."""
    return max(1, -(-buffer_count // 4))


def instance_entry_bytes(params_size: int, buffer_count: int) -> int:
    """Bytes of one instance's entry in a batch table: params, bases, first workgroup."""
    return params_size + 16 * base_rows(buffer_count) + 16


def table_bytes(params_size: int, buffer_count: int) -> int:
    """Bytes of a whole batch table (the uniform binding is always this size)."""
    return TABLE_HEADER_BYTES + MAX_INSTANCES * instance_entry_bytes(params_size, buffer_count)


def batch_table(call_site: Mapping[str, Any], entries: Sequence[tuple[bytes, Sequence[int], int]]) -> bytes:
    """The batch table of one ragged dispatch: ``entries`` are, per instance, its params block
    (the call site's slot of that instance's params), the byte offset of its slice in each
    bound buffer, and its first workgroup."""
    params_size = call_site["params_size"]
    buffer_count = len(call_site["buffers"])
    rows = base_rows(buffer_count)
    out = bytearray(table_bytes(params_size, buffer_count))
    struct.pack_into("<i", out, 0, len(entries))
    step = instance_entry_bytes(params_size, buffer_count)
    for index, (params, bases, first_group) in enumerate(entries):
        at = TABLE_HEADER_BYTES + index * step
        out[at:at + params_size] = params[call_site["params_offset"]:call_site["params_offset"] + params_size]
        struct.pack_into(f"<{4 * rows}i", out, at + params_size, *bases, *([0] * (4 * rows - len(bases))))
        struct.pack_into("<i", out, at + params_size + 16 * rows, first_group)
    return bytes(out)


def grid_of(workgroups: int, call_site_text: str) -> tuple[int, int, int]:
    """The 2-D grid of ``workgroups`` workgroups (the kernels number them ``y * x_count + x``)."""
    if workgroups > MAX_GRID_DIMENSION * MAX_GRID_DIMENSION:
        raise RelaxwebError(
            f"the batch is too large for this device: {call_site_text} needs {workgroups} workgroups, "
            f"above {MAX_GRID_DIMENSION} x {MAX_GRID_DIMENSION}. Split the batch."
        )
    if workgroups <= MAX_GRID_DIMENSION:
        return (max(workgroups, 1), 1, 1)
    rows = -(-workgroups // MAX_GRID_DIMENSION)
    return (-(-workgroups // rows), rows, 1)


@dataclass(frozen=True)
class RaggedDispatch:
    """One dispatch of a kernel's ragged form in a round: the call site, the instances it
    serves with each one's own dispatch record, their workgroups in all and the 2-D grid."""

    call_site: int
    members: tuple[tuple[int, Dispatch], ...]
    workgroups: int
    grid: tuple[int, int, int]


def plan_round(manifest: Mapping[str, Any], lists: Mapping[int, Sequence[Dispatch]]) -> list[RaggedDispatch]:
    """A round's ragged dispatches: the instances' dispatch lists merged
    (:func:`merge_dispatches`), each merged call site cut in :func:`chunks` of
    :data:`MAX_INSTANCES`, each chunk's grid checked (:func:`grid_of`) before any GPU work."""
    planned = []
    for call_site, members in merge_dispatches(lists):
        text = f"call site {call_site} ({manifest['call_sites'][call_site]['binding'][:80]})"
        for chunk in chunks(members):
            workgroups = sum(math.prod(dispatch.grid) for _, dispatch in chunk)
            planned.append(RaggedDispatch(call_site, tuple(chunk), workgroups, grid_of(workgroups, text)))
    return planned


class ElementCounts:
    """:func:`call_elements`, remembered by call site and params slot: a batch evaluates it
    for every instance of every ragged dispatch, and the same sizes come back batch after batch."""

    def __init__(self, manifest: Mapping[str, Any]) -> None:
        self.manifest = manifest
        self._counts: dict[tuple[int, bytes], int | None] = {}

    def of(self, call_site_index: int, params: bytes) -> int | None:
        """Output elements of one call of a call site with this (whole) params block."""
        call_site = self.manifest["call_sites"][call_site_index]
        start = call_site["params_offset"]
        key = (call_site_index, params[start:start + call_site["params_size"]])
        if key not in self._counts:
            self._counts[key] = call_elements(self.manifest, call_site_index, params)
        return self._counts[key]
