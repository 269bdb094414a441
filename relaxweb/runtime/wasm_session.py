"""Run a bundle without a GPU: its ``kernels.wasm`` (WebAssembly SIMD) through wasmtime.

:class:`WasmSession` follows "One run" in ``docs/bundle-format.md`` as ``webgpu.Session``
does: the same host module, command lists and params blocks, carried out by the same driver
(``driver.py``) on :class:`~relaxweb.runtime.wasm_backend.WasmBackend`, which does in one
linear memory what the GPU did.  Outputs kept with ``keep_on_gpu`` are
:class:`~relaxweb.runtime.wasm_backend.WasmTensor`\\ s (a KV cache's present a view of the cache
in memory), so ``generate`` and ``chat`` run the same loop as on WebGPU (``generate.py``), each
token picked on the CPU by ``sampler.py``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
import threading
from pathlib import Path
from typing import Any

from relaxweb.runtime.batch import BatchReport, check_instance_count
from relaxweb.runtime.driver import HostProgramDriver, serialized
from relaxweb.runtime.generate import (
    Generation, GenerationMethods, apply_chat_template, bundle_tokenizer, chat, generate,
)
from relaxweb.runtime.gpu_tensor import TransferStats
from relaxweb.runtime.host import HostModule, load_manifest
from relaxweb.runtime.host_session import HostSessions
from relaxweb.runtime.manifest import MAX_HOST_MODULE_BYTES, read_bundle_file
from relaxweb.runtime.profile import Profile
from relaxweb.runtime.wasm_backend import (  # noqa: F401  (re-exported: the names this module always had)
    KERNEL_SECONDS_PER_CALL, MAX_KERNELS_WASM_BYTES, WasmBackend, WasmTensor, wasm_entry,
)


class WasmSession(GenerationMethods):
    """A bundle loaded on its ``kernels.wasm``, ready to :meth:`run` (same inputs, outputs
    and errors as ``webgpu.Session.run``), its kernels on one CPU thread.  Safe to call
    from several threads as ``webgpu.Session`` is: calls take turns on ``run_lock``.

    Attributes:
        manifest: the bundle's ``manifest.json`` as a dict.
        host: the bundle's host module (shape checks, command list).
        backend: ``"wasm"``.
        backend_reason: why ``backend="auto"`` did not take WebGPU (the adapter's missing
            limits or features, naming the storage that needs a larger binding), else None.
        last_dispatch_count / last_read_count: as on ``Session``.
        memory_bytes: the linear memory's size now (it grows, never shrinks).
        stats: ``Session.stats``' counters for the memory (``buffers_created``: regions laid
            out for storages; ``bytes_read``: bytes copied out of it: outputs, kept copies,
            values read mid-run; ``live_gpu_bytes`` stays 0: see ``memory_bytes``).
    """

    backend = "wasm"
    backend_reason: str | None = None  # set by runtime/backend.load_session when "auto" fell back
    device = None  # no WebGPU device: a WebGPU session refuses this session's tensors

    def __init__(self, bundle_dir: str | Path, *, kernel_timeout_s: float | None = None,
                 relaxed_simd: bool | None = None) -> None:
        """``kernel_timeout_s``: how long one kernels.wasm call may run before the run fails
        (default ``KERNEL_SECONDS_PER_CALL``: docs/design.md, "Deadlines").  ``relaxed_simd``:
        None (the default) runs the kernels' multiply-adds with relaxed SIMD where wasmtime
        compiles it (fused: faster, results may differ in the last bit between machines), False
        lowers them to plain SIMD128 at load, True insists on relaxed SIMD;
        ``session.relaxed_simd`` says which runs."""
        #: held by every call that runs the model or reads its kept tensors (``webgpu.Session``'s "Threads")
        self.run_lock = threading.RLock()
        self.bundle_dir = Path(bundle_dir)
        self.manifest: dict[str, Any] = load_manifest(self.bundle_dir)
        entry = wasm_entry(self.manifest, self.bundle_dir)
        #: the bundle's tokenizer (``relaxweb/tokenizer/``), or None when it has none
        self.tokenizer = bundle_tokenizer(self.bundle_dir, self.manifest)
        self.host = HostModule(
            read_bundle_file(self.bundle_dir, "host.wasm", MAX_HOST_MODULE_BYTES, "the host module"), self.manifest
        )
        #: how the last :meth:`run_batch` ran (``runtime/batch.BatchReport``)
        self.last_batch: BatchReport | None = None
        self._backend = WasmBackend(self.bundle_dir, self.manifest, entry, self.host.sizes_at_bounds(), self,
                                    kernel_timeout_s, relaxed_simd)
        #: whether the kernels run with relaxed SIMD (``runtime/relaxed_simd.py``)
        self.relaxed_simd: bool = self._backend.relaxed_simd
        self._driver = HostProgramDriver(self._backend, HostSessions(self.host))

    @property
    def memory_bytes(self) -> int:
        return self._backend.memory_bytes

    @property
    def stats(self) -> TransferStats:
        return self._backend.stats

    @property
    def last_dispatch_count(self) -> int:
        return self._driver.last_dispatch_count

    @property
    def last_read_count(self) -> int:
        return self._driver.last_read_count

    @serialized
    def run(self, inputs: Mapping[str, Any], keep_on_gpu: bool | Iterable[str] = False) -> dict[str, Any]:
        """Run the model on ``inputs`` (name -> array) and return its outputs by name, as
        ``Session.run`` does (the same checks, :class:`InputShapeError` messages and output
        dtypes).  ``keep_on_gpu`` (names, or True) keeps those outputs in this session as
        :class:`WasmTensor`\\ s, which ``run`` takes back as inputs: a KV cache's present is a
        view of the cache (no copy; valid until the next run ends), given back as its past
        without a byte written; any other kept output is a copy of its bytes."""
        return self._driver.run(inputs, keep_on_gpu)

    @serialized
    def run_batch(self, instances: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
        """``Session.run_batch``'s contract on one CPU thread: the instances run one after
        another (``last_batch.mode`` is "one by one": kernels.wasm has no ragged form)."""
        check_instance_count(len(instances))
        results, self.last_batch = self._driver.run_batch(instances)
        return results

    def generate(self, prompt: str | Sequence[int], *, max_new_tokens: int = 64, temperature: float | None = None,
                 top_k: int | None = None, top_p: float | None = None, repetition_penalty: float | None = None,
                 seed: int = 0, stop_tokens: Iterable[int] | None = None,
                 on_token: Callable[[int, str], Any] | None = None, wait_for_pages: bool = True) -> Generation:
        """``Session.generate`` on this backend: the same loop (``runtime/generate.py``), the KV
        caches kept in place in the memory, each token picked on the CPU by ``sampler.py``
        (sampler.wgsl's algorithm): greedy gives WebGPU's tokens, a seed the same draws."""
        return generate(self, prompt, max_new_tokens=max_new_tokens, temperature=temperature, top_k=top_k, top_p=top_p,
                        repetition_penalty=repetition_penalty, seed=seed, stop_tokens=stop_tokens, on_token=on_token,
                        wait_for_pages=wait_for_pages)

    def chat(self, messages: Sequence[Mapping[str, Any]], **options: Any) -> Generation:
        """``Session.chat``: :meth:`generate` (with the same options) after :meth:`apply_chat_template`'s prompt."""
        return chat(self, messages, **options)

    def apply_chat_template(self, messages: Sequence[Mapping[str, Any]], *, add_generation_prompt: bool = True) -> str:
        """``Session.apply_chat_template``: the bundle's chat template rendered."""
        return apply_chat_template(self, messages, add_generation_prompt=add_generation_prompt)

    @serialized
    def profile(self, inputs: Mapping[str, Any], *, warmup: int = 1) -> Profile:
        """Run ``warmup`` times, then once timing each kernel call by the wall clock (its
        ``kK_units`` and ``kK`` calls), and return the :class:`Profile` (``.outputs``,
        ``.rows``, ``.table()``), the rows ``Session.profile`` gives."""
        outputs, profile = self._driver.profile(inputs, warmup)
        profile.outputs = outputs
        return profile
