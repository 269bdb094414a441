"""``runtime_js/sampler.wgsl`` (both runtimes' next-token sampler on WebGPU) on wgpu against a numpy
reference of what it documents, and its CPU twins (``runtime/sampler.py``, ``runtime_js/cpu_sampler.js``:
the wasm backend's) against it on the same logits: the repetition penalty, greedy, the temperature, top-k and top-p
in transformers' order, the token picked by the inverse of the cumulative probability at a
given uniform, each picked token counted as seen.  Logits come from a bundle whose output is its
input (``logits = x``), kept on the GPU as ``generate`` keeps a decoder's.

A draw whose uniform (or whose top-p cut) falls within float32 noise of a boundary of the
reference's cumulative sums is not compared: the GPU sums in another order.  Each test's top-p
is moved to the middle of the gap between the two masses it falls between, so that the cut
itself is clear.
"""

from __future__ import annotations

import base64
import dataclasses
import json
import subprocess
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from onnx import TensorProto, helper

import relaxweb
from relaxweb.runtime.generate import GpuSampler, Sampling
from relaxweb.runtime.sampler import CpuSampler
from tests.helpers import make_model

ROOT = Path(__file__).resolve().parents[2]
VOCAB = 1000  # not a multiple of the sampler's 256 threads
DRAWS = 48
NOISE = 2e-5  # relative: closer to a boundary than this, float32 sums may fall either side


@pytest.fixture(scope="module")
def session(tmp_path_factory, device):
    model = make_model([helper.make_node("Identity", ["x"], ["logits"])], [("x", TensorProto.FLOAT, [1, "n", VOCAB])],
                       ["logits"])
    return relaxweb.load(relaxweb.build(model, tmp_path_factory.mktemp("sampler") / "bundle").path, device=device)


def penalized(row: np.ndarray, seen: set[int], penalty: float) -> np.ndarray:
    values = row.copy()
    for token in seen:
        values[token] = values[token] * np.float32(penalty) if values[token] < 0 else values[token] / np.float32(penalty)
    return values


def near(value: float, boundaries: np.ndarray, scale: float) -> bool:
    return bool(np.any(np.abs(boundaries - value) <= NOISE * scale))


def masses(row: np.ndarray, seen: set[int], sampling: Sampling) -> tuple[np.ndarray, float]:
    """Each candidate's mass before it (in the top-k: those before it; over the row: those
    more likely), and the total, of the reference."""
    values = penalized(row, seen, sampling.repetition_penalty).astype(np.float64)
    weights = np.exp((values - values.max()) / sampling.temperature)
    if sampling.top_k > 0:
        candidates = sorted(range(len(values)), key=lambda i: (-values[i], i))[:sampling.top_k]
        return np.concatenate([[0.0], np.cumsum(weights[candidates])[:-1]]), weights[candidates].sum()
    return np.array([weights[values > value].sum() for value in values]), weights.sum()


def centered(sampling: Sampling, row: np.ndarray, seen: set[int]) -> Sampling:
    """``sampling`` with its top-p (below 1) moved to the middle of the gap of masses it is in."""
    if sampling.top_p >= 1 or sampling.temperature == 0:
        return sampling
    before, total = masses(row, seen, sampling)
    fractions = np.unique(before / total)
    upper = np.searchsorted(fractions, sampling.top_p)
    return dataclasses.replace(sampling, top_p=float((fractions[upper - 1] + fractions[upper]) / 2))


def reference_token(row: np.ndarray, seen: set[int], sampling: Sampling, uniform: float) -> int | None:
    """The token sampler.wgsl documents, or None where float32 noise may decide."""
    values = penalized(row, seen, sampling.repetition_penalty) if sampling.repetition_penalty != 1 else row
    order = sorted(range(len(values)), key=lambda i: (-values[i], i))
    if sampling.temperature == 0:
        return order[0]
    values = values.astype(np.float64)
    weights = np.exp((values - values[order[0]]) / sampling.temperature)
    if sampling.top_k > 0:
        candidates = order[:sampling.top_k]
        total = weights[candidates].sum()
        before = np.concatenate([[0.0], np.cumsum(weights[candidates])[:-1]])
        if near(sampling.top_p * total, before, total):
            return None
        candidates = [token for token, mass in zip(candidates, before) if mass < sampling.top_p * total or mass == 0]
    else:
        total = weights.sum()
        above = np.array([weights[values > value].sum() for value in values])  # the mass strictly more likely
        if sampling.top_p < 1 and near(sampling.top_p * total, above, total):
            return None
        candidates = [token for token in range(len(values)) if sampling.top_p >= 1 or above[token] < sampling.top_p * total]
    cumulative = np.cumsum(weights[candidates])
    threshold = uniform * cumulative[-1]
    if near(threshold, cumulative, cumulative[-1]):
        return None
    return candidates[int(np.searchsorted(cumulative, threshold, side="right"))]


