#!/usr/bin/env python3
"""Export tiny transformers models whose attention is torch's ``scaled_dot_product_attention``
(transformers' default attention, what users export), for tests/e2e/test_attention_exports.py.

    python3 scripts/export_attention_models.py OUT_DIR [--only NAME ...]

Writes ``OUT_DIR/NAME.onnx`` for each model (random weights from a fixed seed, tiny configs:
2 layers, hidden 32, 2 heads of 16; nothing from the network):

    distilbert_dynamo   DistilBertModel, torch.export (dynamo): input_ids, attention_mask [batch, seq]
                        -> last_hidden_state; the mask filled with finfo.min, the keys transposed by
                        a reshape / transpose / reshape
    bert_dynamo         BertModel, the same exporter and inputs
    gpt2_masked_legacy  GPT2LMHeadModel with an attention_mask input, the TorchScript exporter
                        (opset 17) -> logits; a causal and padding mask filled with -inf
    whisper_decoder_legacy  WhisperModel's decoder, TorchScript exporter: decoder_input_ids
                        [batch, seq] and encoder_hidden_states [batch, frames, 32] ->
                        last_hidden_state: causal self-attention and cross-attention

Every one writes the scaled dot-product attention torch exports: q and k each scaled by the
root of the scale, and ``where(isnan(weights), 0, weights)`` before the value product.

The tests read the four exports committed in ``tests/data/attention-models/`` (exporting them
took CI about 15 s of CPU time); its README says how to write them again.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import sys
import warnings
from pathlib import Path

import numpy as np

SEED = 0
VOCAB = 64
HIDDEN, LAYERS, HEADS = 32, 2, 2


def _seed() -> None:
    import torch

    torch.manual_seed(SEED)
    np.random.seed(SEED)


def _perturb(model):
    """Biases start at 0 and norm weights at 1, which would hide a dropped bias or scale."""
    import torch

    with torch.no_grad():
        for parameter in model.parameters():
            if parameter.numel() > 1 and bool(parameter.min() == parameter.max()):
                parameter.add_(torch.randn_like(parameter) * 0.1)
    return model.eval()


def _sdpa(config):
    config._attn_implementation = "sdpa"  # transformers' default where torch has it; said here to be sure
    return config


class _Outputs:
    """A module returning its model's first output (the exporters take tensors, not dicts)."""

    @staticmethod
    def wrap(model, forward):
        import torch

        class Wrapper(torch.nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.model = model

            def forward(self, *args):
                return forward(self.model, *args)

        return Wrapper().eval()


def distilbert():
    from transformers import DistilBertConfig, DistilBertModel

    _seed()
    config = _sdpa(DistilBertConfig(vocab_size=VOCAB, dim=HIDDEN, n_layers=LAYERS, n_heads=HEADS, hidden_dim=64,
                                    max_position_embeddings=64, dropout=0.0, attention_dropout=0.0))
    return _Outputs.wrap(_perturb(DistilBertModel(config)),
                         lambda m, ids, mask: m(input_ids=ids, attention_mask=mask, return_dict=False)[0])


def bert():
    from transformers import BertConfig, BertModel

    _seed()
    config = _sdpa(BertConfig(vocab_size=VOCAB, hidden_size=HIDDEN, num_hidden_layers=LAYERS, num_attention_heads=HEADS,
                              intermediate_size=64, max_position_embeddings=64, hidden_dropout_prob=0.0,
                              attention_probs_dropout_prob=0.0))
    return _Outputs.wrap(_perturb(BertModel(config, add_pooling_layer=False)),
                         lambda m, ids, mask: m(input_ids=ids, attention_mask=mask, return_dict=False)[0])


def gpt2():
    from transformers import GPT2Config, GPT2LMHeadModel

    _seed()
    config = _sdpa(GPT2Config(vocab_size=VOCAB, n_positions=64, n_embd=HIDDEN, n_layer=LAYERS, n_head=HEADS,
                              resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0))
    return _Outputs.wrap(_perturb(GPT2LMHeadModel(config)), lambda m, ids, mask: m(
        input_ids=ids, attention_mask=mask, use_cache=False, return_dict=False)[0])


def whisper_decoder():
    import torch
    from transformers import WhisperConfig, WhisperModel

    _seed()
    config = _sdpa(WhisperConfig(vocab_size=VOCAB, num_mel_bins=16, d_model=HIDDEN, encoder_layers=1,
                                 decoder_layers=LAYERS, encoder_attention_heads=HEADS, decoder_attention_heads=HEADS,
                                 encoder_ffn_dim=64, decoder_ffn_dim=64, max_source_positions=32,
                                 max_target_positions=32, pad_token_id=0, bos_token_id=1, eos_token_id=2,
                                 decoder_start_token_id=1, dropout=0.0, attention_dropout=0.0))
    decoder = _perturb(WhisperModel(config)).get_decoder()
    # an all-ones decoder mask, as a web app passes it: without one transformers (5.x) looks
    # for packed sequences with torch.diff, which the TorchScript exporter cannot export
    return _Outputs.wrap(decoder, lambda m, ids, states: m(
        input_ids=ids, attention_mask=torch.ones_like(ids), encoder_hidden_states=states, use_cache=False,
        return_dict=False)[0])


#: name -> (builder, exporter, inputs as (name, dtype, dims: ints and names of dynamic dims), output)
MODELS = {
    "distilbert_dynamo": (distilbert, "dynamo", [("input_ids", "int64", ["batch", "seq"]),
                                                 ("attention_mask", "int64", ["batch", "seq"])], "last_hidden_state"),
    "bert_dynamo": (bert, "dynamo", [("input_ids", "int64", ["batch", "seq"]),
                                     ("attention_mask", "int64", ["batch", "seq"])], "last_hidden_state"),
    "gpt2_masked_legacy": (gpt2, "legacy", [("input_ids", "int64", ["batch", "seq"]),
                                            ("attention_mask", "int64", ["batch", "seq"])], "logits"),
    "whisper_decoder_legacy": (whisper_decoder, "legacy", [("decoder_input_ids", "int64", ["batch", "seq"]),
                                                           ("encoder_hidden_states", "float32", ["batch", "frames", HIDDEN])],
                               "last_hidden_state"),
}
#: the example each export traces with
EXAMPLE_DIMS = {"batch": 2, "seq": 5, "frames": 7}


def example_inputs(name: str, dims: dict[str, int], seed: int = 0) -> dict[str, np.ndarray]:
    """Inputs of model ``name`` at ``dims``: token ids below VOCAB, masks of ones whose later
    rows have a padded tail (a left-padded first row for the causal GPT-2: its first query
    sees no key), encoder states from a normal distribution."""
    rng = np.random.default_rng(seed)
    arrays = {}
    for input_name, dtype, shape in MODELS[name][2]:
        concrete = tuple(dims[d] if isinstance(d, str) else d for d in shape)
        if input_name.endswith("input_ids"):
            arrays[input_name] = rng.integers(0, VOCAB, concrete).astype(dtype)
        elif input_name == "attention_mask":
            mask = np.ones(concrete, dtype)
            for row in range(1, concrete[0]):
                mask[row, concrete[1] - min(row, concrete[1] - 1):] = 0
            if name.startswith("gpt2") and concrete[1] > 1:
                mask[0, 0] = 0  # left padding: query 0 of row 0 attends to no key
            arrays[input_name] = mask
        else:
            arrays[input_name] = rng.standard_normal(concrete).astype(dtype)
    return arrays


def export(name: str, out_dir: Path) -> Path:
    import torch

    build, exporter, inputs, output = MODELS[name]
    model = build()
    example = example_inputs(name, EXAMPLE_DIMS)
    args = tuple(torch.from_numpy(example[input_name]) for input_name, _, _ in inputs)
    names = [input_name for input_name, _, _ in inputs]
    path = out_dir / f"{name}.onnx"
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")
        if exporter == "legacy":
            axes = {input_name: {axis: d for axis, d in enumerate(dims) if isinstance(d, str)}
                    for input_name, _, dims in inputs}
            torch.onnx.export(model, args, str(path), dynamo=False, input_names=names, output_names=[output],
                              dynamic_axes={**axes, output: {0: "batch", 1: "seq"}}, opset_version=17,
                              do_constant_folding=True)
        else:
            from torch.export import Dim

            named = {d: Dim(d, min=1, max=64) for _, _, dims in inputs for d in dims if isinstance(d, str)}
            shapes = tuple({axis: named[d] for axis, d in enumerate(dims) if isinstance(d, str)}
                           for _, _, dims in inputs)
            program = torch.onnx.export(model, args, None, dynamo=True, dynamic_shapes={"args": shapes},
                                        input_names=names, output_names=[output], opset_version=18, optimize=True)
            program.save(str(path), external_data=False)
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--only", action="append", default=[], choices=list(MODELS), metavar="NAME",
                        help="export only this model (repeatable): " + ", ".join(MODELS))
    args = parser.parse_args(argv)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    failed = 0
    for name in args.only or list(MODELS):
        try:
            print(f"{name}: {export(name, args.out_dir)}", flush=True)
        except Exception as error:  # noqa: BLE001 - reported per model
            failed += 1
            print(f"{name}: FAILED ({type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''})",
                  flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
