#!/usr/bin/env python3
"""Measure compressed weights on language models: bundle bytes and top-1 token agreement.

    python3 scripts/measure_quantization.py                     # tiny-llama and gpt2-random, 200 steps
    python3 scripts/measure_quantization.py --models tiny-llama --steps 30
    python3 scripts/measure_quantization.py --sensitivity       # + int4 variants on the tiny Llama
    python3 scripts/measure_quantization.py --json out.json     # the results as JSON too

For each model it builds float32, float16, int8 and int4 bundles (``relaxweb.build(...,
weights=...)``, group size 32, float16 scales: the defaults) and reports their weight bytes (the
sum of the shard files) and the ratio of each to the float32 bundle's.  Then:

- the reference: the float32 ONNX model's greedy continuation of a prompt (``--steps`` new
  tokens), computed by onnxruntime with its KV cache (each step's present fed back as past);
- **teacher-forced top-1 agreement** (the standard definition, the figure the goals are about):
  the compressed model decodes the same sequence one token at a time with its own KV cache,
  each step fed the *reference's* token; the step agrees when its argmax is the reference's
  next token;
- **free-running greedy agreement** (labelled as such): the compressed model generates on its
  own from the prompt; the fraction of the positions where its token equals the reference's,
  and the first step where they differ (after it the two texts go separate ways, so this
  figure falls with any early divergence and says less about the weights than the first one);
- the float32 top-1 minus top-2 logit margins along the reference, and each compressed
  model's largest logit error at each step (teacher-forced inputs are the same, so the logits
  compare directly): a step can flip only where its margin is below twice the error.

"The compressed model" is run two ways.  (1) onnxruntime on the ONNX model whose packed
weights are replaced by the float32 values the bundle's kernels decode
(``compress_weights.dequantized``: the pass's own packing, then ``unpack_weights``'s
reference), over all the steps; (2) the bundle itself on relaxweb's Python runtime (wgpu;
lavapipe here), over all the steps for the tiny Llama and ``--gpt2-gpu-steps`` for GPT-2
(12-35 s a step on lavapipe: a one-row matmul runs the 64-row tiles), with the largest
difference between its logits and (1)'s at the same steps: float32 rounding (~1e-5) shows that
(1) computes what the bundle computes, and (1) gives the 200-step figures where (2) cannot.

Models:

- ``tiny-llama``: ``scripts/tiny_llama.py``'s decoder (0.8M parameters, trained on the
  Python documentation's topics, a byte tokenizer), prompted with a sentence in the style of
  that text that is not in it;
- ``gpt2-random``: a GPT-2-small-shaped decoder (12 layers, hidden 768, 12 heads, vocab
  50257, context 1024, 124M parameters; GPT-2's architecture and initialisation: normal
  std 0.02, the residual projections 0.02 / sqrt(2 * layers), the LM head tied to the token
  embedding) with **random weights**: no pretrained weights can be downloaded here.  Exported
  with the same decoder signature (optimum's: input_ids, attention_mask, position_ids,
  past_key_values.{i}.key/value -> logits, present.{i}.key/value).  Its float32 bundle is built
  and measured in bytes but not run (its 154 MB embedding is above lavapipe's 128 MiB binding
  limit); onnxruntime gives its reference;
- ``gpt2-random-untied`` (not in the default run): the same with an LM head of its own (random
  like the rest), whose logits are near-flat noise: the case of tiny logit margins.

Exports are cached under ``.cache/measure-quantization/`` (never committed); bundles are
rebuilt each run into a temporary folder and removed as soon as measured.
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
import onnxruntime
import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
import tiny_llama  # noqa: E402  (scripts/tiny_llama.py: the model, its feeds and greedy loop)

import relaxweb  # noqa: E402
from relaxweb.ops.packed_weights import FORMAT_BITS  # noqa: E402
from relaxweb.passes.compress_weights import MIN_ELEMENTS, dequantized  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
CACHE = ROOT / ".cache" / "measure-quantization"
FORMATS = ("float32", "float16", "int8", "int4")
COMPRESSED = FORMATS[1:]
GOALS = {"int8": {"bytes": 0.27, "agreement": 0.99}, "int4": {"bytes": 0.17, "agreement": 0.90}}

# In the style of pydoc_data's topics (the language reference), written for this measurement:
# not a sentence of the training text.
TINY_LLAMA_PROMPT = "The while statement is used for repeated execution as long as an expression"
# The random model's prompt: any token ids do (its continuation has no meaning).
GPT2_PROMPT_IDS = [464, 1332, 2643, 318, 973, 329, 9341, 9706, 355, 890, 355, 281, 5408]


# A GPT-2-small-shaped decoder with a KV cache -----------------------------------------------


@dataclass(frozen=True)
class GPT2Config:
    """GPT-2 small's shape.  ``kv_heads``, ``head_dim`` and ``layers`` are what
    ``tiny_llama.decoder_feeds`` reads to make a step's feeds."""

    vocab: int = 50257
    dim: int = 768
    layers: int = 12
    heads: int = 12
    context: int = 1024
    init_std: float = 0.02
    tied: bool = True  # the LM head is the token embedding (GPT-2's); False: a head of its own
    seed: int = 0

    @property
    def kv_heads(self) -> int:
        return self.heads

    @property
    def head_dim(self) -> int:
        return self.dim // self.heads