def draw(session, row: np.ndarray, sampling: Sampling, prompt: list[int], uniforms: list[float]) -> list[int]:
    """sampler.wgsl's tokens for one row, one uniform each, in one generate's sampler (its
    seen tokens growing with each pick)."""
    logits = session.run({"x": row[None, None]}, keep_on_gpu=["logits"])["logits"]
    sampler = GpuSampler(session, VOCAB, sampling, prompt)
    try:
        return [sampler.sample(logits, uniform) for uniform in uniforms]
    finally:
        sampler.close()
        logits.dispose()


SAMPLINGS = [
    Sampling(temperature=1.0, top_k=0, top_p=1.0, repetition_penalty=1.0),
    Sampling(temperature=1.0, top_k=0, top_p=0.9, repetition_penalty=1.0),
    Sampling(temperature=0.7, top_k=0, top_p=0.5, repetition_penalty=1.3),
    Sampling(temperature=1.0, top_k=40, top_p=0.8, repetition_penalty=1.0),
    Sampling(temperature=1.3, top_k=200, top_p=0.95, repetition_penalty=0.8),
    Sampling(temperature=0.0, top_k=0, top_p=1.0, repetition_penalty=1.5),
]


@pytest.mark.parametrize("sampling", SAMPLINGS, ids=lambda s: f"T{s.temperature}-k{s.top_k}-p{s.top_p}-r{s.repetition_penalty}")
def test_the_sampler_picks_the_documented_token(session, sampling: Sampling) -> None:
    rng = np.random.default_rng(3)
    row = (rng.standard_normal(VOCAB) * 2).astype(np.float32)
    prompt = [int(token) for token in rng.choice(VOCAB, 40, replace=False)] + [int(np.argmax(row))]
    uniforms = [(index + 0.5) / DRAWS for index in range(DRAWS)]
    seen = set(prompt) if sampling.repetition_penalty != 1 else set()
    sampling = centered(sampling, row, seen)
    tokens = draw(session, row, sampling, prompt, uniforms)
    compared = 0
    for uniform, token in zip(uniforms, tokens):
        expected = reference_token(row, seen, sampling, uniform)
        if expected is not None:
            assert token == expected, (uniform, token, expected)
            compared += 1
        if sampling.repetition_penalty != 1:
            seen.add(token)  # what was picked counts as seen for the next pick, as in generate
    assert compared >= DRAWS * 3 // 4
    assert draw(session, row, sampling, prompt, uniforms) == tokens  # the same uniforms, the same tokens


def test_the_penalty_steers_greedy_picks_away_from_what_was_seen(session) -> None:
    row = np.zeros(VOCAB, np.float32)
    row[[7, 9, 11]] = [5.0, 4.0, 3.0]
    row[500] = -1.0
    greedy = Sampling(temperature=0.0, top_k=0, top_p=1.0, repetition_penalty=2.0)
    # 7 is picked, then halved (2.5 < 4): 9, then 11 (4/2 = 2 < 3, 5/2 = 2.5 < 3), then 7 (2.5 > 2 and 1.5)
    assert draw(session, row, greedy, [], [0.0] * 4) == [7, 9, 11, 7]
    # in the prompt from the start, 7 and 9 are halved: 11 wins
    assert draw(session, row, greedy, [7, 9], [0.0]) == [11]
    # without a penalty nothing changes: the largest every time
    assert draw(session, row, Sampling(0.0, 0, 1.0, 1.0), [7, 9], [0.0] * 3) == [7, 7, 7]
    # a negative logit is multiplied: -1 becomes -2, below -1.5
    negative = np.full(VOCAB, -10.0, np.float32)
    negative[[7, 9]] = [-1.0, -1.5]
    assert draw(session, negative, greedy, [7], [0.0]) == [9]


def test_top_p_keeps_the_most_likely_tokens_that_make_up_p(session) -> None:
    row = np.full(VOCAB, -30.0, np.float32)
    row[[3, 4, 5]] = np.log([0.5, 0.3, 0.2]).astype(np.float32)  # 3 tokens carry all but ~1e-10 of it
    for top_p, allowed in ((0.4, {3}), (0.7, {3, 4}), (0.9, {3, 4, 5})):
        for top_k in (0, 10):
            tokens = draw(session, row, Sampling(1.0, top_k, top_p, 1.0), [], [(i + 0.5) / 32 for i in range(32)])
            assert set(tokens) == allowed, (top_p, top_k, sorted(set(tokens)))


