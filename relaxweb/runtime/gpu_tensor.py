"""Tensors that stay on the GPU between runs, and the counters of what moves to and from it.

``Session.run(inputs, keep_on_gpu=[...])`` returns a :class:`GpuTensor` for each kept output:
a buffer of its own (never a storage that the next run overwrites), which ``run`` accepts
back as an input and copies GPU-to-GPU into the input's storage.  A disposed tensor's buffer
goes to its session's :class:`BufferPool`, where the next kept output of that size finds it,
so a decode loop that disposes the previous step's tensors creates no buffers once warm.

A model's KV cache output (manifest ``caches``) kept on the GPU is a *view* instead: a
:class:`GpuTensor` over the cache's own storage (its logical shape; no buffer, no copy), which
the next run takes back as that cache's past without moving anything.  Every run writes every
cache, so a view is valid until the next run ends: given to that run it is current (its
past), and afterwards it is stale, refused with an error wherever it is used (read it with
``numpy()`` first to keep its values).  Any other past (an array, another tensor) is written
into the cache's rows, one write or copy per block before the cache axis.

:class:`TransferStats` counts the session's real calls: buffers created, bytes written from
the host (inputs, params and weights apart), bytes read back; ``Session.stats`` holds the
counts of the session's lifetime (``total``) and since its last run started (``last_run``).
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass, fields
from typing import Any

import numpy as np

from relaxweb.errors import RelaxwebError


@dataclass
class TransferCounts:
    """What a span of a session's life (its lifetime, or one run) did to GPU memory."""

    #: GPU buffers created (weights, storages, params, readback and staging buffers, kept outputs).
    buffers_created: int = 0
    #: bytes of inputs written from the host (a GpuTensor input writes none: it is copied on the GPU)
    input_bytes_written: int = 0
    #: bytes of params blocks (the kernels' shapes and sizes) written from the host
    params_bytes_written: int = 0
    #: bytes of weights written from the host (at load)
    weight_bytes_written: int = 0
    #: bytes read back from the GPU: outputs, values read mid-run, ``GpuTensor.numpy()``, timestamps
    bytes_read: int = 0

    def as_dict(self) -> dict[str, int]:
        return {field.name: getattr(self, field.name) for field in fields(self)}


class TransferStats:
    """A session's counters: ``total`` since it was created (load included), ``last_run``
    since its last run started (that run, and what was done after it: reading a
    ``GpuTensor`` back counts there too, so a decode loop's ``last_run`` is one token's), and
    ``live_gpu_bytes``: the bytes of its GPU buffers that exist now (created, and neither
    destroyed nor freed; pooled buffers of disposed GpuTensors count), so that a test can show
    memory stays flat."""

    def __init__(self) -> None:
        self.total = TransferCounts()
        self.last_run = TransferCounts()
        self.live_gpu_bytes = 0

    def track_buffer(self, buffer: Any) -> None:
        """Count a new buffer's bytes in ``live_gpu_bytes`` until it is destroyed (its
        ``destroy`` is wrapped) or freed (a finalizer), whichever comes first."""
        size, ref, live = buffer.size, weakref.ref(buffer), [True]
        self.live_gpu_bytes += size

        def gone() -> None:
            if live[0]:
                live[0] = False
                self.live_gpu_bytes -= size

        def destroy() -> None:  # holds no reference to the buffer: no cycle keeps it alive
            gone()
            target = ref()
            if target is not None:
                type(target).destroy(target)

        buffer.destroy = destroy
        weakref.finalize(buffer, gone)

    def start_run(self) -> None:
        self.last_run = TransferCounts()

    def add(self, counter: str, amount: int = 1) -> None:
        for counts in (self.total, self.last_run):
            setattr(counts, counter, getattr(counts, counter) + amount)

    def __repr__(self) -> str:
        return f"TransferStats(total={self.total}, last_run={self.last_run}, live_gpu_bytes={self.live_gpu_bytes})"


class BufferPool:
    """Buffers of disposed :class:`GpuTensor`\\ s, kept for the next kept output that fits."""

    def __init__(self) -> None:
        self._free: list[Any] = []

    def take(self, size: int) -> Any | None:
        """The smallest free buffer of at least ``size`` bytes (removed from the pool), or None."""
        fitting = [buffer for buffer in self._free if buffer.size >= size]
        if not fitting:
            return None
        smallest = min(fitting, key=lambda buffer: buffer.size)
        self._free.remove(smallest)
        return smallest

    def give(self, buffer: Any) -> None:
        self._free.append(buffer)

    def __len__(self) -> int:
        return len(self._free)


@dataclass(frozen=True)
class CacheView:
    """What makes a :class:`GpuTensor` a view of a KV cache: the manifest's cache entry and
    the number of the run that wrote it (current while no later run has started)."""

    cache: dict
    run: int


def cache_block_copies(cache: dict, shape: tuple[int, ...], itemsize: int,
                       source: dict | None) -> list[tuple[int, int, int]]:
    """(source offset, cache offset, bytes) of each block of a tensor of ``shape`` along the
    cache's axis: its rows, ``capacity`` rows apart in the cache, dense in the source (``None``)
    or ``capacity`` rows apart in the ``source`` cache's layout."""
    axis = cache["axis"]
    outer = int(np.prod(shape[:axis], dtype=np.int64))
    row = int(np.prod(shape[axis + 1:], dtype=np.int64)) * itemsize
    size = shape[axis] * row
    source_stride = size if source is None else source["capacity"] * row
    return [(block * source_stride, block * cache["capacity"] * row, size) for block in range(outer) if size]


class GpuTensor:
    """An output kept on the GPU by ``Session.run(..., keep_on_gpu=...)``.

    ``name`` is the output's, ``dtype`` its model dtype (the GPU holds int64 as int32 and so
    on, as for any tensor), ``shape`` its shape in this run.  Give it to ``run`` as an input
    (of the same dtype and rank) to copy it on the GPU; ``numpy()`` reads it back;
    ``dispose()`` gives its buffer back to the session for later kept outputs.
    """

    def __init__(self, session: Any, name: str, dtype: np.dtype, shape: tuple[int, ...], buffer: Any,
                 nbytes: int, cache_view: CacheView | None = None) -> None:
        self.name = name
        self.dtype = dtype
        self.shape = shape
        #: bytes of its values as the GPU holds them (its buffer may be larger: sized at the bound)
        self.nbytes = nbytes
        self._session = session
        self._buffer = buffer
        #: set for a view of a KV cache (its buffer is the cache's storage, not its own)
        self.cache_view = cache_view

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def disposed(self) -> bool:
        return self._buffer is None

    @property
    def session(self) -> Any:
        """The :class:`~relaxweb.runtime.webgpu.Session` whose run made it."""
        return self._session

    def buffer(self) -> Any:
        """Its GPU buffer; a :class:`RelaxwebError` once disposed."""
        if self._buffer is None:
            raise RelaxwebError(f"GPU tensor '{self.name}' was disposed and cannot be used any more")
        return self._buffer

    def numpy(self) -> np.ndarray:
        """Its values, read back from the GPU, as an array of its dtype and shape."""
        return self._session.read_gpu_tensor(self)

    def dispose(self) -> None:
        """Give its buffer back to its session (for later kept outputs); using it afterwards is
        an error.  Disposing twice does nothing."""
        if self._buffer is not None and self.cache_view is None:  # a view's buffer is the cache's
            self._session.release_gpu_buffer(self._buffer)
        self._buffer = None

    def __repr__(self) -> str:
        state = ", disposed" if self.disposed else ""
        return f"GpuTensor({self.name!r}, {self.dtype}, {list(self.shape)}{state})"
