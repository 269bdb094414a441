"""Batches of instances of different sizes in headless Chromium (``model.runBatch`` of the
browser runtime, ``relaxweb/runtime_js/batch.js``; ``relaxweb.browser.run_batch_in_browser``).

Each instance of a batch has its own values of the model's symbolic sizes; the batch runs one
ragged dispatch per call site for all of them (``lastBatch.mode == "ragged"``), and each
instance's outputs must match onnxruntime on that instance alone:

- the BERT-like model of scripts/export_test_models.py (``bert_legacy``: input_ids and
  attention_mask ``[batch, seq]``), instances of different ``seq`` (and ``batch``);
- the If model of tests/ops/test_control_flow.py (``two_output_if_model``: the branch depends on
  the sign of the sum of ``x``, read back from the GPU), instances of different row counts
  whose branches differ, so the rounds and the merge of branch dispatches are exercised.

A model whose output size is read back (NonZero) checks that storages grown between rounds
keep each instance's slice.  An instance above a bound is refused before any GPU work, the message naming the instance.
Skipped like tests/runtime_js/test_browser.py (Playwright, Chromium) and, for BERT, like
tests/runtime_js/test_browser_models.py (torch, transformers).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from onnx import helper

import relaxweb
from relaxweb.browser import open_runner_page, run_batch_in_browser
from relaxweb.compiler import build_bundle
from relaxweb.errors import InputShapeError
from tests.helpers import MODEL, assert_close, make_model, onnxruntime_outputs, rand
from tests.model_exports import Export, committed_exports, export_script
from tests.runtime_js.test_browser import pytestmark as browser_marks
from tests.ops.test_control_flow import two_output_if_model

pytestmark = browser_marks

#: BERT's build bounds and the instances' sizes (each its own batch and seq).
BERT_BOUNDS = {"batch": 2, "seq": 16}
BERT_SIZES = [{"batch": 1, "seq": 5}, {"batch": 2, "seq": 11}, {"batch": 1, "seq": 16}]
#: The If model's instances: (rows, sign of x); the branches alternate.
IF_INSTANCES = [(2, 1.0), (5, -1.0), (3, 1.0), (7, -1.0), (4, -1.0)]


@pytest.fixture(scope="module")
def bert(tmp_path_factory: pytest.TempPathFactory) -> tuple[Export, Path]:
    export = committed_exports(["bert_legacy"])["bert_legacy"]
    folder = tmp_path_factory.mktemp("batch-bert") / "bundle"
    build_bundle(export.path, folder, BERT_BOUNDS)
    return export, folder


@pytest.fixture(scope="module")
def if_bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("batch-if") / "bundle"
    relaxweb.build(two_output_if_model(), folder)
    return folder


def bert_instances(export: Export, sizes: list[dict[str, int]]) -> list[dict[str, np.ndarray]]:
    return [export_script().make_inputs(export.sidecar["inputs"], dims, seed=7 * k + sum(dims.values()))
            for k, dims in enumerate(sizes)]


def test_bert_instances_of_different_seq_match_onnxruntime_each(bert, device) -> None:
    export, bundle = bert
    instances = bert_instances(export, BERT_SIZES)
    batch = run_batch_in_browser(bundle, instances, timeout_s=300)
    assert batch.report["mode"] == "ragged", batch.report
    assert batch.report["instances"] == len(instances)
    # the same work counted as the Python runtime counts it: each instance at its own sizes
    python = relaxweb.Session(bundle, device)
    python.run_batch(instances)
    assert batch.report["elements"] == python.last_batch.elements > 0
    assert batch.report["dispatches"] == python.last_batch.dispatches
    assert batch.ms > 0
    assert len(batch.outputs) == len(instances)
    for dims, inputs, actual in zip(BERT_SIZES, instances, batch.outputs):
        expected = onnxruntime_outputs(export.path, inputs)
        assert len(actual) == len(expected)
        for (name, got), want in zip(actual.items(), expected):
            assert got.shape == want.shape, f"{name} at {dims}: shape {got.shape}, onnxruntime {want.shape}"
            assert_close(got, want, MODEL, err_msg=f"instance at {dims}: {name}")


def test_bert_instance_above_a_bound_is_refused_naming_it(bert) -> None:
    export, bundle = bert
    instances = bert_instances(export, [{"batch": 1, "seq": 4}, {"batch": 1, "seq": 8}, {"batch": 1, "seq": 17}])
    with pytest.raises(InputShapeError, match=r"^instance 2 of the batch: .*seq.*17.*16"):
        run_batch_in_browser(bundle, instances, timeout_s=300)


def test_if_instances_taking_different_branches_match_onnxruntime_each(if_bundle: Path) -> None:
    model = two_output_if_model()
    instances = [{"x": sign * np.abs(rand(rows, 3, seed=rows))} for rows, sign in IF_INSTANCES]
    batch = run_batch_in_browser(if_bundle, instances)
    assert batch.report["mode"] == "ragged", batch.report
    # the condition is read back: more than one round, and fewer dispatches than one by one
    assert batch.report["rounds"] > 1
    for (rows, sign), inputs, actual in zip(IF_INSTANCES, instances, batch.outputs):
        expected = onnxruntime_outputs(model, inputs)
        assert_close(actual["y"], expected[0], err_msg=f"y at {rows} rows, sign {sign}")
        assert_close(actual["second"], expected[1], err_msg=f"second at {rows} rows, sign {sign}")


def test_if_batch_on_the_wasm_backend_runs_one_by_one(if_bundle: Path) -> None:
    model = two_output_if_model()
    instances = [{"x": sign * np.abs(rand(rows, 3, seed=rows))} for rows, sign in IF_INSTANCES[:3]]
    batch = run_batch_in_browser(if_bundle, instances, load_options={"backend": "wasm"})
    assert batch.report["mode"] == "one by one"
    assert "wasm" in batch.report["reason"]
    for inputs, actual in zip(instances, batch.outputs):
        expected = onnxruntime_outputs(model, inputs)
        assert_close(actual["y"], expected[0])
        assert_close(actual["second"], expected[1])


def test_an_instance_with_a_wrong_input_is_refused_naming_it(if_bundle: Path) -> None:
    instances = [{"x": rand(2, 3, seed=1)}, {"x": rand(2, 4, seed=2)}]
    with pytest.raises(InputShapeError, match=r"^instance 1 of the batch: .*'x'"):
        run_batch_in_browser(if_bundle, instances)


def nonzero_model():
    """y = relu(float(NonZero(x > 0))): the count k is read back; storages sized by it grow."""
    nodes = [helper.make_node("Greater", ["x", "zero"], ["m"]), helper.make_node("NonZero", ["m"], ["i"]),
             helper.make_node("Cast", ["i"], ["c"], to=1), helper.make_node("Relu", ["c"], ["y"])]
    return make_model(nodes, [("x", ["n", 3])], ["y"], {"zero": np.array(0, np.float32)}, opset=17)


def test_storages_grown_between_rounds_keep_each_instances_slice(tmp_path: Path) -> None:
    model = nonzero_model()
    relaxweb.build(model, tmp_path / "bundle")
    # 30 rows: about 45 nonzero indices, past one 256-byte slice of the storages sized by k
    instances = [{"x": rand(rows, 3, seed=rows)} for rows in (2, 30, 4, 9)]
    batch = run_batch_in_browser(tmp_path / "bundle", instances)
    assert batch.report["mode"] == "ragged", batch.report
    assert batch.report["rounds"] == 2
    for inputs, actual in zip(instances, batch.outputs):
        (expected,) = onnxruntime_outputs(model, inputs)
        assert actual["y"].shape == expected.shape
        assert_close(actual["y"], expected)


#: In the page: a batch, a batch one of whose instances the host module refuses, batches and runs
#: at once, a refusal between two batches at once, then the first batch again; each result's
#: values (or error) in order.
BATCHES_AFTER_A_REFUSAL = """
async ({ instances }) => {
  const model = await window.relaxweb.load("/bundle/");
  const tensors = instances.map(({ data, shape }) => ({ x: { data: Float32Array.from(data), shape } }));
  const values = (outputs) => outputs.map(({ y, second }) => [Array.from(y.data), Array.from(second.data)]);
  const results = [values(await model.runBatch(tensors))];
  const wrong = { x: { data: new Float32Array(8), shape: [2, 4] } }; // refused by the host module (x is [n, 3])
  try {
    await model.runBatch([tensors[0], wrong]);
    results.push("not refused");
  } catch (error) {
    results.push(`${error.name}: ${error.message}`);
  }
  const together = await Promise.all([model.runBatch(tensors), model.run(tensors[1]), model.runBatch(tensors.slice(2))]);
  results.push(values(together[0]), values([together[1]]), values(together[2]));
  // a refusal while the batch before maps its outputs
  const settled = await Promise.allSettled([model.runBatch(tensors), model.runBatch([tensors[0], wrong]), model.runBatch(tensors)]);
  results.push(settled.map(({ status, value, reason }) => (status === "fulfilled" ? values(value) : `${reason.name}: ${reason.message}`)));
  results.push(values(await model.runBatch(tensors)));
  const live = model.stats.liveGpuBytes;
  model.dispose();
  return { results, live };
}
"""


def test_batches_after_a_refused_instance_and_at_once_give_each_its_outputs(if_bundle: Path) -> None:
    """A refused instance leaves the batch before it alone (its readbacks are idle buffers the
    next runs reuse), and batches and runs at once take turns, each with its own outputs."""
    instances = [sign * np.abs(rand(rows, 3, seed=rows)) for rows, sign in IF_INSTANCES]
    with open_runner_page(if_bundle) as page:
        out = page.evaluate(BATCHES_AFTER_A_REFUSAL, {"instances": [{"data": x.ravel().tolist(), "shape": list(x.shape)}
                                                                     for x in instances]})
    first, refused, together, alone, tail, (before, refused_at_once, after), again = out["results"]
    assert refused.startswith("InputShapeError: instance 1 of the batch: input 'x'"), refused
    assert refused_at_once == refused
    assert together == first and again == first and before == first and after == first
    assert alone == first[1:2] and tail == first[2:]
    model = two_output_if_model()
    for x, (y, second) in zip(instances, first):
        expected = onnxruntime_outputs(model, {"x": x})
        assert_close(np.array(y, np.float32).reshape(expected[0].shape), expected[0])
        assert_close(np.array(second, np.float32).reshape(expected[1].shape), expected[1])


@pytest.mark.parametrize("backend", ["webgpu", "wasm"])
def test_an_index_error_in_a_batch_names_the_instance(tmp_path: Path, backend: str) -> None:
    """As in Python (tests/e2e/test_index_checks.py): a ragged batch's run status does not say
    whose index failed, so the instances run again one at a time to name it."""
    from onnx import TensorProto

    from relaxweb.errors import RelaxwebError

    table = np.random.default_rng(0).standard_normal((1000, 8)).astype(np.float32)
    model = make_model([helper.make_node("Gather", ["table", "ids"], ["embedded"], name="embed_tokens")],
                       [("ids", TensorProto.INT64, ["b", "s"])], ["embedded"], {"table": table})
    bundle = relaxweb.build(model, tmp_path / "bundle").path
    instances = [{"ids": np.array([[1, 2, 3]], np.int64)}, {"ids": np.array([[4, 5000]], np.int64)},
                 {"ids": np.array([[7]], np.int64)}]
    with pytest.raises(RelaxwebError, match=r": RunCheckError: instance 1 of the batch: node 'embed_tokens' \(Gather\): "
                                            r"index 5000 is out of range for axis 0 of extent 1000$"):
        run_batch_in_browser(bundle, instances, load_options={"backend": backend})