class GPT2Block(nn.Module):
    def __init__(self, config: GPT2Config):
        super().__init__()
        self.heads, self.head_dim = config.heads, config.head_dim
        self.ln_1, self.ln_2 = nn.LayerNorm(config.dim), nn.LayerNorm(config.dim)
        self.c_attn = nn.Linear(config.dim, 3 * config.dim)
        self.attn_proj = nn.Linear(config.dim, config.dim)
        self.c_fc = nn.Linear(config.dim, 4 * config.dim)
        self.mlp_proj = nn.Linear(4 * config.dim, config.dim)

    def forward(self, x, mask, past_key, past_value):
        batch, sequence, dim = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(dim, dim=2)
        q, k, v = (t.view(batch, sequence, self.heads, self.head_dim).transpose(1, 2) for t in (q, k, v))
        key, value = torch.cat((past_key, k), dim=2), torch.cat((past_value, v), dim=2)
        scores = torch.matmul(q, key.transpose(2, 3)) / math.sqrt(self.head_dim) + mask
        attended = torch.matmul(torch.softmax(scores, dim=-1), value).transpose(1, 2).reshape(batch, sequence, dim)
        x = x + self.attn_proj(attended)
        return x + self.mlp_proj(nn.functional.gelu(self.c_fc(self.ln_2(x)), approximate="tanh")), key, value


class GPT2(nn.Module):
    """GPT-2 (pre-norm blocks, learned positions, tanh GELU, tied LM head) with the decoder
    signature of ``tiny_llama.TinyLlama``: ``forward(input_ids, attention_mask, position_ids,
    past_key_values) -> (logits, presents)``."""

    def __init__(self, config: GPT2Config):
        super().__init__()
        self.config = config
        self.wte, self.wpe = nn.Embedding(config.vocab, config.dim), nn.Embedding(config.context, config.dim)
        self.blocks = nn.ModuleList(GPT2Block(config) for _ in range(config.layers))
        self.ln_f = nn.LayerNorm(config.dim)
        self.lm_head = None if config.tied else nn.Linear(config.dim, config.vocab, bias=False)
        generator = torch.Generator().manual_seed(config.seed)
        for name, parameter in self.named_parameters():  # transformers' GPT2PreTrainedModel._init_weights
            if name.endswith("bias"):
                nn.init.zeros_(parameter)
            elif "ln_" in name:
                nn.init.ones_(parameter)
            else:
                std = config.init_std / math.sqrt(2 * config.layers) if name.endswith("proj.weight") else config.init_std
                nn.init.normal_(parameter, 0.0, std, generator=generator)

    def forward(self, input_ids, attention_mask, position_ids, past_key_values):
        x = self.wte(input_ids) + self.wpe(position_ids)
        past, total = past_key_values[0].shape[2], attention_mask.shape[1]
        causal = torch.arange(total)[None, :] <= torch.arange(input_ids.shape[1])[:, None] + past
        allowed = causal[None, None] & attention_mask[:, None, None, :].bool()
        mask = torch.where(allowed, 0.0, torch.finfo(torch.float32).min)
        presents = []
        for index, block in enumerate(self.blocks):
            x, key, value = block(x, mask, past_key_values[2 * index], past_key_values[2 * index + 1])
            presents += [key, value]
        head = self.wte.weight if self.lm_head is None else self.lm_head.weight
        return torch.matmul(self.ln_f(x), head.t()), presents


