#!/usr/bin/env python3
"""The decoder corpus: tiny decoder LLMs exported with a KV cache as people export them, for
``tests/e2e/test_decoders.py`` (each builds with one cache per layer, and greedy ``generate``
gives onnxruntime's tokens).

    python3 scripts/export_decoders.py OUT_DIR [--only NAME ...] [--write-test-data]
    python3 scripts/export_decoders.py OUT_DIR --size smollm-135m --only builder_int4 --only builder_fp32

``--size`` chooses the Llama's shape for the builder's models (``tiny``, the default, for the
tests; ``smollm-135m``, SmolLM-135M's shape with random weights, for ``bench/decode.py``).

Writes ``OUT_DIR/NAME.onnx`` (weights inline) and ``OUT_DIR/NAME.json``: the exporter, the
inputs and outputs, and what feeding the decoder takes (``decoder``: layers, key/value heads,
head size, vocabulary, the cache's float type), read from the model itself.  Random weights
from fixed seeds, transformers models built from configs: nothing reaches the network.

    builder_fp32           onnxruntime-genai's model builder (``python -m onnxruntime_genai.models.builder``)
                           -p fp32 -e cpu, a Llama with tied embeddings (SmolLM's shape, tiny):
                           GroupQueryAttention with packed QKV, rotary inside, seqlens_k and
                           total_sequence_length from the attention mask, a symbolic ``kv_cache_dim``
    builder_fp16           -p fp16 -e webgpu (what is published for the web): the same in float16
    builder_int4           -p int4 -e cpu as it comes: MatMulNBits, and the tied embedding a
                           GatherBlockQuantized reading the LM head's words through a Reshape
    builder_int4_unshared  -p int4 -e cpu --extra_options shared_embeddings=false: a float Gather
    dynamo_llama           LlamaForCausalLM (tied, grouped KV heads) through ``torch.onnx.export(...,
                           dynamo=True)``, its DynamicCache given as flat past / present tensors
    optimum_gpt2           optimum's ``text-generation-with-past`` of GPT2LMHeadModel, and of
    optimum_llama          LlamaForCausalLM and
    optimum_qwen2          Qwen2ForCausalLM (grouped KV heads, QKV biases)

The builder needs ``onnxruntime-genai``, the dynamo export torch, transformers and onnxscript
(relaxweb's environment).  optimum is not installed there (it pins its own transformers): the
optimum models are exported by this script run with the model zoo's torch environment
(``.cache/model-zoo/venv-torch``, made by ``python3 scripts/model_zoo.py setup``; ``--zoo-venv``
names another).  ``--write-test-data`` copies the tiny decoders it wrote (each under 1 MB) to
``tests/data/decoders/``, where the tests read them: CI has no optimum, and exporting the others
took CI about 50 s of CPU time.  The exports are deterministic (fixed seeds): the same package
versions write the same bytes.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import io
import json
import shutil
import subprocess
import sys
import tempfile
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parent.parent
TEST_DATA = ROOT / "tests" / "data" / "decoders"
ZOO_VENV = ROOT / ".cache" / "model-zoo" / "venv-torch"
MAX_COMMITTED_BYTES = 1 << 20
SEED = 0
#: A tiny decoder: 2 layers, 4 query heads sharing 2 key / value heads of 16; the weights
#: spread (initializer_range 0.2) so that greedy tokens are not one token repeated.
SIZES = dict(vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=256, initializer_range=0.2)
#: SmolLM-135M's shape (its config.json: 30 layers, 9 query heads sharing 3 key / value heads
#: of 64, tied embeddings), random weights spread wider than its initializer_range of 0.02:
#: with 0.02 greedy decoding repeats one token (a check of the tokens that checks little);
#: with 0.1 a 32-token prompt's 32 greedy tokens are all different (transformers, seed 0).
SMOLLM_135M = dict(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
                   num_key_value_heads=3, max_position_embeddings=2048, initializer_range=0.1, rms_norm_eps=1e-5,
                   rope_theta=10000.0)
#: --size: the builder's Llama shapes (the other exporters are tiny only)
LLAMA_SIZES = {"tiny": SIZES, "smollm-135m": SMOLLM_135M}


@dataclass(frozen=True)
class Decoder:
    name: str
    exporter: str  # "builder", "dynamo" or "optimum"
    label: str
    #: (OUT_DIR) -> writes OUT_DIR/NAME.onnx; returns what the exporter's config says of the
    #: decoder where the model leaves it symbolic (the builder's head size: ``kv_cache_dim``)
    export: Callable[[Path], dict]


# onnxruntime-genai's model builder ------------------------------------------------------------


def _builder_module():
    """scripts/export_optimized_models.py (its model builder driver), as a module."""
    spec = importlib.util.spec_from_file_location("export_optimized_models", ROOT / "scripts" / "export_optimized_models.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("export_optimized_models", module)  # its dataclasses look themselves up there
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


def tied_llama():
    """A Llama with tied input and output embeddings (as SmolLM, Llama 3.2 1B, Qwen2.5 0.5B)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    return LlamaForCausalLM(LlamaConfig(tie_word_embeddings=True, **LLAMA_SIZES[ARGS.size]))


