"""Run a bundle without a GPU: its ``kernels.wasm`` (WebAssembly SIMD) through wasmtime.

:class:`WasmSession` follows "One run" in ``docs/bundle-format.md`` as ``webgpu.Session``
does: the same host module, command lists and params blocks, carried out by the same driver
(``driver.py``) on :class:`~relaxweb.runtime.wasm_backend.WasmBackend`, which does in one
linear memory what the GPU did.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from relaxweb.errors import RelaxwebError
from relaxweb.runtime.batch import BatchReport, check_instance_count
from relaxweb.runtime.driver import HostProgramDriver
from relaxweb.runtime.generate import apply_chat_template, bundle_tokenizer
from relaxweb.runtime.host import HostModule, load_manifest
from relaxweb.runtime.host_session import HostSessions
from relaxweb.runtime.manifest import MAX_HOST_MODULE_BYTES, read_bundle_file
from relaxweb.runtime.profile import Profile
from relaxweb.runtime.wasm_backend import (  # noqa: F401  (re-exported: the names this module always had)
    KERNEL_SECONDS_PER_CALL, MAX_KERNELS_WASM_BYTES, WasmBackend, wasm_entry,
)


class WasmSession:
    """A bundle loaded on its ``kernels.wasm``, ready to :meth:`run` (same inputs, outputs
    and errors as ``webgpu.Session.run``), on one thread.

    Attributes:
        manifest: the bundle's ``manifest.json`` as a dict.
        host: the bundle's host module (shape checks, command list).
        backend: ``"wasm"``.
        last_dispatch_count / last_read_count: as on ``Session``.
        memory_bytes: the linear memory's size now (it grows, never shrinks).
    """

    backend = "wasm"

    def __init__(self, bundle_dir: str | Path) -> None:
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
        self._backend = WasmBackend(self.bundle_dir, self.manifest, entry, self.host.sizes_at_bounds())
        self._driver = HostProgramDriver(self._backend, HostSessions(self.host))

    @property
    def memory_bytes(self) -> int:
        return self._backend.memory_bytes

    @property
    def last_dispatch_count(self) -> int:
        return self._driver.last_dispatch_count

    @property
    def last_read_count(self) -> int:
        return self._driver.last_read_count

    def run(self, inputs: Mapping[str, Any], keep_on_gpu: bool | Iterable[str] = False) -> dict[str, Any]:
        """Run the model on ``inputs`` (name -> array) and return its outputs by name, as
        ``Session.run`` does (the same checks, :class:`InputShapeError` messages and output
        dtypes).  ``keep_on_gpu`` needs the webgpu backend: there are no GPU tensors here."""
        return self._driver.run(inputs, keep_on_gpu)

    def run_batch(self, instances: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
        """``Session.run_batch``'s contract on one CPU thread: the instances run one after
        another (``last_batch.mode`` is "one by one": kernels.wasm has no ragged form)."""
        check_instance_count(len(instances))
        results, self.last_batch = self._driver.run_batch(instances)
        return results

    def generate(self, *args: Any, **kwargs: Any) -> Any:
        """Not on this backend: generation keeps the KV cache and picks tokens on the GPU."""
        raise RelaxwebError("generate needs the webgpu backend (it keeps the KV cache on the GPU and picks each token "
                            "there); load the bundle with backend='webgpu'")

    def chat(self, *args: Any, **kwargs: Any) -> Any:
        """Not on this backend: chat generates (see :meth:`generate`)."""
        return self.generate(*args, **kwargs)

    def apply_chat_template(self, messages: Sequence[Mapping[str, Any]], *, add_generation_prompt: bool = True) -> str:
        """``Session.apply_chat_template``: the bundle's chat template rendered (no GPU needed)."""
        return apply_chat_template(self, messages, add_generation_prompt=add_generation_prompt)

    def profile(self, inputs: Mapping[str, Any], *, warmup: int = 1) -> Profile:
        """Run ``warmup`` times, then once timing each kernel call by the wall clock (its
        ``kK_units`` and ``kK`` calls), and return the :class:`Profile` (``.outputs``,
        ``.rows``, ``.table()``), the rows ``Session.profile`` gives."""
        outputs, profile = self._driver.profile(inputs, warmup)
        profile.outputs = outputs
        return profile
