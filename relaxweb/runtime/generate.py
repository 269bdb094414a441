"""Text generation with a decoder bundle: ``Session.generate`` (``relaxweb generate DIR``),
``Session.chat`` and ``Session.apply_chat_template`` (``relaxweb chat DIR``).

A bundle can generate when it has the decoder signature optimum and transformers.js use
(:func:`decoder_signature`): an ``input_ids`` input and a ``logits`` output, and a
``present.X`` output for each ``past_key_values.X`` input (``attention_mask`` and
``position_ids`` optional).  Generation is a prefill of the prompt with an empty past, then one
run per token with the new token, each run's ``present`` (and ``logits``) kept
(``run(..., keep_on_gpu=...)``) and the presents fed back as the next run's past.  The loop is
the same on both backends; what differs is behind ``run`` (WebGPU: GpuTensors, the caches'
views on the GPU; wasm: ``WasmTensor``\\ s, the caches' views in the wasm memory) and the sampler
(:data:`SAMPLERS`): on WebGPU ``runtime_js/sampler.wgsl`` (the browser runtime runs the same
file) picks the token from the last position's logits and only that one integer is read back
(with the run status the step's run left unread: a step waits for the GPU once); on wasm ``sampler.py`` does the same on the CPU.  Every kept tensor made is disposed before
``generate`` returns, however it ends.

Random numbers come from mulberry32 seeded with ``seed``, one uniform per token with 24 bits
(exact in float32): ``runtime_js/generate.js`` draws the same, so a seed gives the same tokens
in both runtimes wherever the logits agree.  The sampler applies the repetition penalty, the
temperature, top-k and top-p in transformers' order; an option not given takes the bundle's
default (its tokenizer's ``generation_config.json``, :data:`GREEDY` without one).  Generation
stops at any of the stop tokens (by default every EOS id of the tokenizer).
"""

from __future__ import annotations

import struct
import threading
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
from relaxweb.runtime.manifest import read_bundle_file
from relaxweb.runtime.paged_generate import PAGE_TABLE, PagedScheduler, Request, SchedulerStats, new_request, pool_layout
from relaxweb.runtime.run_status import STATUS_BYTES, check_run_status
from relaxweb.runtime.sampler import MAX_TOP_K, CpuSampler, Sampling, seen_bits
from relaxweb.tokenizer import TextStream, Tokenizer, make_tokenizer

SAMPLER_PATH = Path(__file__).resolve().parent.parent / "runtime_js" / "sampler.wgsl"
PAST_PREFIX, PRESENT_PREFIX = "past_key_values.", "present."
STOPPED = ("eos", "length", "aborted")
_PARAMS_BYTES = 32  # sampler.wgsl's Params
#: The sampling options without a default from the bundle: greedy, nothing cut, no penalty.
GREEDY = {"temperature": 0.0, "top_k": 0, "top_p": 1.0, "repetition_penalty": 1.0}


@dataclass(frozen=True)
class DecoderSignature:
    """Which inputs and outputs of a bundle ``generate`` feeds and reads."""

    attention_mask: bool
    position_ids: bool
    #: (past input, present output) of each cache tensor, in the manifest's order of inputs
    cache: tuple[tuple[str, str], ...]


@dataclass
class Generation:
    """What ``generate`` returns: the new tokens (a stop token not included; the prompt's
    not either) and their text (the tokenizer's decoding of them),
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
    paged = [PAGE_TABLE] if "kv_pool" in manifest else []  # a paged KV cache's page table (paged_generate.py)
    others = [name for name in inputs if name not in ("input_ids", "attention_mask", "position_ids", *pasts, *paged)]
    if others:
        problems.append(f"inputs generate cannot feed: {', '.join(repr(name) for name in others)}")
    if problems:
        raise RelaxwebError("this bundle cannot generate: it has " + "; ".join(problems) + " (a decoder has input_ids "
                            f"-> logits and a {PRESENT_PREFIX}X output for each {PAST_PREFIX}X input, optionally "
                            "attention_mask and position_ids)")
    return DecoderSignature("attention_mask" in inputs, "position_ids" in inputs, cache)


def sequence_limit(manifest: Mapping[str, Any], signature: DecoderSignature) -> int | None:
    """The longest sequence (prompt and new tokens) one run can take: the bound of each cache's
    length (past + 1; its axis as ``cache_axis`` finds it) or of the attention mask's, whichever
    is smallest; None when unbounded."""
    bounds = {var["name"]: var["bound"] for var in manifest["symbolic_vars"] if var["bound"] is not None}
    inputs = {entry["name"]: entry for entry in manifest["inputs"]}
    limits = []
    for past, present in signature.cache:
        length = inputs[past]["shape"][cache_axis(manifest, past, present)]
        if length in bounds:
            limits.append(bounds[length] + 1)
    if signature.attention_mask and inputs["attention_mask"]["shape"][-1] in bounds:
        limits.append(bounds[inputs["attention_mask"]["shape"][-1]])
    return min(limits, default=None)


def cache_axis(manifest: Mapping[str, Any], past: str, present: str) -> int:
    """The axis of input ``past`` that is the past length: the cache's axis where the bundle
    has one, else the one symbolic dimension (not the batch) the output ``present`` names
    otherwise, else the past's one symbolic dimension; a RelaxwebError when there is none."""
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
    return axes[0]


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