def builder(name: str, precision: str, provider: str, **extra_options: str) -> Callable[[Path], dict]:
    def export(out_dir: Path) -> dict:
        module = _builder_module()
        module.export_genai(module.GenaiSpec(name, tied_llama, precision, provider, extra_options), out_dir)
        shutil.rmtree(out_dir / f"{name}.hf", ignore_errors=True)
        sizes = LLAMA_SIZES[ARGS.size]
        return {"head_size": sizes["hidden_size"] // sizes["num_attention_heads"]}

    return export


# torch dynamo -----------------------------------------------------------------------------------


def dynamo_llama(out_dir: Path) -> dict:
    """LlamaForCausalLM with its cache as flat tensors: ``(input_ids, attention_mask,
    position_ids, past_key_values.L.key/value...) -> (logits, present.L.key/value...)``."""
    import torch
    from transformers import DynamicCache, LlamaConfig, LlamaForCausalLM

    torch.manual_seed(SEED)
    config = LlamaConfig(tie_word_embeddings=True, **SIZES)
    config._attn_implementation = "eager"
    model = LlamaForCausalLM(config).eval()
    layers, kv_heads = config.num_hidden_layers, config.num_key_value_heads
    head = config.hidden_size // config.num_attention_heads

    class FlatCache(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, input_ids, attention_mask, position_ids, past):
            cache = DynamicCache(config=config)
            for layer in range(layers):
                cache.update(past[2 * layer], past[2 * layer + 1], layer)
            out = self.model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                             past_key_values=cache, use_cache=True)
            present = [t for layer in out.past_key_values.layers for t in (layer.keys, layer.values)]
            return (out.logits, *present)

    pasts = [f"past_key_values.{layer}.{part}" for layer in range(layers) for part in ("key", "value")]
    batch, seq = torch.export.Dim("batch_size", max=64), torch.export.Dim("sequence_length", max=1024)
    past, total = torch.export.Dim("past_sequence_length", max=1024), torch.export.Dim("total_sequence_length", max=2048)
    example = (torch.randint(0, SIZES["vocab_size"], (1, 3)), torch.ones(1, 7, dtype=torch.int64), torch.arange(4, 7)[None],
               tuple(torch.randn(1, kv_heads, 4, head) for _ in pasts))
    dims = ({0: batch, 1: seq}, {0: batch, 1: total}, {0: batch, 1: seq}, tuple({0: batch, 2: past} for _ in pasts))
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        warnings.simplefilter("ignore")
        torch.onnx.export(FlatCache(), example, str(out_dir / "dynamo_llama.onnx"), dynamo=True, opset_version=18,
                          input_names=["input_ids", "attention_mask", "position_ids", *pasts],
                          output_names=["logits", *(name.replace("past_key_values", "present") for name in pasts)],
                          dynamic_shapes=dims, external_data=False)
    return {}


# optimum (run with the model zoo's torch environment) -------------------------------------------


