"""LSTM, GRU and RNN (``relaxweb/ops/recurrent.py``, ``relaxweb/library/recurrent.py``).

- Deduction keeps the sequence length symbolic; wrong shapes and attributes are clear errors.
- The activation attributes resolve as onnxruntime reads them.
- The op's numpy reference and the legalized module (input projection, persistent kernel,
  slices) agree with onnxruntime in the interpreter, for every attribute combination.
- On wgpu and on kernels.wasm (the ``backend`` fixture): ONNX's node cases, hand-built models covering every attribute (directions,
  initial states, ``sequence_lens``, peepholes, ``clip``, ``input_forget``,
  ``linear_before_reset``, each activation with its alpha / beta, more hidden units than
  a workgroup has invocations), each built once and run at three sequence lengths against
  onnxruntime; the batch-major layout (onnxruntime has none: checked against the time-major
  model with transposed inputs and outputs).
- A small CRNN (conv features -> bidirectional LSTM -> linear) exported by torch with a
  dynamic width (``tests/fixtures/crnn_export.py``'s exports, committed in ``tests/data/crnn/``):
  one build matches onnxruntime at three sequence lengths on the Python runtime and in
  Chromium (browser).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import relaxweb
from relaxweb.compiler import import_model
from relaxweb.errors import RelaxwebError
from relaxweb.ir import FunctionBuilder, SizeVar, TensorStructInfo
from relaxweb.ir.interpreter import run_module
from relaxweb.ir.parser import parse_module
from relaxweb.ir.printer import format_module, module_constants
from relaxweb.ir.structural import structural_equal
from relaxweb.ops import DeductionError, call_op
from relaxweb.ops.recurrent import resolve_activations
from relaxweb.passes import legalize_ops
from tests.helpers import F32_LOOSE, ONNX_CASE, assert_close, build_once, in_the_browser, load_bundle, make_model, onnx_node_cases, onnxruntime_outputs, rand

ROOT = Path(__file__).resolve().parents[2]
GATES = {"LSTM": 4, "GRU": 3, "RNN": 1}
STEPS = (5, 1, 7)  # one build, three sequence lengths (1: a single step)
BATCH, INPUT = 3, 4


# Models ------------------------------------------------------------------------------------------


def recurrent_model(cell: str, direction: str = "forward", hidden: int = 5, *, bias: bool = True,
                    lengths: bool = False, initial: bool = False, peepholes: bool = False, layout: int = 0,
                    **attributes) -> onnx.ModelProto:
    """One LSTM / GRU / RNN node: X with a symbolic sequence length ``T``; the optional inputs
    asked for (the weights as initializers, the lengths and initial states as inputs)."""
    directions = 2 if direction == "bidirectional" else 1
    gates = GATES[cell] * hidden
    weights = {"W": rand(directions, gates, INPUT, seed=1) * 0.5, "R": rand(directions, gates, hidden, seed=2) * 0.5}
    x_dims = ["B", "T", INPUT] if layout else ["T", "B", INPUT]
    states = ["B", directions, hidden] if layout else [directions, "B", hidden]
    inputs, names = [("X", x_dims)], ["X", "W", "R"]
    if bias:
        weights["B"] = rand(directions, 2 * gates, seed=3)
    names.append("B" if bias else "")
    names.append("sequence_lens" if lengths else "")
    if lengths:
        inputs.append(("sequence_lens", TensorProto.INT32, ["B"]))
    names.append("initial_h" if initial else "")
    if initial:
        inputs.append(("initial_h", states))
    if cell == "LSTM":
        names.append("initial_c" if initial else "")
        if initial:
            inputs.append(("initial_c", states))
        if peepholes:
            weights["P"] = rand(directions, 3 * hidden, seed=4)
        names.append("P" if peepholes else "")
    while names[-1] == "":
        names.pop()
    outputs = ["Y", "Y_h"] + (["Y_c"] if cell == "LSTM" else [])
    node = helper.make_node(cell, names, outputs, name=f"{cell.lower()}_node", direction=direction, hidden_size=hidden,
                            **({"layout": layout} if layout else {}), **attributes)
    return make_model([node], inputs, outputs, weights, opset=14)


def feeds_for(model: onnx.ModelProto, steps: int, seed: int = 0) -> dict[str, np.ndarray]:
    """Inputs at ``steps`` time steps: lengths from ``steps`` down to 1, unit-scale states."""
    node = model.graph.node[0]
    layout = next((a.i for a in node.attribute if a.name == "layout"), 0)
    feeds = {"X": rand((BATCH, steps, INPUT) if layout else (steps, BATCH, INPUT), seed=seed + steps)}
    for value in model.graph.input[1:]:
        dims = [BATCH if d.dim_param == "B" else d.dim_value for d in value.type.tensor_type.shape.dim]
        if value.name == "sequence_lens":
            feeds[value.name] = np.array([steps, max(steps - 2, 1), 1], np.int32)
        else:
            feeds[value.name] = rand(dims, seed=seed + len(feeds))
    return feeds




ACTIVATION_CASES = [
    ("Relu", None, None), ("Tanh", None, None), ("Sigmoid", None, None), ("Affine", 0.5, 0.2),
    ("LeakyRelu", 0.3, None), ("LeakyRelu", None, None), ("ThresholdedRelu", 0.1, None), ("ScaledTanh", 0.7, 0.9),
    ("HardSigmoid", 0.3, 0.4), ("HardSigmoid", None, None), ("Elu", 0.8, None), ("Elu", None, None),
    ("Softsign", None, None), ("Softplus", None, None),
]


def _activation(name, alpha, beta) -> dict:
    attributes = {"activations": [name]}
    if alpha is not None:
        attributes["activation_alpha"] = [alpha]
    if beta is not None:
        attributes["activation_beta"] = [beta]
    return attributes


#: (id, cell, keyword arguments of recurrent_model): every attribute and optional input.
CONFIGS = [
    *[(f"{cell}-{direction}-all-inputs", cell, {"direction": direction, "lengths": True, "initial": True,
                                                  "peepholes": cell == "LSTM"})
      for cell in GATES for direction in ("forward", "reverse", "bidirectional")],
    *[(f"{cell}-no-bias", cell, {"bias": False}) for cell in GATES],
    ("GRU-linear-before-reset", "GRU", {"direction": "bidirectional", "lengths": True, "initial": True,
                                        "linear_before_reset": 1}),
    ("GRU-linear-before-reset-no-bias", "GRU", {"bias": False, "linear_before_reset": 1}),
    ("LSTM-input-forget", "LSTM", {"peepholes": True, "input_forget": 1}),
    *[(f"{cell}-clip", cell, {"direction": "bidirectional", "clip": 0.3, "peepholes": cell == "LSTM"}) for cell in GATES],
    ("LSTM-130-hidden-units", "LSTM", {"hidden": 130, "direction": "bidirectional", "lengths": True}),
    ("GRU-70-hidden-units", "GRU", {"hidden": 70, "initial": True}),
    *[(f"RNN-{name}-{alpha}-{beta}", "RNN", _activation(name, alpha, beta)) for name, alpha, beta in ACTIVATION_CASES],
    ("LSTM-six-activations", "LSTM", {
        "direction": "bidirectional", "activations": ["HardSigmoid", "Softsign", "Elu", "Sigmoid", "Tanh", "LeakyRelu"],
        "activation_alpha": [0.3, 0.9, 0.05], "activation_beta": [0.45]}),
    ("GRU-four-activations", "GRU", {
        "direction": "bidirectional", "activations": ["HardSigmoid", "Affine", "Sigmoid", "ScaledTanh"],
        "activation_alpha": [0.3, 0.9, 0.5], "activation_beta": [0.45, 0.1, 1.5]}),
]
CONFIG_IDS = [config[0] for config in CONFIGS]


# Deduction and attributes ---------------------------------------------------------------------------


@pytest.mark.parametrize("cell", ["lstm", "gru", "rnn"])
@pytest.mark.parametrize("layout", [0, 1])
def test_deduction_keeps_the_sequence_length_symbolic(cell: str, layout: int) -> None:
    steps, batch = SizeVar("T"), SizeVar("B")
    builder = FunctionBuilder("main")
    x = builder.add_param("X", TensorStructInfo((batch, steps, 4) if layout else (steps, batch, 4), "float32"))
    gates = {"lstm": 4, "gru": 3, "rnn": 1}[cell] * 6
    w = builder.add_param("W", TensorStructInfo((2, gates, 4), "float32"))
    r = builder.add_param("R", TensorStructInfo((2, gates, 6), "float32"))
    activations = resolve_activations(cell, "bidirectional", None, None, None)
    call = call_op(cell, x, w, r, optional=[], direction="bidirectional", hidden_size=6, layout=layout,
                   activations=activations, clip=None)
    fields = call.struct_info.fields
    assert len(fields) == (3 if cell == "lstm" else 2)
    y_shape = (batch, steps, 2, 6) if layout else (steps, 2, batch, 6)
    state_shape = (batch, 2, 6) if layout else (2, batch, 6)
    assert fields[0] == TensorStructInfo(y_shape, "float32")
    assert all(field == TensorStructInfo(state_shape, "float32") for field in fields[1:])


def test_deduction_names_the_argument_of_a_wrong_shape() -> None:
    builder = FunctionBuilder("main")
    x = builder.add_param("X", TensorStructInfo((SizeVar("T"), 2, 4), "float32"))
    w = builder.add_param("W", TensorStructInfo((1, 20, 4), "float32"))
    r = builder.add_param("R", TensorStructInfo((1, 20, 5), "float32"))
    h0 = builder.add_param("h0", TensorStructInfo((1, 3, 5), "float32"))  # batch 3, X has 2
    activations = resolve_activations("lstm", "forward", None, None, None)
    with pytest.raises(DeductionError, match=r"initial_h must have shape \(1, 2, 5\), got \(1, 3, 5\)"):
        call_op("lstm", x, w, r, h0, optional=["initial_h"], hidden_size=5, activations=activations)
    with pytest.raises(DeductionError, match=r"W must have shape \(1, 24, 4\)"):
        call_op("lstm", x, w, r, optional=[], hidden_size=6, activations=activations)


def test_activation_attributes_resolve_as_onnxruntime_reads_them() -> None:
    # alpha / beta go, in order, to the functions that take them; the rest take defaults
    assert resolve_activations("lstm", "forward", ["HardSigmoid", "Tanh", "LeakyRelu"], [0.3], [0.45]) == [
        ("hardsigmoid", 0.3, 0.45), ("tanh", 0.0, 0.0), ("leakyrelu", 0.01, 0.0)]
    assert resolve_activations("gru", "bidirectional", ["Elu", "Affine"], [2.0, 3.0, 4.0], [5.0]) == [
        ("elu", 2.0, 0.0), ("affine", 3.0, 5.0), ("elu", 4.0, 0.0), ("affine", 0.0, 0.0)]
    assert resolve_activations("rnn", "bidirectional", None, None, None) == [("tanh", 0.0, 0.0)] * 2
    with pytest.raises(DeductionError, match="unknown activation"):
        resolve_activations("rnn", "forward", ["Swish"], None, None)
    with pytest.raises(DeductionError, match="needs 2 activation"):
        resolve_activations("gru", "forward", ["Sigmoid", "Tanh", "Tanh"], None, None)


def test_an_unsupported_attribute_is_one_error_naming_the_node() -> None:
    model = recurrent_model("RNN", activations=["Swish"])
    with pytest.raises(RelaxwebError, match="RNN node 'rnn_node'.*unknown activation"):
        import_model(model)


# The interpreter ------------------------------------------------------------------------------------


def _check_interpreter(model: onnx.ModelProto, steps=STEPS) -> None:
    """The op's reference and the legalized module against onnxruntime, at each length."""
    module = import_model(model)
    legalized = legalize_ops(module)
    for count in steps:
        feeds = feeds_for(model, count)
        expected = onnxruntime_outputs(model, feeds)
        for name, actual in (("reference", run_module(module, feeds)), ("legalized", run_module(legalized, feeds))):
            for output, got, want in zip(("Y", "Y_h", "Y_c"), actual, expected):
                assert got.shape == want.shape, f"{name} {output} at T={count}"
                assert_close(got, want, F32_LOOSE, err_msg=f"{name} {output} at T={count}")