def checked_options(max_new_tokens: Any, temperature: Any, top_k: Any, seed: Any, top_p: Any = 1.0,
                    repetition_penalty: Any = 1.0) -> None:
    """A RelaxwebError for the first option out of range (the browser runtime checks the same)."""
    if not _is_integer(max_new_tokens) or max_new_tokens < 1:
        raise RelaxwebError(f"max_new_tokens must be an integer >= 1, got {max_new_tokens!r}")
    if not _is_number(temperature) or not 0 <= temperature < float("inf") or not _in_float32(temperature):
        raise RelaxwebError(f"temperature must be a number >= 0 (0: greedy), got {temperature!r}{_float32_note(temperature)}")
    if not _is_integer(top_k) or not 0 <= top_k <= MAX_TOP_K:
        raise RelaxwebError(f"top_k must be an integer from 0 (the whole vocabulary) to {MAX_TOP_K}, got {top_k!r}")
    if not _is_number(top_p) or not 0 < top_p <= 1 or not _in_float32(top_p):
        raise RelaxwebError(f"top_p must be a number above 0 and at most 1 (1: no cut), got {top_p!r}{_float32_note(top_p)}")
    if not _is_number(repetition_penalty) or not 0 < repetition_penalty < float("inf") or not _in_float32(repetition_penalty):
        raise RelaxwebError(f"repetition_penalty must be a number above 0 (1: none), got {repetition_penalty!r}"
                            f"{_float32_note(repetition_penalty)}")
    if not _is_integer(seed):
        raise RelaxwebError(f"seed must be an integer, got {seed!r}")


def sampling_options(defaults: Mapping[str, Any], **given: Any) -> dict[str, Any]:
    """The sampling options of a generate call: each one given (not None), else the bundle's
    default (``defaults``: its tokenizer's), else :data:`GREEDY`'s."""
    return {name: given[name] if given.get(name) is not None else defaults.get(name, greedy)
            for name, greedy in GREEDY.items()}


def _is_integer(value: Any) -> bool:
    """A Python int that is not a bool (``True`` is an int to Python, never a count here)."""
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return _is_integer(value) or (isinstance(value, float) and value == value)


#: The samplers compute in float32: the smallest normal and the largest finite float32.
FLOAT32_RANGE = (1.1754943508222875e-38, 3.4028234663852886e38)


def _in_float32(value: float) -> bool:
    """Whether ``value`` is 0 or a normal float32 (else the samplers would see 0 or infinity)."""
    return value == 0 or FLOAT32_RANGE[0] <= abs(value) <= FLOAT32_RANGE[1]


def _float32_note(value: Any) -> str:
    """Why a number otherwise in range is refused: the samplers compute in float32."""
    if _is_number(value) and value != 0 and not _in_float32(value) and abs(value) < float("inf"):
        return " (outside float32's range, 1.2e-38 to 3.4e38, which the samplers compute in)"
    return ""