def gpt2_path(config: GPT2Config = GPT2Config(), log=print) -> Path:
    """The random GPT-2-small-shaped model exported once into the cache."""
    path = CACHE / f"gpt2-random{'' if config.tied else '-untied'}-seed{config.seed}" / "model.onnx"
    if not path.exists():
        log(f"exporting {path.relative_to(ROOT)} (124M parameters, random) ...")
        torch.manual_seed(config.seed)
        tiny_llama.export(GPT2(config).eval(), path)  # the same signature, axes and opset
        model = onnx.load(str(path))
        del model.metadata_props[:]  # the export wrote the tiny Llama's byte tokenizer: not this model's
        onnx.save(model, str(path))
    return path


# Decoding ----------------------------------------------------------------------------------------


class Decoder:
    """One batch-1 decode: a run function (onnxruntime or a relaxweb session) and its cache."""

    def __init__(self, run, config, prompt: list[int]):
        self.run, self.config = run, config
        self.outputs = run(tiny_llama.decoder_feeds(config, prompt, 0, None))
        self.position = len(prompt)

    @property
    def logits(self) -> np.ndarray:
        return self.outputs["logits"][0, -1]

    def step(self, token: int) -> None:
        past = [self.outputs[name] for name in tiny_llama.past_names(self.config, "present")]
        self.outputs = self.run(tiny_llama.decoder_feeds(self.config, [token], self.position, past))
        self.position += 1

    def fork(self) -> "Decoder":
        """A decoder that goes on from this one's state (steps replace ``outputs``, never change it)."""
        return copy.copy(self)


def reference_run(run, config, prompt: list[int], steps: int) -> dict:
    """The float32 greedy continuation, each step's top-1 - top-2 margin, and its logits."""
    decoder = Decoder(run, config, prompt)
    tokens, margins, logits = [], [], []
    for step in range(steps):
        row = decoder.logits.astype(np.float64)
        top2 = np.partition(row, -2)[-2:]
        tokens.append(int(row.argmax()))
        margins.append(float(top2[1] - top2[0]))
        logits.append(decoder.logits.copy())
        if step + 1 < steps:
            decoder.step(tokens[-1])
    return {"tokens": tokens, "margins": margins, "logits": logits}


def agreement_run(run, config, prompt: list[int], reference: dict, steps: int | None = None) -> dict:
    """Teacher-forced agreement with ``reference`` over its first ``steps`` steps (each fed the
    reference's token), the logits of each step, and the free-running greedy agreement: the
    teacher-forced run is the free run up to the first disagreement, where the free run forks and
    goes on alone."""
    expected = reference["tokens"][:steps]
    steps = len(expected)
    decoder = Decoder(run, config, prompt)
    tokens, logits, fork, fork_step = [], [], None, None
    for step in range(steps):
        tokens.append(int(decoder.logits.argmax()))
        logits.append(decoder.logits.copy())
        if fork is None and tokens[-1] != expected[step]:
            fork, fork_step = decoder.fork(), step
        if step + 1 < steps:
            decoder.step(expected[step])
    free = list(expected) if fork_step is None else expected[:fork_step] + free_run(fork, steps - fork_step)
    return {"tokens": tokens, "logits": logits, "steps": steps,
            "agreement": float(np.mean(np.equal(tokens, expected))),
            "free_agreement": float(np.mean(np.equal(free, expected))),
            "first_divergence": fork_step, "free_tokens": free}


def free_run(decoder: Decoder, steps: int) -> list[int]:
    tokens = []
    for step in range(steps):
        tokens.append(int(decoder.logits.argmax()))
        if step + 1 < steps:
            decoder.step(tokens[-1])
    return tokens


# Measuring one model -----------------------------------------------------------------------------


def weight_bytes(folder: Path) -> int:
    return sum(f.stat().st_size for f in (folder / "weights").glob("shard*.bin"))


def bounds_for(prompt: list[int], steps: int) -> dict[str, int]:
    total = len(prompt) + steps
    return {"batch_size": 1, "sequence_length": len(prompt), "past_sequence_length": total,
            "total_sequence_length": total}


@dataclass(frozen=True)
class Packing:
    """One weight's compression: ``relaxweb build --weights format --group-size --scale-dtype``."""

    format: str
    group_size: int = 32
    scale_dtype: str = "float16"

    def bytes_per_weight(self) -> float:
        """Packed bytes per value: the value, its share of a scale and (int4) of a zero point."""
        if self.format in ("float32", "float16"):
            return {"float32": 4.0, "float16": 2.0}[self.format]
        bits = FORMAT_BITS[self.format]
        scale = {"float16": 2, "float32": 4}[self.scale_dtype]
        return bits / 8 + (scale + (bits / 8 if self.format == "int4" else 0)) / self.group_size


