"""The host-program driver: "One run" of ``docs/bundle-format.md``, written once for every backend.

A run starts the host module on the input shapes and carries out its command lists one stage
at a time: the stage's params, its dispatches, then a read back (its value handed to the host,
which resumes), a resume, or the end; storages grow between two stages keeping their contents;
the last stage ends with the outputs.  A batch does the same in rounds, for every instance at
once (``runtime/batch.py``).  How each state is done on a device is the backend's: WebGPU
(``webgpu_backend.py``, ``webgpu_batch.py``) or ``kernels.wasm`` (``wasm_backend.py``), each
behind :class:`RunBackend` (and :class:`RaggedBatchBackend` for ragged batches).
``runtime_js/driver.js`` is the twin, with the same states and names (docs/runtime-core.md).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

from relaxweb.errors import RelaxwebError, RunCheckError
from relaxweb.runtime.batch import (
    ONE_BY_ONE, RAGGED, BatchReport, ElementCounts, RaggedDispatch, instance_error, plan_round,
)
from relaxweb.runtime.host import Dispatch, Read
from relaxweb.runtime.host_session import HostSessions, HostStep
from relaxweb.runtime.profile import DispatchTime, Profile, summarize


_Method = TypeVar("_Method", bound=Callable[..., Any])


def serialized(method: _Method) -> _Method:
    """A session method that holds the session's ``run_lock`` (a ``threading.RLock``) for its
    whole work, readback included: a session holds one run's state at a time (the host
    module's, the storages', the wasm memory), so calls from several threads take turns.
    Reentrant: ``generate`` runs ``run`` many times under one hold (its KV caches and kept
    tensors stay its own until it ends)."""

    @functools.wraps(method)
    def locked(self: Any, *args: Any, **kwargs: Any) -> Any:
        with self.run_lock:
            return method(self, *args, **kwargs)

    return locked  # type: ignore[return-value]


@dataclass(frozen=True)
class PreparedRun:
    """A run's inputs after the checks, before any device work: the input shapes the host
    takes (``()`` for a sequence input), the element shapes of each sequence input by index,
    the device arrays (or GpuTensors) in manifest order, and the outputs to keep on the GPU."""

    shapes: list[tuple[int, ...]]
    sequences: dict[int, list | None]
    arrays: list[Any]
    kept: frozenset[int] = field(default_factory=frozenset)


@dataclass(frozen=True)
class FinishedRun:
    """A run up to its last submit: what ``read_outputs`` needs, and its counts."""

    readback: Any
    dispatches: int
    reads: int


class DispatchTimer(Protocol):
    """Times each dispatch of a profiled run (``webgpu_timers.py``, ``profile.WallClockTimer``)."""

    method: str

    def times(self) -> list[DispatchTime]: ...


class RunBackend(Protocol):
    """What a device does in each state of a run (docs/runtime-core.md, "The backend interface")."""

    manifest: Mapping[str, Any]

    def prepare_run(self, inputs: Mapping[str, Any], keep_on_gpu: Any) -> PreparedRun:
        """Check and convert the inputs (no device work)."""

    def one_by_one_reason(self, instances: Sequence[Mapping[str, Any]]) -> str:
        """Why a batch runs instance by instance on this backend, or ``""``."""

    def ragged_batch(self) -> RaggedBatchBackend:
        """The ragged batch backend (only asked for when :meth:`one_by_one_reason` is ``""``)."""

    def check_commands(self, commands: Sequence[Any]) -> None:
        """Refuse a command list this device cannot run, before any work."""

    def prepare_storages(self, sizes: Sequence[int], keep_contents: bool) -> None:
        """Every storage at least ``sizes`` bytes (contents carried over with ``keep_contents``)."""

    def write_inputs(self, run: PreparedRun) -> None:
        """The run's inputs into their storages."""

    def begin_step(self, params: bytes) -> None:
        """Start a stage with its params block."""

    def encode_dispatches(self, dispatches: Sequence[Dispatch], params: bytes, timer: Any) -> None:
        """Run or encode the stage's dispatches in order (timed by ``timer`` when given)."""

    def read_value(self, read: Read) -> int:
        """End the stage reading the i32 a read record names."""

    def submit(self) -> None:
        """End a stage that resumes without reading."""

    def submit_outputs(self, run: PreparedRun, step: HostStep) -> Any:
        """End the last stage: the output copies and the run's last submit."""

    def read_outputs(self, readback: Any) -> dict[str, Any]:
        """The outputs by name."""

    def release_run(self) -> None:
        """Release what the run kept past its submits (after the outputs, or an error)."""

    def create_timer(self) -> DispatchTimer:
        """A timer for a profiled run."""