def optimum_models() -> dict[str, Callable]:
    """Each optimum model's ...ForCausalLM (built in the zoo's environment, which has its own transformers)."""
    def gpt2():
        from transformers import GPT2Config, GPT2LMHeadModel

        return GPT2LMHeadModel(GPT2Config(vocab_size=SIZES["vocab_size"], n_positions=256, n_embd=64, n_layer=2, n_head=4,
                                          initializer_range=0.2, bos_token_id=0, eos_token_id=0))

    def llama():
        from transformers import LlamaConfig, LlamaForCausalLM

        return LlamaForCausalLM(LlamaConfig(**SIZES))

    def qwen2():
        from transformers import Qwen2Config, Qwen2ForCausalLM

        return Qwen2ForCausalLM(Qwen2Config(tie_word_embeddings=True, **SIZES))

    return {"optimum_gpt2": gpt2, "optimum_llama": llama, "optimum_qwen2": qwen2}


def optimum_worker(out_dir: Path, names: list[str]) -> None:
    """The optimum exports, in this process (the zoo's environment): ``main_export`` of a
    ``save_pretrained`` folder, task ``text-generation-with-past``, opset 17, eager attention."""
    import torch
    from optimum.exporters.onnx import main_export

    for name in names:
        torch.manual_seed(SEED)
        model = optimum_models()[name]()
        model.config._attn_implementation = "eager"
        with tempfile.TemporaryDirectory(prefix="decoder-") as work:
            model.eval().save_pretrained(Path(work) / "pretrained")
            with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
                warnings.simplefilter("ignore")
                main_export(str(Path(work) / "pretrained"), output=Path(work) / "onnx", task="text-generation-with-past",
                            opset=17, device="cpu", do_validation=False)
            shutil.copyfile(Path(work) / "onnx" / "model.onnx", out_dir / f"{name}.onnx")


def optimum(name: str) -> Callable[[Path], dict]:
    def export(out_dir: Path) -> dict:
        python = Path(ARGS.zoo_venv) / "bin" / "python"
        if not python.exists():
            raise RuntimeError(f"optimum runs in the model zoo's torch environment, {python} is missing "
                               "(python3 scripts/model_zoo.py setup)")
        done = subprocess.run([str(python), __file__, str(out_dir), "--optimum-worker", name], capture_output=True,
                              text=True, cwd=ROOT)
        if done.returncode:
            raise RuntimeError((done.stderr or done.stdout).strip().splitlines()[-1])
        return {}

    return export


DECODERS = {decoder.name: decoder for decoder in [
    Decoder("builder_fp32", "builder", "onnxruntime-genai model builder -p fp32 -e cpu", builder("builder_fp32", "fp32", "cpu")),
    Decoder("builder_fp16", "builder", "onnxruntime-genai model builder -p fp16 -e webgpu",
            builder("builder_fp16", "fp16", "webgpu")),
    Decoder("builder_int4", "builder", "onnxruntime-genai model builder -p int4 -e cpu (tied embeddings)",
            builder("builder_int4", "int4", "cpu")),
    Decoder("builder_int4_unshared", "builder", "onnxruntime-genai model builder -p int4 -e cpu "
            "--extra_options shared_embeddings=false", builder("builder_int4_unshared", "int4", "cpu", shared_embeddings="false")),
    Decoder("dynamo_llama", "dynamo", "torch.onnx.export(dynamo=True) of LlamaForCausalLM with a flat cache", dynamo_llama),
    Decoder("optimum_gpt2", "optimum", "optimum text-generation-with-past (GPT-2)", optimum("optimum_gpt2")),
    Decoder("optimum_llama", "optimum", "optimum text-generation-with-past (Llama)", optimum("optimum_llama")),
    Decoder("optimum_qwen2", "optimum", "optimum text-generation-with-past (Qwen2)", optimum("optimum_qwen2")),
]}


# What a test needs to feed a decoder ------------------------------------------------------------


def decoder_info(path: Path, stated: dict) -> dict:
    """Layers, key / value heads, head size (the present's where the past leaves it symbolic,
    else the exporter's ``stated`` one), vocabulary and cache dtype, read from the model's
    inputs and outputs."""
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    dims = {value.name: [d.dim_value if d.HasField("dim_value") else d.dim_param for d in value.type.tensor_type.shape.dim]
            for value in [*model.graph.input, *model.graph.output]}
    key = dims["past_key_values.0.key"]
    head = next((d for d in (key[3], dims["present.0.key"][3]) if isinstance(d, int)), stated.get("head_size"))
    past_type = next(v.type.tensor_type.elem_type for v in model.graph.input if v.name == "past_key_values.0.key")
    return {"layers": sum(name.startswith("past_key_values.") and name.endswith(".key") for name in dims),
            "kv_heads": key[1], "head_size": head, "vocab": dims["logits"][-1],
            "float_type": onnx.helper.tensor_dtype_to_np_dtype(past_type).name}