def with_bundle_weights(path: Path, packing) -> tuple[onnx.ModelProto, float]:
    """The ONNX model with each weight that compression packs replaced by the float32 values the
    bundle's kernels decode (``compress_weights.dequantized``, along the pass's axis: a MatMul's
    second input along its rows, a 2-d Gather table along its columns), and the weight bytes
    that packing gives (estimated per value: :meth:`Packing.bytes_per_weight`).  ``packing`` is a
    :class:`Packing` for every weight, or a function of the reading node's name giving one (the
    sensitivity study compresses one family of weights differently; a bundle has one packing)."""
    choose = packing if callable(packing) else (lambda node_name: packing)
    model = onnx.load(str(path))
    axes: dict[str, tuple[int, str]] = {}
    for node in model.graph.node:
        attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
        if node.op_type == "MatMul":
            axes.setdefault(node.input[1], (-2, node.name))
        elif node.op_type == "Gather" and attrs.get("axis", 0) == 0:
            axes.setdefault(node.input[0], (1, node.name))
        elif node.op_type == "Conv":
            raise NotImplementedError("convolution weights: not needed for these decoders")
    total = 0.0
    for initializer in model.graph.initializer:
        data = onnx.numpy_helper.to_array(initializer)
        axis, reader = axes.get(initializer.name, (None, None))
        if (axis is not None and data.dtype == np.float32 and data.size >= MIN_ELEMENTS
                and (data.ndim == 2 or (data.ndim > 2 and axis == -2))):
            chosen = choose(reader)
            total += data.size * chosen.bytes_per_weight()
            if chosen.format != "float32":
                decoded = dequantized(data, chosen.format, axis % data.ndim, chosen.group_size, chosen.scale_dtype)
                initializer.CopyFrom(onnx.numpy_helper.from_array(decoded, initializer.name))
        else:
            total += data.nbytes
    return model, total


def onnxruntime_runner(model: onnx.ModelProto):
    session = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    names = [output.name for output in session.get_outputs()]
    return lambda feeds: dict(zip(names, session.run(None, feeds)))


def compare(measured: dict, reference: dict) -> dict:
    """A run's figures against the reference: agreement, and the logit error at each step."""
    errors = np.array([np.abs(a - b).max() for a, b in zip(measured.pop("logits"), reference["logits"])])
    margins = np.array(reference["margins"][:len(errors)])
    return measured | {"logit_error_quantiles": quantiles(errors),
                       "steps_with_margin_below_twice_the_error": int(np.sum(margins < 2 * errors))}


def measure_model(name: str, path: Path, config, prompt: list[int], steps: int, gpu_steps: int,
                  gpu_formats: tuple[str, ...], work: Path, device=None, log=print) -> dict:
    """Bytes of each format's bundle; agreement over ``steps`` of onnxruntime with each compressed
    bundle's weights; agreement over ``gpu_steps`` of the bundles of ``gpu_formats`` on relaxweb's
    Python runtime, and their largest logit difference from onnxruntime with the same weights."""
    result = {"model": name, "onnx": str(path.relative_to(ROOT)), "prompt_tokens": len(prompt), "steps": steps,
              "gpu_steps": gpu_steps, "formats": {}}
    started = time.perf_counter()
    reference = reference_run(onnxruntime_runner(onnx.load(str(path))), config, prompt, steps)
    log(f"{name}: float32 reference from onnxruntime, {steps} steps in {time.perf_counter() - started:.1f} s")
    result["reference"] = {"tokens": reference["tokens"], "margin_quantiles": quantiles(np.array(reference["margins"]))}
    for fmt in FORMATS:
        started = time.perf_counter()
        bundle = relaxweb.build(path, work / f"{name}-{fmt}", bounds=bounds_for(prompt, steps), weights=fmt)
        entry = {"weight_bytes": weight_bytes(bundle.path)}
        log(f"{name} {fmt}: built in {time.perf_counter() - started:.1f} s, {entry['weight_bytes']:,} weight bytes")
        if fmt != "float32":
            started = time.perf_counter()
            runner = onnxruntime_runner(with_bundle_weights(path, Packing(fmt))[0])
            quantized = agreement_run(runner, config, prompt, reference)
            entry["onnxruntime"] = compare(quantized | {}, reference)
            log(f"{name} {fmt}: onnxruntime with the bundle's weights: teacher-forced agreement "
                f"{quantized['agreement']:.1%}, free-running {quantized['free_agreement']:.1%} (first divergence "
                f"{quantized['first_divergence']}), {time.perf_counter() - started:.1f} s")
        if fmt in gpu_formats:
            started = time.perf_counter()
            gpu = agreement_run(relaxweb.load(bundle.path, device=device).run, config, prompt, reference, gpu_steps)
            if fmt != "float32":
                entry["gpu_vs_onnxruntime_logits"] = float(max(np.abs(a - b).max() for a, b in
                                                                zip(gpu["logits"], quantized["logits"])))
            entry["gpu"] = compare(gpu, reference)
            log(f"{name} {fmt}: relaxweb (wgpu) teacher-forced agreement {gpu['agreement']:.1%} over {gpu['steps']} "
                f"steps, free-running {gpu['free_agreement']:.1%}, {time.perf_counter() - started:.1f} s")
        result["formats"][fmt] = entry
        shutil.rmtree(bundle.path)  # the bundles are large: each is removed when measured
    full = result["formats"]["float32"]["weight_bytes"]
    for entry in result["formats"].values():
        entry["bytes_ratio"] = entry["weight_bytes"] / full
    return result