class GpuSampler:
    """sampler.wgsl on a session's device: its pipeline (kept per device) and, for one
    ``generate``, its four small buffers (destroyed by :meth:`close`): the params, the token,
    its staging copy and the ids seen (one bit each: the prompt's, then each token picked)."""

    _pipelines: "weakref.WeakKeyDictionary[Any, Any]" = weakref.WeakKeyDictionary()

    def __init__(self, session: Any, vocab: int, sampling: Sampling, prompt: Sequence[int]) -> None:
        self.session = session
        self.sampling = sampling
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
        # the token, then (at 4) the run status a kept run left unread: its error comes first
        self.staging = session.buffers.create(label="sampled token read", size=4 + STATUS_BYTES,
                                              usage=usage.MAP_READ | usage.COPY_DST)
        seen = seen_bits(vocab, sampling, prompt)
        self.seen = session.buffers.create(label="seen tokens", size=max(16, -(-seen.nbytes // 16) * 16),
                                           usage=usage.STORAGE | usage.COPY_DST)
        if sampling.repetition_penalty != 1:  # the prompt's ids count as seen, as in transformers
            session.buffers.write(self.seen, seen.tobytes(), "params_bytes_written")

    def encode(self, encoder: Any, logits: GpuTensor, row: int, uniform: float) -> None:
        """Record the pick of the next token from row ``row`` of ``logits`` (``[1, T, vocab]``
        float32) into ``encoder``: the token lands in ``self.result``."""
        vocab = logits.shape[-1]
        sampling = self.sampling
        params = struct.pack("<IIIffffI", row * vocab, vocab, sampling.top_k, sampling.temperature, uniform,
                             sampling.top_p, sampling.repetition_penalty, int(sampling.repetition_penalty != 1))
        self.session.buffers.write(self.params, params, "params_bytes_written")
        device = self.session.device
        bind_group = device.create_bind_group(layout=self.pipeline.get_bind_group_layout(0), entries=[
            {"binding": 0, "resource": {"buffer": self.params, "offset": 0, "size": _PARAMS_BYTES}},
            {"binding": 1, "resource": {"buffer": logits.buffer(), "offset": 0, "size": logits.buffer().size}},
            {"binding": 2, "resource": {"buffer": self.result, "offset": 0, "size": 16}},
            {"binding": 3, "resource": {"buffer": self.seen, "offset": 0, "size": self.seen.size}},
        ])
        compute_pass = encoder.begin_compute_pass()
        compute_pass.set_pipeline(self.pipeline)
        compute_pass.set_bind_group(0, bind_group)
        compute_pass.dispatch_workgroups(1)
        compute_pass.end()

    def sample(self, logits: GpuTensor, uniform: float) -> int:
        """The next token from the last row of ``logits`` (``[1, seq, vocab]`` float32)."""
        return self.sample_rows(self.session, logits, [(self, int(np.prod(logits.shape[:-1])) - 1, uniform)],
                                self.staging)[0]

    @staticmethod
    def sample_rows(session: Any, logits: GpuTensor, picks: Sequence[tuple["GpuSampler", int, float]],
                    staging: Any = None) -> list[int]:
        """Each sampler's next token from its row of ``logits`` (``picks``: sampler, row,
        uniform), all in one submit with one read of the tokens (and of the run status the
        run that made the logits left unread: its error comes first)."""
        size = 4 * len(picks) + STATUS_BYTES
        own = staging is None
        if own:
            staging = session.buffers.create(label="sampled tokens read", size=-(-size // 16) * 16,
                                             usage=wgpu.BufferUsage.MAP_READ | wgpu.BufferUsage.COPY_DST)
        try:
            encoder = session.device.create_command_encoder()
            for sampler, row, uniform in picks:
                sampler.encode(encoder, logits, row, uniform)
            for index, (sampler, _, _) in enumerate(picks):
                encoder.copy_buffer_to_buffer(sampler.result, 0, staging, 4 * index, 4)
            tokens_bytes = 4 * len(picks)
            carries_status = session.copy_unread_status(encoder, staging, tokens_bytes)
            session.device.queue.submit([encoder.finish()])
            read = tokens_bytes + STATUS_BYTES if carries_status else tokens_bytes
            staging.map_sync(wgpu.MapMode.READ, 0, read)
            try:
                data = bytes(staging.read_mapped(0, read))
            finally:
                staging.unmap()
        finally:
            if own:
                staging.destroy()
        if carries_status:  # the run that made the logits (and any before it) kept everything
            check_run_status(session.manifest, data[tokens_bytes:])
        session.stats.add("bytes_read", tokens_bytes)
        return list(struct.unpack(f"<{len(picks)}I", data[:tokens_bytes]))

    def close(self) -> None:
        for buffer in (self.params, self.result, self.staging, self.seen):
            buffer.destroy()


#: The token sampler of each backend (``session.backend``): made per ``generate`` as
#: ``sampler(session, vocab, sampling, prompt)``, then ``sample(logits, uniform) -> int`` per
#: token and ``close()``.
SAMPLERS: dict[str, Callable[..., Any]] = {"webgpu": GpuSampler, "wasm": CpuSampler}


def bundle_tokenizer(bundle_dir: Path, manifest: Mapping[str, Any]) -> Tokenizer | None:
    """The tokenizer of a bundle (its manifest validated), or None when it has none; its files
    are read inside the bundle folder only."""
    if "tokenizer" not in manifest:
        return None
    return make_tokenizer(manifest["tokenizer"],
                          lambda name, limit: read_bundle_file(bundle_dir, name, limit, "the tokenizer file"))


def _prompt_ids(session: Any, prompt: str | Sequence[int], vocab: int) -> list[int]:
    if isinstance(prompt, str):
        if session.tokenizer is None:
            raise RelaxwebError("this bundle has no tokenizer (build it with --tokenizer PATH): give the prompt "
                                "as token ids")
        ids = session.tokenizer.encode(prompt)
        too_large = [i for i in ids if i >= vocab]
        if too_large:
            raise RelaxwebError(f"the tokenizer gave the id {too_large[0]}, but the model's logits have {vocab} entries: "
                                "this tokenizer is not the model's")
    else:
        ids = list(prompt)
        if not all(isinstance(i, (int, np.integer)) and not isinstance(i, bool) and 0 <= i < vocab for i in ids):
            raise RelaxwebError(f"a prompt of token ids must hold integers from 0 to {vocab - 1}")
        ids = [int(i) for i in ids]
    if not ids:
        raise RelaxwebError("the prompt is empty: generate needs at least one token to start from")
    return ids


def apply_chat_template(session: Any, messages: Any, *, add_generation_prompt: bool = True) -> str:
    """``Session.apply_chat_template``: see its docstring."""
    template = getattr(session.tokenizer, "chat_template", None)
    if template is None:
        which = "no tokenizer" if session.tokenizer is None else f"a {session.tokenizer.kind} tokenizer without one"
        raise RelaxwebError(f"this bundle has no chat template ({which}): build it with --tokenizer FOLDER, a "
                            "tokenizer folder with chat_template.jinja or a chat_template in tokenizer_config.json")
    return template.render(messages, add_generation_prompt=add_generation_prompt)


def chat(session: Any, messages: Any, **options: Any) -> Generation:
    """``Session.chat``: the reply to ``messages``, generated (by the session's ``generate``)
    after their prompt: the chat template's text, encoded without adding special tokens (the
    template writes them), as transformers encodes it."""
    prompt = apply_chat_template(session, messages)
    return session.generate(session.tokenizer.encode(prompt, add_special_tokens=False), **options)


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
        grows = present_entry["shape"] or [None] * len(past_entry["shape"])
        length = cache_axis(manifest, past, present)
        shape = []
        for axis, dim in enumerate(past_entry["shape"]):
            out = grows[axis] if axis < len(grows) else None
            extent = 1 if dim == batch else 0 if axis == length else dim if isinstance(dim, int) else out
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


def generate(session: Any, prompt: str | Sequence[int], *, max_new_tokens: int = 64, temperature: float | None = None,
             top_k: int | None = None, top_p: float | None = None, repetition_penalty: float | None = None, seed: int = 0,
             stop_tokens: Iterable[int] | None = None, on_token: Callable[[int, str], Any] | None = None,
             wait_for_pages: bool = True) -> Generation:
    """``Session.generate``: see its docstring."""
    return generate_many(session, [prompt], max_new_tokens=max_new_tokens, temperature=temperature, top_k=top_k,
                         top_p=top_p, repetition_penalty=repetition_penalty, seeds=[seed], stop_tokens=stop_tokens,
                         on_tokens=[on_token], wait_for_pages=wait_for_pages)[0]


@dataclass(frozen=True)
class _Setup:
    """What every generation of one call shares: the decoder signature, the sampling, the
    vocabulary, the sequence limit and the stop tokens."""

    signature: DecoderSignature
    sampling: Sampling
    vocab: int
    limit: int | None
    stops: frozenset[int]


def _setup(session: Any, max_new_tokens: Any, seeds: Sequence[Any], stop_tokens: Iterable[int] | None,
           **given: Any) -> _Setup:
    signature = decoder_signature(session.manifest)
    tokenizer = session.tokenizer
    options = sampling_options(tokenizer.generation_defaults if tokenizer is not None else {}, **given)
    for seed in seeds:
        checked_options(max_new_tokens, seed=seed, **options)
    sampling = Sampling(float(options["temperature"]), options["top_k"], float(options["top_p"]),
                        float(options["repetition_penalty"]))
    logits_entry = next(entry for entry in session.manifest["outputs"] if entry["name"] == "logits")
    vocab = logits_entry["shape"][-1] if logits_entry["shape"] else None
    if not isinstance(vocab, int) or logits_entry["dtype"] not in ("float32", "float16"):  # (float16: float32 on the GPU)
        raise RelaxwebError("this bundle cannot generate: its logits must be float32 or float16 with a fixed vocabulary "
                            f"size as their last dimension, got {logits_entry['dtype']} {logits_entry['shape']}")
    layout = pool_layout(session.manifest)
    limit = layout.capacity if layout is not None else sequence_limit(session.manifest, signature)
    stops = frozenset(tokenizer.stop_tokens if stop_tokens is None and tokenizer is not None else stop_tokens or ())
    return _Setup(signature, sampling, vocab, limit, stops)


def generate_many(session: Any, prompts: Sequence[str | Sequence[int]], *, max_new_tokens: int = 64,
                  temperature: float | None = None, top_k: int | None = None, top_p: float | None = None,
                  repetition_penalty: float | None = None, seeds: Sequence[int] | None = None,
                  stop_tokens: Iterable[int] | None = None,
                  on_tokens: Sequence[Callable[[int, str], Any] | None] | None = None,
                  wait_for_pages: bool = True) -> list[Generation]:
    """``Session.generate_many``: one Generation per prompt.  On a bundle with a paged KV cache
    (``--kv-pages``) the prompts advance together (``paged_generate.py``); otherwise one
    after another, each as ``generate`` alone."""
    if isinstance(prompts, str) or not isinstance(prompts, Sequence) or not prompts:
        raise RelaxwebError("prompts must be a non-empty list of prompts (texts or lists of token ids)")
    seeds = list(seeds) if seeds is not None else list(range(len(prompts)))
    on_tokens = list(on_tokens) if on_tokens is not None else [None] * len(prompts)
    if len(seeds) != len(prompts) or len(on_tokens) != len(prompts):
        raise RelaxwebError(f"{len(prompts)} prompts need as many seeds and on_token callbacks, got {len(seeds)} and "
                            f"{len(on_tokens)}")
    setup = _setup(session, max_new_tokens, seeds, stop_tokens, temperature=temperature, top_k=top_k, top_p=top_p,
                   repetition_penalty=repetition_penalty)
    prompt_ids = [_prompt_ids(session, prompt, setup.vocab) for prompt in prompts]
    for ids in prompt_ids:
        if setup.limit is not None and len(ids) > setup.limit:
            raise RelaxwebError(f"the prompt has {len(ids)} tokens; this bundle's bounds allow sequences of at most "
                                f"{setup.limit}")
    if pool_layout(session.manifest) is None:
        with session.run_lock:  # the caches are the session's for the whole generation
            return [_generate_alone(session, setup, ids, max_new_tokens, seed, on_token)
                    for ids, seed, on_token in zip(prompt_ids, seeds, on_tokens)]
    scheduler = paged_scheduler(session, setup)
    requests = [new_request(ids, max_new_tokens=max_new_tokens, sampling=setup.sampling, uniform=mulberry32(seed),
                            stops=setup.stops, on_token=on_token, tokenizer=session.tokenizer)
                for ids, seed, on_token in zip(prompt_ids, seeds, on_tokens)]
    submitted = []
    try:
        for request in requests:
            submitted.append(scheduler.submit(request, wait_for_pages))
    except RelaxwebError:
        scheduler.cancel(submitted)
        raise
    scheduler.wait(requests)
    return [_generation_of(session, request) for request in requests]


class GenerationMethods:
    """The generation methods both sessions share (``webgpu.Session``, ``wasm_session.WasmSession``)."""

    def generate_many(self, prompts: Sequence[str | Sequence[int]], *, max_new_tokens: int = 64,
                      temperature: float | None = None, top_k: int | None = None, top_p: float | None = None,
                      repetition_penalty: float | None = None, seeds: Sequence[int] | None = None,
                      stop_tokens: Iterable[int] | None = None,
                      on_tokens: Sequence[Callable[[int, str], Any] | None] | None = None,
                      wait_for_pages: bool = True) -> list[Generation]:
        """One :class:`~relaxweb.runtime.generate.Generation` per prompt, with :meth:`generate`'s
        options; prompt ``i`` draws from seed ``seeds[i]`` (default ``i``) and streams to
        ``on_tokens[i]``.  On a bundle built with ``--kv-pages`` the prompts advance together,
        every run a step of all live sequences (``runtime/paged_generate.py``), and concurrent
        ``generate`` calls from other threads join the same steps; a sequence whose pages are
        taken waits for them (``wait_for_pages=False``: refused).  Otherwise they run one after
        another.  Greedy tokens are those of each prompt alone."""
        return generate_many(self, prompts, max_new_tokens=max_new_tokens, temperature=temperature, top_k=top_k,
                             top_p=top_p, repetition_penalty=repetition_penalty, seeds=seeds, stop_tokens=stop_tokens,
                             on_tokens=on_tokens, wait_for_pages=wait_for_pages)

    @property
    def generation_stats(self) -> Any:
        """The paged KV cache's scheduler now (``paged_generate.SchedulerStats``: live sequences,
        queued requests, pages in use, tokens per second), None on a bundle without one."""
        return generation_stats(self)


#: held while a session's scheduler is made: not the session's run_lock, which a step holds for
#: its whole run, so that a generate call that comes in while another drives the steps submits
#: its request at once (on the run lock it would wait behind every step of a thread that takes
#: the lock back as soon as it lets it go)
_SCHEDULER_MADE = threading.Lock()


def paged_scheduler(session: Any, setup: _Setup) -> PagedScheduler:
    """The session's scheduler (made on first use)."""
    with _SCHEDULER_MADE:
        scheduler = getattr(session, "_paged_scheduler", None)
        if scheduler is None:
            backend = session.backend
            sampler_class = SAMPLERS[backend]

            def make_sampler(request: Request) -> Any:
                return sampler_class(session, setup.vocab, request.sampling, request.prompt)

            def sample_batch(logits: Any, picks: list) -> list[int]:
                return sampler_class.sample_rows(session, logits, picks)

            scheduler = PagedScheduler(session, pool_layout(session.manifest), setup.signature, make_sampler,
                                       sample_batch)
            session._paged_scheduler = scheduler
        return scheduler


def generation_stats(session: Any) -> SchedulerStats | None:
    """``Session.generation_stats``: the scheduler's, None before its first use or without a paged KV cache."""
    scheduler = getattr(session, "_paged_scheduler", None)
    return scheduler.stats() if scheduler is not None else None


def _generation_of(session: Any, request: Request) -> Generation:
    """A finished request as the Generation its caller gets (its error raised)."""
    if request.error is not None:
        raise request.error
    tokenizer = session.tokenizer
    text = (request.text + request.stream.finish()) if tokenizer is None else tokenizer.decode(request.tokens)
    decoded = len(request.tokens) - 1
    elapsed = request.finished_at - request.first_token_at
    speed = decoded / elapsed if decoded > 0 and elapsed > 0 else 0.0
    prefill_ms = (request.first_token_at - request.submitted) * 1e3 if request.first_token_at else 0.0
    return Generation(request.tokens, text, request.stopped or "length", speed, prefill_ms)


def _generate_alone(session: Any, setup: _Setup, ids: list[int], max_new_tokens: int, seed: int,
                    on_token: Callable[[int, str], Any] | None) -> Generation:
    """One generation on a bundle whose caches are not paged: the loop of the module doc."""
    signature, sampling, vocab, limit, stops = setup.signature, setup.sampling, setup.vocab, setup.limit, setup.stops
    tokenizer = session.tokenizer
    stream = TextStream() if tokenizer is None else tokenizer.stream()
    feeds, uniform = _Feeds(session.manifest, signature), mulberry32(seed)
    keep = ["logits", *(present for _, present in signature.cache)]

    tokens: list[int] = []
    text = ""
    stopped = "length"
    held: list[GpuTensor] = []  # every kept tensor alive: disposed whatever happens
    sampler = SAMPLERS[session.backend](session, vocab, sampling, ids)
    started = time.perf_counter()
    decode_started = prefill_ms = 0.0
    try:
        outputs = session.run(feeds(ids, 0, None), keep_on_gpu=keep)
        held = list(outputs.values())
        while True:
            token = sampler.sample(outputs["logits"], uniform())
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
    text = (text + stream.finish()) if tokenizer is None else tokenizer.decode(tokens)
    decoded = len(tokens) - 1
    elapsed = time.perf_counter() - decode_started
    return Generation(tokens, text, stopped, decoded / elapsed if decoded > 0 and elapsed > 0 else 0.0, prefill_ms)