class RaggedBatchBackend(Protocol):
    """What a device does in each state of a ragged batch (docs/runtime-core.md)."""

    def prepare_instance(self, inputs: Mapping[str, Any]) -> PreparedRun:
        """An instance's inputs checked and converted (arrays only)."""

    def lay_out(self, sizes: Sequence[Sequence[int]], var_values: Sequence[Mapping[str, int]]) -> None:
        """The packed slice layout of the instances' first steps, checked, no device work."""

    def write_inputs(self, runs: Sequence[PreparedRun]) -> None:
        """Packed storages (re)allocated, each instance's inputs in its slices."""

    def begin_round(self) -> None:
        """Start a round (copying the slices the last :meth:`grow_slices` moved)."""

    def encode_round(self, plan: Sequence[RaggedDispatch], live: Mapping[int, HostStep]) -> int:
        """The round's ragged dispatches; how many were encoded."""

    def finish_instance(self, index: int, step: HostStep) -> Any:
        """An instance whose list ends with its outputs; what ``read_batch_outputs`` needs of it."""

    def read_values(self, reads: Mapping[int, Read]) -> dict[int, int]:
        """End the round (its submit), with the values the reading instances read."""

    def grow_slices(self, sizes: Sequence[Sequence[int]], var_values: Sequence[Mapping[str, int]]) -> None:
        """The layout grown to ``sizes``, checked, storages that changed reallocated."""

    def read_batch_outputs(self, readbacks: Sequence[Any]) -> list[dict[str, Any]]:
        """Every instance's outputs, in order."""

    def release_batch(self) -> None:
        """After an error: release what the rounds left."""


