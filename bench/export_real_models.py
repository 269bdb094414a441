"""Export the benchmark's real-size models (random weights, nothing downloaded) to ONNX.

Run by ``bench/run.py`` with the model corpus's ``torch`` environment
(``.cache/model-zoo/venv-torch``, made by ``python3 scripts/model_zoo.py setup``): torchvision,
transformers and optimum live there.  Each model is written once to ``OUT/NAME.onnx`` (plus
external data for the large ones) with a sidecar ``OUT/NAME.export.json`` saying how it was
made; an existing file is kept.

    .cache/model-zoo/venv-torch/bin/python bench/export_real_models.py OUT [--only NAME ...]

Architectures and sizes are the published ones (the configs' defaults / torchvision's
constructors), with the exporters their users use: torchvision models through
``torch.onnx.export`` (dynamic batch, height, width), transformers models through optimum
(``main_export``, opset 17) as the Hugging Face Hub's ONNX files are made.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))

from zoo.export_optimum import optimum  # noqa: E402
from zoo.export_torch import IMAGE_DIMS, eager, export, perturb, seeded  # noqa: E402


def torchvision_classifier(constructor: str, out: Path, work: Path) -> None:
    """A torchvision classifier at its published size, exported as the corpus exports its small
    ones (``zoo.export_torch.export``: TorchScript, dynamic batch, height and width)."""
    import torchvision

    seeded()
    model = getattr(torchvision.models, constructor)(weights=None)
    files = export(perturb(model), {"image": torch.randn(1, 3, 224, 224)}, work / "model.onnx",
                   {"image": IMAGE_DIMS}, ["logits"], dynamo=False)
    _move_model(files["model"], out)


def optimum_export(model, task: str, work: Path, file: str, out: Path) -> None:
    """The corpus's optimum export (``zoo.export_optimum.optimum``) of a real-size model."""
    files = optimum(model, task, work, {"model": file})
    _move_model(files["model"], out)


def _move_model(source: Path, out: Path) -> None:
    """Re-save ``source`` as ``out`` with its weights in one external data file beside it
    (protobuf's 2 GB limit is far, but onnxruntime-web fetches the weights as a separate file,
    as it does for the Hub's large models)."""
    import onnx

    model = onnx.load(str(source))
    onnx.save_model(model, str(out), save_as_external_data=True, all_tensors_to_one_file=True,
                    location=out.name + ".data", size_threshold=1024)


def bert_base(out: Path, work: Path) -> None:
    from transformers import BertConfig, BertModel

    seeded()
    optimum_export(BertModel(eager(BertConfig())), "feature-extraction", work, "model.onnx", out)


def gpt2_small(out: Path, work: Path) -> None:
    from transformers import GPT2Config, GPT2LMHeadModel

    seeded()
    optimum_export(GPT2LMHeadModel(eager(GPT2Config())), "text-generation-with-past", work, "model.onnx", out)


def whisper_tiny_encoder(out: Path, work: Path) -> None:
    from transformers import WhisperConfig, WhisperForConditionalGeneration

    seeded()
    # openai/whisper-tiny's config, written out (nothing downloaded)
    config = WhisperConfig(vocab_size=51865, num_mel_bins=80, d_model=384, encoder_layers=4, decoder_layers=4,
                           encoder_attention_heads=6, decoder_attention_heads=6, encoder_ffn_dim=1536,
                           decoder_ffn_dim=1536, max_source_positions=1500, max_target_positions=448,
                           pad_token_id=50257, bos_token_id=50257, eos_token_id=50257,
                           decoder_start_token_id=50258, suppress_tokens=[], begin_suppress_tokens=[])
    optimum_export(WhisperForConditionalGeneration(eager(config)), "automatic-speech-recognition", work,
                   "encoder_model.onnx", out)


MODELS = {
    "resnet50": ("torchvision resnet50(weights=None), torch.onnx.export (legacy), opset 17",
                 lambda out, work: torchvision_classifier("resnet50", out, work)),
    "mobilenet_v3_large": ("torchvision mobilenet_v3_large(weights=None), torch.onnx.export (legacy), opset 17",
                           lambda out, work: torchvision_classifier("mobilenet_v3_large", out, work)),
    "bert_base": ("transformers BertModel(BertConfig()) (bert-base size), optimum feature-extraction", bert_base),
    "gpt2_small": ("transformers GPT2LMHeadModel(GPT2Config()) (gpt2 124M), optimum text-generation-with-past",
                   gpt2_small),
    "whisper_tiny_encoder": (("transformers Whisper with openai/whisper-tiny's config, optimum "
                              "automatic-speech-recognition, the encoder"), whisper_tiny_encoder),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--only", action="append", choices=sorted(MODELS))
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    for name in args.only or MODELS:
        out = args.out / f"{name}.onnx"
        if out.is_file():
            continue
        how, export = MODELS[name]
        work = args.out / f"{name}.work"
        shutil.rmtree(work, ignore_errors=True)
        work.mkdir()
        start = time.monotonic()
        print(f"exporting {name}: {how}", flush=True)
        export(out, work)
        shutil.rmtree(work, ignore_errors=True)
        (args.out / f"{name}.export.json").write_text(json.dumps(
            {"name": name, "how": how, "seconds": round(time.monotonic() - start, 1),
             "torch": torch.__version__}, indent=1) + "\n")


if __name__ == "__main__":
    main()
