"""Text generation with a decoder bundle: ``Session.generate`` (``relaxweb generate DIR``).

A bundle can generate when it has the decoder signature optimum and transformers.js use
(:func:`decoder_signature`): an ``input_ids`` input and a ``logits`` output, and a
``present.X`` output for each ``past_key_values.X`` input (``attention_mask`` and
``position_ids`` optional).  Generation is a prefill of the prompt with an empty past, then one
run per token with the new token, each run's ``present`` (and ``logits``) kept on the GPU
(``run(..., keep_on_gpu=...)``) and the presents fed back as the next run's past.  The next
token is picked on the GPU by ``runtime_js/sampler.wgsl`` (the browser runtime runs the same
file) from the last position's logits: only that one integer is read back per token.  Every
GpuTensor made is disposed before ``generate`` returns, however it ends.

Random numbers come from mulberry32 seeded with ``seed``, one uniform per token with 24 bits
(exact in float32): ``runtime_js/generate.js`` draws the same, so a seed gives the same tokens
in both runtimes wherever the logits agree.
"""

from __future__ import annotations

import struct
import time
import weakref
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

import wgpu

from relaxweb.errors import RelaxwebError
from relaxweb.runtime.gpu_tensor import GpuTensor
from relaxweb.tokenizer import TextStream

SAMPLER_PATH = Path(__file__).resolve().parent.parent / "runtime_js" / "sampler.wgsl"
#: The largest top_k the sampler keeps in workgroup memory (sampler.wgsl's MAX_TOP_K).
MAX_TOP_K = 256
PAST_PREFIX, PRESENT_PREFIX = "past_key_values.", "present."
STOPPED = ("eos", "length", "aborted")
_PARAMS_BYTES = 32  # sampler.wgsl's Params (20 bytes), padded to a multiple of 16


@dataclass(frozen=True)
class DecoderSignature:
    """Which inputs and outputs of a bundle ``generate`` feeds and reads."""

    attention_mask: bool
    position_ids: bool
    #: (past input, present output) of each cache tensor, in the manifest's order of inputs
    cache: tuple[tuple[str, str], ...]


@dataclass
class Generation:
    """What ``generate`` returns: the new tokens (a stop token not included) and their text,
    why it stopped (``"eos"``: a stop token; ``"length"``: ``max_new_tokens``, or the bundle's
    bound on the sequence; ``"aborted"``: the callback returned False), the decode speed (tokens
    after the first, per second of their runs) and the prefill's time (the prompt's run and the
    first token's sampling)."""

    tokens: list[int]
    text: str
    stopped: str
    tokens_per_second: float
    prefill_ms: float


def decoder_signature(manifest: Mapping[str, Any]) -> DecoderSignature:
    """The bundle's decoder signature, or a RelaxwebError saying everything it lacks."""
    inputs = {entry["name"]: entry for entry in manifest["inputs"]}
    outputs = {entry["name"]: entry for entry in manifest["outputs"]}
    problems = []
    if "input_ids" not in inputs:
        problems.append("no input 'input_ids'")
    if "logits" not in outputs:
        problems.append("no output 'logits'")
    pasts = [name for name in inputs if name.startswith(PAST_PREFIX)]
    if not pasts:
        problems.append(f"no cache inputs '{PAST_PREFIX}*'")
    cache = tuple((past, PRESENT_PREFIX + past[len(PAST_PREFIX):]) for past in pasts)
    problems += [f"no output '{present}' for input '{past}'" for past, present in cache if present not in outputs]
    others = [name for name in inputs if name not in ("input_ids", "attention_mask", "position_ids", *pasts)]
    if others:
        problems.append(f"inputs generate cannot feed: {', '.join(repr(name) for name in others)}")
    if problems:
        raise RelaxwebError("this bundle cannot generate: it has " + "; ".join(problems) + " (a decoder has input_ids "
                            f"-> logits and a {PRESENT_PREFIX}X output for each {PAST_PREFIX}X input, optionally "
                            "attention_mask and position_ids)")
    return DecoderSignature("attention_mask" in inputs, "position_ids" in inputs, cache)


