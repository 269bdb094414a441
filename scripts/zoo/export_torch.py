"""Models exported with torch.onnx from relaxweb's own environment (torch and transformers):
transformers architectures with random weights from tiny configs, and plain PyTorch models
(U-Net, CRNN, GRU and LSTM speech models).  Nothing is downloaded: transformers builds every
model from its config.

Each public function exports one model into the folder it is given and returns
``{"model": path}``; ``export_torchvision`` and ``export_ort`` reuse ``export``.
"""

from __future__ import annotations

import contextlib
import inspect
import io
import warnings
from pathlib import Path

import numpy as np
import torch
from torch import nn

SEED = 0
VOCAB = 100
#: torch.export's range of each named dynamic dim (the example value lies inside)
DIM_RANGES = {"batch": (1, 64), "seq": (1, 128), "height": (32, 1024), "width": (32, 1024),
              "frames": (1, 4096), "samples": (800, 160000)}


def export(model: nn.Module, example: dict[str, torch.Tensor], path: Path, dims: dict[str, list],
           outputs: list[str], dynamo: bool, opset: int = 17) -> dict[str, Path]:
    """Export ``model`` called with the ``example`` inputs (by keyword, in order) to ``path``.

    ``dims`` gives each input's dims as ints and names; named dims are dynamic (``dynamic_axes``
    for TorchScript, ``torch.export.Dim`` of that name and DIM_RANGES's range for dynamo).
    """
    names = list(example)
    args = tuple(example.values())
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")
        if not dynamo:
            axes = {name: {axis: d for axis, d in enumerate(dims[name]) if isinstance(d, str)} for name in names}
            torch.onnx.export(model.eval(), args, str(path), dynamo=False, input_names=names, output_names=outputs,
                              dynamic_axes=axes, opset_version=opset, do_constant_folding=True)
        else:
            from torch.export import Dim

            named = {d: Dim(d, min=DIM_RANGES[d][0], max=DIM_RANGES[d][1])
                     for name in names for d in dims[name] if isinstance(d, str)}
            shapes = tuple({axis: named[d] for axis, d in enumerate(dims[name]) if isinstance(d, str)}
                           for name in names)
            if any(p.kind is p.VAR_POSITIONAL for p in inspect.signature(model.forward).parameters.values()):
                shapes = {"args": shapes}  # the wrappers' forward(*args)
            program = torch.onnx.export(model.eval(), args, None, dynamo=True, dynamic_shapes=shapes,
                                        input_names=names, output_names=outputs, opset_version=max(opset, 18),
                                        optimize=True)
            program.save(str(path), external_data=False)
    return {"model": path}


def seeded() -> None:
    torch.manual_seed(SEED)
    np.random.seed(SEED)


def perturb(model: nn.Module) -> nn.Module:
    """Biases start at 0 and norm weights at 1, which would hide a dropped bias or scale:
    give every constant parameter and buffer some noise (positive for variances)."""
    with torch.no_grad():
        for parameter in model.parameters():
            if parameter.numel() > 1 and bool(parameter.min() == parameter.max()):
                parameter.add_(torch.rand_like(parameter) * 0.2)
        for name, buffer in model.named_buffers():
            if name.endswith("running_var"):
                buffer.uniform_(0.5, 1.5)
            elif name.endswith("running_mean"):
                buffer.uniform_(-0.2, 0.2)
    return model.eval()


def eager(config):
    """Plain matmul/softmax attention (not SDPA), the portable form for ONNX."""
    for attribute in ("_attn_implementation", "attn_implementation"):
        with contextlib.suppress(Exception):
            setattr(config, attribute, "eager")
    return config


