"""Attention as transformers' users export it fuses: DistilBERT and BERT through torch.export
(dynamo), GPT-2 with an attention mask and Whisper's decoder (causal self-attention and
cross-attention) through the TorchScript exporter, all with transformers' default attention
(torch's ``scaled_dot_product_attention``: q and k each scaled, ``where(isnan(weights), 0,
weights)``, finfo.min or -inf masks, the dynamo exporter's flattened key transpose).

The models are scripts/export_attention_models.py's exports (tiny configs, random weights),
committed in tests/data/attention-models/ (exporting them here took CI about 15 s of CPU time;
its README says how to export them again, with which package versions), each built once with
bounds (so the manifest says every storage's size).  For each model:

* every attention site of the manifest is fused, one ``attention`` call site per site, no
  softmax kernel is left, and no storage holds the ``[batch, heads, seq, seq]`` scores;
* the bundle matches onnxruntime on WebGPU and on kernels.wasm (the ``backend`` fixture), at
  a padded batch (GPT-2: a left-padded row whose first query sees no key, 0 as the unfused
  where makes it) and at seq 1.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

import relaxweb
from tests.helpers import MODEL, assert_close, build_once, load_bundle, onnxruntime_outputs

pytestmark = pytest.mark.slow  # four models built, each run on both backends

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "export_attention_models.py"
COMMITTED = ROOT / "tests" / "data" / "attention-models"
#: model -> its attention sites (a layer's self-attention; Whisper's cross-attention too)
SITES = {"distilbert_dynamo": 2, "bert_dynamo": 2, "gpt2_masked_legacy": 2, "whisper_decoder_legacy": 4}
BOUNDS = {"batch": 2, "seq": 128, "frames": 128}
HEADS = 2
SHAPES = [{"batch": 2, "seq": 6, "frames": 9}, {"batch": 1, "seq": 1, "frames": 3}]


def _script():
    spec = importlib.util.spec_from_file_location("export_attention_models", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


@pytest.fixture(scope="session")
def exports() -> dict[str, Path]:
    """Each model's committed export."""
    return {name: COMMITTED / f"{name}.onnx" for name in SITES}


def _bundle(exports: dict[str, Path], name: str, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_once(exports[name], tmp_path_factory.mktemp(name), bounds=_bounds(name))


def _bounds(name: str) -> dict[str, int]:
    return {var: bound for var, bound in BOUNDS.items() if var != "frames" or name.startswith("whisper")}


@pytest.mark.parametrize("name", list(SITES))
def test_every_attention_site_is_one_kernel_and_the_scores_are_never_stored(exports, tmp_path_factory, name) -> None:
    manifest = relaxweb.inspect(_bundle(exports, name, tmp_path_factory)).manifest
    sites = manifest["attention"]
    assert len(sites) == SITES[name] and all(site["status"] == "fused" for site in sites), sites
    assert all("node" in site[role] for site in sites for role in ("scores", "softmax", "output"))
    kernels = [kernel["name"] for kernel in manifest["kernels"]]
    assert not any("softmax" in kernel for kernel in kernels), kernels
    attention_sites = [site for site in manifest["call_sites"] if "attention" in manifest["kernels"][site["kernel"]]["name"]]
    assert len(attention_sites) == SITES[name]
    scores_bytes = BOUNDS["batch"] * HEADS * BOUNDS["seq"] * BOUNDS["seq"] * 4
    largest = max(storage["size_at_bounds"] for storage in manifest["storages"])
    assert largest < scores_bytes, (largest, scores_bytes)


@pytest.mark.parametrize("name", list(SITES))
def test_fused_exports_match_onnxruntime(backend, exports, tmp_path_factory, name) -> None:
    script = _script()
    session = load_bundle(_bundle(exports, name, tmp_path_factory), backend)
    output = script.MODELS[name][3]
    for seed, dims in enumerate(SHAPES):
        feeds = script.example_inputs(name, dims, seed=seed)
        wanted = onnxruntime_outputs(exports[name], feeds)[0]
        assert_close(session.run(feeds)[output], wanted, MODEL, err_msg=f"{name} on {backend} at {dims}")


def test_inspect_lists_the_sites_of_the_model_and_of_its_bundle(exports, tmp_path_factory) -> None:
    """``relaxweb inspect MODEL`` and ``relaxweb inspect DIR`` name each site's nodes: the
    same listing, from the model and from the bundle's manifest."""
    name = "whisper_decoder_legacy"
    report = relaxweb.inspect(exports[name])
    bundle = relaxweb.inspect(_bundle(exports, name, tmp_path_factory))
    assert list(report.attention) == bundle.manifest["attention"]
    lines = str(bundle).splitlines()
    start = lines.index("attention sites: 4, 4 fused")
    assert lines[start + 1:start + 3] == [
        "  0: fused",
        "     scores node '/model/layers.0/self_attn/MatMul', softmax node '/model/layers.0/self_attn/Softmax', "
        "output node '/model/layers.0/self_attn/MatMul_1'"]
    assert "softmax node '/model/layers.1/encoder_attn/Softmax'" in str(report)
