"""The next token of ``generate`` picked on the CPU: ``runtime_js/sampler.wgsl``'s algorithm in numpy.

The wasm backend has no GPU to run ``sampler.wgsl`` on, so it picks each token here, from the
last row of the kept ``logits``, with the same steps in the same float32 arithmetic: the
repetition penalty (a logit of a seen token divided by it, multiplied where negative), greedy
(the first largest logit; NaN never picked, a row of NaNs gives 0), the top ``top_k`` in order
(larger first, the smaller index among equals), top-p inside the top-k by the sequential sum of
thread 0, top-p over the row by the shader's bisection of the 2^32 float keys, and the pick by
the inverse cumulative probability at the token's uniform.  Sums are taken in the shader's
order (a thread's strided or contiguous chunk in sequence, then its tree or sequential
reduction), so the only difference left is ``exp``: WGSL's is not the correctly rounded one
numpy uses, so a draw whose uniform (or top-p cut) falls within a few ulps of a boundary may
pick the neighbouring token.  Greedy picks never differ.  ``runtime_js/cpu_sampler.js`` is
the twin in JS.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

#: sampler.wgsl's THREADS (its workgroup) and MAX_TOP_K (the top-k it keeps)
THREADS = 256
MAX_TOP_K = 256
_NONE = 0xFFFFFFFF
_F32 = np.float32


@dataclass(frozen=True)
class Sampling:
    """How the sampler picks each token (sampler.wgsl), checked by ``generate.sampling_options``."""

    temperature: float
    top_k: int
    top_p: float
    repetition_penalty: float


def seen_bits(vocab: int, sampling: Sampling, prompt: Sequence[int]) -> np.ndarray:
    """The seen-token bits of a new generation (one bit per id): the prompt's when there is a
    repetition penalty, as in transformers; none otherwise."""
    seen = np.zeros(-(-vocab // 32), np.uint32)
    if sampling.repetition_penalty != 1 and len(prompt):
        ids = np.array(prompt, np.int64)
        np.bitwise_or.at(seen, ids // 32, (np.uint32(1) << (ids % 32).astype(np.uint32)))
    return seen


def order_keys(values: np.ndarray) -> np.ndarray:
    """A uint32 per float32 that orders as the floats do (sampler.wgsl's ``order_key``)."""
    bits = values.view(np.uint32)
    return np.where(bits & 0x80000000, ~bits, bits | 0x80000000).astype(np.uint32)


def _strided_sum(weights: np.ndarray) -> _F32:
    """sampler.wgsl's ``weight_from`` reduction: thread t adds elements t, t + THREADS, ... in
    order, then the threads' sums are added in a tree."""
    padded = np.zeros(-(-len(weights) // THREADS) * THREADS, _F32)
    padded[:len(weights)] = weights
    sums = np.add.reduce(padded.reshape(-1, THREADS), axis=0, dtype=_F32)  # row after row, as the threads add
    stride = THREADS // 2
    while stride:
        sums[:stride] += sums[stride:2 * stride]
        stride //= 2
    return sums[0]


def _top_p_cutoff(weights: np.ndarray, keys: np.ndarray, top_p: _F32) -> int:
    """The smallest key whose tokens keep top_p of the probability (sampler.wgsl's bisection)."""
    total = _strided_sum(weights)
    low, high = 0, _NONE
    for _ in range(32):
        if low >= high:
            break
        middle = low + (high - low) // 2
        if _strided_sum(np.where(keys >= middle + 1, weights, _F32(0))) < top_p * total:
            high = middle
        else:
            low = middle + 1
    return low


def _pick_in_top_k(top: np.ndarray, weights: np.ndarray, top_p: _F32, uniform: _F32) -> int:
    """Thread 0's pick among the top-k (in order) cut to top_p: keep j while those before it
    weigh less than top_p of their total, then the inverse cumulative probability."""
    total = np.cumsum(weights, dtype=_F32)[-1]
    kept, kept_weight = 0, _F32(0)
    while kept < len(top) and (kept == 0 or kept_weight < top_p * total):
        kept_weight = _F32(kept_weight + weights[kept])
        kept += 1
    threshold = uniform * kept_weight
    crossed = np.flatnonzero(np.cumsum(weights[:kept], dtype=_F32) > threshold)
    return int(top[crossed[0]] if len(crossed) else top[kept - 1])


def _pick_in_row(weights: np.ndarray, first: int, uniform: _F32) -> int:
    """The pick over the whole row (``weights`` 0 where a token is cut): each thread sums a
    contiguous chunk in order, thread 0 finds the chunk where the running sum crosses
    uniform * total, then the token inside it; ``first`` (the largest) if none crosses."""
    vocab = len(weights)
    chunk = -(-vocab // THREADS)
    padded = np.zeros(chunk * THREADS, _F32)
    padded[:vocab] = weights
    chunks = padded.reshape(THREADS, chunk)
    chunk_sums = np.cumsum(chunks, axis=1, dtype=_F32)[:, -1]
    running = np.cumsum(chunk_sums, dtype=_F32)  # the running sum after each chunk
    threshold = uniform * running[-1]
    crossed = np.flatnonzero(running > threshold)
    if not len(crossed):
        return first
    t = int(crossed[0])
    before = running[t - 1] if t else _F32(0)
    inside = np.cumsum(np.concatenate([[before], chunks[t]]).astype(_F32), dtype=_F32)[1:]
    hit = np.flatnonzero(inside > threshold)
    index = t * chunk + int(hit[0]) if len(hit) else first
    return index if index < vocab else first


def sample_row(row: np.ndarray, seen: np.ndarray, sampling: Sampling, uniform: float) -> int:
    """The token sampler.wgsl picks from ``row`` (float32 logits) at ``uniform``, with the
    penalty on the ids marked in ``seen`` (which then marks the token picked)."""
    values = np.array(row, _F32)
    vocab = len(values)
    if sampling.repetition_penalty != 1:
        penalty = _F32(sampling.repetition_penalty)
        ids = np.arange(vocab)
        marked = (seen[ids // 32] >> (ids % 32).astype(np.uint32)) & 1 == 1
        values = np.where(marked, np.where(values < 0, values * penalty, values / penalty), values).astype(_F32)
    token = _pick(values, sampling, _F32(uniform))
    seen[token // 32] |= np.uint32(1) << np.uint32(token % 32)
    return token


def _pick(values: np.ndarray, sampling: Sampling, uniform: _F32) -> int:
    valid = values == values  # NaN is never picked
    candidates = np.flatnonzero(valid)
    if not len(candidates):
        return 0
    greedy = sampling.temperature == 0
    rounds = 1 if greedy or sampling.top_k == 0 else min(sampling.top_k, MAX_TOP_K)
    if rounds == 1:
        top = candidates[[int(np.argmax(values[candidates]))]]  # argmax: the first of equals
    else:  # larger first, the smaller index among equals (-0.0 equals 0.0, as in the shader)
        top = candidates[np.lexsort((candidates, -values[candidates]))[:rounds]]
    if greedy:
        return int(top[0])
    largest, temperature = values[top[0]], _F32(sampling.temperature)
    top_p = _F32(sampling.top_p)
    with np.errstate(over="ignore", under="ignore", invalid="ignore"):
        if sampling.top_k > 0:
            return _pick_in_top_k(top, np.exp((values[top] - largest) / temperature).astype(_F32), top_p, uniform)
        weights = np.where(valid, np.exp((values - largest) / temperature), _F32(0)).astype(_F32)
    if sampling.top_p < 1:
        keys = order_keys(values)
        weights = np.where(keys >= _top_p_cutoff(weights, keys, top_p), weights, _F32(0)).astype(_F32)
    return _pick_in_row(weights, int(top[0]), uniform)


class CpuSampler:
    """The token sampler of one ``generate`` on the wasm backend: its sampling options and the
    ids seen (the prompt's with a penalty, then each token picked), as sampler.wgsl keeps them
    on the GPU; ``sample`` reads the last row of the kept ``logits`` (a ``WasmTensor``)."""

    def __init__(self, session: Any, vocab: int, sampling: Sampling, prompt: Sequence[int]) -> None:
        self.vocab = vocab
        self.sampling = sampling
        self.seen = seen_bits(vocab, sampling, prompt)

    def sample(self, logits: Any, uniform: float) -> int:
        """The next token from the last row of ``logits`` (``[1, seq, vocab]``, float32 as held)."""
        return sample_row(logits.device_data()[-self.vocab:], self.seen, self.sampling, uniform)

    @staticmethod
    def sample_rows(session: Any, logits: Any, picks: Sequence[tuple["CpuSampler", int, float]]) -> list[int]:
        """Each sampler's next token from its row of ``logits`` (``picks``: sampler, row, uniform)."""
        data = logits.device_data()
        return [sample_row(data[row * sampler.vocab:(row + 1) * sampler.vocab], sampler.seen, sampler.sampling, uniform)
                for sampler, row, uniform in picks]

    def close(self) -> None:
        """Nothing to release: the seen ids go with the sampler."""
