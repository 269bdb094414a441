"""The decoder corpus (``scripts/export_decoders.py``): tiny decoder LLMs as people export them
with a KV cache, each built once with bounds.  Each has one KV cache per layer's keys and values
in its manifest, and greedy ``generate`` from token ids gives the tokens onnxruntime (CPU)
gives on the same ONNX: on WebGPU and on the wasm backend in Python (from the third decode step
on, no buffer or memory region created and only the new token's ids, mask and positions
written: no cache bytes move; on wasm only the logits' row is copied out), and in Chromium on
both backends, the wasm one on worker threads (every decoder of the corpus).

Every decoder of the corpus is the script's export committed under ``tests/data/decoders/``
(each under 1 MB; its README says how to export them again, with which package versions):
optimum lives in the model zoo's environment, which CI has not, and exporting the model
builder's and torch dynamo's here took CI about 50 s of CPU time.  So what these tests check is
what those exporters wrote at the versions named there; after upgrading onnxruntime-genai,
torch or transformers, export the corpus again (``--write-test-data``) and run these tests.

optimum's exports write attention as transformers' eager code does (the scale split over q and
k, the mask a ``where``, NaN rows zeroed after the softmax), which ``fuse_attention`` fuses, so
they have their caches too; their attention mask's length, written
``past_sequence_length + sequence_length``, is that sum (``frontend/dim_expression.py``), so
their bounds bound it and every storage is laid out once, at load.
"""

from __future__ import annotations

import functools
import json
import shutil
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

import relaxweb
from relaxweb import browser
from tests.helpers import in_the_browser

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
COMMITTED = ROOT / "tests" / "data" / "decoders"
DECODERS = ("builder_fp32", "builder_fp16", "builder_int4", "builder_int4_unshared", "dynamo_llama",
            "optimum_gpt2", "optimum_llama", "optimum_qwen2")
BOUNDS = {"batch_size": 1, "sequence_length": 32, "past_sequence_length": 64, "total_sequence_length": 96}
PROMPT = [5, 17, 33, 2, 99, 45, 7]
STEPS = 12


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    """A copy of the committed corpus (each decoder's model and sidecar)."""
    folder = tmp_path_factory.mktemp("decoders")
    for name in DECODERS:
        for suffix in (".onnx", ".json"):
            shutil.copyfile(COMMITTED / f"{name}{suffix}", folder / f"{name}{suffix}")
    return folder


def model_path(corpus: Path, name: str) -> Path:
    return corpus / f"{name}.onnx"


def sidecar(corpus: Path, name: str) -> dict:
    return json.loads((corpus / f"{name}.json").read_text())


@pytest.fixture(scope="module")
def bundle_of(corpus: Path, tmp_path_factory):
    """Each decoder built once, with the bounds of the symbolic sizes it has."""
    @functools.cache
    def build(name: str) -> relaxweb.Bundle:
        path = model_path(corpus, name)
        names = {d.dim_param for value in onnx.load(str(path), load_external_data=False).graph.input
                 for d in value.type.tensor_type.shape.dim}
        bounds = {var: bound for var, bound in BOUNDS.items() if var in names}
        return relaxweb.build(path, tmp_path_factory.mktemp(name) / "bundle", bounds=bounds)

    return build


@pytest.fixture(scope="module")
def onnxruntime_tokens(corpus: Path):
    """onnxruntime's greedy tokens for PROMPT, each step's presents fed back as the past."""
    @functools.cache
    def greedy(name: str) -> tuple[int, ...]:
        session = ort.InferenceSession(str(model_path(corpus, name)), providers=["CPUExecutionProvider"])
        info, names = sidecar(corpus, name)["decoder"], [o.name for o in session.get_outputs()]
        outputs, tokens = None, []
        for step in range(STEPS):
            feeds = decoder_feeds(session, info, PROMPT if step == 0 else tokens[-1:], len(PROMPT) + step - 1, outputs)
            outputs = dict(zip(names, session.run(None, feeds)))
            tokens.append(int(outputs["logits"][0, -1].argmax()))
        return tuple(tokens)

    return greedy


def decoder_feeds(session, info: dict, tokens: list[int], start: int, past: dict | None) -> dict[str, np.ndarray]:
    """One step of batch 1: ``tokens`` at positions ``start ..``, after ``past`` (the previous
    step's outputs; an empty past of the model's head size on the prompt)."""
    inputs = {value.name for value in session.get_inputs()}
    start = 0 if past is None else start
    total = start + len(tokens)
    feeds = {"input_ids": np.array([tokens], np.int64)}
    if "attention_mask" in inputs:
        feeds["attention_mask"] = np.ones((1, total), np.int64)
    if "position_ids" in inputs:
        feeds["position_ids"] = np.arange(start, total, dtype=np.int64)[None]
    for name in inputs - set(feeds):
        empty = np.zeros((1, info["kv_heads"], 0, info["head_size"]), info["float_type"])
        feeds[name] = empty if past is None else past[name.replace("past_key_values", "present")]
    return feeds