# The tiny Llama's weight families, by a part of their reading node's name (torch's module path).
FAMILIES = {"the embedding": "embed_tokens", "the LM head": "lm_head", "attention": "self_attn", "the MLPs": "mlp"}


def sensitivity(path: Path, config, prompt: list[int], reference: dict, log=print) -> list[dict]:
    """int4 variants, each run by onnxruntime with the weights it decodes: other group sizes,
    float32 scales, and each family of weights kept at int8 (the others int4).  Bytes are
    estimated per value (:meth:`Packing.bytes_per_weight`), as a ratio to float32's."""
    variants = [("int4, group 32, float16 scales (the default)", Packing("int4")),
                ("int4, group 16", Packing("int4", 16)), ("int4, group 64", Packing("int4", 64)),
                ("int4, float32 scales", Packing("int4", scale_dtype="float32"))]
    for family, part in FAMILIES.items():
        variants.append((f"int4, {family} int8",
                         lambda node_name, part=part: Packing("int8" if part in node_name else "int4")))
    full = with_bundle_weights(path, Packing("float32"))[1]
    rows = []
    for label, packing in variants:
        model, size = with_bundle_weights(path, packing)
        run = agreement_run(onnxruntime_runner(model), config, prompt, reference)
        rows.append({"variant": label, "bytes_ratio": size / full, "agreement": run["agreement"],
                     "free_agreement": run["free_agreement"], "first_divergence": run["first_divergence"]})
        log(f"sensitivity: {label}: {rows[-1]['bytes_ratio']:.3f}x, teacher-forced {run['agreement']:.1%}")
    return rows


def sensitivity_table(rows: list[dict]) -> str:
    lines = ["variant (onnxruntime, tiny-llama)                    bytes (est.)  teacher  free  1st diff", "-" * 90]
    for row in rows:
        first = "-" if row["first_divergence"] is None else str(row["first_divergence"])
        lines.append(f"{row['variant']:<52} {row['bytes_ratio']:>8.3f}x  {row['agreement']:>7.1%} "
                     f"{row['free_agreement']:>6.1%} {first:>8}")
    return "\n".join(lines)


def quantiles(values: np.ndarray) -> dict[str, float]:
    return {f"p{q}": float(np.percentile(values, q)) for q in (0, 10, 50, 90, 100)}


def models(names: list[str], steps: int, gpt2_gpu_steps: int, log=print) -> list[tuple]:
    """(name, onnx path, config, prompt ids, GPU steps, formats run on the GPU) of each model."""
    chosen = []
    for name in names:
        if name == "tiny-llama":
            path = tiny_llama.tiny_llama_paths(log=log)["model"]
            chosen.append((name, path, tiny_llama.Config(), tiny_llama.encode(TINY_LLAMA_PROMPT), steps, FORMATS))
        elif name in ("gpt2-random", "gpt2-random-untied"):
            config = GPT2Config(tied=name == "gpt2-random")
            chosen.append((name, gpt2_path(config, log=log), config, GPT2_PROMPT_IDS, gpt2_gpu_steps,
                           COMPRESSED if gpt2_gpu_steps > 0 else ()))
    return chosen