@pytest.mark.parametrize("config", CONFIGS, ids=CONFIG_IDS)
def test_reference_and_legalized_module_match_onnxruntime(config) -> None:
    _, cell, options = config
    _check_interpreter(recurrent_model(cell, **options))


def test_the_legalized_module_prints_and_parses_back() -> None:
    model = recurrent_model("GRU", "bidirectional", lengths=True, initial=True, clip=0.5,
                            activations=["HardSigmoid", "Tanh"], activation_alpha=[0.3])
    legalized = legalize_ops(import_model(model))
    text = format_module(legalized)
    assert '@library_kernel(builder="recurrence"' in text
    assert structural_equal(parse_module(text, constants=module_constants(legalized)), legalized)


def _time_major(model: onnx.ModelProto) -> onnx.ModelProto:
    """The same layer with ``layout`` 0 (onnxruntime runs only that) and time-major inputs."""
    time_major = onnx.ModelProto()
    time_major.CopyFrom(model)
    node = time_major.graph.node[0]
    kept = [a for a in node.attribute if a.name != "layout"]
    del node.attribute[:]
    node.attribute.extend(kept)
    for value in time_major.graph.input:
        dims = value.type.tensor_type.shape.dim
        if value.name in ("X", "initial_h", "initial_c"):
            first, second = dims[0].SerializeToString(), dims[1].SerializeToString()
            dims[0].ParseFromString(second)
            dims[1].ParseFromString(first)
    return time_major