def decode_step_bytes(manifest: dict, past: int, backend: str = "webgpu") -> int:
    """What a decode step after ``past`` tokens writes from the host: its token, the mask over
    ``past + 1`` positions and its position, each element as the backend holds its dtype (an
    int64 is 4 bytes on the GPU, 8 in kernels.wasm's memory)."""
    field = "wasm_bytes" if backend == "wasm" else "device_bytes"
    size = {entry["name"]: manifest["dtypes"][entry["dtype"]][field] for entry in manifest["inputs"]}
    return size["input_ids"] + (past + 1) * size.get("attention_mask", 0) + size.get("position_ids", 0)


def test_the_corpus_has_what_each_exporter_writes(corpus: Path) -> None:
    """The model builder's GroupQueryAttention in every variant (the tied int4 one reading its
    embedding through a GatherBlockQuantized), a symbolic head size; the others plain ONNX."""
    ops = {name: set(sidecar(corpus, name)["op_types"]) for name in DECODERS}
    for name, found in ops.items():
        if name.startswith("builder"):
            assert "com.microsoft.GroupQueryAttention" in found, (name, found)
            assert onnx.load(str(corpus / f"{name}.onnx")).graph.input[2].type.tensor_type.shape.dim[3].dim_param
        else:
            assert not any("." in op for op in found), (name, found)
    assert {"com.microsoft.GatherBlockQuantized", "com.microsoft.MatMulNBits"} <= ops["builder_int4"]
    assert "com.microsoft.GatherBlockQuantized" not in ops["builder_int4_unshared"]


@pytest.mark.parametrize("name", DECODERS)
def test_each_layer_has_a_key_and_a_value_cache(bundle_of, corpus: Path, name: str) -> None:
    bundle = bundle_of(name)
    layers = sidecar(corpus, name)["decoder"]["layers"]
    inputs, outputs = [i["name"] for i in bundle.manifest["inputs"]], [o["name"] for o in bundle.manifest["outputs"]]
    pairs = sorted((inputs[c["input"]], outputs[c["output"]], c["axis"], c["capacity"]) for c in bundle.manifest["caches"])
    assert pairs == sorted((f"past_key_values.{layer}.{part}", f"present.{layer}.{part}", 2, 96)
                           for layer in range(layers) for part in ("key", "value"))


@pytest.mark.parametrize("name", DECODERS)
def test_greedy_generate_on_webgpu_gives_onnxruntimes_tokens(bundle_of, onnxruntime_tokens, device, name: str) -> None:
    """From token ids and an empty past generate makes from the model (the builder's head size
    is symbolic, ``kv_cache_dim``: the present's 16, which the model's check accepts)."""
    session = bundle_of(name).load(device=device)
    generation = session.generate(PROMPT, max_new_tokens=STEPS, stop_tokens=[])
    assert tuple(generation.tokens) == onnxruntime_tokens(name)


@pytest.mark.parametrize("name", DECODERS)
def test_decode_steps_create_no_buffer_and_move_no_cache_bytes(bundle_of, device, name: str) -> None:
    """Each decode step's run, from the third on: no buffer created, only the new token's inputs
    written (the presents stay on the GPU as views of the caches and come back as the past)."""
    bundle = bundle_of(name)
    session = bundle.load(device=device)
    counts = []
    session.generate(PROMPT, max_new_tokens=STEPS, stop_tokens=[],
                     on_token=lambda token, text: counts.append(session.stats.last_run))
    for step, count in enumerate(counts[3:], start=3):  # count `step` is of the run after `len(PROMPT) + step - 1` tokens
        assert count.buffers_created == 0, (step, count)
        assert count.input_bytes_written == decode_step_bytes(bundle.manifest, len(PROMPT) + step - 1), (step, count)


@pytest.mark.parametrize("name", DECODERS)
def test_greedy_generate_on_wasm_gives_onnxruntimes_tokens(bundle_of, onnxruntime_tokens, name: str) -> None:
    """The same bundle on the wasm backend: the same loop, each token picked on the CPU."""
    session = relaxweb.load(bundle_of(name).path, backend="wasm")
    generation = session.generate(PROMPT, max_new_tokens=STEPS, stop_tokens=[])
    assert tuple(generation.tokens) == onnxruntime_tokens(name)


def vocab_bytes(manifest: dict) -> int:
    """The bytes of one row of logits as the device holds them (float32)."""
    return 4 * next(entry for entry in manifest["outputs"] if entry["name"] == "logits")["shape"][-1]


