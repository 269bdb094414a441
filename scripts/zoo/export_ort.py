"""Models as onnxruntime's tools rewrite them, in relaxweb's environment: the transformer
optimizer (``optimize_model``: com.microsoft contrib ops such as Attention,
SkipLayerNormalization, EmbedLayerNormalization, BiasGelu / FastGelu) and the float16
conversion, applied to the torch exports of ``export_torch``."""

from __future__ import annotations

from pathlib import Path

import onnx
from onnxruntime.transformers.float16 import convert_float_to_float16
from onnxruntime.transformers.optimizer import optimize_model

from zoo import export_torch


def optimized(base: dict[str, Path], model_type: str, work: Path, float16: bool = False):
    """The transformer optimizer's Python fusions (opt_level 0: no onnxruntime graph
    optimizations baked in), as web libraries ship optimized models."""
    model = optimize_model(str(base["model"]), model_type=model_type, num_heads=4, hidden_size=64, opt_level=0)
    if float16:
        model.convert_float_to_float16(keep_io_types=True)
    path = work / "optimized.onnx"
    model.save_model_to_file(str(path))
    return {"model": path}


def bert_optimized(work: Path) -> dict[str, Path]:
    return optimized(export_torch.bert(work), "bert", work)


def gpt2_optimized(work: Path) -> dict[str, Path]:
    return optimized(export_torch.gpt2(work), "gpt2", work)


def bert_fp16(work: Path) -> dict[str, Path]:
    return optimized(export_torch.bert(work), "bert", work, float16=True)


def resnet_fp16(work: Path) -> dict[str, Path]:
    """Weights, activations, inputs and outputs in float16."""
    base = export_torch.hf_resnet(work)
    path = work / "float16.onnx"
    onnx.save(convert_float_to_float16(onnx.load(str(base["model"])), keep_io_types=False), str(path))
    return {"model": path}
