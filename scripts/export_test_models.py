#!/usr/bin/env python3
"""Export the tiny real-world models that tests/e2e/test_models.py imports.

    python3 scripts/export_test_models.py OUT_DIR [--only NAME ...]

Writes, for each model NAME, ``OUT_DIR/NAME.onnx`` and a sidecar ``OUT_DIR/NAME.json``
(the inputs: name, dtype, dims with their symbolic names; the outputs; the exporter;
the export time; the dim_param names the exporter actually wrote).  Models:

    gpt2_legacy, gpt2_dynamo    GPT2LMHeadModel (use_cache=False): input_ids[batch, seq] -> logits
    bert_legacy, bert_dynamo    BertModel: input_ids, attention_mask [batch, seq] -> last_hidden_state
    cnn_legacy, cnn_dynamo      a small CNN: x[batch, 3, height, width] -> logits[batch, 10]
    gpt2_small                  GPT-2 small itself (124M: vocabulary 50257, 12 layers of 768), legacy
                                exporter; only with --only (its 154 MB embedding is above one WebGPU
                                binding: tests/wgsl/test_split_weights.py; ~650 MB on disk)

Weights are random from fixed seeds and configs are tiny, so each export takes seconds.
Nothing here reaches the network (transformers builds models from a config).
``*_legacy`` use the TorchScript exporter (``dynamo=False``, ``dynamic_axes``, opset 17);
``*_dynamo`` use ``torch.export`` (``dynamo=True``, ``dynamic_shapes`` of ``torch.export.Dim``
named batch/seq/height/width) and need ``onnxscript``.

The tests read the six default exports committed in ``tests/data/test-models/`` (exporting them
took CI about 20 s of CPU time); its README says how to write them again.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import sys
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np

SEED = 0
VOCAB = 128


@dataclass
class InputSpec:
    name: str
    dtype: str  # numpy dtype name
    dims: list  # ints, or str for symbolic dims
    # how tests fill it: "ids" (integers in [0, high)), "mask" (ones with a zero tail per row), "normal"
    kind: str = "normal"
    high: int = 0


@dataclass
class ModelSpec:
    name: str
    family: str  # gpt2 / bert / cnn
    exporter: str  # legacy / dynamo
    build: Callable  # () -> torch.nn.Module
    inputs: list[InputSpec]
    outputs: list[str]
    # symbolic dim name -> value used for the example inputs given to the exporter
    example_dims: dict[str, int] = field(default_factory=dict)
    default: bool = True  # exported when no --only names it


def _seed() -> None:
    import torch

    torch.manual_seed(SEED)
    np.random.seed(SEED)


class _GPT2Logits:
    """Factory for GPT2LMHeadModel returning only the logits (no past key values): the tiny
    config (hidden 64, 2 layers), or with ``small`` GPT-2 small's own (transformers' defaults)."""

    @staticmethod
    def build(small: bool = False):
        import torch
        from transformers import GPT2Config, GPT2LMHeadModel

        _seed()
        sizes = {} if small else {"vocab_size": VOCAB, "n_positions": 128, "n_embd": 64, "n_layer": 2, "n_head": 4}
        config = GPT2Config(
            **sizes, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, use_cache=False,
            bos_token_id=0, eos_token_id=0,
        )
        _eager_attention(config)
        inner = GPT2LMHeadModel(config).eval()
        _perturb_trivial(inner)

        class Wrapper(torch.nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.model = inner

            def forward(self, input_ids):
                # An explicit all-ones mask: without one, transformers (5.x) looks for packed
                # sequences in position_ids with torch.diff, which the TorchScript exporter
                # cannot export (aten::diff).
                mask = torch.ones_like(input_ids)
                return self.model(input_ids=input_ids, attention_mask=mask, use_cache=False, return_dict=False)[0]

        return Wrapper().eval()


class _Bert:
    @staticmethod
    def build():
        import torch
        from transformers import BertConfig, BertModel

        _seed()
        config = BertConfig(
            vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
            intermediate_size=128, max_position_embeddings=128, type_vocab_size=2,
            hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
        )
        _eager_attention(config)
        inner = BertModel(config, add_pooling_layer=False).eval()
        _perturb_trivial(inner)

        class Wrapper(torch.nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.model = inner

            def forward(self, input_ids, attention_mask):
                return self.model(input_ids=input_ids, attention_mask=attention_mask, return_dict=False)[0]

        return Wrapper().eval()


def _perturb_trivial(model) -> None:
    """Biases start at 0 and norm weights at 1, which would hide a dropped bias or scale (and
    an exporter may drop an add of zeros): give every constant parameter random noise."""
    import torch

    with torch.no_grad():
        for parameter in model.parameters():
            if parameter.numel() > 1 and bool(parameter.min() == parameter.max()):
                parameter.add_(torch.randn_like(parameter) * 0.1)


def _eager_attention(config) -> None:
    """Plain matmul/softmax attention (not SDPA), the portable form for ONNX."""
    for attribute in ("_attn_implementation", "attn_implementation"):
        with contextlib.suppress(Exception):
            setattr(config, attribute, "eager")


class _CNN:
    @staticmethod
    def build():
        import torch
        from torch import nn

        _seed()

        class SmallCNN(nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.conv1 = nn.Conv2d(3, 8, kernel_size=3, padding=1)
                self.bn1 = nn.BatchNorm2d(8)
                self.pool = nn.MaxPool2d(2)
                self.conv2 = nn.Conv2d(8, 16, kernel_size=3, padding=2, dilation=2, groups=2)
                self.bn2 = nn.BatchNorm2d(16)
                self.gap = nn.AdaptiveAvgPool2d(1)
                self.fc = nn.Linear(16, 10)

            def forward(self, x):
                x = self.pool(torch.relu(self.bn1(self.conv1(x))))
                # bn2 after the ReLU, so the exporters cannot fold it into conv2 (bn1 is folded)
                x = self.bn2(torch.relu(self.conv2(x)))
                x = torch.flatten(self.gap(x), 1)
                return self.fc(x)

        model = SmallCNN()
        # non-trivial batch-norm statistics, so folding them in is visible in the numbers
        with torch.no_grad():
            for bn in (model.bn1, model.bn2):
                bn.running_mean.uniform_(-0.5, 0.5)
                bn.running_var.uniform_(0.5, 1.5)
                bn.weight.uniform_(0.5, 1.5)
                bn.bias.uniform_(-0.5, 0.5)
        return model.eval()


def _token_inputs(with_mask: bool) -> list[InputSpec]:
    inputs = [InputSpec("input_ids", "int64", ["batch", "seq"], kind="ids", high=VOCAB)]
    if with_mask:
        inputs.append(InputSpec("attention_mask", "int64", ["batch", "seq"], kind="mask"))
    return inputs


def model_specs() -> dict[str, ModelSpec]:
    specs = []
    for exporter in ("legacy", "dynamo"):
        specs.append(ModelSpec(f"gpt2_{exporter}", "gpt2", exporter, _GPT2Logits.build,
                               _token_inputs(False), ["logits"], {"batch": 2, "seq": 7}))
        specs.append(ModelSpec(f"bert_{exporter}", "bert", exporter, _Bert.build,
                               _token_inputs(True), ["last_hidden_state"], {"batch": 2, "seq": 7}))
        specs.append(ModelSpec(f"cnn_{exporter}", "cnn", exporter, _CNN.build,
                               [InputSpec("x", "float32", ["batch", 3, "height", "width"])], ["logits"],
                               {"batch": 2, "height": 28, "width": 36}))
    specs.append(ModelSpec("gpt2_small", "gpt2", "legacy", lambda: _GPT2Logits.build(small=True),
                           [InputSpec("input_ids", "int64", ["batch", "seq"], kind="ids", high=50257)], ["logits"],
                           {"batch": 2, "seq": 7}, default=False))
    return {spec.name: spec for spec in specs}


def make_inputs(inputs: list[InputSpec], dims: dict[str, int], seed: int = 0) -> dict[str, np.ndarray]:
    """Concrete inputs for the given values of the symbolic dims (used by the tests too).

    ``inputs`` may be InputSpec objects or their JSON dicts (from a sidecar).
    """
    rng = np.random.default_rng(seed)
    arrays = {}
    for spec in inputs:
        if isinstance(spec, dict):
            spec = InputSpec(**spec)
        shape = tuple(dims[d] if isinstance(d, str) else int(d) for d in spec.dims)
        if spec.kind == "ids":
            arrays[spec.name] = rng.integers(0, spec.high, size=shape).astype(spec.dtype)
        elif spec.kind == "mask":
            mask = np.ones(shape, dtype=spec.dtype)
            # every row keeps its first token; later rows get a padded tail of growing length
            for row in range(shape[0]):
                pad = min(row, shape[-1] - 1)
                if pad:
                    mask[row, shape[-1] - pad:] = 0
            arrays[spec.name] = mask
        else:
            arrays[spec.name] = rng.standard_normal(shape).astype(spec.dtype)
    return arrays


def _dim_params(path: Path) -> dict[str, list]:
    import onnx

    model = onnx.load(str(path), load_external_data=False)

    def dims(values):
        out = {}
        for value in values:
            shape = value.type.tensor_type.shape
            out[value.name] = [d.dim_param if d.HasField("dim_param") else (d.dim_value if d.HasField("dim_value") else None)
                               for d in shape.dim]
        return out

    return {"inputs": dims(model.graph.input), "outputs": dims(model.graph.output),
            "opset": next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), None),
            "op_types": sorted({n.op_type if n.domain in ("", "ai.onnx") else f"{n.domain}.{n.op_type}" for n in model.graph.node}),
            "nodes": len(model.graph.node)}


def _check_against_torch(model, spec: ModelSpec, path: Path) -> dict | None:
    """Max |onnxruntime - torch| at a shape other than the example's (None without onnxruntime)."""
    try:
        import onnxruntime as ort
    except ImportError:
        return None
    import torch

    dims = {d: v - 1 for d, v in spec.example_dims.items()}
    inputs = make_inputs(spec.inputs, dims, seed=1)
    with torch.no_grad():
        expected = model(*(torch.from_numpy(inputs[i.name]) for i in spec.inputs)).numpy()
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    (actual,) = session.run(None, inputs)
    return {"dims": dims, "max_abs_diff": float(np.max(np.abs(actual - expected)))}