def sequence_limit(manifest: Mapping[str, Any], signature: DecoderSignature) -> int | None:
    """The longest sequence (prompt and new tokens) one run can take: the bound of the cache's
    length (past + 1) or of the attention mask's, whichever is smaller; None when unbounded."""
    bounds = {var["name"]: var["bound"] for var in manifest["symbolic_vars"] if var["bound"] is not None}
    inputs = {entry["name"]: entry for entry in manifest["inputs"]}
    limits = []
    past = inputs[signature.cache[0][0]]["shape"]
    if len(past) == 4 and past[2] in bounds:
        limits.append(bounds[past[2]] + 1)
    if signature.attention_mask and inputs["attention_mask"]["shape"][-1] in bounds:
        limits.append(bounds[inputs["attention_mask"]["shape"][-1]])
    return min(limits, default=None)


def mulberry32(seed: int) -> Callable[[], float]:
    """A seeded generator of uniforms in [0, 1) with 24 bits (``generate.js`` has the same)."""
    state = seed & 0xFFFFFFFF

    def imul(a: int, b: int) -> int:
        return (a * b) & 0xFFFFFFFF

    def next_uniform() -> float:
        nonlocal state
        state = (state + 0x6D2B79F5) & 0xFFFFFFFF
        t = imul(state ^ (state >> 15), state | 1)
        t ^= (t + imul(t ^ (t >> 7), t | 61)) & 0xFFFFFFFF
        return ((t ^ (t >> 14)) >> 8) / (1 << 24)

    return next_uniform


def checked_options(max_new_tokens: Any, temperature: Any, top_k: Any, seed: Any) -> None:
    """A RelaxwebError for the first option out of range (the browser runtime checks the same)."""
    if not _is_integer(max_new_tokens) or max_new_tokens < 1:
        raise RelaxwebError(f"max_new_tokens must be an integer >= 1, got {max_new_tokens!r}")
    if not _is_number(temperature) or not 0 <= temperature < float("inf"):
        raise RelaxwebError(f"temperature must be a number >= 0 (0: greedy), got {temperature!r}")
    if not _is_integer(top_k) or not 0 <= top_k <= MAX_TOP_K:
        raise RelaxwebError(f"top_k must be an integer from 0 (the whole vocabulary) to {MAX_TOP_K}, got {top_k!r}")
    if not _is_integer(seed):
        raise RelaxwebError(f"seed must be an integer, got {seed!r}")


def _is_integer(value: Any) -> bool:
    """A Python int that is not a bool (``True`` is an int to Python, never a count here)."""
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return _is_integer(value) or isinstance(value, float)


class _Sampler:
    """sampler.wgsl on a session's device: its pipeline (kept per device) and, for one
    ``generate``, its three small buffers (destroyed by :meth:`close`)."""

    _pipelines: "weakref.WeakKeyDictionary[Any, Any]" = weakref.WeakKeyDictionary()

    def __init__(self, session: Any) -> None:
        self.session = session
        device = session.device
        if device not in self._pipelines:
            module = device.create_shader_module(label="sampler", code=SAMPLER_PATH.read_text())
            self._pipelines[device] = device.create_compute_pipeline(
                label="sampler", layout="auto", compute={"module": module, "entry_point": "main"})
        self.pipeline = self._pipelines[device]
        usage = wgpu.BufferUsage
        self.params = session.buffers.create(label="sampler params", size=_PARAMS_BYTES,
                                             usage=usage.UNIFORM | usage.COPY_DST)
        self.result = session.buffers.create(label="sampled token", size=16, usage=usage.STORAGE | usage.COPY_SRC)
        self.staging = session.buffers.create(label="sampled token read", size=16,
                                              usage=usage.MAP_READ | usage.COPY_DST)

    def sample(self, logits: GpuTensor, temperature: float, top_k: int, uniform: float) -> int:
        """The next token from the last row of ``logits`` (``[1, seq, vocab]`` float32)."""
        vocab = logits.shape[-1]
        offset = (int(np.prod(logits.shape[:-1])) - 1) * vocab
        params = struct.pack("<IIIff12x", offset, vocab, top_k, temperature, uniform)
        self.session.buffers.write(self.params, params, "params_bytes_written")
        device = self.session.device
        bind_group = device.create_bind_group(layout=self.pipeline.get_bind_group_layout(0), entries=[
            {"binding": 0, "resource": {"buffer": self.params, "offset": 0, "size": _PARAMS_BYTES}},
            {"binding": 1, "resource": {"buffer": logits.buffer(), "offset": 0, "size": logits.buffer().size}},
            {"binding": 2, "resource": {"buffer": self.result, "offset": 0, "size": 16}},
        ])
        encoder = device.create_command_encoder()
        compute_pass = encoder.begin_compute_pass()
        compute_pass.set_pipeline(self.pipeline)
        compute_pass.set_bind_group(0, bind_group)
        compute_pass.dispatch_workgroups(1)
        compute_pass.end()
        encoder.copy_buffer_to_buffer(self.result, 0, self.staging, 0, 4)
        device.queue.submit([encoder.finish()])
        self.staging.map_sync(wgpu.MapMode.READ)
        try:
            (token,) = struct.unpack("<I", self.staging.read_mapped(0, 4))
            self.session.stats.add("bytes_read", 4)
        finally:
            self.staging.unmap()
        return token

    def close(self) -> None:
        for buffer in (self.params, self.result, self.staging):
            buffer.destroy()


