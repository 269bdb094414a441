#!/usr/bin/env python3
"""Export tiny transformer models, optimize them with onnxruntime's transformer optimizer (which
writes onnxruntime's com.microsoft contrib ops), and convert some to float16.

    python3 scripts/export_optimized_models.py OUT_DIR [--only NAME ...] [--write-test-data]

Writes ``OUT_DIR/NAME.onnx`` and ``OUT_DIR/NAME.json`` (inputs with their symbolic dims, the
op types written, the optimizer's options) for each model NAME below.  Weights are random
from fixed seeds (transformers builds the models from configs; nothing reaches the network);
each model is exported with the TorchScript exporter (``dynamo=False``, batch and sequence
dynamic, opset 17), then ``onnxruntime.transformers.optimizer.optimize_model`` rewrites it:

    bert                 BertModel: EmbedLayerNormalization, Attention, SkipLayerNormalization, BiasGelu
    bert_mha_gelu        the same with use_multi_head_attention and no bias-GELU fusion:
                         MultiHeadAttention, Gelu
    bert_fast_gelu       with enable_gelu_approximation: FastGelu
    distilbert           DistilBertModel (model type bert)
    gpt2                 GPT2Model: SkipLayerNormalization, FastGelu
    llama                LlamaModel (RMS norm, rotary, grouped KV heads; model type gpt2):
                         SimplifiedLayerNormalization, SkipSimplifiedLayerNormalization
    llama_ort_optimized  the same after onnxruntime's own graph optimizations too (opt_level 2):
                         QuickGelu (SiLU, alpha 1), SimplifiedLayerNormalization
    bert_fused_matmul    BertModel through the optimizer with only_onnxruntime at opt_level 2 (its
                         graph optimizations without the ones the Python fusions disable):
                         FusedMatMul (the attention scores' MatMul and scale), BiasGelu
    geglu_unet           a diffusion transformer's GEGLU feed-forward block through the UNet
                         optimizer (model type unet, enable_bias_add): SkipLayerNormalization,
                         BiasSplitGelu, BiasAdd; onnxruntime's CPU provider has no kernel for the
                         last two, so NAME.reference.onnx (the export before optimizing) is kept
                         as the reference
    clip_text            CLIPTextModel (model type clip): QuickGelu, SkipLayerNormalization
    cnn                  a small CNN (conv, batch norm, pooling, softmax), not optimized: the float32
                         baseline of cnn_fp16
    *_fp16               bert, gpt2 and the CNN converted by onnxruntime's
                         ``float16.convert_float_to_float16`` (weights and activations in float16,
                         Casts at the inputs and outputs kept float32); gpt2_fp16_io with its
                         float16 output too

Decoders with a KV cache, written by onnxruntime-genai's model builder
(``python -m onnxruntime_genai.models.builder -i HF_DIR -o OUT -p PRECISION -e PROVIDER``) from a
transformers ...ForCausalLM saved to ``OUT_DIR/NAME.hf`` (random weights, a word-level tokenizer the
builder requires); inputs ``input_ids``, ``attention_mask`` ``[batch, total]``, ``position_ids`` where the
builder keeps it, and ``past_key_values.L.key/value``; outputs ``logits`` and ``present.L.*``.
They are exported only when named with ``--only`` (the builder is an optional install:
``pip install onnxruntime-genai``); ``scripts/export_decoders.py`` exports the decoder corpus (the
builder's variants with tied embeddings, torch dynamo's and optimum's) with this module's driver:

    llama_genai          -p fp32 -e cpu: GroupQueryAttention with packed QKV and its own rotary
                         (do_rotary=1, cos_cache/sin_cache), seqlens_k and total_sequence_length
                         from the attention mask
    llama_genai_rotary   -p fp16 -e dml (the builder writes rotary inside GQA for every provider but
                         DirectML): RotaryEmbedding nodes (position_ids), then GroupQueryAttention
                         with separate Q, K, V (do_rotary=0); float16 weights, activations and cache
    gemma2_genai         Gemma2ForCausalLM, -p fp32 -e cpu --extra_options windowed_kv_cache=false:
                         GroupQueryAttention with softcap and, on its sliding-window layer,
                         local_window_size
    llama_genai_int4     -p int4 -e cpu: MatMulNBits (untied embeddings: a float Gather)
    gemma2_genai_windowed_cache  gemma2 with the builder's default windowed cache for the sliding-window
                         layer (GroupQueryAttention's sliding_window_cache=1), which relaxweb refuses

``--write-test-data`` copies the builder's decoders written (NAME.onnx and NAME.json, each under
1 MB) to ``tests/data/genai-decoders/``, where ``tests/e2e/test_optimized_models.py`` reads them:
exporting them there took CI about 40 s of CPU time.  Fixed seeds: the same package versions
write the same bytes.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import io
import json
import shutil
import subprocess
import sys
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
GENAI_TEST_DATA = ROOT / "tests" / "data" / "genai-decoders"
MAX_COMMITTED_BYTES = 1 << 20
SEED = 0
VOCAB = 128
HIDDEN, HEADS = 64, 4


@dataclass
class Spec:
    name: str
    build: Callable  # () -> (torch module, input specs, output names)
    model_type: str = "bert"
    options: dict = field(default_factory=dict)  # FusionOptions attributes
    opt_level: int = 0
    only_onnxruntime: bool = False  # onnxruntime's graph optimizations alone, none of them disabled
    float16: bool = False
    float16_io: bool = False  # float16 inputs and outputs too (else they stay float32, Casts inside)
    # onnxruntime's CPU provider has no kernel for an op the optimizer writes (BiasSplitGelu, BiasAdd):
    # the export before optimization is kept (NAME.reference.onnx) as the reference, the same function
    reference_is_raw: bool = False


def _seed() -> None:
    import torch

    torch.manual_seed(SEED)
    np.random.seed(SEED)


def _noisy(model):
    """Biases start at 0 and norm weights at 1, which would hide a dropped bias or scale."""
    import torch

    with torch.no_grad():
        for parameter in model.parameters():
            if parameter.numel() > 1 and bool(parameter.min() == parameter.max()):
                parameter.add_(torch.randn_like(parameter) * 0.1)
    return model


def _eager(config):
    with contextlib.suppress(Exception):
        config._attn_implementation = "eager"
    return config


TOKENS = [{"name": "input_ids", "dtype": "int64", "dims": ["batch", "seq"], "kind": "ids", "high": VOCAB}]
MASK = [{"name": "attention_mask", "dtype": "int64", "dims": ["batch", "seq"], "kind": "mask"}]


def _wrap(inner, with_mask: bool):
    import torch

    class Wrapper(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = inner

        def forward(self, input_ids, attention_mask=None):
            if attention_mask is None:
                attention_mask = torch.ones_like(input_ids)
            return self.model(input_ids=input_ids, attention_mask=attention_mask, return_dict=False)[0]

    return Wrapper().eval(), TOKENS + (MASK if with_mask else []), ["last_hidden_state"]


def bert():
    from transformers import BertConfig, BertModel

    _seed()
    config = _eager(BertConfig(vocab_size=VOCAB, hidden_size=HIDDEN, num_hidden_layers=2, num_attention_heads=HEADS,
                               intermediate_size=128, max_position_embeddings=128, type_vocab_size=2,
                               hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0))
    return _wrap(_noisy(BertModel(config, add_pooling_layer=False).eval()), True)


def distilbert():
    from transformers import DistilBertConfig, DistilBertModel

    _seed()
    config = _eager(DistilBertConfig(vocab_size=VOCAB, dim=HIDDEN, n_layers=2, n_heads=HEADS, hidden_dim=128,
                                     max_position_embeddings=128, dropout=0.0, attention_dropout=0.0))
    return _wrap(_noisy(DistilBertModel(config).eval()), True)


def gpt2():
    from transformers import GPT2Config, GPT2Model

    _seed()
    config = _eager(GPT2Config(vocab_size=VOCAB, n_positions=128, n_embd=HIDDEN, n_layer=2, n_head=HEADS,
                               resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, use_cache=False))
    return _wrap(_noisy(GPT2Model(config).eval()), False)


def llama():
    from transformers import LlamaConfig, LlamaModel

    _seed()
    config = _eager(LlamaConfig(vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=128, num_hidden_layers=2,
                                num_attention_heads=HEADS, num_key_value_heads=2, max_position_embeddings=128,
                                use_cache=False))
    return _wrap(_noisy(LlamaModel(config).eval()), False)


def clip_text():
    from transformers import CLIPTextConfig, CLIPTextModel

    _seed()
    config = _eager(CLIPTextConfig(vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=128, num_hidden_layers=2,
                                   num_attention_heads=HEADS, max_position_embeddings=128, hidden_act="quick_gelu"))
    return _wrap(_noisy(CLIPTextModel(config).eval()), False)


def geglu_block():
    """A diffusion transformer's feed-forward block: ``y = x + h``, layer norm, GEGLU (a
    projection halved: ``a * gelu(gate)``), a projection back, plus ``y``."""
    import torch.nn.functional as F
    from torch import nn

    class Geglu(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.norm = nn.LayerNorm(HIDDEN)
            self.project_in = nn.Linear(HIDDEN, 8 * HIDDEN)
            self.project_out = nn.Linear(4 * HIDDEN, HIDDEN)

        def forward(self, x, h):
            y = x + h
            values, gate = self.project_in(self.norm(y)).chunk(2, dim=-1)
            return self.project_out(values * F.gelu(gate)) + y

    _seed()
    features = [{"name": name, "dtype": "float32", "dims": ["batch", "seq", HIDDEN], "kind": "normal"} for name in ("x", "h")]
    return _noisy(Geglu().eval()), features, ["y"]


def cnn():
    import torch
    from torch import nn

    _seed()
    model = nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(8, 16, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, 10),
        nn.Softmax(dim=-1),
    )
    with torch.no_grad():
        model[1].running_mean.uniform_(-0.5, 0.5)
        model[1].running_var.uniform_(0.5, 1.5)
    return model.eval(), [{"name": "x", "dtype": "float32", "dims": ["batch", 3, "height", "width"], "kind": "normal"}], ["probabilities"]


SPECS = {spec.name: spec for spec in [
    Spec("bert", bert),
    Spec("bert_mha_gelu", bert, options={"use_multi_head_attention": True, "enable_bias_gelu": False}),
    Spec("bert_fast_gelu", bert, options={"enable_gelu_approximation": True}),
    Spec("distilbert", distilbert),
    Spec("gpt2", gpt2, model_type="gpt2"),
    Spec("llama", llama, model_type="gpt2"),
    Spec("llama_ort_optimized", llama, model_type="gpt2", opt_level=2),
    Spec("bert_fused_matmul", bert, opt_level=2, only_onnxruntime=True),
    Spec("geglu_unet", geglu_block, model_type="unet", options={"enable_bias_add": True}, reference_is_raw=True),
    Spec("clip_text", clip_text, model_type="clip"),
    Spec("bert_fp16", bert, float16=True),
    Spec("gpt2_fp16", gpt2, model_type="gpt2", float16=True),
    Spec("cnn", cnn, model_type="none"),
    Spec("cnn_fp16", cnn, model_type="none", float16=True),
    Spec("gpt2_fp16_io", gpt2, model_type="gpt2", float16=True, float16_io=True),
]}


GENAI_LAYERS, GENAI_KV_HEADS = 2, 2


def llama_for_causal_lm():
    from transformers import LlamaConfig, LlamaForCausalLM

    return LlamaForCausalLM(LlamaConfig(**_decoder_sizes()))


def gemma2_for_causal_lm():
    """Gemma 2: attention logits soft-capped, every other layer a sliding window of 4 keys."""
    from transformers import Gemma2Config, Gemma2ForCausalLM

    return Gemma2ForCausalLM(Gemma2Config(head_dim=HIDDEN // HEADS, sliding_window=4, attn_logit_softcapping=5.0,
                                          final_logit_softcapping=None, **_decoder_sizes()))


def _decoder_sizes() -> dict:
    """``intermediate_size`` differs from ``VOCAB``: the builder takes every Linear with ``VOCAB``
    outputs for the LM head."""
    return dict(vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=96, num_hidden_layers=GENAI_LAYERS,
                num_attention_heads=HEADS, num_key_value_heads=GENAI_KV_HEADS, max_position_embeddings=128,
                initializer_range=0.2)


@dataclass
class GenaiSpec:
    """A decoder written by onnxruntime-genai's model builder (the CLI's -p, -e and --extra_options)."""
    name: str
    build: Callable  # () -> a transformers ...ForCausalLM
    precision: str
    provider: str
    extra_options: dict = field(default_factory=dict)


GENAI_SPECS = {spec.name: spec for spec in [
    GenaiSpec("llama_genai", llama_for_causal_lm, "fp32", "cpu"),
    GenaiSpec("llama_genai_rotary", llama_for_causal_lm, "fp16", "dml"),
    GenaiSpec("gemma2_genai", gemma2_for_causal_lm, "fp32", "cpu", {"windowed_kv_cache": "false"}),
    # what relaxweb refuses, naming it: int4 weights (MatMulNBits), the sliding-window cache
    GenaiSpec("llama_genai_int4", llama_for_causal_lm, "int4", "cpu"),
    GenaiSpec("gemma2_genai_windowed_cache", gemma2_for_causal_lm, "fp32", "cpu"),
]}


def save_for_causal_lm(spec: GenaiSpec, folder: Path) -> None:
    """The model (random weights) and a word-level tokenizer, as ``save_pretrained`` writes them."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    _seed()
    _noisy(spec.build().eval()).save_pretrained(folder)
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, **{f"t{i}": i for i in range(3, VOCAB)}}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=tokenizer, unk_token="<unk>", bos_token="<s>", eos_token="</s>").save_pretrained(folder)


