"""Models onnxruntime's transformer optimizer wrote (com.microsoft contrib ops), and float16
conversions, built once each and run on WebGPU and on kernels.wasm (the Python runtime's two
backends) at several shapes against onnxruntime running the same model.

``scripts/export_optimized_models.py`` exports tiny BERT, DistilBERT, GPT-2, Llama and CLIP
text models (random weights) with torch.onnx and optimizes them, in a subprocess; the contrib
ops each model carries are checked first, so a change in what the optimizer writes shows up
as such.  GroupQueryAttention and RotaryEmbedding come from decoders that onnxruntime-genai's
model builder writes (``test_genai_decoder_matches_onnxruntime``): the script's exports of those
are committed under ``tests/data/genai-decoders/`` (each under 1 MB; exporting them here took CI
about 40 s of CPU time), so those tests check what the builder wrote at the versions its README
names (``--write-test-data`` exports them again).  Every contrib op is also checked on
hand-built models in ``tests/frontend/test_contrib_ops.py``.

float16 tolerance: relaxweb computes float16 tensors in float32 on the device (rounding only
weights and the model's own Casts), onnxruntime rounds every activation to float16, so the two
differ by the float16 rounding accumulated through the layers: on these models up to 2.6e-3
absolute at outputs of magnitude up to 5 (onnxruntime's own float16 and float32 runs of the
same model differ by up to 4.4e-3).  ``float16_tolerance`` allows 4 float16 ulps at the
largest output magnitude (1.6e-2 for outputs up to 8, 0.2% of an O(1) error's scale there),
plus the FLOAT16 tier's relative part.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

import relaxweb
from tests.helpers import FLOAT16, MODEL, Tolerance, assert_close, build_once, load_bundle

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "export_optimized_models.py"
GENAI_COMMITTED = ROOT / "tests" / "data" / "genai-decoders"

# model -> the contrib ops the optimizer must have written into it
CONTRIB_OPS = {
    "bert": {"com.microsoft.Attention", "com.microsoft.EmbedLayerNormalization", "com.microsoft.SkipLayerNormalization",
             "com.microsoft.BiasGelu"},
    "bert_mha_gelu": {"com.microsoft.MultiHeadAttention", "com.microsoft.Gelu", "com.microsoft.EmbedLayerNormalization"},
    "bert_fast_gelu": {"com.microsoft.Attention", "com.microsoft.FastGelu"},
    "bert_fused_matmul": {"com.microsoft.FusedMatMul", "com.microsoft.BiasGelu"},
    "geglu_unet": {"com.microsoft.SkipLayerNormalization", "com.microsoft.BiasSplitGelu", "com.microsoft.BiasAdd"},
    "distilbert": {"com.microsoft.Attention", "com.microsoft.EmbedLayerNormalization", "com.microsoft.BiasGelu"},
    "gpt2": {"com.microsoft.SkipLayerNormalization", "com.microsoft.FastGelu"},
    "llama": {"SimplifiedLayerNormalization", "com.microsoft.SkipSimplifiedLayerNormalization"},
    "clip_text": {"com.microsoft.QuickGelu", "com.microsoft.SkipLayerNormalization"},
}
# -> its float32 model (gpt2_fp16_io: float16 output too)
FLOAT16_MODELS = {"bert_fp16": "bert", "gpt2_fp16": "gpt2", "gpt2_fp16_io": "gpt2", "cnn_fp16": "cnn"}

TOKEN_SHAPES = [{"batch": 2, "seq": 7}, {"batch": 1, "seq": 1}, {"batch": 3, "seq": 12}]
IMAGE_SHAPES = [{"batch": 2, "height": 16, "width": 16}, {"batch": 1, "height": 24, "width": 8}]


@functools.lru_cache(maxsize=None)
def export_module():
    """scripts/export_optimized_models.py as a module (for its input maker)."""
    spec = importlib.util.spec_from_file_location("export_optimized_models", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("export_optimized_models", module)  # its dataclasses look themselves up there
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


@pytest.fixture(scope="module")
def exported(tmp_path_factory) -> Path:
    """The models the tests below read, exported by the script (not its others)."""
    if importlib.util.find_spec("torch") is None or importlib.util.find_spec("transformers") is None:
        pytest.skip("exporting needs torch and transformers")
    folder = tmp_path_factory.mktemp("optimized")
    names = sorted({*CONTRIB_OPS, *FLOAT16_MODELS, *FLOAT16_MODELS.values()})
    done = subprocess.run([sys.executable, str(SCRIPT), str(folder), *(f"--only={name}" for name in names)],
                          capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return folder


def sidecar(folder: Path, name: str) -> dict:
    return json.loads((folder / f"{name}.json").read_text())


def onnxruntime_session(path: Path):
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])


def exact_reference(path: Path, folder: Path) -> Path:
    """``path`` with every MatMulNBits' ``accuracy_level`` 0.  The model builder writes 4, which
    lets onnxruntime quantize the activations to int8 before the product (its results then move
    by ~0.1 on unit-scale logits); the level is the least accuracy a kernel must give, and
    relaxweb computes in float32, so the reference is the product onnxruntime computes in float."""
    model = onnx.load(str(path))
    for node in model.graph.node:
        if node.op_type == "MatMulNBits":
            for attribute in node.attribute:
                if attribute.name == "accuracy_level":
                    attribute.i = 0
    exact = folder / f"{path.stem}_accuracy_level_0.onnx"
    onnx.save(model, str(exact))
    return exact


def shapes_of(info: dict) -> list[dict]:
    return IMAGE_SHAPES if any("height" in i["dims"] for i in info["inputs"]) else TOKEN_SHAPES


def float16_tolerance(expected: np.ndarray) -> Tolerance:
    ulp = float(np.spacing(np.float16(np.abs(expected).max())))
    return Tolerance(rtol=FLOAT16.rtol, atol=max(FLOAT16.atol, 4 * ulp))


@pytest.mark.parametrize("name", sorted(CONTRIB_OPS))
def test_optimized_model_matches_onnxruntime(backend, exported: Path, name: str, tmp_path) -> None:
    info = sidecar(exported, name)
    missing = CONTRIB_OPS[name] - set(info["op_types"])
    assert not missing, f"the optimizer did not write {sorted(missing)} into {name}: it wrote {info['op_types']}"
    path = exported / f"{name}.onnx"
    session = load_bundle(build_once(path, tmp_path / "bundle"), backend)
    # onnxruntime computes the model itself, or (no CPU kernel for an op written) the export before optimizing
    expected_session = onnxruntime_session(exported / info["reference"])
    make_inputs = export_module().make_inputs
    for seed, dims in enumerate(shapes_of(info)):
        feeds = make_inputs(info["inputs"], dims, seed)
        expected = expected_session.run(None, feeds)
        actual = session.run(feeds)
        for output, want in zip(info["outputs"], expected):
            assert_close(actual[output], want, MODEL, err_msg=f"{name}: {output} at {dims}")


@pytest.mark.parametrize("name", sorted(FLOAT16_MODELS))
def test_float16_model_matches_onnxruntime(backend, exported: Path, name: str, tmp_path) -> None:
    """Against onnxruntime running the same float16 model, and the float32 model it came from."""
    info = sidecar(exported, name)
    path = exported / f"{name}.onnx"
    session = load_bundle(build_once(path, tmp_path / "bundle"), backend)
    float16_session = onnxruntime_session(path)
    float32_session = onnxruntime_session(exported / f"{FLOAT16_MODELS[name]}.onnx")
    make_inputs = export_module().make_inputs
    for seed, dims in enumerate(shapes_of(info)):
        feeds = make_inputs(info["inputs"], dims, seed)
        actual = session.run(feeds)
        for reference, expected in (("float16", float16_session.run(None, feeds)), ("float32", float32_session.run(None, feeds))):
            for output, want in zip(info["outputs"], expected):
                if reference == "float16":
                    assert actual[output].dtype == want.dtype
                assert_close(actual[output].astype(np.float32), want.astype(np.float32), float16_tolerance(want),
                             err_msg=f"{name}: {output} at {dims} against onnxruntime's {reference} model")


# Decoders written by onnxruntime-genai's model builder -------------------------------------------

# model -> the contrib ops the builder must have written into it, the attributes of every
# GroupQueryAttention node, and of at least one
GENAI_MODELS = {
    "llama_genai": ({"com.microsoft.GroupQueryAttention"}, {"do_rotary": 1}, {}),
    "llama_genai_rotary": ({"com.microsoft.GroupQueryAttention", "com.microsoft.RotaryEmbedding"}, {"do_rotary": 0}, {}),
    "gemma2_genai": ({"com.microsoft.GroupQueryAttention"}, {"do_rotary": 1, "softcap": 5.0}, {"local_window_size": 4}),
    # int4 weights as the builder quantizes them (MatMulNBits, ops/packed_weights.py)
    "llama_genai_int4": ({"com.microsoft.GroupQueryAttention", "com.microsoft.MatMulNBits"}, {"do_rotary": 1}, {}),
}
# model -> the error relaxweb stops with (what the builder writes that relaxweb does not do)
GENAI_REFUSED = {
    "gemma2_genai_windowed_cache": r"com\.microsoft\.GroupQueryAttention node '/model/layers\.0/attn/GroupQueryAttention': "
                                   r"sliding_window_cache=1 is not supported",
}
# (batch, prompt length, each entry's real prompt length: the rest is right padding)
PROMPTS = [(2, 5, [5, 3]), (1, 9, [9]), (3, 2, [2, 1, 2])]
DECODE_STEPS = 2


@pytest.fixture(scope="module")
def built_by_genai(tmp_path_factory) -> Path:
    """A copy of the committed decoders that the model builder wrote (models and sidecars)."""
    folder = tmp_path_factory.mktemp("genai")
    for name in [*GENAI_MODELS, *GENAI_REFUSED]:
        for suffix in (".onnx", ".json"):
            shutil.copyfile(GENAI_COMMITTED / f"{name}{suffix}", folder / f"{name}{suffix}")
    return folder


def genai_attributes(path: Path) -> list[dict]:
    import onnx

    return [{a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
            for node in onnx.load(str(path)).graph.node if node.op_type == "GroupQueryAttention"]


def real_rows(array: np.ndarray, lengths: list[int], filled: list[int]) -> list[np.ndarray]:
    """Each entry's rows that hold real tokens: logits ``[B, S, V]`` (axis 1) or a cache ``[B, N, T, H]`` (axis 2);
    what a padded token's row holds is the kernel's business (onnxruntime leaves cache rows past the end unset)."""
    if array.ndim == 3:
        return [array[b, :length] for b, length in enumerate(lengths)]
    return [array[b, :, :before + length] for b, (before, length) in enumerate(zip(filled, lengths))]


@pytest.mark.parametrize("name", sorted(GENAI_MODELS))
def test_genai_decoder_matches_onnxruntime(backend, built_by_genai: Path, name: str, tmp_path) -> None:
    """A prompt (ragged: right-padded entries), then decode steps fed with the previous step's
    present cache, from one build, at several batch sizes and prompt lengths."""
    info = sidecar(built_by_genai, name)
    contrib, every, some = GENAI_MODELS[name]
    missing = contrib - set(info["op_types"])
    assert not missing, f"the builder did not write {sorted(missing)} into {name}: it wrote {info['op_types']}"
    written = genai_attributes(built_by_genai / f"{name}.onnx")
    assert all(every.items() <= node.items() for node in written), f"{name}: GroupQueryAttention attributes {written}"
    assert any(some.items() <= node.items() for node in written), f"{name}: GroupQueryAttention attributes {written}"
    path = built_by_genai / f"{name}.onnx"
    session = load_bundle(build_once(path, tmp_path / "bundle"), backend)
    expected_session = onnxruntime_session(exact_reference(path, tmp_path))
    decoder_feeds = export_module().decoder_feeds
    float16 = info["decoder"]["float_type"] == "float16"
    rng = np.random.default_rng(0)
    for batch, seq, lengths in PROMPTS:
        tokens, past, filled = rng.integers(0, info["decoder"]["vocab"], size=(batch, seq)), None, [0] * batch
        for step in range(DECODE_STEPS + 1):
            feeds = decoder_feeds(info, tokens, lengths, past, filled)
            expected = dict(zip(info["outputs"], expected_session.run(None, feeds)))
            actual = session.run(feeds)
            for output, want in expected.items():
                tolerance = float16_tolerance(want) if float16 else MODEL
                assert actual[output].dtype == want.dtype and actual[output].shape == want.shape, output
                for row, (got, wanted) in enumerate(zip(real_rows(actual[output], lengths, filled),
                                                         real_rows(want, lengths, filled))):
                    assert_close(got.astype(np.float32), wanted.astype(np.float32), tolerance,
                                 err_msg=f"{name}: {output} of entry {row} at batch {batch}, prompt {seq}, step {step}")
            # the next step: one new token per entry, right after its real ones (the same past for both)
            past, filled = expected, [before + length for before, length in zip(filled, lengths)]
            tokens, lengths = rng.integers(0, info["decoder"]["vocab"], size=(batch, 1)), [1] * batch


@pytest.mark.parametrize("name", sorted(GENAI_REFUSED))
def test_genai_decoder_relaxweb_cannot_do_is_refused_by_name(built_by_genai: Path, name: str) -> None:
    with pytest.raises(relaxweb.RelaxwebError, match="^" + GENAI_REFUSED[name] + "$"):
        relaxweb.inspect(built_by_genai / f"{name}.onnx").module  # noqa: B018 - importing is what raises