def write_sidecar(decoder: Decoder, out_dir: Path, stated: dict) -> dict:
    import onnx

    path = out_dir / f"{decoder.name}.onnx"
    model = onnx.load(str(path), load_external_data=False)
    sidecar = {"name": decoder.name, "exporter": decoder.exporter, "label": decoder.label, "size": ARGS.size,
               "inputs": [value.name for value in model.graph.input], "outputs": [value.name for value in model.graph.output],
               "op_types": sorted({f"{n.domain}.{n.op_type}" if n.domain not in ("", "ai.onnx") else n.op_type
                                   for n in model.graph.node}),
               "decoder": decoder_info(path, stated)}
    (out_dir / f"{decoder.name}.json").write_text(json.dumps(sidecar, indent=1) + "\n")
    return sidecar


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--only", action="append", default=[], metavar="NAME", help="one of: " + ", ".join(DECODERS))
    parser.add_argument("--write-test-data", action="store_true",
                        help=f"copy the decoders written (tiny, each < 1 MB) to {TEST_DATA.relative_to(ROOT)}")
    parser.add_argument("--zoo-venv", default=str(ZOO_VENV), help="the virtual environment with optimum")
    parser.add_argument("--size", choices=LLAMA_SIZES, default="tiny",
                        help="the builder's Llama shape (default: %(default)s; smollm-135m: SmolLM-135M's, for bench/decode.py)")
    parser.add_argument("--optimum-worker", action="append", default=[], help=argparse.SUPPRESS)
    return parser.parse_args(argv)


ARGS = argparse.Namespace(zoo_venv=str(ZOO_VENV), size="tiny")


def main(argv: list[str] | None = None) -> int:
    global ARGS
    ARGS = parse_args(argv)
    ARGS.out_dir.mkdir(parents=True, exist_ok=True)
    if ARGS.optimum_worker:
        optimum_worker(ARGS.out_dir, ARGS.optimum_worker)
        return 0
    names = ARGS.only or list(DECODERS)
    unknown = [name for name in names if name not in DECODERS]
    if unknown:
        raise SystemExit(f"error: unknown decoder(s): {', '.join(unknown)} (known: {', '.join(DECODERS)})")
    not_sized = [name for name in names if DECODERS[name].exporter != "builder"]
    if ARGS.size != "tiny" and not_sized:
        raise SystemExit(f"error: --size {ARGS.size} is for the builder's models; {', '.join(not_sized)} are tiny only "
                         "(give --only builder_...)")
    if ARGS.size != "tiny" and ARGS.write_test_data:
        raise SystemExit("error: --write-test-data copies the tiny decoders (the tests'), not --size " + ARGS.size)
    failed = 0
    for name in names:
        decoder = DECODERS[name]
        try:
            sidecar = write_sidecar(decoder, ARGS.out_dir, decoder.export(ARGS.out_dir))
        except Exception as error:  # noqa: BLE001 - reported per model, the others go on
            failed += 1
            print(f"{name}: FAILED ({type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''})", flush=True)
            continue
        print(f"{name}: {sidecar['decoder']} {[op for op in sidecar['op_types'] if '.' in op]}", flush=True)
        if ARGS.write_test_data:
            size = (ARGS.out_dir / f"{name}.onnx").stat().st_size
            if size > MAX_COMMITTED_BYTES:
                raise SystemExit(f"error: {name}.onnx is {size} bytes, over the {MAX_COMMITTED_BYTES} committed at most")
            TEST_DATA.mkdir(parents=True, exist_ok=True)
            for suffix in (".onnx", ".json"):
                shutil.copyfile(ARGS.out_dir / f"{name}{suffix}", TEST_DATA / f"{name}{suffix}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
