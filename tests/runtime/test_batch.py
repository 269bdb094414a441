"""Batches of instances of different sizes (``Session.run_batch``): the ragged form
of the kernels (``relaxweb/wgsl/ragged.py``), the merge of instances' dispatches and the packed
layout (``relaxweb/runtime/batch.py``), and whole batches on wgpu against onnxruntime run on
each instance alone: the BERT-like and GPT-2-like test models at lengths 1..128, and an ONNX
``If`` whose branch differs between instances.  Refusals name the instance and the size."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnxruntime
import pytest
from onnx import TensorProto, helper

import relaxweb
from relaxweb.errors import InputShapeError, RelaxwebError
from relaxweb.ir.symbolic import SizeVar
from relaxweb.library import (
    kv_cache_write_kernel, sequence_write_kernel, unique_count_kernel, unique_values_kernel, write_row_kernel,
)
from relaxweb.passes.context import PassContext
from relaxweb.runtime.batch import (
    MAX_BATCH_INSTANCES, MAX_INSTANCES, RAGGED, SLICE_ALIGNMENT, SliceLayout, batch_table, call_elements, grid_of, merge_dispatches,
    table_bytes,
)
from relaxweb.runtime.host import Dispatch
from relaxweb.runtime.webgpu import Session
from relaxweb.wgsl import ragged
from relaxweb.wgsl.library import library_kernel_wgsl
from relaxweb.wgsl.ragged import ragged_problem, ragged_source
from tests.helpers import F32_LOOSE, MODEL, assert_close, make_model, onnxruntime_outputs, rand
from tests.model_exports import committed_exports
from tests.e2e.test_api import npz, run_cli
from tests.ops.test_control_flow import two_output_if_model
from tests.ops.test_loop import LOOP_RUNS, loop_feeds, loop_model
from tests.wgsl.test_split_weights import SPLIT, small_inputs, small_model

ELEMENTWISE = """\
struct Params {
  element_count: i32,
  n: i32,
  _pad0: i32,
  _pad1: i32,
}

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read_write> out: array<f32>;

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) workgroup: vec3<u32>,
        @builtin(num_workgroups) workgroups: vec3<u32>,
        @builtin(local_invocation_index) local_index: u32) {
  let group = i32(workgroup.y * workgroups.x + workgroup.x);
  let index = group * 64 + i32(local_index);
  if (index >= params.element_count) {
    return;
  }
  out[index] = x[x[index % params.n]] * 2.0;
}
"""


def test_the_ragged_form_reads_every_buffer_at_its_instance_base() -> None:
    source = ragged_source(ELEMENTWISE, "kernels/double.wgsl")
    assert source is not None
    assert "@group(0) @binding(0) var<uniform> ragged_batch: RaggedBatch;" in source
    assert f"instances: array<RaggedInstance, {ragged.MAX_INSTANCES}>" in source
    # nested accesses are based too, and the output
    assert ("out[ragged_base_out + (index)] = x[ragged_base_x + (x[ragged_base_x + (index % params.n)])] * 2.0;"
            in source)
    assert "let group = ragged_flat - ragged_batch.instances[ragged_instance].first_group.x;" in source
    # main reads the instance's params as a uniform let (barriers allowed under it)
    assert "  let params = ragged_batch.instances[ragged_instance].params;" in source


def test_kernels_outside_the_shader_contract_have_no_ragged_form() -> None:
    assert ragged_problem(ELEMENTWISE) is None
    with_length = ELEMENTWISE.replace("params.n]", "i32(arrayLength(&x))]")
    assert ragged_problem(with_length) == "it reads a buffer's length"
    assert ragged_source(with_length) is None
    renumbered = ELEMENTWISE.replace("  let group = i32(workgroup.y * workgroups.x + workgroup.x);\n", "  let group = 0;\n")
    assert "number its workgroup" in ragged_problem(renumbered)
    grid_stride = ELEMENTWISE.replace("  out[index] =", "  let stride = i32(workgroups.x) * 64;\n  out[index] =")
    assert "grid's size" in ragged_problem(grid_stride)


def test_the_runtime_and_the_kernels_agree_on_the_table() -> None:
    assert MAX_INSTANCES == ragged.MAX_INSTANCES
    call_site = {"params_offset": 256, "params_size": 16, "buffers": [{"weight": 0}, {"storage": 1}, {"storage": 2}]}
    params = bytes(256) + np.array([10, 3, 0, 0], "<i4").tobytes()
    table = batch_table(call_site, [(params, [0, 512, 1024], 0), (params, [0, 768, 2048], 7)])
    assert len(table) == table_bytes(16, 3) == 16 + MAX_INSTANCES * (16 + 16 + 16)
    words = np.frombuffer(table, "<i4")
    assert words[0] == 2
    assert list(words[4:16]) == [10, 3, 0, 0, 0, 512, 1024, 0, 0, 0, 0, 0]
    assert list(words[16:28]) == [10, 3, 0, 0, 0, 768, 2048, 0, 7, 0, 0, 0]


def test_slices_are_packed_and_grow_in_place_of_the_instance() -> None:
    layout = SliceLayout.of([[100, 0], [300, 256]])
    assert layout.offsets == [[0, 256], [0, 256]]
    assert layout.totals == [256 + 512, 2 * SLICE_ALIGNMENT]
    grown, changed = layout.grown([[100, 0], [900, 256]])
    assert changed == [0] and grown.offsets[0] == [0, 256] and grown.capacities[0] == [256, 1024]
    assert grid_of(70000, "x") == (35000, 2, 1) and grid_of(0, "x") == (1, 1, 1)


def test_instances_on_different_branches_share_the_dispatches_before_and_after() -> None:
    """Instances 0 and 2 took the then branch (call sites 5, 6), 1 the else branch (7); all
    run 1 before and 9 after: 1 and 9 are one dispatch each."""
    lists = {0: [1, 5, 6, 9], 1: [1, 7, 9], 2: [1, 5, 6, 9]}
    merged = merge_dispatches({k: [Dispatch(c, (1, 1, 1)) for c in v] for k, v in lists.items()})
    assert [(site, [k for k, _ in members]) for site, members in merged] == [
        (1, [0, 1, 2]), (5, [0, 2]), (6, [0, 2]), (7, [1]), (9, [0, 1, 2])]


# Whole batches on wgpu --------------------------------------------------------------------


def token_instances(name: str, lengths: list[int], seed: int = 0) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    instances = []
    for length in lengths:
        inputs = {"input_ids": rng.integers(0, 100, size=(1, length)).astype(np.int64)}
        if name.startswith("bert"):
            inputs["attention_mask"] = (rng.random((1, length)) < 0.9).astype(np.int64)
        instances.append(inputs)
    return instances


@pytest.fixture(scope="module")
def token_bundles(tmp_path_factory) -> dict[str, Path]:
    exports = committed_exports(["bert_legacy", "gpt2_legacy"])
    bundles = {}
    for name, export in exports.items():
        bundles[name] = tmp_path_factory.mktemp(name) / "bundle"
        relaxweb.build(export.path, bundles[name], bounds={"seq": 128, "batch": 4})
        bundles[name + ".onnx"] = export.path
    return bundles


@pytest.mark.slow
@pytest.mark.parametrize("name", ["bert_legacy", "gpt2_legacy"])
def test_a_batch_matches_onnxruntime_on_each_instance(device, token_bundles, name: str) -> None:
    session = Session(token_bundles[name], device)
    reference = onnxruntime.InferenceSession(str(token_bundles[name + ".onnx"]), providers=["CPUExecutionProvider"])
    lengths = [1, 128, 9, 64, 65, 33, 2, 100, 17]
    instances = token_instances(name, lengths)
    single_dispatches = None
    for _ in range(2):  # the second batch reuses the first's buffers and pipelines
        outputs = session.run_batch(instances)
        assert session.last_batch.mode == RAGGED and session.last_batch.instances == len(lengths)
        for index, (inputs, result) in enumerate(zip(instances, outputs)):
            (expected,) = reference.run(None, inputs)
            (actual,) = result.values()
            assert_close(actual, expected, MODEL, err_msg=f"{name}, instance {index} (seq {lengths[index]})")
        session.run(instances[0])
        single_dispatches = session.last_dispatch_count
        # one dispatch per call site for the whole batch: what one instance alone makes
        assert session.last_batch.dispatches == single_dispatches
    # every output element computed is one an instance alone computes: nothing padded
    assert session.last_batch.elements == sum(single_run_elements(session, inputs) for inputs in instances)


def single_run_elements(session: Session, inputs: dict[str, np.ndarray]) -> int:
    """Output elements the dispatches of one run of ``inputs`` compute (a run without reads)."""
    session.host.run_with_shapes([array.shape for array in inputs.values()])
    params = session.host.params()
    return sum(call_elements(session.manifest, command.call_site, params) for command in session.host.commands())


@pytest.fixture(scope="module")
def if_bundle(tmp_path_factory) -> Path:
    bundle = tmp_path_factory.mktemp("if") / "bundle"
    relaxweb.build(two_output_if_model(), bundle)
    return bundle


def test_instances_whose_if_branch_differs_match_onnxruntime(device, if_bundle) -> None:
    session = Session(if_bundle, device)
    reference = onnxruntime.InferenceSession(two_output_if_model().SerializeToString(),
                                             providers=["CPUExecutionProvider"])
    cases = [(2, 1.0), (5, -1.0), (3, 1.0), (7, -1.0), (1, -1.0), (4, 1.0)]
    instances = [{"x": sign * np.abs(rand(rows, 3, seed=rows))} for rows, sign in cases]
    outputs = session.run_batch(instances)
    assert session.last_batch.mode == RAGGED
    for (rows, sign), inputs, result in zip(cases, instances, outputs):
        expected = reference.run(None, inputs)
        assert_close(result["y"], expected[0], err_msg=f"y at {rows} rows, sign {sign}")
        assert_close(result["second"], expected[1], err_msg=f"second at {rows} rows, sign {sign}")
    # the then branch's two kernels and the else branch's run once each, for their groups;
    # the reduction before the If and the subtraction after it once for all six
    session.run(instances[0])
    then_dispatches = session.last_dispatch_count
    session.run(instances[1])
    else_dispatches = session.last_dispatch_count
    assert session.last_batch.dispatches < then_dispatches + else_dispatches


def test_an_instance_above_a_bound_is_refused_by_name(device, token_bundles) -> None:
    session = Session(token_bundles["gpt2_legacy"], device)
    instances = token_instances("gpt2_legacy", [5, 7, 129])
    with pytest.raises(InputShapeError, match=r"instance 2 of the batch: .*129.*128"):
        session.run_batch(instances)
    assert session.stats.last_run.input_bytes_written == 0  # refused before any GPU work


def test_a_batch_above_the_device_buffer_limit_is_refused_by_instance(device, tmp_path) -> None:
    """Five instances of 32 MiB: the packed storage needs 160 MiB, above the device's 128 MiB
    maxStorageBufferBindingSize; the fifth takes it past."""
    model = make_model([helper.make_node("Relu", ["x"], ["y"])], [("x", ["n", 1024])], ["y"])
    relaxweb.build(model, tmp_path / "bundle")
    session = Session(tmp_path / "bundle", device)
    largest, limit_name = session.storage_size_limit()
    rows = 8192
    count = largest // (rows * 1024 * 4) + 1
    instances = [{"x": np.zeros((rows, 1024), np.float32)} for _ in range(count)]
    with pytest.raises(RelaxwebError, match=rf"too large for this device: .* instance {count - 1} \(n = {rows}; "
                                            rf"33554432 bytes\).*{limit_name} = {largest}"):
        session.run_batch(instances)
    assert session.stats.last_run.input_bytes_written == 0
    small = [{"x": rand(rows, 1024)[: k + 1]} for k in range(3)]
    for inputs, result in zip(small, session.run_batch(small)):
        assert_close(result["y"], np.maximum(inputs["x"], 0))


def test_a_bundle_that_cannot_batch_runs_one_by_one(tmp_path) -> None:
    model = make_model([helper.make_node("Relu", ["x"], ["y"])], [("x", ["n", 4])], ["y"])
    relaxweb.build(model, tmp_path / "bundle")
    session = relaxweb.load(tmp_path / "bundle", backend="wasm")
    instances = [{"x": rand(k + 1, 4)} for k in range(3)]
    for inputs, result in zip(instances, session.run_batch(instances)):
        assert_close(result["y"], np.maximum(inputs["x"], 0))
    assert session.last_batch.mode == "one by one" and "wasm" in session.last_batch.reason


def test_a_batch_reads_weights_bound_in_parts(tmp_path) -> None:
    """Weights above one binding are read through load functions asking their first part's
    length; the ragged forms keep them (weights are shared, bound whole)."""
    out = tmp_path / "split"
    with PassContext(binding_split_bytes=SPLIT):
        relaxweb.build(small_model(), out, bounds={"n": 64})
    manifest = relaxweb.inspect(out).manifest
    assert all("batch_file" in kernel for kernel in manifest["kernels"])
    session = relaxweb.load(out, backend="webgpu", limits={"maxStorageBufferBindingSize": SPLIT})
    base = small_inputs()
    instances = [{"ids": base["ids"][:k], "x": rand(base["x"].shape[0], 256, seed=k)} for k in (7, 1, 4)]
    for inputs, result in zip(instances, session.run_batch(instances)):
        y, z = onnxruntime_outputs(small_model(), inputs)
        assert_close(result["y"], y, F32_LOOSE)
        assert_close(result["z"], z)
    assert session.last_batch.mode == RAGGED


@pytest.mark.parametrize("batch", [True, False])
def test_the_command_line_runs_several_input_files(device, if_bundle, tmp_path, capsys, batch: bool) -> None:
    """``relaxweb run DIR --inputs A --inputs B [--batch] --out FOLDER``: one file per instance,
    the time without load printed; an instance refused is named."""
    cases = [(2, 1.0), (5, -1.0), (3, 1.0)]
    files = [npz(tmp_path / f"case{k}.npz", x=sign * np.abs(rand(rows, 3, seed=rows))) for k, (rows, sign) in enumerate(cases)]
    flags = ["--batch"] if batch else []
    status, out, err = run_cli(capsys, "run", if_bundle, *(a for f in files for a in ("--inputs", f)), *flags,
                               "--out", tmp_path / "outs")
    assert status == 0, err
    assert f"ran 3 instances {'as one batch (ragged)' if batch else 'one after another (one by one)'}" in err
    assert "without load" in err
    reference = onnxruntime.InferenceSession(two_output_if_model().SerializeToString(),
                                             providers=["CPUExecutionProvider"])
    for k, path in enumerate(files):
        written = np.load(tmp_path / "outs" / f"{k}.case{k}.npz")
        expected = reference.run(None, dict(np.load(path)))
        assert_close(written["y"], expected[0])
        assert f"{k}.case{k}:" in out
    bad = npz(tmp_path / "bad.npz", x=np.zeros((2, 4), np.float32))
    status, _, err = run_cli(capsys, "run", if_bundle, "--inputs", files[0], "--inputs", bad, *flags)
    assert status == 2 and ("instance 1 of the batch" if batch else f"instance 1 ({bad})") in err
    assert "dimension 1 is 4, expected 3" in err


def test_instances_looping_a_different_number_of_times_match_onnxruntime(device, tmp_path) -> None:
    """A Loop whose trip count (and condition) are inputs read back from the GPU: the instances
    run their iterations in rounds, each leaving the batch when its loop ends."""
    model = loop_model()
    relaxweb.build(model, tmp_path / "bundle")
    session = Session(tmp_path / "bundle", device)
    instances = [loop_feeds(trip, cond) for trip, cond in LOOP_RUNS]
    outputs = session.run_batch(instances)
    assert session.last_batch.mode == RAGGED
    for (trip, cond), inputs, result in zip(LOOP_RUNS, instances, outputs):
        for output, expected in zip(model.graph.output, onnxruntime_outputs(model, inputs)):
            assert result[output.name].shape == expected.shape, f"{output.name} at trip={trip}, cond={cond}"
            assert_close(result[output.name], expected, err_msg=f"{output.name} at trip={trip}, cond={cond}")
    # the rounds of the longest instance (trip 8): its two reads (trip count, condition), then
    # one round per iteration (a list ending in a resume), then the end
    assert session.last_batch.rounds == 2 + 8 + 1


def test_a_batch_of_too_many_instances_is_refused(if_bundle) -> None:
    session = relaxweb.load(if_bundle, backend="wasm")
    with pytest.raises(RelaxwebError, match=f"at most {MAX_BATCH_INSTANCES} instances.*got {MAX_BATCH_INSTANCES + 1}"):
        session.run_batch([{"x": rand(1, 3)}] * (MAX_BATCH_INSTANCES + 1))


def test_the_library_copy_kernels_have_ragged_forms() -> None:
    """The loop's row writer, the sequence and KV cache writers and unique's two kernels number
    their workgroup as the shader contract says (they computed the flat index inline, so they
    had no ragged form and a bundle with an ONNX Loop ran its batch one by one)."""
    n = SizeVar("n")
    kernels = [write_row_kernel("write_row", SizeVar("rows"), (n,), "float32", "row"),
               sequence_write_kernel("float32"), unique_count_kernel("unique_count", n, "int64"),
               unique_values_kernel("unique_values", n, "float32"),
               kv_cache_write_kernel("kv_write", (1, 2), n, (8,), 64, "float32", "past")]
    for kernel in kernels:
        assert ragged_problem(library_kernel_wgsl(kernel)) is None, kernel.name
        assert ragged_source(library_kernel_wgsl(kernel)) is not None, kernel.name


def scan_loop_model():
    """An ONNX Loop whose trip count is an input: an accumulator and its squares stacked as a
    scan output ([trip, n]), then a Relu of the scans."""
    body = helper.make_graph(
        [helper.make_node("Add", ["acc", "one"], ["acc2"]), helper.make_node("Identity", ["cond"], ["cond2"]),
         helper.make_node("Mul", ["acc2", "acc2"], ["scan"])], "body",
        [helper.make_tensor_value_info("i", TensorProto.INT64, []),
         helper.make_tensor_value_info("cond", TensorProto.BOOL, []),
         helper.make_tensor_value_info("acc", TensorProto.FLOAT, None)],
        [helper.make_tensor_value_info("cond2", TensorProto.BOOL, []),
         helper.make_tensor_value_info("acc2", TensorProto.FLOAT, None),
         helper.make_tensor_value_info("scan", TensorProto.FLOAT, None)],
        [helper.make_tensor("one", TensorProto.FLOAT, [], [1.0])])
    return make_model([helper.make_node("Loop", ["trip", "", "x"], ["final", "scans"], body=body),
                       helper.make_node("Relu", ["scans"], ["r"])],
                      [("x", ["n"]), ("trip", TensorProto.INT64, [])], ["final", "scans", "r"])


def test_instances_of_a_loop_with_different_trip_counts_batch(device, tmp_path) -> None:
    """Each instance its own length and trip count: the loop's steps are rounds, the instances
    that still loop share each step's dispatches, the scans' storage grows between rounds."""
    relaxweb.build(scan_loop_model(), tmp_path / "bundle")
    session = Session(tmp_path / "bundle", device)
    cases = [(3, 7), (50, 1), (1, 12), (7, 3)]
    instances = [{"x": rand(n, seed=n), "trip": np.array(trips, np.int64)} for n, trips in cases]
    outputs = session.run_batch(instances)
    assert session.last_batch.mode == RAGGED, session.last_batch.reason
    for (n, trips), inputs, result in zip(cases, instances, outputs):
        for name, expected in zip(("final", "scans", "r"), onnxruntime_outputs(scan_loop_model(), inputs)):
            assert_close(result[name], expected, err_msg=f"{name} at n = {n}, {trips} trips")
    dispatches = 0
    for inputs in instances:
        session.run(inputs)
        dispatches += session.last_dispatch_count
    assert session.last_batch.dispatches < dispatches