def export_genai(spec: GenaiSpec, out_dir: Path) -> dict:
    """Run the model builder on a saved ...ForCausalLM; NAME.onnx keeps its weights inline."""
    import onnx

    hf_dir, built = out_dir / f"{spec.name}.hf", out_dir / f"{spec.name}.genai"
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        warnings.simplefilter("ignore")
        save_for_causal_lm(spec, hf_dir)
    command = [sys.executable, "-m", "onnxruntime_genai.models.builder", "-i", str(hf_dir), "-o", str(built),
               "-p", spec.precision, "-e", spec.provider, "-c", str(out_dir / "genai-cache")]
    if spec.extra_options:
        command += ["--extra_options", *(f"{key}={value}" for key, value in spec.extra_options.items())]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"the model builder failed: {(done.stderr or done.stdout).strip().splitlines()[-1:]}")
    model = onnx.load(str(built / "model.onnx"))  # with its external data
    onnx.save(model, str(out_dir / f"{spec.name}.onnx"))
    shutil.rmtree(built)
    ops = collections.Counter(n.op_type if n.domain in ("", "ai.onnx") else f"{n.domain}.{n.op_type}" for n in model.graph.node)
    float_type = "float16" if spec.precision == "fp16" else "float32"  # int4: float32 activations
    sidecar = {"name": spec.name, "builder": {"precision": spec.precision, "provider": spec.provider,
                                              "extra_options": spec.extra_options},
               "reference": f"{spec.name}.onnx", "inputs": [i.name for i in model.graph.input],
               "outputs": [o.name for o in model.graph.output], "op_types": dict(sorted(ops.items())),
               "decoder": {"layers": GENAI_LAYERS, "kv_heads": GENAI_KV_HEADS, "head_size": HIDDEN // HEADS,
                           "vocab": VOCAB, "float_type": float_type}}
    (out_dir / f"{spec.name}.json").write_text(json.dumps(sidecar, indent=1) + "\n")
    return sidecar


