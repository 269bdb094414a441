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
import contextlib
import io
import json
import shutil
import sys
import time
import warnings
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))

from zoo.export_torch import eager, perturb, seeded  # noqa: E402


def torchvision_classifier(constructor: str, out: Path) -> None:
    import torchvision

    seeded()
    model = perturb(getattr(torchvision.models, constructor)(weights=None)).eval()
    example = torch.randn(1, 3, 224, 224)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(model, (example,), str(out), input_names=["image"], output_names=["logits"],
                          dynamic_axes={"image": {0: "batch", 2: "height", 3: "width"}, "logits": {0: "batch"}},
                          opset_version=17, dynamo=False)


def optimum_export(model, task: str, work: Path, file: str, out: Path) -> None:
    from optimum.exporters.onnx import main_export

    perturb(model)
    model.save_pretrained(work / "pretrained")
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")
        main_export(str(work / "pretrained"), output=work / "onnx", task=task, opset=17, device="cpu",
                    do_validation=False)
    _move_model(work / "onnx" / file, out)


def _move_model(source: Path, out: Path) -> None:
    """Re-save ``source`` as ``out`` with its weights in one external data file beside it."""
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
                 lambda out, work: torchvision_classifier("resnet50", out)),
    "mobilenet_v3_large": ("torchvision mobilenet_v3_large(weights=None), torch.onnx.export (legacy), opset 17",
                           lambda out, work: torchvision_classifier("mobilenet_v3_large", out)),
    "bert_base": ("transformers BertModel(BertConfig()) (bert-base size), optimum feature-extraction", bert_base),
    "gpt2_small": ("transformers GPT2LMHeadModel(GPT2Config()) (gpt2 124M), optimum text-generation-with-past",
                   gpt2_small),
    "whisper_tiny_encoder": ("transformers Whisper with openai/whisper-tiny's config, optimum "
                             "automatic-speech-recognition, the encoder", whisper_tiny_encoder),
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