@pytest.mark.parametrize("name", DECODERS)
def test_decode_steps_on_wasm_lay_out_no_memory_and_move_no_cache_bytes(bundle_of, name: str) -> None:
    """Each decode step's run on the wasm backend, from the third on: no region laid out and
    the memory's size unchanged, only the new token's inputs written and only the logits' row
    copied out (the presents stay in the memory as views of the caches and come back as the
    past)."""
    bundle = bundle_of(name)
    session = relaxweb.load(bundle.path, backend="wasm")
    counts = []
    session.generate(PROMPT, max_new_tokens=STEPS, stop_tokens=[],
                     on_token=lambda token, text: counts.append((session.stats.last_run, session.memory_bytes)))
    for step, (count, memory_bytes) in enumerate(counts[3:], start=3):
        assert count.buffers_created == 0 and memory_bytes == counts[2][1], (step, count)
        assert count.input_bytes_written == decode_step_bytes(bundle.manifest, len(PROMPT) + step - 1, "wasm"), \
            (step, count)
        assert count.bytes_read == vocab_bytes(bundle.manifest), (step, count)


#: Runs in the runner page (cross-origin isolated: the wasm backend runs on worker threads):
#: greedy generate from token ids, each decode run's counts.
GENERATE_IN_PAGE = """
async ({ prompt, steps, backend }) => {
  const model = await window.relaxweb.load("/bundle/", { backend });
  const counts = [];
  const generation = await model.generate(prompt, { maxNewTokens: steps, stopTokens: [],
                                                     onToken: () => counts.push({ ...model.stats.lastRun }) });
  const threads = model.threads ?? 0;
  const unitsRunByWorkers = model.unitsRunByWorkers ?? 0;
  model.dispose();
  return { tokens: generation.tokens, counts, threads, unitsRunByWorkers };
}
"""


@in_the_browser
@pytest.mark.parametrize("backend", ["webgpu", "wasm"])
@pytest.mark.parametrize("name", DECODERS)
def test_greedy_generate_in_chromium_gives_onnxruntimes_tokens(bundle_of, onnxruntime_tokens, name: str,
                                                               backend: str) -> None:
    try:
        browser.find_chromium()
    except relaxweb.RelaxwebError as error:
        pytest.skip(str(error))
    bundle = bundle_of(name)
    with browser.open_runner_page(bundle.path, timeout_s=120) as page:
        result = page.evaluate(GENERATE_IN_PAGE, {"prompt": PROMPT, "steps": STEPS, "backend": backend})
    assert tuple(result["tokens"]) == onnxruntime_tokens(name)
    if backend == "wasm":
        assert result["threads"] > 1 and result["unitsRunByWorkers"] > 0, result
    if bundle.manifest["caches"]:
        for step, count in enumerate(result["counts"][3:], start=3):
            assert count["buffersCreated"] == 0, (step, count)
            assert count["inputBytesWritten"] == decode_step_bytes(bundle.manifest, len(PROMPT) + step - 1, backend), \
                (step, count)
            if backend == "wasm":
                assert count["bytesRead"] == vocab_bytes(bundle.manifest), (step, count)


def test_a_cache_view_on_wasm_is_the_present_until_the_next_run(bundle_of, corpus: Path) -> None:
    """A kept present on the wasm backend is a view of its cache: its values are the present's,
    given back as the past it gives the logits the arrays give, and after that run it is refused."""
    session = relaxweb.load(bundle_of("builder_int4").path, backend="wasm")
    reference = ort.InferenceSession(str(model_path(corpus, "builder_int4")), providers=["CPUExecutionProvider"])
    info = sidecar(corpus, "builder_int4")["decoder"]
    arrays = session.run(decoder_feeds(reference, info, PROMPT, 0, None))
    kept = session.run(decoder_feeds(reference, info, PROMPT, 0, None), keep_on_gpu=True)
    views = {name: tensor for name, tensor in kept.items() if name.startswith("present.")}
    assert all(view.cache_view is not None for view in views.values())
    for name, view in views.items():
        np.testing.assert_array_equal(view.numpy(), arrays[name])
    token = [int(arrays["logits"][0, -1].argmax())]
    from_views = session.run(decoder_feeds(reference, info, token, len(PROMPT), views))
    assert session.stats.last_run.input_bytes_written == decode_step_bytes(bundle_of("builder_int4").manifest, len(PROMPT),
                                                                           "wasm")
    from_arrays = session.run(decoder_feeds(reference, info, token, len(PROMPT), arrays))
    np.testing.assert_array_equal(from_views["logits"], from_arrays["logits"])
    with pytest.raises(relaxweb.RelaxwebError, match="is a view of a KV cache that a later run has written"):
        views["present.0.key"].numpy()