def decoder_feeds(info: dict, tokens: np.ndarray, lengths: list[int], past: dict | None,
                  filled: list[int]) -> dict[str, np.ndarray]:
    """One step of a builder-written decoder (the tests use this too): ``tokens`` ``[batch, seq]``
    are the new tokens, of which entry ``b`` really has the first ``lengths[b]`` (the rest is right
    padding, masked out); ``past`` is the previous step's outputs (None on the prompt), whose cache
    holds ``filled[b]`` real rows for entry ``b``: its new tokens go at positions ``filled[b]`` on."""
    decoder = info["decoder"]
    batch, seq = tokens.shape
    past_length = 0 if past is None else past["present.0.key"].shape[2]
    mask = np.zeros((batch, past_length + seq), dtype=np.int64)
    for row, (before, length) in enumerate(zip(filled, lengths)):
        mask[row, :before + length] = 1
    feeds = {"input_ids": tokens.astype(np.int64), "attention_mask": mask}
    if "position_ids" in info["inputs"]:
        feeds["position_ids"] = (np.array(filled)[:, None] + np.arange(seq)).astype(np.int64)
    for layer in range(decoder["layers"]):
        for part in ("key", "value"):
            empty = np.zeros((batch, decoder["kv_heads"], 0, decoder["head_size"]), dtype=decoder["float_type"])
            feeds[f"past_key_values.{layer}.{part}"] = empty if past is None else past[f"present.{layer}.{part}"]
    return feeds