# The CPU twins (runtime/sampler.py, runtime_js/cpu_sampler.js: the wasm backend's sampler) ------------


def cpu_draw(row: np.ndarray, sampling: Sampling, prompt: list[int], uniforms: list[float]) -> list[int]:
    """sampler.py's tokens for one row, one uniform each, its seen ids growing as sampler.wgsl's do."""
    sampler = CpuSampler(None, VOCAB, sampling, prompt)
    logits = SimpleNamespace(device_data=lambda: row)
    return [sampler.sample(logits, uniform) for uniform in uniforms]


def js_draws(cases: list[tuple[np.ndarray, Sampling, list[int], list[float]]]) -> list[list[int]]:
    """cpu_sampler.js's tokens for each case, in node."""
    script = """
import { CpuSampler } from "./relaxweb/runtime_js/cpu_sampler.js";
let input = "";
for await (const chunk of process.stdin) input += chunk;
const results = [];
for (const { row, sampling, prompt, uniforms } of JSON.parse(input)) {
  const bytes = Buffer.from(row, "base64");
  const data = new Float32Array(bytes.buffer, bytes.byteOffset, bytes.length / 4);
  const sampler = new CpuSampler(data.length, sampling, prompt);
  const tokens = [];
  for (const uniform of uniforms) tokens.push(await sampler.sample({ deviceData: () => data }, uniform));
  results.push(tokens);
}
console.log(JSON.stringify(results));
"""
    payload = [{"row": base64.b64encode(row.astype("<f4").tobytes()).decode(), "prompt": prompt, "uniforms": uniforms,
                "sampling": {"temperature": s.temperature, "topK": s.top_k, "topP": s.top_p,
                             "repetitionPenalty": s.repetition_penalty}} for row, s, prompt, uniforms in cases]
    done = subprocess.run(["node", "--input-type=module", "-e", script], input=json.dumps(payload), capture_output=True,
                          text=True, cwd=ROOT, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout)


def sampler_cases() -> list[tuple[np.ndarray, Sampling, list[int], list[float]]]:
    """Every sampling of SAMPLINGS on a random row (with NaN, -inf and ties), and the top-p row."""
    rng = np.random.default_rng(5)
    row = (rng.standard_normal(VOCAB) * 2).astype(np.float32)
    row[[10, 20]] = row.max()  # ties at the top
    row[30], row[40] = np.nan, -np.inf
    prompt = [int(token) for token in rng.choice(VOCAB, 40, replace=False)] + [int(np.nanargmax(row))]
    uniforms = [(index + 0.5) / DRAWS for index in range(DRAWS)]
    cases = [(row, sampling, prompt, uniforms) for sampling in SAMPLINGS]
    peaked = np.full(VOCAB, -30.0, np.float32)
    peaked[[3, 4, 5]] = np.log([0.5, 0.3, 0.2]).astype(np.float32)
    cases += [(peaked, Sampling(1.0, top_k, top_p, 1.0), [], uniforms) for top_p in (0.4, 0.7, 0.9) for top_k in (0, 10)]
    return cases


def test_the_cpu_samplers_pick_the_gpus_tokens(session) -> None:
    """The same rows, options, prompts and uniforms: sampler.py and cpu_sampler.js pick what
    sampler.wgsl picks (its sums in the shader's order; only exp may differ by ulps, and no draw
    of these falls that close to a boundary)."""
    cases = sampler_cases()
    gpu = [draw(session, row, sampling, prompt, uniforms) for row, sampling, prompt, uniforms in cases]
    python = [cpu_draw(row, sampling, prompt, uniforms) for row, sampling, prompt, uniforms in cases]
    js = js_draws(cases)
    for (_, sampling, _, _), on_gpu, in_python, in_js in zip(cases, gpu, python, js):
        assert in_python == on_gpu, sampling
        assert in_js == on_gpu, sampling
    assert len({tuple(tokens) for tokens in gpu}) > 5  # the options pick differently


def test_the_cpu_sampler_never_picks_nan_and_a_row_of_nans_gives_0() -> None:
    nans = np.full(VOCAB, np.nan, np.float32)
    assert cpu_draw(nans, Sampling(0.0, 0, 1.0, 1.0), [], [0.5]) == [0]
    assert cpu_draw(nans, Sampling(1.0, 5, 1.0, 1.0), [], [0.5]) == [0]
    nans[7] = -50.0
    assert cpu_draw(nans, Sampling(1.0, 0, 0.5, 1.0), [], [0.1, 0.9]) == [7, 7]
