"""Timing each dispatch of a profiled WebGPU run (``Session.profile``; ``runtime/profile.py`` sums them).

Timestamp queries where the device has ``timestamp-query`` (a compute pass per dispatch, its
start and end written to a query set), else one submit per dispatch timed by the wall clock
until the queue has done it.  ``runtime_js/webgpu_timers.js`` is the twin.
"""

from __future__ import annotations

import struct
import time
from typing import Any

import wgpu

from relaxweb.runtime.host import Dispatch
from relaxweb.runtime.profile import SUBMITS, TIMESTAMPS, DispatchTime, params_fields
from relaxweb.runtime.webgpu_buffers import QUERY_RESOLVE_USAGE, READBACK_USAGE


class DispatchTimer:
    """How a profiled run times dispatches: :meth:`encode` takes over the encoding of each
    stage's dispatches (``WebGpuBackend.encode_dispatches``), :meth:`times` gives them after the
    run's last submit."""

    method = ""

    def __init__(self, backend: Any) -> None:  # the webgpu_backend.WebGpuBackend it times
        self.backend = backend
        self.device = backend.device

    def encode(self, encoder: wgpu.GPUCommandEncoder, dispatches: list[Dispatch], params: bytes) -> wgpu.GPUCommandEncoder:
        raise NotImplementedError

    def times(self) -> list[DispatchTime]:
        raise NotImplementedError

    def _fields(self, command: Dispatch, params: bytes) -> tuple[int, ...]:
        return params_fields(params, self.backend.manifest["call_sites"][command.call_site])


class TimestampTimer(DispatchTimer):
    """One compute pass per dispatch, with timestamps written at its start and end into a
    query set, resolved and copied to a mappable buffer in the same encoder."""

    method = TIMESTAMPS
    _MAX_QUERIES = 4096  # WebGPU's largest query set

    def __init__(self, backend: Any) -> None:
        super().__init__(backend)
        # per query set: the set and its resolve buffer (destroyed after the run), the mappable
        # copy, and its dispatches' (call site, params)
        self._pending: list[tuple[list, wgpu.GPUBuffer, list[tuple[int, tuple[int, ...]]]]] = []

    def encode(self, encoder, dispatches, params):
        per_set = self._MAX_QUERIES // 2
        for first in range(0, len(dispatches), per_set):
            chunk = dispatches[first:first + per_set]
            count = 2 * len(chunk)
            query_set = self.device.create_query_set(type=wgpu.QueryType.timestamp, count=count)
            for index, command in enumerate(chunk):
                compute_pass = encoder.begin_compute_pass(timestamp_writes={
                    "query_set": query_set, "beginning_of_pass_write_index": 2 * index,
                    "end_of_pass_write_index": 2 * index + 1,
                })
                self.backend.encode_dispatch(compute_pass, command)
                compute_pass.end()
            resolved = self.backend.buffers.create(size=8 * count, usage=QUERY_RESOLVE_USAGE)
            readable = self.backend.buffers.create(size=8 * count, usage=READBACK_USAGE)
            encoder.resolve_query_set(query_set, 0, count, resolved, 0)
            encoder.copy_buffer_to_buffer(resolved, 0, readable, 0, 8 * count)
            self._pending.append(([query_set, resolved], readable, [(c.call_site, self._fields(c, params)) for c in chunk]))
        return encoder

    def times(self):
        times = []
        for spent, readable, calls in self._pending:
            readable.map_sync(wgpu.MapMode.READ)
            try:
                stamps = struct.unpack(f"<{2 * len(calls)}Q", readable.read_mapped())
                self.backend.stats.add("bytes_read", 16 * len(calls))
            finally:
                readable.unmap()
                for used in (readable, *spent):
                    used.destroy()
            for index, (call_site, fields) in enumerate(calls):
                # nanoseconds; a pair out of order (a driver's clock reset) counts as 0
                elapsed = max(0, stamps[2 * index + 1] - stamps[2 * index])
                times.append(DispatchTime(call_site, elapsed / 1e6, fields))
        return times


class SubmitTimer(DispatchTimer):
    """One submit per dispatch, timed by the wall clock until the queue has done it.

    The wait is a map of a 4-byte buffer that the dispatch's command buffer copies into last
    (a map completes once the submits using the buffer are done): wgpu-py's
    ``on_submitted_work_done_sync`` fails with the wgpu-native it ships (0.32)."""

    method = SUBMITS

    def __init__(self, backend: Any) -> None:
        super().__init__(backend)
        self._times: list[DispatchTime] = []
        self._fence_source = backend.buffers.create(size=4, usage=wgpu.BufferUsage.COPY_SRC)
        self._fence = backend.buffers.create(size=4, usage=READBACK_USAGE)

    def _submit_and_wait(self, encoder: wgpu.GPUCommandEncoder) -> None:
        encoder.copy_buffer_to_buffer(self._fence_source, 0, self._fence, 0, 4)
        self.device.queue.submit([encoder.finish()])
        self._fence.map_sync(wgpu.MapMode.READ)
        self._fence.unmap()

    def encode(self, encoder, dispatches, params):
        # what came before (uploads, copies of grown storages) is done before the first timing
        self._submit_and_wait(encoder)
        for command in dispatches:
            single = self.device.create_command_encoder()
            compute_pass = single.begin_compute_pass()
            self.backend.encode_dispatch(compute_pass, command)
            compute_pass.end()
            start = time.perf_counter()
            self._submit_and_wait(single)
            elapsed = time.perf_counter() - start
            self._times.append(DispatchTime(command.call_site, elapsed * 1e3, self._fields(command, params)))
        return self.device.create_command_encoder()

    def times(self):
        self._fence.destroy()
        self._fence_source.destroy()
        return self._times