def make_inputs(inputs: list[dict], dims: dict[str, int], seed: int = 0) -> dict[str, np.ndarray]:
    """Inputs for the given values of the symbolic dims (the tests use this too)."""
    rng = np.random.default_rng(seed)
    arrays = {}
    for spec in inputs:
        shape = tuple(dims[d] if isinstance(d, str) else int(d) for d in spec["dims"])
        if spec["kind"] == "ids":
            arrays[spec["name"]] = rng.integers(0, spec["high"], size=shape).astype(spec["dtype"])
        elif spec["kind"] == "mask":
            mask = np.ones(shape, dtype=spec["dtype"])
            for row in range(shape[0]):  # every row keeps its first token; later rows get a padded tail
                pad = min(row, shape[-1] - 1)
                if pad:
                    mask[row, shape[-1] - pad:] = 0
            arrays[spec["name"]] = mask
        else:
            arrays[spec["name"]] = rng.standard_normal(shape).astype(spec["dtype"])
    return arrays


def export(spec: Spec, out_dir: Path) -> dict:
    import onnx
    import torch

    model, inputs, outputs = spec.build()
    example_dims = {"batch": 2, "seq": 7, "height": 16, "width": 16}
    example = make_inputs(inputs, example_dims)
    raw = out_dir / f"{spec.name}.raw.onnx"
    dynamic_axes = {i["name"]: {a: d for a, d in enumerate(i["dims"]) if isinstance(d, str)} for i in inputs}
    for name in outputs:
        dynamic_axes[name] = {0: "batch"} if spec.model_type == "none" else {0: "batch", 1: "seq"}
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")
        torch.onnx.export(model, tuple(torch.from_numpy(example[i["name"]]) for i in inputs), str(raw), dynamo=False,
                          input_names=[i["name"] for i in inputs], output_names=outputs, dynamic_axes=dynamic_axes,
                          opset_version=17, do_constant_folding=True)
        optimized = _optimize(spec, raw)
        if spec.float16:
            optimized.convert_float_to_float16(keep_io_types=not spec.float16_io)
    path = out_dir / f"{spec.name}.onnx"
    optimized.save_model_to_file(str(path))
    if spec.reference_is_raw:
        raw.replace(out_dir / f"{spec.name}.reference.onnx")
    else:
        raw.unlink()
    written = onnx.load(str(path))
    ops = collections.Counter(n.op_type if n.domain in ("", "ai.onnx") else f"{n.domain}.{n.op_type}" for n in written.graph.node)
    sidecar = {"name": spec.name, "model_type": spec.model_type, "options": spec.options, "opt_level": spec.opt_level,
               "only_onnxruntime": spec.only_onnxruntime, "float16": spec.float16, "float16_io": spec.float16_io,
               "reference": f"{spec.name}.reference.onnx" if spec.reference_is_raw else f"{spec.name}.onnx",
               "inputs": inputs, "outputs": outputs, "op_types": dict(sorted(ops.items()))}
    (out_dir / f"{spec.name}.json").write_text(json.dumps(sidecar, indent=1) + "\n")
    return sidecar