def _prompt_ids(session: Any, prompt: str | Sequence[int], vocab: int) -> list[int]:
    if isinstance(prompt, str):
        if session.tokenizer is None:
            raise RelaxwebError("this bundle has no tokenizer (build it with --tokenizer FILE): give the prompt "
                                "as token ids")
        ids = session.tokenizer.encode(prompt)
    else:
        ids = list(prompt)
        if not all(isinstance(i, (int, np.integer)) and not isinstance(i, bool) and 0 <= i < vocab for i in ids):
            raise RelaxwebError(f"a prompt of token ids must hold integers from 0 to {vocab - 1}")
        ids = [int(i) for i in ids]
    if not ids:
        raise RelaxwebError("the prompt is empty: generate needs at least one token to start from")
    return ids


class _Feeds:
    """The inputs of each run: the new tokens, their mask and positions, and the past."""

    def __init__(self, manifest: Mapping[str, Any], signature: DecoderSignature) -> None:
        self.signature = signature
        entries = {entry["name"]: entry for entry in manifest["inputs"]}
        self.dtypes = {name: np.dtype(entry["dtype"]) for name, entry in entries.items()}
        self.empty_past = {past: np.zeros(self.empty_past_shape(manifest, past, present), self.dtypes[past])
                           for past, present in signature.cache}

    @staticmethod
    def empty_past_shape(manifest: Mapping[str, Any], past: str, present: str) -> list[int]:
        """The prompt's empty past: 1 for the batch, 0 for the past length (the dimension the
        present grows along: the cache's axis, else the one symbolic dimension the present
        names otherwise), and each other dimension as the model has it: the past's when a
        number, else the present's (a head size the exporter left symbolic, ``kv_cache_dim``,
        that the model's graph fixes)."""
        inputs = [entry["name"] for entry in manifest["inputs"]]
        past_entry = manifest["inputs"][inputs.index(past)]
        present_entry = next(entry for entry in manifest["outputs"] if entry["name"] == present)
        batch = manifest["inputs"][inputs.index("input_ids")]["shape"][0]
        axes = [cache["axis"] for cache in manifest.get("caches", []) if cache["input"] == inputs.index(past)]
        grows = present_entry["shape"] or [None] * len(past_entry["shape"])
        symbolic = [axis for axis, dim in enumerate(past_entry["shape"]) if isinstance(dim, str) and dim != batch]
        if not axes:
            axes = [axis for axis in symbolic if axis < len(grows) and isinstance(grows[axis], str)
                    and grows[axis] != past_entry["shape"][axis]] or (symbolic if len(symbolic) == 1 else [])
        if len(axes) != 1:
            raise RelaxwebError(f"this bundle cannot generate: no dimension of input '{past}' {past_entry['shape']} is "
                                f"the past length alone (the one output '{present}' {present_entry['shape']} grows along)")
        shape = []
        for axis, dim in enumerate(past_entry["shape"]):
            out = grows[axis] if axis < len(grows) else None
            extent = 1 if dim == batch else 0 if axis == axes[0] else dim if isinstance(dim, int) else out
            if not isinstance(extent, int):
                raise RelaxwebError(f"this bundle cannot generate: dimension {axis} of input '{past}' ({dim}) has no "
                                    f"extent in the model (output '{present}' has {out} there), so its empty past "
                                    "cannot be made")
            shape.append(extent)
        return shape

    def __call__(self, tokens: list[int], start: int, past: Mapping[str, Any] | None) -> dict[str, Any]:
        feeds: dict[str, Any] = {"input_ids": np.array([tokens], self.dtypes["input_ids"])}
        if self.signature.attention_mask:
            feeds["attention_mask"] = np.ones((1, start + len(tokens)), self.dtypes["attention_mask"])
        if self.signature.position_ids:
            feeds["position_ids"] = np.arange(start, start + len(tokens), dtype=self.dtypes["position_ids"])[None]
        for past_name, present_name in self.signature.cache:
            feeds[past_name] = self.empty_past[past_name] if past is None else past[present_name]
        return feeds


