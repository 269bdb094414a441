"""Run a bundle on WebGPU from Python, with wgpu-py (wgpu-native).

:class:`Session` loads a bundle folder once (weights, pipelines, buffers) and then runs it
as many times as wanted, following "One run" in ``docs/bundle-format.md``: the host-program
driver (``driver.py``) carries out the host's command lists on the session's
:class:`~relaxweb.runtime.webgpu_backend.WebGpuBackend` (and ragged batches on
``webgpu_batch.WebGpuRaggedBatch``).  The device and its limits are ``webgpu_device.py``'s, the
shaders and pipelines ``webgpu_kernels.py``'s, the buffers ``webgpu_buffers.py``'s, the dispatch
timers of ``profile`` ``webgpu_timers.py``'s.  It mirrors the browser runtime
(``relaxweb/runtime_js/``): the same files, the same steps, nothing model-specific
(docs/runtime-core.md).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
import threading
from pathlib import Path
from typing import Any

import numpy as np
import wgpu

from relaxweb.errors import RelaxwebError
from relaxweb.runtime.batch import BatchReport, check_instance_count
from relaxweb.runtime.driver import HostProgramDriver, serialized
from relaxweb.runtime.generate import (
    Generation, GenerationMethods, apply_chat_template, bundle_tokenizer, chat, generate,
)
from relaxweb.runtime.gpu_tensor import GpuTensor, TransferStats
from relaxweb.runtime.host import HostModule, load_manifest
from relaxweb.runtime.host_session import HostSessions
from relaxweb.runtime.manifest import MAX_HOST_MODULE_BYTES, kernel_source, read_bundle_file
from relaxweb.runtime.profile import Profile
from relaxweb.runtime.tensors import load_shards
from relaxweb.runtime.webgpu_backend import WebGpuBackend
from relaxweb.runtime.webgpu_buffers import SessionBuffers, gpu_buffer_size  # noqa: F401  (re-exported)
from relaxweb.runtime.webgpu_device import (  # noqa: F401  (re-exported: the names this module always had)
    CAPPED_LIMITS, PART_ALIGNMENT, TIMESTAMP_QUERY, check_device_limits, checked_limit_caps, default_adapter,
    default_device, load_time_limits, missing_features, parts_at_limit, smallest_part_bytes, storage_size_limit,
    unsatisfied_limits, webgpu_unavailable, wgpu_limit_name,
)
from relaxweb.runtime.webgpu_kernels import (  # noqa: F401  (re-exported)
    KERNEL_VARIANTS, SHADER_F16, choose_kernels, create_pipelines, kernel_file, session_kernels,
)


class Session(GenerationMethods):
    """A bundle loaded on a WebGPU device, ready to :meth:`run`.

    Attributes:
        manifest: the bundle's ``manifest.json`` as a dict.
        device: the wgpu device everything lives on.
        host: the bundle's host module (shape checks, command list).
        last_dispatch_count: how many dispatches the last :meth:`run` recorded, over all
            its steps.
        last_read_count: how many values the last :meth:`run` read back from the GPU (one
            per step but the last; 0 for bundles without reads).
        stats: the :class:`~relaxweb.runtime.gpu_tensor.TransferStats` of its GPU calls:
            ``stats.total`` since it was created (load included), ``stats.last_run`` since
            the last :meth:`run` started (buffers created, input / params / weight bytes
            written from the host, bytes read back).
        weight_part_sizes: for each weight the bundle binds in parts, by name, the byte
            sizes of the buffers it was loaded into (one: the device binds it whole).

    ``profiling=True`` (without a ``device``) loads it on a device with the adapter's
    ``timestamp-query`` feature when it has one, for :meth:`profile`; otherwise the feature
    is never requested.

    ``backend`` is ``"webgpu"`` (``wasm_session.WasmSession``'s is ``"wasm"``), and
    ``backend_reason`` None (a WasmSession that ``backend="auto"`` chose says why there).

    Threads: one session may be called from several threads.  Its calls take turns: ``run``,
    ``run_batch``, ``profile``, ``generate``, ``chat`` and reading or disposing a kept
    GpuTensor each hold ``run_lock`` (a reentrant lock) for their whole work, readback
    included (a generation holds it from its prompt to its last token), so a thread waits
    while another's call runs; for runs at the same time, load one session per thread.

    ``limits`` (``{"maxStorageBufferBindingSize": n, "maxBufferSize": n}``, either) lowers the
    buffer size limits that weights the bundle binds in parts are split at, to split them as
    a device that offers only those would (to check a bundle for such devices, and in tests);
    storages are still sized against the device's own limits.
    """

    backend = "webgpu"
    backend_reason: str | None = None

    def __init__(self, bundle_dir: str | Path, device: wgpu.GPUDevice | None = None, *, profiling: bool = False,
                 kernels: str = "auto", limits: Mapping[str, int] | None = None) -> None:
        #: held by every call that runs the model or reads its tensors (see "Threads" above)
        self.run_lock = threading.RLock()
        self.limits = checked_limit_caps(limits)
        if kernels not in KERNEL_VARIANTS:
            raise ValueError(f"kernels must be one of {', '.join(KERNEL_VARIANTS)}, got {kernels!r}")
        self.bundle_dir = Path(bundle_dir)
        self.stats = TransferStats()
        self.manifest: dict[str, Any] = load_manifest(self.bundle_dir)
        unavailable = webgpu_unavailable(self.manifest)
        if unavailable:  # before any shard is read or device requested
            raise RelaxwebError(f'{unavailable}; load it with backend="wasm"')
        #: the bundle's tokenizer (``relaxweb/tokenizer/``), or None when it has none
        self.tokenizer = bundle_tokenizer(self.bundle_dir, self.manifest)
        self.host = HostModule(
            read_bundle_file(self.bundle_dir, "host.wasm", MAX_HOST_MODULE_BYTES, "the host module"), self.manifest
        )
        required_limits = load_time_limits(self.manifest)
        required_features = list(self.manifest.get("required_features", []))
        # which shaders of kernels with a variant to compile ("gpu", "cpu" or "f16")
        self.kernels = session_kernels(kernels, self.manifest, device)
        if self.kernels == "f16" and SHADER_F16 not in required_features:
            required_features.append(SHADER_F16)
        if device is None:
            device = default_device(required_limits, required_features, profiling=profiling, manifest=self.manifest)
        else:
            check_device_limits(device, required_limits, required_features, self.manifest)
        self.device: wgpu.GPUDevice = device

        self.buffers = SessionBuffers(device, self.manifest, self.stats, self.limits)
        sizes_at_bounds = self.host.sizes_at_bounds()
        self.buffers.load(load_shards(self.bundle_dir, self.manifest), sizes_at_bounds)
        layouts, pipelines = create_pipelines(device, self.manifest, self.kernels, self.read_kernel_source)
        self._backend = WebGpuBackend(self, self.buffers, layouts, pipelines, sizes_at_bounds)
        self._driver = HostProgramDriver(self._backend, HostSessions(self.host))
        #: how the last :meth:`run_batch` ran (``runtime/batch.BatchReport``)
        self.last_batch: BatchReport | None = None

    @property
    def last_dispatch_count(self) -> int:
        return self._driver.last_dispatch_count

    @property
    def last_read_count(self) -> int:
        return self._driver.last_read_count

    @property
    def storage_buffer_sizes(self) -> list[int]:
        """The byte size of each storage's GPU buffer (0: not allocated yet)."""
        return [0 if buffer is None else buffer.size for buffer in self.buffers.storages]

    @property
    def weight_part_sizes(self) -> dict[str, list[int]]:
        """For each weight the bundle binds in parts, by name, the byte sizes of the buffers
        it was loaded into (one: the device binds it whole)."""
        return self.buffers.weight_part_sizes

    def read_kernel_source(self, file: str) -> str:
        """The WGSL source of one of the bundle's kernel files (checked: ``manifest.kernel_source``)."""
        return kernel_source(self.bundle_dir, file)

    # Running -----------------------------------------------------------------------------

    @serialized
    def run(self, inputs: Mapping[str, np.ndarray | GpuTensor],
            keep_on_gpu: bool | Iterable[str] = False) -> dict[str, np.ndarray | GpuTensor]:
        """Run the model on ``inputs`` (name -> array) and return its outputs by name.

        ``keep_on_gpu`` (a list of output names, or True for every output but sequences)
        returns those outputs as :class:`~relaxweb.runtime.gpu_tensor.GpuTensor`\\ s: a copy
        on the GPU in a buffer of their own, nothing read back.  A ``GpuTensor`` (of this
        session's device) is accepted as an input like an array of its dtype and shape, and
        copied on the GPU into the input's storage by the run's first command encoder.

        Raises :class:`InputShapeError` when an input is missing, unknown, of the wrong
        dtype or rank, or when the host module rejects the shapes (e.g. a bound exceeded)
        or a value read back from the GPU (its ``resume`` returns an error code).

        One step per command list: a list that ends with a :class:`Read` is submitted, the
        value is read and given to the host's ``resume``, which writes the next list; one
        that ends with a :class:`Resume` (a loop's iteration) is submitted and resumed at
        once.  Storages that grow between two steps keep their contents.
        """
        return self._driver.run(inputs, keep_on_gpu)

    @serialized
    def run_batch(self, instances: Sequence[Mapping[str, np.ndarray]]) -> list[dict[str, np.ndarray]]:
        """Run the model on each of ``instances`` (a list of ``name -> array``, each with its
        own values of the model's symbolic sizes within their bounds) and return their outputs,
        one dict per instance, in order.

        The instances run as one ragged batch (``runtime/batch.py``): each kernel is dispatched
        once for all the instances that run it, over each instance's own sizes, their data
        packed without padding; instances whose ``If`` conditions differ share every dispatch
        but their branches'.  Every instance is checked and sized before any GPU work: one
        outside the bounds raises :class:`InputShapeError`, a batch whose packed size exceeds a
        device limit a :class:`RelaxwebError`, each naming the instance.  Bundles that cannot
        batch (``last_batch.reason``: a kernel without a ragged form, KV caches, sequences) run
        the instances one after another.  ``last_batch`` reports how it ran."""
        check_instance_count(len(instances))
        self.stats.start_run()
        results, self.last_batch = self._driver.run_batch(instances)
        return results

    @serialized
    def profile(self, inputs: Mapping[str, np.ndarray], *, warmup: int = 1) -> Profile:
        """Run the model ``warmup`` times, then once like :meth:`run` timing each dispatch
        (drivers compile a pipeline on its first use), and return the
        :class:`~relaxweb.runtime.profile.Profile`: its outputs (``.outputs``, the same as
        :meth:`run` gives), one row per kernel (calls, time, FLOPs and bytes) and the table
        of the slowest (``.table()``).

        Dispatches are timed by timestamp queries (a compute pass each, timestamps at its
        start and end) where the device has ``timestamp-query`` (load with
        ``profiling=True``), otherwise by one submit per dispatch, timing the wall clock
        until the queue has done it (which adds the submit's overhead to every dispatch).
        """
        outputs, profile = self._driver.profile(inputs, warmup)
        profile.outputs = outputs
        return profile

    def generate(self, prompt: str | Sequence[int], *, max_new_tokens: int = 64, temperature: float | None = None,
                 top_k: int | None = None, top_p: float | None = None, repetition_penalty: float | None = None,
                 seed: int = 0, stop_tokens: Iterable[int] | None = None,
                 on_token: Callable[[int, str], Any] | None = None, wait_for_pages: bool = True) -> Generation:
        """Generate up to ``max_new_tokens`` tokens after ``prompt`` (text, encoded by the
        bundle's tokenizer with its special tokens, or token ids) with a decoder bundle
        (``runtime/generate.py``: which bundles can, and how): greedy when ``temperature`` is
        0, else sampled from softmax(logits / temperature) over the ``top_k`` largest logits
        (0: all) cut to the ``top_p`` most likely (1: no cut), logits of tokens already in the
        sequence divided by ``repetition_penalty`` (1: none), with random numbers from
        ``seed``; an option left None takes the bundle's default (its generation_config.json;
        else greedy, 0, 1, 1).  The next token is picked on the GPU and only it is read back.
        It stops at a token of ``stop_tokens`` (default: every EOS id of the tokenizer; not
        included), after ``max_new_tokens``, or when ``on_token(token, text_so_far)`` (called
        once per token, the text holding complete characters only) returns False.  Returns a
        :class:`~relaxweb.runtime.generate.Generation` (``tokens``: the new ids without the
        prompt's, ``text``: their decoding, ``stopped``: "eos", "length" or "aborted",
        ``tokens_per_second``, ``prefill_ms``); every GpuTensor it made is disposed."""
        return generate(self, prompt, max_new_tokens=max_new_tokens, temperature=temperature, top_k=top_k, top_p=top_p,
                        repetition_penalty=repetition_penalty, seed=seed, stop_tokens=stop_tokens, on_token=on_token,
                        wait_for_pages=wait_for_pages)

    def apply_chat_template(self, messages: Sequence[Mapping[str, Any]], *, add_generation_prompt: bool = True) -> str:
        """The prompt text of a conversation (``[{"role": "user", "content": "Hi"}, ...]``), the
        bundle's chat template rendered as transformers' ``apply_chat_template(messages,
        tokenize=False, add_generation_prompt=True)`` renders it."""
        return apply_chat_template(self, messages, add_generation_prompt=add_generation_prompt)

    def chat(self, messages: Sequence[Mapping[str, Any]], **options: Any) -> Generation:
        """The assistant's reply to ``messages``: :meth:`generate` (with the same options) after
        :meth:`apply_chat_template`'s prompt; ``tokens`` and ``text`` are the reply's."""
        return chat(self, messages, **options)

    # What other modules of the runtime use ------------------------------------------------

    def storage_size_limit(self) -> tuple[int, str]:
        """The largest storage buffer this device binds, and the WebGPU limit that says so."""
        return storage_size_limit(self.device)

    @serialized
    def read_gpu_tensor(self, tensor: GpuTensor) -> np.ndarray:
        """A GpuTensor's values as an array (what ``tensor.numpy()`` calls)."""
        return self._backend.read_gpu_tensor(tensor)

    def copy_unread_status(self, encoder: wgpu.GPUCommandEncoder, target: wgpu.GPUBuffer, offset: int) -> bool:
        """Copy the run status a run that read nothing back left unread to ``offset`` of
        ``target``, a buffer the caller maps: it checks those bytes (``run_status.check_run_status``)
        before using what it read; returns whether there was one (``generate``'s token read)."""
        return self._backend.copy_status_into(encoder, target, offset)

    @serialized
    def release_gpu_buffer(self, buffer: wgpu.GPUBuffer) -> None:
        """Take back the buffer of a disposed GpuTensor, for later kept outputs."""
        self._backend.release_gpu_buffer(buffer)
