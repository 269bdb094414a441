#!/usr/bin/env python3
"""Train and export a tiny Llama-like decoder with a KV cache: a model worth generating from.

    python3 scripts/tiny_llama.py            # train (~2-3 min on one core) and export, or reuse the cache
    python3 scripts/tiny_llama.py --force    # train again even if the cache is current
    python3 scripts/tiny_llama.py --check    # re-verify the cached export against torch and onnxruntime

Writes ``.cache/tiny-llama/`` (never committed; tests call ``tiny_llama_paths()``, which trains
when the cache is missing or was made from another configuration or training text):

    model.onnx      the decoder, float32, weights inside the file
    tokenizer.json  the tokenizer (below); also in model.onnx's metadata_props["relaxweb.tokenizer"]
    reference.json  the configuration, the training text's sha256, training time and loss, a prompt,
                    its greedy continuation (text and token ids) and the check's results

The model, in plain torch (no ``transformers`` code, so the export only changes with torch.onnx):
token embedding; LAYERS decoder layers of RMSNorm -> attention -> residual, RMSNorm -> SwiGLU MLP
-> residual; a final RMSNorm; an LM head.  Attention has 4 query heads sharing 2 key/value heads
(grouped-query, each key/value head repeated to its query heads as transformers' ``repeat_kv``
does), rotary position embedding (rotate-half, computed from ``position_ids``), and a causal mask
combined with ``attention_mask``, added to the scores before the softmax (the form exporters
write and relaxweb fuses into one attention kernel).  The LM head is not tied to the embedding:
so the graph has one Gather of the embedding and one MatMul of the head, each weight with one
consumer, as in Llama's own exports; tying would save only VOCAB x DIM = 33k parameters here.

The export (``torch.onnx.export``, TorchScript exporter, opset 17) has the decoder signature that
optimum and transformers.js use:

    inputs   input_ids                       int64    [batch_size, sequence_length]
             attention_mask                  int64    [batch_size, total_sequence_length]
             position_ids                    int64    [batch_size, sequence_length]
             past_key_values.{i}.key/.value  float32  [batch_size, 2, past_sequence_length, 32]
    outputs  logits                          float32  [batch_size, sequence_length, 258]
             present.{i}.key/.value          float32  [batch_size, 2, total_sequence_length, 32]

with total_sequence_length = past_sequence_length + sequence_length, and present = concat(past,
new keys or values) along the sequence axis.  A prompt is fed with a past of length 0.

Tokenizer (``tokenizer.json``), byte-level:

    {"kind": "byte", "vocab_size": 258, "bos_token_id": 256, "eos_token_id": 257}

Token ids 0-255 are the bytes of the UTF-8 text; 256 (BOS) starts every sequence, 257 (EOS) ends
a document.  Decoding drops the special ids and decodes the bytes as UTF-8, replacing invalid
sequences.

Training text: the Python documentation's topics (``pydoc_data/topics.py``, the text of
``help('if')`` and the like: ~750 KB of English prose and code from the language reference),
which ships with CPython itself and so is on every machine that can run relaxweb's tests, read
at run time and never committed.  Each topic is one document (BOS text EOS); training takes
random windows of CONTEXT + 1 tokens from their concatenation, from fixed seeds, on one thread.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import onnx
import onnxruntime
import pydoc_data.topics
import torch
from torch import nn

ROOT = Path(__file__).resolve().parent.parent
CACHE = ROOT / ".cache" / "tiny-llama"

BOS, EOS, VOCAB = 256, 257, 258
TOKENIZER = {"kind": "byte", "vocab_size": VOCAB, "bos_token_id": BOS, "eos_token_id": EOS}
TOKENIZER_METADATA_KEY = "relaxweb.tokenizer"
PROMPT = "The if statement"
DIMS = {"batch": "batch_size", "sequence": "sequence_length", "past": "past_sequence_length",
        "total": "total_sequence_length"}


@dataclass(frozen=True)
class Config:
    vocab: int = VOCAB
    dim: int = 128
    layers: int = 4
    heads: int = 4
    kv_heads: int = 2
    hidden: int = 352  # the SwiGLU width: ~8/3 * dim, a multiple of 32
    context: int = 128
    rope_theta: float = 10000.0
    norm_eps: float = 1e-5
    # training
    seed: int = 0
    steps: int = 330
    batch: int = 16
    learning_rate: float = 3e-3
    warmup: int = 30
    threads: int = 1

    @property
    def head_dim(self) -> int:
        return self.dim // self.heads


# Tokenizer ----------------------------------------------------------------------------------


def encode(text: str, bos: bool = True) -> list[int]:
    return ([BOS] if bos else []) + list(text.encode("utf-8"))


def decode(ids) -> str:
    return bytes(int(i) for i in ids if int(i) < 256).decode("utf-8", errors="replace")


def training_text() -> list[str]:
    """The documents: the topics of pydoc_data/topics.py, in key order."""
    topics = pydoc_data.topics.topics
    return [topics[key] for key in sorted(topics)]


def text_digest(documents: list[str]) -> str:
    return hashlib.sha256("\0".join(documents).encode("utf-8")).hexdigest()


# The model ----------------------------------------------------------------------------------


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class Attention(nn.Module):
    def __init__(self, config: Config):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = config.heads, config.kv_heads, config.head_dim
        self.q_proj = nn.Linear(config.dim, config.heads * config.head_dim, bias=False)
        self.k_proj = nn.Linear(config.dim, config.kv_heads * config.head_dim, bias=False)
        self.v_proj = nn.Linear(config.dim, config.kv_heads * config.head_dim, bias=False)
        self.o_proj = nn.Linear(config.heads * config.head_dim, config.dim, bias=False)

    def forward(self, x, cos, sin, mask, past_key, past_value):
        batch, sequence, _ = x.shape
        q = self.q_proj(x).view(batch, sequence, self.heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(batch, sequence, self.kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(batch, sequence, self.kv_heads, self.head_dim).transpose(1, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        key, value = torch.cat((past_key, k), dim=2), torch.cat((past_value, v), dim=2)
        repeat = self.heads // self.kv_heads
        keys = key[:, :, None].expand(-1, -1, repeat, -1, -1).reshape(batch, self.heads, -1, self.head_dim)
        values = value[:, :, None].expand(-1, -1, repeat, -1, -1).reshape(batch, self.heads, -1, self.head_dim)
        scores = torch.matmul(q, keys.transpose(2, 3)) / math.sqrt(self.head_dim) + mask
        out = torch.matmul(torch.softmax(scores, dim=-1), values)
        return self.o_proj(out.transpose(1, 2).reshape(batch, sequence, -1)), key, value


class MLP(nn.Module):
    def __init__(self, config: Config):
        super().__init__()
        self.gate_proj = nn.Linear(config.dim, config.hidden, bias=False)
        self.up_proj = nn.Linear(config.dim, config.hidden, bias=False)
        self.down_proj = nn.Linear(config.hidden, config.dim, bias=False)

    def forward(self, x):
        return self.down_proj(nn.functional.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, config: Config):
        super().__init__()
        self.input_layernorm = RMSNorm(config.dim, config.norm_eps)
        self.self_attn = Attention(config)
        self.post_attention_layernorm = RMSNorm(config.dim, config.norm_eps)
        self.mlp = MLP(config)

    def forward(self, x, cos, sin, mask, past_key, past_value):
        attended, key, value = self.self_attn(self.input_layernorm(x), cos, sin, mask, past_key, past_value)
        x = x + attended
        return x + self.mlp(self.post_attention_layernorm(x)), key, value


class TinyLlama(nn.Module):
    """``forward(input_ids, attention_mask, position_ids, past_key_values)`` -> ``(logits,
    presents)``; ``past_key_values`` and ``presents`` alternate key, value per layer."""

    def __init__(self, config: Config):
        super().__init__()
        self.config = config
        self.embed_tokens = nn.Embedding(config.vocab, config.dim)
        self.layers = nn.ModuleList(DecoderLayer(config) for _ in range(config.layers))
        self.norm = RMSNorm(config.dim, config.norm_eps)
        self.lm_head = nn.Linear(config.dim, config.vocab, bias=False)
        inverse = 1.0 / config.rope_theta ** (torch.arange(0, config.head_dim, 2, dtype=torch.float32) / config.head_dim)
        self.register_buffer("inv_freq", inverse, persistent=False)

    def forward(self, input_ids, attention_mask, position_ids, past_key_values):
        x = self.embed_tokens(input_ids)
        angles = position_ids[:, None, :, None].float() * self.inv_freq  # [batch, 1, sequence, head_dim / 2]
        angles = torch.cat((angles, angles), dim=-1)
        cos, sin = angles.cos(), angles.sin()
        # query i (at total position past + i) sees key j when j <= past + i and attention_mask[j] is 1
        past = past_key_values[0].shape[2]
        total = attention_mask.shape[1]
        query_positions = torch.arange(input_ids.shape[1])[:, None] + past
        causal = torch.arange(total)[None, :] <= query_positions  # [sequence, total]
        allowed = causal[None, None] & attention_mask[:, None, None, :].bool()
        mask = torch.where(allowed, 0.0, torch.finfo(torch.float32).min)
        presents = []
        for index, layer in enumerate(self.layers):
            x, key, value = layer(x, cos, sin, mask, past_key_values[2 * index], past_key_values[2 * index + 1])
            presents += [key, value]
        return self.lm_head(self.norm(x)), presents

    def empty_past(self, batch: int = 1) -> list[torch.Tensor]:
        shape = (batch, self.config.kv_heads, 0, self.config.head_dim)
        return [torch.zeros(shape) for _ in range(2 * self.config.layers)]

    def logits(self, ids: torch.Tensor) -> torch.Tensor:
        """Logits of a whole sequence ``[batch, sequence]`` without a cache (training, reference)."""
        batch, sequence = ids.shape
        positions = torch.arange(sequence).expand(batch, sequence)
        return self(ids, torch.ones_like(ids), positions, self.empty_past(batch))[0]


def parameter_count(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


# Training -----------------------------------------------------------------------------------


def train(config: Config, log=print) -> tuple[TinyLlama, dict]:
    torch.manual_seed(config.seed)
    torch.set_num_threads(config.threads)
    documents = training_text()
    stream = torch.tensor([token for document in documents for token in encode(document) + [EOS]])
    model = TinyLlama(config)
    optimizer = torch.optim.AdamW(model.parameters(), lr=config.learning_rate, betas=(0.9, 0.95), weight_decay=0.1)
    generator = torch.Generator().manual_seed(config.seed)
    start, losses = time.perf_counter(), []
    for step in range(config.steps):
        scale = min(1.0, (step + 1) / config.warmup) * 0.5 * (1 + math.cos(math.pi * step / config.steps))
        for group in optimizer.param_groups:
            group["lr"] = config.learning_rate * max(scale, 0.05)
        offsets = torch.randint(0, len(stream) - config.context - 1, (config.batch,), generator=generator)
        window = torch.stack([stream[offset:offset + config.context + 1] for offset in offsets.tolist()])
        logits = model.logits(window[:, :-1])
        loss = nn.functional.cross_entropy(logits.reshape(-1, config.vocab), window[:, 1:].reshape(-1))
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        losses.append(loss.item())
        if step % 50 == 0 or step == config.steps - 1:
            log(f"step {step:4d}  loss {loss.item():.3f}  {time.perf_counter() - start:6.1f} s")
    model.eval()
    seconds = time.perf_counter() - start
    final = float(np.mean(losses[-20:]))
    return model, {"seconds": round(seconds, 1), "final_loss": round(final, 4), "tokens": len(stream),
                   "parameters": parameter_count(model), "threads": config.threads}


@torch.no_grad()
def greedy_without_cache(model: TinyLlama, prompt: list[int], steps: int) -> list[int]:
    ids = list(prompt)
    for _ in range(steps):
        ids.append(int(model.logits(torch.tensor([ids]))[0, -1].argmax()))
    return ids[len(prompt):]


# Export -------------------------------------------------------------------------------------


def input_names(config: Config) -> list[str]:
    return ["input_ids", "attention_mask", "position_ids", *past_names(config, "past_key_values")]


def past_names(config: Config, prefix: str) -> list[str]:
    return [f"{prefix}.{layer}.{kind}" for layer in range(config.layers) for kind in ("key", "value")]


def output_names(config: Config) -> list[str]:
    return ["logits", *past_names(config, "present")]


class Exported(nn.Module):
    """The model with its past as separate arguments, for torch.onnx."""

    def __init__(self, model: TinyLlama):
        super().__init__()
        self.model = model

    def forward(self, input_ids, attention_mask, position_ids, *past):
        logits, presents = self.model(input_ids, attention_mask, position_ids, list(past))
        return (logits, *presents)


def export(model: TinyLlama, path: Path) -> None:
    config = model.config
    batch, sequence, past = 2, 3, 5  # traced with a past of 5; every length is a dim_param
    args = (torch.randint(0, 256, (batch, sequence)), torch.ones(batch, past + sequence, dtype=torch.int64),
            torch.arange(past, past + sequence).expand(batch, sequence),
            *[torch.zeros(batch, config.kv_heads, past, config.head_dim) for _ in range(2 * config.layers)])
    axes = {"input_ids": {0: DIMS["batch"], 1: DIMS["sequence"]},
            "attention_mask": {0: DIMS["batch"], 1: DIMS["total"]},
            "position_ids": {0: DIMS["batch"], 1: DIMS["sequence"]},
            "logits": {0: DIMS["batch"], 1: DIMS["sequence"]}}
    axes |= {name: {0: DIMS["batch"], 2: DIMS["past"]} for name in past_names(config, "past_key_values")}
    axes |= {name: {0: DIMS["batch"], 2: DIMS["total"]} for name in past_names(config, "present")}
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.onnx.export(Exported(model), args, str(path), dynamo=False, opset_version=17, input_names=input_names(config),
                      output_names=output_names(config), dynamic_axes=axes)
    onnx_model = onnx.load(str(path))
    onnx.helper.set_model_props(onnx_model, {TOKENIZER_METADATA_KEY: json.dumps(TOKENIZER)})
    onnx.save(onnx_model, str(path))


# onnxruntime --------------------------------------------------------------------------------


def decoder_feeds(config: Config, tokens: list[int], start: int, past: list[np.ndarray] | None) -> dict:
    """Feeds for one batch-1 step: ``tokens`` at positions start, start + 1, ... after a cache
    ``past`` of length ``start`` (None: an empty one)."""
    if past is None:
        past = [np.zeros((1, config.kv_heads, 0, config.head_dim), np.float32)] * (2 * config.layers)
    feeds = {"input_ids": np.array([tokens], np.int64),
             "attention_mask": np.ones((1, start + len(tokens)), np.int64),
             "position_ids": np.arange(start, start + len(tokens), dtype=np.int64)[None]}
    return feeds | dict(zip(past_names(config, "past_key_values"), past))


def greedy_with_cache(run, config: Config, prompt: list[int], steps: int) -> list[int]:
    """Greedy tokens from a KV-cache decoder: ``run(feeds) -> {name: array}`` (onnxruntime or
    relaxweb's runtime): the prompt with an empty past, then one token at a time, each step's
    present fed back as the next step's past."""
    outputs = run(decoder_feeds(config, prompt, 0, None))
    generated, start = [], len(prompt)
    for _ in range(steps):
        generated.append(int(outputs["logits"][0, -1].argmax()))
        past = [outputs[name] for name in past_names(config, "present")]
        outputs = run(decoder_feeds(config, generated[-1:], start, past))
        start += 1
    return generated


def onnxruntime_runner(path: Path):
    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    names = [output.name for output in session.get_outputs()]
    return lambda feeds: dict(zip(names, session.run(None, feeds)))


class CheckFailed(Exception):
    """The export does not compute what torch computes."""


def require(condition: bool, message: str) -> None:
    if not condition:
        raise CheckFailed(message)


@torch.no_grad()
def check(model: TinyLlama, path: Path, reference: dict, log=print) -> dict:
    """The export against torch: prefill with an empty past and decode steps give torch's logits
    (MODEL tolerance, rtol = atol = 1e-4), the cache's outputs are concat(past, new), greedy
    tokens with the cache in onnxruntime are torch's without one, the tokenizer is in the model."""
    config = model.config
    run = onnxruntime_runner(path)
    ids = encode(reference["prompt"]) + reference["continuation_ids"][:8]
    expected = model.logits(torch.tensor([ids]))[0].numpy()
    prefill = 16 if len(ids) > 16 else len(ids) - 1
    outputs = run(decoder_feeds(config, ids[:prefill], 0, None))
    errors = [float(np.abs(outputs["logits"][0] - expected[:prefill]).max())]
    for position in range(prefill, len(ids)):
        past = [outputs[name] for name in past_names(config, "present")]
        outputs = run(decoder_feeds(config, ids[position:position + 1], position, past))
        errors.append(float(np.abs(outputs["logits"][0, 0] - expected[position]).max()))
        for name, before in zip(past_names(config, "present"), past):
            require(outputs[name].shape[2] == position + 1 and np.array_equal(outputs[name][:, :, :position], before),
                    f"{name} at position {position} is not concat(past, new)")
    scale = float(np.abs(expected).max())
    require(max(errors) <= 1e-4 + 1e-4 * scale, f"onnxruntime's logits differ from torch's by {max(errors)}")
    tokens = greedy_with_cache(run, config, encode(reference["prompt"]), len(reference["continuation_ids"]))
    require(tokens == reference["continuation_ids"], f"greedy tokens with the cache differ from torch's: {tokens}")
    metadata = {prop.key: prop.value for prop in onnx.load(str(path), load_external_data=False).metadata_props}
    require(json.loads(metadata.get(TOKENIZER_METADATA_KEY, "null")) == TOKENIZER,
            f"metadata_props[{TOKENIZER_METADATA_KEY!r}] is not the tokenizer")
    log(f"check: onnxruntime logits within {max(errors):.2e} of torch's (prefill {prefill}, "
        f"{len(errors) - 1} decode steps); {len(tokens)} greedy tokens with the cache equal torch's")
    return {"max_logit_error": max(errors), "greedy_tokens_checked": len(tokens)}


# The cache ----------------------------------------------------------------------------------


def _describe(config: Config) -> dict:
    return {"config": asdict(config), "text_sha256": text_digest(training_text()), "torch": torch.__version__}


def _paths(cache: Path) -> dict[str, Path]:
    return {name: cache / f"{name}.{suffix}" for name, suffix in
            (("model", "onnx"), ("tokenizer", "json"), ("reference", "json"), ("weights", "pt"))}


def _cached(config: Config, cache: Path) -> dict | None:
    paths = _paths(cache)
    if not all(path.exists() for path in paths.values()):
        return None
    reference = json.loads(paths["reference"].read_text())
    described = _describe(config)
    return reference if all(reference.get(key) == value for key, value in described.items()) else None


def build(config: Config = Config(), cache: Path = CACHE, force: bool = False, log=print) -> dict[str, Path]:
    """Train, export and check into ``cache`` unless it already holds this configuration's model."""
    paths = _paths(cache)
    if not force and _cached(config, cache) is not None:
        return paths
    model, training = train(config, log=log)
    export(model, paths["model"])
    continuation = greedy_without_cache(model, encode(PROMPT), 64)
    reference = _describe(config) | {"training": training, "prompt": PROMPT, "continuation": decode(continuation),
                                     "continuation_ids": continuation}
    reference["check"] = check(model, paths["model"], reference, log=log)
    torch.save(model.state_dict(), paths["weights"])
    paths["tokenizer"].write_text(json.dumps(TOKENIZER, indent=2) + "\n")
    paths["reference"].write_text(json.dumps(reference, indent=2) + "\n")
    return paths


def tiny_llama_paths(log=print) -> dict[str, Path]:
    """The cached model's files (``model``, ``tokenizer``, ``reference``, ``weights``), trained
    and exported first when missing or stale."""
    return build(log=log)


def load_trained(config: Config = Config(), cache: Path = CACHE) -> TinyLlama:
    model = TinyLlama(config)
    model.load_state_dict(torch.load(_paths(cache)["weights"]))
    return model.eval()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog="See the module docstring for the model, the export and the tokenizer.")
    parser.add_argument("--force", action="store_true", help="train and export again even if the cache is current")
    parser.add_argument("--check", action="store_true",
                        help="re-verify the cached export (torch vs onnxruntime, greedy tokens with the cache)")
    parser.add_argument("--cache", type=Path, default=CACHE, help=f"the output folder (default: {CACHE})")
    parser.add_argument("--steps", type=int, default=Config.steps, help="training steps (default: %(default)s)")
    args = parser.parse_args(argv)
    config = Config(steps=args.steps)
    if args.check:
        reference = _cached(config, args.cache)
        if reference is None:
            print(f"error: no current model in {args.cache}: run without --check first", file=sys.stderr)
            return 2
        try:
            check(load_trained(config, args.cache), _paths(args.cache)["model"], reference)
        except CheckFailed as error:
            print(f"error: {error}", file=sys.stderr)
            return 1
        return 0
    paths = build(config, args.cache, force=args.force)
    reference = json.loads(paths["reference"].read_text())
    training = reference["training"]
    print(f"{training['parameters']} parameters, trained in {training['seconds']} s "
          f"({training['threads']} thread), final loss {training['final_loss']} nats/byte")
    print(f"{reference['prompt']!r} -> {reference['continuation']!r}")
    print("\n".join(f"{name}: {path}" for name, path in paths.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