def export(spec: ModelSpec, out_dir: Path, verbose: bool = False) -> dict:
    import torch

    model = spec.build()
    example = make_inputs(spec.inputs, spec.example_dims)
    args = tuple(torch.from_numpy(example[i.name]) for i in spec.inputs)
    path = out_dir / f"{spec.name}.onnx"
    input_names = [i.name for i in spec.inputs]
    start = time.perf_counter()
    sink = io.StringIO()
    with warnings.catch_warnings(), contextlib.redirect_stdout(sink if not verbose else sys.stdout):
        warnings.simplefilter("ignore")
        if spec.exporter == "legacy":
            dynamic_axes = {i.name: {axis: d for axis, d in enumerate(i.dims) if isinstance(d, str)} for i in spec.inputs}
            # outputs: the leading batch (and seq for token models) are dynamic
            out_axes = {0: "batch", 1: "seq"} if spec.family != "cnn" else {0: "batch"}
            for name in spec.outputs:
                dynamic_axes[name] = out_axes
            torch.onnx.export(
                model, args, str(path), dynamo=False, input_names=input_names, output_names=spec.outputs,
                dynamic_axes=dynamic_axes, opset_version=17, do_constant_folding=True,
            )
        else:
            from torch.export import Dim

            named = {}
            for i in spec.inputs:
                for d in i.dims:
                    if isinstance(d, str) and d not in named:
                        # GPT-2/BERT have 128 positions; the CNN needs at least a 2x2 pooled map
                        low, high = (1, 128) if d in ("batch", "seq") else (4, 4096)
                        if d == "batch":
                            high = 1024
                        named[d] = Dim(d, min=low, max=high)
            dynamic_shapes = {i.name: {axis: named[d] for axis, d in enumerate(i.dims) if isinstance(d, str)}
                              for i in spec.inputs}
            program = torch.onnx.export(
                model, args, None, dynamo=True, dynamic_shapes=dynamic_shapes, input_names=input_names,
                output_names=spec.outputs, opset_version=18, optimize=True, verbose=False,
            )
            program.save(str(path), external_data=False)
    seconds = time.perf_counter() - start
    written = _dim_params(path)
    check = _check_against_torch(model, spec, path)
    sidecar = {
        "name": spec.name,
        "family": spec.family,
        "exporter": spec.exporter,
        "torch": torch.__version__,
        "seed": SEED,
        "inputs": [i.__dict__ for i in spec.inputs],
        "outputs": spec.outputs,
        "example_dims": spec.example_dims,
        "export_seconds": round(seconds, 3),
        "onnxruntime_vs_torch": check,
        "written": written,
    }
    (out_dir / f"{spec.name}.json").write_text(json.dumps(sidecar, indent=1) + "\n")
    return sidecar


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--only", action="append", default=[], metavar="NAME",
                        help="export only this model (repeatable): " + ", ".join(model_specs()))
    parser.add_argument("--keep-going", action="store_true", help="report a failed export and go on")
    parser.add_argument("--verbose", action="store_true", help="show the exporters' own output")
    args = parser.parse_args(argv)
    specs = model_specs()
    names = args.only or [name for name, spec in specs.items() if spec.default]
    unknown = [n for n in names if n not in specs]
    if unknown:
        parser.error(f"unknown model(s): {', '.join(unknown)}; known: {', '.join(specs)}")
    args.out_dir.mkdir(parents=True, exist_ok=True)
    failed = 0
    for name in names:
        try:
            sidecar = export(specs[name], args.out_dir, verbose=args.verbose)
        except Exception as error:  # noqa: BLE001 - reported per model
            if not args.keep_going:
                raise
            failed += 1
            print(f"{name}: FAILED ({type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''})")
            continue
        dims = sidecar["written"]["inputs"]
        print(f"{name}: {sidecar['export_seconds']:.2f}s, {sidecar['written']['nodes']} nodes, inputs {dims}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