def generate(session: Any, prompt: str | Sequence[int], *, max_new_tokens: int = 64, temperature: float = 0.0,
             top_k: int = 0, seed: int = 0, stop_tokens: Iterable[int] | None = None,
             on_token: Callable[[int, str], Any] | None = None) -> Generation:
    """``Session.generate``: see its docstring."""
    signature = decoder_signature(session.manifest)
    checked_options(max_new_tokens, temperature, top_k, seed)
    logits_entry = next(entry for entry in session.manifest["outputs"] if entry["name"] == "logits")
    vocab = logits_entry["shape"][-1] if logits_entry["shape"] else None
    if not isinstance(vocab, int) or logits_entry["dtype"] not in ("float32", "float16"):  # (float16: float32 on the GPU)
        raise RelaxwebError("this bundle cannot generate: its logits must be float32 or float16 with a fixed vocabulary "
                            f"size as their last dimension, got {logits_entry['dtype']} {logits_entry['shape']}")
    ids = _prompt_ids(session, prompt, vocab)
    limit = sequence_limit(session.manifest, signature)
    if limit is not None and len(ids) > limit:
        raise RelaxwebError(f"the prompt has {len(ids)} tokens; this bundle's bounds allow sequences of at most {limit}")
    stops = set(session.tokenizer.stop_tokens if stop_tokens is None and session.tokenizer else stop_tokens or ())
    stream = TextStream() if session.tokenizer is None else session.tokenizer.stream()
    feeds, uniform = _Feeds(session.manifest, signature), mulberry32(seed)
    keep = ["logits", *(present for _, present in signature.cache)]

    tokens: list[int] = []
    text = ""
    stopped = "length"
    held: list[GpuTensor] = []  # every GpuTensor alive: disposed whatever happens
    sampler = _Sampler(session)
    started = time.perf_counter()
    decode_started = prefill_ms = 0.0
    try:
        outputs = session.run(feeds(ids, 0, None), keep_on_gpu=keep)
        held = list(outputs.values())
        while True:
            token = sampler.sample(outputs["logits"], float(temperature), top_k, uniform())
            outputs["logits"].dispose()
            if not tokens:
                decode_started = time.perf_counter()
                prefill_ms = (decode_started - started) * 1e3
            if token in stops:
                stopped = "eos"
                break
            tokens.append(token)
            text += stream.push(token)
            if on_token is not None and on_token(token, text) is False:
                stopped = "aborted"
                break
            if len(tokens) == max_new_tokens or (limit is not None and len(ids) + len(tokens) > limit):
                break
            previous = held
            outputs = session.run(feeds([token], len(ids) + len(tokens) - 1, outputs), keep_on_gpu=keep)
            held = list(outputs.values())
            for tensor in previous:
                tensor.dispose()
    finally:
        for tensor in held:
            tensor.dispose()
        sampler.close()
    text += stream.finish()
    decoded = len(tokens) - 1
    elapsed = time.perf_counter() - decode_started
    return Generation(tokens, text, stopped, decoded / elapsed if decoded > 0 and elapsed > 0 else 0.0, prefill_ms)