# Report ------------------------------------------------------------------------------------------


def table(results: list[dict]) -> str:
    """One row per model and format: bytes, then onnxruntime with the bundle's weights over all
    steps, then the bundle itself on relaxweb's Python runtime over its GPU steps."""
    lines = [f"{'':<55}onnxruntime, the bundle's weights       relaxweb on wgpu",
             f"{'model':<18} weights    weight bytes  ratio  teacher   free  1st diff  error p50/max  "
             "steps teacher  vs ort",
             "-" * 118]
    for result in results:
        for fmt, entry in result["formats"].items():
            row = f"{result['model']:<18} {fmt:<8} {entry['weight_bytes']:>14,} {entry['bytes_ratio']:>6.3f}"
            if "onnxruntime" in entry:
                ort = entry["onnxruntime"]
                first = "-" if ort["first_divergence"] is None else str(ort["first_divergence"])
                error = ort["logit_error_quantiles"]
                row += (f" {ort['agreement']:>7.1%} {ort['free_agreement']:>6.1%} {first:>8}"
                        f"  {error['p50']:>6.3f}/{error['p100']:<6.3f}")
            else:
                row += f" {'(the reference)':>45}"
            if "gpu" in entry:
                versus = entry.get("gpu_vs_onnxruntime_logits")
                row += (f"  {entry['gpu']['steps']:>5} {entry['gpu']['agreement']:>7.1%}"
                        f"  {'-' if versus is None else f'{versus:.1e}'}")
            lines.append(row)
        margins = result["reference"]["margin_quantiles"]
        lines.append(f"{'':<18} float32 top-1 - top-2 logit margin over the {result['steps']} steps: "
                     + ", ".join(f"{q} {v:.3f}" for q, v in margins.items()))
    return "\n".join(lines)


def goals_met(results: list[dict]) -> list[str]:
    lines = []
    for result in results:
        for fmt, goal in GOALS.items():
            entry = result["formats"][fmt]
            agreement = entry["onnxruntime"]["agreement"]
            ok_bytes, ok_agreement = entry["bytes_ratio"] <= goal["bytes"], agreement >= goal["agreement"]
            lines.append(f"{result['model']} {fmt}: bytes {entry['bytes_ratio']:.3f}x <= {goal['bytes']}x "
                         f"{'met' if ok_bytes else 'MISSED'}; teacher-forced agreement over {result['steps']} steps "
                         f"{agreement:.1%} >= {goal['agreement']:.0%} {'met' if ok_agreement else 'MISSED'}")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog="See the module docstring for the definitions and the models.")
    parser.add_argument("--models", nargs="+", choices=("tiny-llama", "gpt2-random", "gpt2-random-untied"),
                        default=["tiny-llama", "gpt2-random"], help="the models to measure (default: %(default)s)")
    parser.add_argument("--steps", type=int, default=200, help="decode steps (default: %(default)s)")
    parser.add_argument("--gpt2-gpu-steps", type=int, default=3,
                        help="decode steps of the GPT-2-shaped bundles on wgpu (default: %(default)s; "
                             "~10-30 s each on lavapipe)")
    parser.add_argument("--sensitivity", action="store_true",
                        help="also run int4 variants on the tiny Llama in onnxruntime (group sizes, float32 "
                             "scales, one family of weights at int8)")
    parser.add_argument("--json", type=Path, help="also write the results to this JSON file")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    results = []
    with tempfile.TemporaryDirectory(prefix="measure-quantization-") as work:
        for name, path, config, prompt, gpu_steps, gpu_formats in models(args.models, args.steps, args.gpt2_gpu_steps):
            results.append(measure_model(name, path, config, prompt, args.steps, gpu_steps, gpu_formats, Path(work)))
    report = {"models": results}
    if args.sensitivity:
        (_, path, config, prompt, _, _), = models(["tiny-llama"], args.steps, 0)
        reference = reference_run(onnxruntime_runner(onnx.load(str(path))), config, prompt, args.steps)
        report["sensitivity"] = sensitivity(path, config, prompt, reference)
    print(table(results))
    print("\n".join(goals_met(results)))
    if args.sensitivity:
        print(sensitivity_table(report["sensitivity"]))
    if args.json:
        args.json.write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