def _batch_major_expected(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    swapped = {name: value.swapaxes(0, 1) if name in ("X", "initial_h", "initial_c") else value
               for name, value in feeds.items()}
    y, *states = onnxruntime_outputs(_time_major(model), swapped)
    return [y.transpose(2, 0, 1, 3), *(state.swapaxes(0, 1) for state in states)]


@pytest.mark.parametrize("cell", ["LSTM", "GRU", "RNN"])
def test_batch_major_layout_in_the_interpreter(cell: str) -> None:
    model = recurrent_model(cell, "bidirectional", layout=1, lengths=True, initial=True, peepholes=cell == "LSTM")
    module = import_model(model)
    legalized = legalize_ops(module)
    for count in STEPS:
        feeds = feeds_for(model, count)
        expected = _batch_major_expected(model, feeds)
        for actual in (run_module(module, feeds), run_module(legalized, feeds)):
            for got, want in zip(actual, expected):
                assert_close(got, want, F32_LOOSE)


def test_out_of_range_sequence_lengths_are_clamped() -> None:
    """onnxruntime rejects lengths outside [1, T]; the GPU cannot read them to reject them,
    so they are clamped: 0 runs no step (the initial state stays), above T runs T."""
    model = recurrent_model("LSTM", "bidirectional", lengths=True, initial=True)
    module = import_model(model)
    feeds = feeds_for(model, 4)
    feeds["sequence_lens"] = np.array([0, 9, -3], np.int32)
    y, y_h, y_c = run_module(module, feeds)
    assert not y[:, :, 0].any() and not y[:, :, 2].any()
    np.testing.assert_array_equal(y_h[:, 0], feeds["initial_h"][:, 0])
    np.testing.assert_array_equal(y_c[:, 2], feeds["initial_c"][:, 2])
    in_range = dict(feeds, sequence_lens=np.array([1, 4, 1], np.int32))
    assert_close(y[:, :, 1], onnxruntime_outputs(model, in_range)[0][:, :, 1], F32_LOOSE)
    assert_close(run_module(legalize_ops(module), feeds)[0], y, F32_LOOSE)


# The Python runtime's backends (WebGPU and kernels.wasm) -----------------------------------------------


def _check_compiled(model: onnx.ModelProto, folder: Path, backend: str, expected_of=onnxruntime_outputs) -> None:
    """One build; every sequence length of STEPS against ``expected_of`` on the Python runtime."""
    session = load_bundle(build_once(model, folder), backend)
    names = [output.name for output in model.graph.output]
    for count in STEPS:
        feeds = feeds_for(model, count)
        actual = session.run(feeds)
        for name, want in zip(names, expected_of(model, feeds)):
            assert actual[name].shape == want.shape, f"{name} at T={count}"
            assert_close(actual[name], want, F32_LOOSE, err_msg=f"{name} at T={count}")


@pytest.mark.parametrize("config", CONFIGS, ids=CONFIG_IDS)
def test_one_build_matches_onnxruntime_at_three_lengths_on_each_backend(backend, tmp_path, config) -> None:
    _, cell, options = config
    _check_compiled(recurrent_model(cell, **options), tmp_path, backend)


@pytest.mark.parametrize("cell", ["LSTM", "GRU", "RNN"])
def test_batch_major_layout_on_each_backend(backend, tmp_path, cell: str) -> None:
    model = recurrent_model(cell, "bidirectional", layout=1, lengths=True, initial=True, peepholes=cell == "LSTM")
    _check_compiled(model, tmp_path, backend, _batch_major_expected)


def test_a_wide_lstm_over_many_steps_matches_onnxruntime(backend, tmp_path) -> None:
    """Hidden size 512 over 40 steps (ddddocr's captcha recognizer is this wide): 163840
    iterations of a plain dot-product loop per invocation, past the 65535 that llvmpipe
    runs of any loop; the unrolled loop needs 5120."""
    rng = np.random.default_rng(3)
    hidden, features = 512, 24
    weights = {"W": rng.standard_normal((2, 4 * hidden, features)).astype(np.float32) * 0.05,
               "R": rng.standard_normal((2, 4 * hidden, hidden)).astype(np.float32) * 0.05,
               "B": rng.standard_normal((2, 8 * hidden)).astype(np.float32) * 0.05}
    node = helper.make_node("LSTM", ["x", "W", "R", "B"], ["y", "y_h", "y_c"], direction="bidirectional",
                            hidden_size=hidden)
    model = make_model([node], [("x", ["steps", 1, features])], ["y", "y_h", "y_c"], weights, opset=14)
    session = load_bundle(build_once(model, tmp_path / "bundle"), backend)
    for steps in (40, 3):
        feeds = {"x": rand(steps, 1, features, seed=steps)}
        actual = session.run(feeds)
        for name, want in zip(("y", "y_h", "y_c"), onnxruntime_outputs(model, feeds)):
            assert_close(actual[name], want, F32_LOOSE, err_msg=f"{name} over {steps} steps")


def _node_cases() -> dict:
    return {case.name: case for case in onnx_node_cases(["lstm", "gru", "rnn"])}


@pytest.mark.parametrize("name", sorted(_node_cases()))
def test_onnx_node_case_on_each_backend(backend, tmp_path, name: str) -> None:
    """ONNX's node cases (the batch-major ones too, which onnxruntime cannot run)."""
    case = _node_cases()[name]
    session = load_bundle(build_once(case.model, tmp_path), backend)
    for inputs, outputs in case.data_sets:
        feeds = {value.name: array for value, array in zip(case.model.graph.input, inputs)}
        actual = session.run(feeds)
        for value, want in zip(case.model.graph.output, outputs):
            assert_close(actual[value.name], want, ONNX_CASE, err_msg=f"{name} {value.name}")


# A CRNN exported by torch ---------------------------------------------------------------------------

WIDTHS = (12, 40, 61)  # sequence lengths 3, 10 and 15 (width // 4)


def _crnn_model(exporter: str) -> Path:
    """The CRNN as torch's ``exporter`` wrote it (committed: see tests/data/crnn/README.md)."""
    return ROOT / "tests" / "data" / "crnn" / f"crnn_{exporter}.onnx"


def _crnn_runs(path: Path) -> tuple[list[dict], list[np.ndarray]]:
    import onnxruntime as ort

    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    runs = [{"image": rand(2, 1, 16, width, seed=width)} for width in WIDTHS]
    return runs, [session.run(None, run)[0] for run in runs]


@pytest.fixture(scope="module")
def crnn_builds() -> dict[str, tuple[Path, Path]]:
    """exporter -> (model, bundle): each CRNN exported and built once for both backends."""
    return {}


@pytest.mark.slow
@pytest.mark.parametrize("exporter", ["legacy", "dynamo"])
def test_crnn_bidirectional_lstm_matches_onnxruntime_at_three_lengths(backend, crnn_builds, tmp_path_factory,
                                                                     exporter: str) -> None:
    if exporter not in crnn_builds:
        folder = tmp_path_factory.mktemp(f"crnn-{exporter}")
        path = _crnn_model(exporter)
        assert "LSTM" in {node.op_type for node in onnx.load(str(path)).graph.node}
        bundle = relaxweb.build(path, folder / "bundle")
        assert set(bundle.symbolic_vars) == {"batch", "width"}
        crnn_builds[exporter] = path, bundle.path
    path, bundle_path = crnn_builds[exporter]
    session = load_bundle(bundle_path, backend)
    runs, expected = _crnn_runs(path)
    for width, run, want in zip(WIDTHS, runs, expected):
        got = session.run(run)["logits"]
        assert got.shape == want.shape == (width // 4, 2, 11)
        assert_close(got, want, F32_LOOSE, err_msg=f"width {width}")


@pytest.fixture(scope="module")
def vad_build(tmp_path_factory) -> tuple[Path, Path]:
    """(model, bundle): the VAD exported by torch and built once for both backends."""
    pytest.importorskip("torch")
    folder = tmp_path_factory.mktemp("vad")
    path = folder / "vad.onnx"
    done = subprocess.run([sys.executable, "-m", "tests.fixtures.vad_export", str(path)], capture_output=True,
                          text=True, cwd=ROOT, timeout=300)
    assert done.returncode == 0, done.stderr[-4000:]
    assert [node.op_type for node in onnx.load(str(path)).graph.node][-1] == "If"
    return path, relaxweb.build(path, folder / "bundle").path


@pytest.mark.slow
def test_a_scripted_vad_with_an_if_on_the_sample_rate_matches_onnxruntime(backend, vad_build) -> None:
    """Silero VAD v5's shape (tests/fixtures/vad_export.py): an If with two outputs whose
    branches hold a reflect Pad, a Conv STFT and an LSTM step; both branches, three batches
    and two lengths from one build."""
    path, bundle_path = vad_build
    session = load_bundle(bundle_path, backend)
    for rate, samples, batch in ((16000, 512, 1), (8000, 256, 2), (16000, 1024, 3)):
        feeds = {"input": rand(batch, samples, seed=samples), "state": rand(2, batch, 64, seed=batch),
                 "sr": np.array(rate, np.int64)}
        expected = onnxruntime_outputs(path, feeds)
        actual = session.run(feeds)
        for name, want in zip(("output", "stateN"), expected):
            assert_close(actual[name], want, F32_LOOSE, err_msg=f"{name} at sr {rate}, {samples} samples, batch {batch}")


@in_the_browser
@pytest.mark.slow
def test_crnn_bidirectional_lstm_in_the_browser(tmp_path) -> None:
    from relaxweb.browser import run_many_in_browser

    path = _crnn_model("legacy")
    relaxweb.build(path, tmp_path / "bundle")
    runs, expected = _crnn_runs(path)
    for width, got, want in zip(WIDTHS, run_many_in_browser(tmp_path / "bundle", runs, timeout_s=300), expected):
        assert_close(got["logits"], want, F32_LOOSE, err_msg=f"width {width} in Chromium")