def _optimize(spec: Spec, raw: Path):
    """The optimizer's OnnxModel (for the CNN, the export as one: no fusions apply)."""
    import onnx
    from onnxruntime.transformers.fusion_options import FusionOptions
    from onnxruntime.transformers.onnx_model import OnnxModel
    from onnxruntime.transformers.optimizer import optimize_model

    if spec.model_type == "none":
        return OnnxModel(onnx.load(str(raw)))
    options = FusionOptions(spec.model_type)
    for key, value in spec.options.items():
        setattr(options, key, value)
    return optimize_model(str(raw), model_type=spec.model_type, num_heads=HEADS, hidden_size=HIDDEN,
                          optimization_options=options, opt_level=spec.opt_level, use_gpu=False,
                          only_onnxruntime=spec.only_onnxruntime)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--only", action="append", default=[], metavar="NAME",
                        help="one of: " + ", ".join([*SPECS, *GENAI_SPECS]))
    parser.add_argument("--write-test-data", action="store_true",
                        help=f"copy the builder's decoders written (each < 1 MB) to {GENAI_TEST_DATA.relative_to(ROOT)}")
    args = parser.parse_args(argv)
    names = args.only or list(SPECS)  # the builder's decoders only when asked for: it is an optional install
    unknown = [n for n in names if n not in SPECS and n not in GENAI_SPECS]
    if unknown:
        parser.error(f"unknown model(s): {', '.join(unknown)}")
    args.out_dir.mkdir(parents=True, exist_ok=True)
    failed = 0
    for name in names:
        try:
            sidecar = export(SPECS[name], args.out_dir) if name in SPECS else export_genai(GENAI_SPECS[name], args.out_dir)
        except Exception as error:  # noqa: BLE001 - reported per model
            failed += 1
            print(f"{name}: FAILED ({type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''})")
            continue
        contrib = {k: v for k, v in sidecar["op_types"].items() if "." in k or k == "SimplifiedLayerNormalization"}
        print(f"{name}: {contrib}")
        if args.write_test_data and name in GENAI_SPECS:
            write_test_data(args.out_dir, name)
    return 1 if failed else 0


def write_test_data(out_dir: Path, name: str) -> None:
    """NAME.onnx and NAME.json into tests/data/genai-decoders/ (refused above 1 MB)."""
    size = (out_dir / f"{name}.onnx").stat().st_size
    if size > MAX_COMMITTED_BYTES:
        raise SystemExit(f"error: {name}.onnx is {size} bytes, over the {MAX_COMMITTED_BYTES} committed at most")
    GENAI_TEST_DATA.mkdir(parents=True, exist_ok=True)
    for suffix in (".onnx", ".json"):
        shutil.copyfile(out_dir / f"{name}{suffix}", GENAI_TEST_DATA / f"{name}{suffix}")


if __name__ == "__main__":
    sys.exit(main())