class FirstOutput(nn.Module):
    """A transformers model called by keyword, returning its first output (logits)."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, *args):
        return self.model(*args, return_dict=False)[0]


def image(batch: int = 2, height: int = 64, width: int = 64) -> torch.Tensor:
    seeded()
    return torch.randn(batch, 3, height, width)


IMAGE_DIMS = ["batch", 3, "height", "width"]


def tokens(with_mask: bool = True) -> dict[str, torch.Tensor]:
    seeded()
    example = {"input_ids": torch.randint(0, VOCAB, (2, 7))}
    if with_mask:
        example["attention_mask"] = torch.ones(2, 7, dtype=torch.int64)
    return example


TOKEN_DIMS = {"input_ids": ["batch", "seq"], "attention_mask": ["batch", "seq"]}


# Image classification ---------------------------------------------------------------------------


def image_classifier(model: nn.Module, work: Path, dynamo: bool, dims=IMAGE_DIMS, example=None) -> dict[str, Path]:
    example = image() if example is None else example
    return export(perturb(FirstOutput(model)), {"pixel_values": example}, work / "model.onnx",
                  {"pixel_values": dims}, ["logits"], dynamo)


def hf_resnet(work: Path) -> dict[str, Path]:
    from transformers import ResNetConfig, ResNetForImageClassification

    seeded()
    config = ResNetConfig(embedding_size=16, hidden_sizes=[16, 32, 64, 128], depths=[1, 1, 1, 1],
                          layer_type="basic", num_labels=10)
    return image_classifier(ResNetForImageClassification(config), work, dynamo=False)


def hf_convnext(work: Path) -> dict[str, Path]:
    from transformers import ConvNextConfig, ConvNextForImageClassification

    seeded()
    config = ConvNextConfig(hidden_sizes=[16, 32, 64, 128], depths=[1, 1, 2, 1], num_labels=10)
    return image_classifier(ConvNextForImageClassification(config), work, dynamo=True)


def hf_vit(work: Path) -> dict[str, Path]:
    from transformers import ViTConfig, ViTForImageClassification

    seeded()
    config = eager(ViTConfig(image_size=32, patch_size=8, hidden_size=64, num_hidden_layers=2,
                             num_attention_heads=4, intermediate_size=128, num_labels=10))
    return image_classifier(ViTForImageClassification(config), work, dynamo=False, dims=["batch", 3, 32, 32],
                            example=image(2, 32, 32))


def hf_mobilenet_v2(work: Path) -> dict[str, Path]:
    from transformers import MobileNetV2Config, MobileNetV2ForImageClassification

    seeded()
    config = MobileNetV2Config(depth_multiplier=0.35, image_size=64, num_labels=10)
    return image_classifier(MobileNetV2ForImageClassification(config), work, dynamo=False)


def hf_efficientnet(work: Path) -> dict[str, Path]:
    from transformers import EfficientNetConfig, EfficientNetForImageClassification

    seeded()
    config = EfficientNetConfig(image_size=64, width_coefficient=0.25, depth_coefficient=0.25, hidden_dim=320,
                                num_labels=10)
    return image_classifier(EfficientNetForImageClassification(config), work, dynamo=True)


# Segmentation ----------------------------------------------------------------------------------


def hf_segformer(work: Path) -> dict[str, Path]:
    from transformers import SegformerConfig, SegformerForSemanticSegmentation

    seeded()
    config = eager(SegformerConfig(depths=[1, 1, 1, 1], hidden_sizes=[16, 32, 64, 128],
                                   num_attention_heads=[1, 2, 4, 8], decoder_hidden_size=64, num_labels=4))
    return image_classifier(SegformerForSemanticSegmentation(config), work, dynamo=False)


class UNet(nn.Module):
    """The classic U-Net shape at a small width: 4 levels down by max-pooling, up by
    transposed convolutions, each level's features concatenated into its way up."""

    def __init__(self, channels=(8, 16, 32, 64), classes: int = 3) -> None:
        super().__init__()

        def block(cin, cout):
            return nn.Sequential(nn.Conv2d(cin, cout, 3, padding=1), nn.BatchNorm2d(cout), nn.ReLU(),
                                 nn.Conv2d(cout, cout, 3, padding=1), nn.BatchNorm2d(cout), nn.ReLU())

        self.down = nn.ModuleList()
        cin = 3
        for c in channels:
            self.down.append(block(cin, c))
            cin = c
        self.up = nn.ModuleList(nn.ConvTranspose2d(c, c // 2, 2, stride=2) for c in reversed(channels[1:]))
        self.merge = nn.ModuleList(block(c, c // 2) for c in reversed(channels[1:]))
        self.head = nn.Conv2d(channels[0], classes, 1)

    def forward(self, x):
        skips = []
        for i, block in enumerate(self.down):
            x = block(x if i == 0 else nn.functional.max_pool2d(x, 2))
            skips.append(x)
        for up, merge, skip in zip(self.up, self.merge, reversed(skips[:-1])):
            x = merge(torch.cat([up(x), skip], dim=1))
        return self.head(x)


def unet(work: Path) -> dict[str, Path]:
    seeded()
    return export(perturb(UNet()), {"image": image()}, work / "model.onnx", {"image": IMAGE_DIMS}, ["mask"],
                  dynamo=True)


# OCR and speech --------------------------------------------------------------------------------


class CRNN(nn.Module):
    """A text-line recognizer: a conv stack that pools the height away, a 2-layer BiLSTM over
    the width, per-step CTC logits (time-major output, as CTC decoders read it)."""

    def __init__(self, classes: int = 37) -> None:
        super().__init__()

        def conv(cin, cout, pool):
            return nn.Sequential(nn.Conv2d(cin, cout, 3, padding=1), nn.BatchNorm2d(cout), nn.ReLU(), nn.MaxPool2d(pool))

        self.features = nn.Sequential(conv(1, 16, 2), conv(16, 32, 2), conv(32, 48, (2, 1)), conv(48, 64, (4, 1)))
        self.rnn = nn.LSTM(64, 48, num_layers=2, bidirectional=True)
        self.fc = nn.Linear(96, classes)

    def forward(self, image):
        x = self.features(image)  # [batch, 64, 1, width / 4]
        x = x.squeeze(2).permute(2, 0, 1)  # [time, batch, 64]
        x, _ = self.rnn(x)
        return self.fc(x).log_softmax(-1)


def crnn_bilstm(work: Path) -> dict[str, Path]:
    seeded()
    return export(perturb(CRNN()), {"image": torch.randn(2, 1, 32, 100)}, work / "model.onnx",
                  {"image": ["batch", 1, 32, "width"]}, ["log_probs"], dynamo=False)


class KeywordSpotter(nn.Module):
    def __init__(self, features: int = 40, hidden: int = 64, keywords: int = 12) -> None:
        super().__init__()
        self.gru = nn.GRU(features, hidden, num_layers=2, batch_first=True)
        self.fc = nn.Linear(hidden, keywords)

    def forward(self, mfcc):
        x, _ = self.gru(mfcc)
        return self.fc(x[:, -1])


def kws_gru(work: Path) -> dict[str, Path]:
    seeded()
    return export(perturb(KeywordSpotter()), {"mfcc": torch.randn(2, 30, 40)}, work / "model.onnx",
                  {"mfcc": ["batch", "frames", 40]}, ["logits"], dynamo=False)


class VoiceActivity(nn.Module):
    """A streaming detector: the LSTM's state goes out and comes back in with the next chunk."""

    def __init__(self, features: int = 64, hidden: int = 32) -> None:
        super().__init__()
        self.encoder = nn.Sequential(nn.Conv1d(features, 32, 3, padding=1), nn.ReLU())
        self.lstm = nn.LSTM(32, hidden, batch_first=True)
        self.fc = nn.Linear(hidden, 1)

    def forward(self, x, h, c):
        x = self.encoder(x.transpose(1, 2)).transpose(1, 2)
        x, (h, c) = self.lstm(x, (h, c))
        return torch.sigmoid(self.fc(x)).squeeze(-1), h, c


def vad_lstm(work: Path) -> dict[str, Path]:
    seeded()
    example = {"x": torch.randn(2, 10, 64), "h": torch.randn(1, 2, 32), "c": torch.randn(1, 2, 32)}
    return export(perturb(VoiceActivity()), example, work / "model.onnx",
                  {"x": ["batch", "frames", 64], "h": [1, "batch", 32], "c": [1, "batch", 32]},
                  ["speech_prob", "hn", "cn"], dynamo=False)


def wav2vec2(work: Path) -> dict[str, Path]:
    from transformers import Wav2Vec2Config, Wav2Vec2ForCTC

    seeded()
    config = eager(Wav2Vec2Config(vocab_size=32, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                  intermediate_size=64, conv_dim=(16, 16, 16), conv_stride=(5, 2, 2),
                                  conv_kernel=(10, 3, 3), num_conv_pos_embeddings=16,
                                  num_conv_pos_embedding_groups=2, hidden_dropout=0.0, activation_dropout=0.0,
                                  attention_dropout=0.0, feat_proj_dropout=0.0, layerdrop=0.0))
    model = perturb(FirstOutput(Wav2Vec2ForCTC(config)))
    return export(model, {"input_values": torch.randn(2, 2000)}, work / "model.onnx",
                  {"input_values": ["batch", "samples"]}, ["logits"], dynamo=False)


# Text --------------------------------------------------------------------------------------------


def text_model(model: nn.Module, work: Path, dynamo: bool, with_mask: bool = True) -> dict[str, Path]:
    example = tokens(with_mask)
    return export(perturb(FirstOutput(model)), example, work / "model.onnx", TOKEN_DIMS, ["logits"], dynamo)


def bert_model() -> nn.Module:
    from transformers import BertConfig, BertForSequenceClassification

    seeded()
    config = eager(BertConfig(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                              intermediate_size=128, max_position_embeddings=128, num_labels=3,
                              hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0))
    return BertForSequenceClassification(config)


def bert(work: Path) -> dict[str, Path]:
    return text_model(bert_model(), work, dynamo=False)


def distilbert(work: Path) -> dict[str, Path]:
    from transformers import DistilBertConfig, DistilBertForSequenceClassification

    seeded()
    config = eager(DistilBertConfig(vocab_size=VOCAB, dim=64, n_layers=2, n_heads=4, hidden_dim=128,
                                    max_position_embeddings=128, num_labels=3, dropout=0.0, attention_dropout=0.0))
    return text_model(DistilBertForSequenceClassification(config), work, dynamo=True)


class CausalLM(nn.Module):
    """Logits of a causal LM without its cache; an explicit all-ones mask, as a web app
    passes it (transformers would otherwise look for packed sequences with torch.diff)."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids):
        mask = torch.ones_like(input_ids)
        return self.model(input_ids=input_ids, attention_mask=mask, use_cache=False, return_dict=False)[0]


def gpt2_model() -> nn.Module:
    from transformers import GPT2Config, GPT2LMHeadModel

    seeded()
    config = eager(GPT2Config(vocab_size=VOCAB, n_positions=128, n_embd=64, n_layer=2, n_head=4, resid_pdrop=0.0,
                              embd_pdrop=0.0, attn_pdrop=0.0, use_cache=False, bos_token_id=0, eos_token_id=0))
    return GPT2LMHeadModel(config)


def gpt2(work: Path) -> dict[str, Path]:
    return export(perturb(CausalLM(gpt2_model())), tokens(False), work / "model.onnx", TOKEN_DIMS, ["logits"],
                  dynamo=False)


def llama(work: Path) -> dict[str, Path]:
    from transformers import LlamaConfig, LlamaForCausalLM

    seeded()
    config = eager(LlamaConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                               num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                               use_cache=False))
    return export(perturb(CausalLM(LlamaForCausalLM(config))), tokens(False), work / "model.onnx", TOKEN_DIMS,
                  ["logits"], dynamo=False)