class HostProgramDriver:
    """Runs a bundle's host program on one backend: single runs, profiled runs and batches."""

    def __init__(self, backend: RunBackend, host: HostSessions) -> None:
        self.backend = backend
        self.host = host
        self.manifest = backend.manifest
        #: dispatches of the last run, over all its steps
        self.last_dispatch_count = 0
        #: values the last run read back (one per step but the last)
        self.last_read_count = 0
        self._element_counts = ElementCounts(self.manifest)

    # Single runs ---------------------------------------------------------------------------

    def run(self, inputs: Mapping[str, Any], keep_on_gpu: Any = False, timer: Any = None) -> dict[str, Any]:
        """One run of ``inputs``: its outputs by name."""
        run = self.backend.prepare_run(inputs, keep_on_gpu)
        try:
            finished = self.run_steps(run, timer)
            outputs = self.backend.read_outputs(finished.readback)
        finally:
            self.backend.release_run()
        self.last_dispatch_count, self.last_read_count = finished.dispatches, finished.reads
        return outputs

    def run_steps(self, run: PreparedRun, timer: Any = None) -> FinishedRun:
        """A prepared run from the host's start to its last submit."""
        backend, host = self.backend, self.host
        step = host.start(run.shapes, run.sequences)
        backend.check_commands(step.commands)
        backend.prepare_storages(step.sizes, False)  # nothing of this run is on the device yet
        backend.write_inputs(run)
        dispatches = reads = 0
        while True:
            backend.begin_step(step.params)
            backend.encode_dispatches(step.dispatches, step.params, timer)
            dispatches += len(step.dispatches)
            read = step.read
            if read is not None:
                value = backend.read_value(read)
                reads += 1
                step = host.resume(read.slot, value)
            elif step.resumes:
                backend.submit()
                step = host.resume(None, 0)
            else:
                break
            backend.check_commands(step.commands)
            backend.prepare_storages(step.sizes, True)
        return FinishedRun(backend.submit_outputs(run, step), dispatches, reads)

    def profile(self, inputs: Mapping[str, Any], warmup: int = 1) -> tuple[dict[str, Any], Profile]:
        """``warmup`` runs, then one with every dispatch timed: its outputs and its profile."""
        for _ in range(warmup):
            self.run(inputs)
        timer = self.backend.create_timer()
        outputs = self.run(inputs, timer=timer)
        return outputs, summarize(self.manifest, timer.times(), timer.method)

    # Batches -------------------------------------------------------------------------------

    def run_batch(self, instances: Sequence[Mapping[str, Any]]) -> tuple[list[dict[str, Any]], BatchReport]:
        """Each instance's outputs, in order, and how the batch ran: as one ragged batch, or
        one instance after another where the backend says why."""
        report = BatchReport(instances=len(instances))
        reason = self.backend.one_by_one_reason(instances)
        if reason or not instances:
            report.mode, report.reason = (ONE_BY_ONE, reason) if reason else (RAGGED, "")
            return self.run_one_by_one(instances, report), report
        batch = self.backend.ragged_batch()
        try:
            readbacks = self.run_batch_rounds(batch, instances, report)
            return batch.read_batch_outputs(readbacks), report
        except RunCheckError as error:
            batch.release_batch()
            raise self.instance_of_check(instances, error) from None
        except BaseException:
            batch.release_batch()
            raise

    def instance_of_check(self, instances: Sequence[Mapping[str, Any]], error: RunCheckError) -> RelaxwebError:
        """The error of a kernel's check in a ragged batch, naming the instance: the run status
        holds the node and the values but not which instance's rows failed, so the instances
        run again one at a time (``run_one_by_one``, whose errors name the instance) until one
        fails (an error path only); ``error`` itself if none does alone."""
        try:
            self.run_one_by_one(instances, BatchReport(instances=len(instances)))
        except RunCheckError as named:
            return named
        return error

    def run_one_by_one(self, instances: Sequence[Mapping[str, Any]], report: BatchReport) -> list[dict[str, Any]]:
        """Each instance in a run of its own (its errors name it), its dispatches and rounds
        counted into ``report``."""
        results = []
        for index, inputs in enumerate(instances):
            try:
                results.append(self.run(inputs))
            except RelaxwebError as error:
                raise instance_error(index, error) from None
            report.dispatches += self.last_dispatch_count
            report.rounds += 1 + self.last_read_count
        report.elements = None  # not counted for runs of their own
        return results

    def run_batch_rounds(self, batch: RaggedBatchBackend, instances: Sequence[Mapping[str, Any]],
                         report: BatchReport) -> list[Any]:
        """A ragged batch up to its last round: every instance checked and started (nothing on
        the device yet), then rounds of the live instances' merged dispatches; returns what
        ``read_batch_outputs`` needs of each instance."""
        runs, steps = [], []
        for index, inputs in enumerate(instances):
            try:
                run = batch.prepare_instance(inputs)
                steps.append(self.host.start_instance(index, run.shapes, run.sequences))
            except RelaxwebError as error:
                raise instance_error(index, error) from None
            runs.append(run)
        report.var_values = [step.var_values for step in steps]
        batch.lay_out([step.sizes for step in steps], report.var_values)
        plan = self._plan({index: step for index, step in enumerate(steps)})
        batch.write_inputs(runs)
        readbacks: list[Any] = [None] * len(steps)
        live = dict(enumerate(steps))
        while live:
            report.rounds += 1
            batch.begin_round()
            for dispatch in plan:
                for index, _ in dispatch.members:
                    report.add_elements(self._element_counts.of(dispatch.call_site, live[index].params))
            report.dispatches += batch.encode_round(plan, live)
            for index, step in live.items():
                if step.finished:
                    readbacks[index] = batch.finish_instance(index, step)
            values = batch.read_values({index: step.read for index, step in live.items() if step.read is not None})
            live = self._resumed(live, values)
            for index, step in live.items():  # steps: every instance's latest step
                steps[index] = step
            if live:
                plan = self._plan(live)
                batch.grow_slices([step.sizes for step in steps], report.var_values)
        return readbacks

    def _plan(self, live: Mapping[int, HostStep]) -> list[RaggedDispatch]:
        return plan_round(self.manifest, {index: step.dispatches for index, step in live.items()})

    def _resumed(self, live: Mapping[int, HostStep], values: Mapping[int, int]) -> dict[int, HostStep]:
        """The next step of each live instance that read a value or resumes (its errors name it)."""
        resumed = {}
        for index, step in live.items():
            if step.finished:
                continue
            read = step.read
            try:
                resumed[index] = self.host.resume_instance(index, None if read is None else read.slot,
                                                           values.get(index, 0))
            except RelaxwebError as error:
                raise instance_error(index, error) from None
        return resumed
