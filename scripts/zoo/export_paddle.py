"""PaddlePaddle models (random weights) exported as PaddleOCR and paddle.vision users do,
``paddle.onnx.export`` (paddle2onnx), in the ``paddle`` environment."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import paddle
from paddle import nn

SEED = 0


def perturb(layer: nn.Layer) -> nn.Layer:
    """Batch-norm statistics and constant parameters (biases, scales) get random values."""
    rng = np.random.default_rng(SEED)
    for sub in layer.sublayers(include_self=True):
        if isinstance(sub, (nn.BatchNorm2D, nn.BatchNorm1D, nn.BatchNorm)):
            sub._mean.set_value(rng.uniform(-0.2, 0.2, sub._mean.shape).astype("float32"))
            sub._variance.set_value(rng.uniform(0.5, 1.5, sub._variance.shape).astype("float32"))
    for parameter in layer.parameters():
        value = parameter.numpy()
        if value.size > 1 and value.min() == value.max():
            parameter.set_value(value + rng.uniform(0, 0.2, value.shape).astype(value.dtype))
    layer.eval()
    return layer


def export(layer: nn.Layer, work: Path, shape: list) -> dict[str, Path]:
    prefix = work / "model"
    paddle.onnx.export(perturb(layer), str(prefix), input_spec=[paddle.static.InputSpec(shape, "float32", "x")],
                       opset_version=17)
    return {"model": work / "model.onnx"}


def mobilenet_v3_small(work: Path) -> dict[str, Path]:
    paddle.seed(SEED)
    return export(paddle.vision.models.mobilenet_v3_small(num_classes=10), work, [None, 3, None, None])


def resnet18(work: Path) -> dict[str, Path]:
    paddle.seed(SEED)
    return export(paddle.vision.models.resnet18(num_classes=10), work, [None, 3, None, None])


def conv_bn(cin: int, cout: int, stride=1, kernel=3) -> nn.Sequential:
    return nn.Sequential(nn.Conv2D(cin, cout, kernel, stride=stride, padding=kernel // 2, bias_attr=False),
                         nn.BatchNorm2D(cout), nn.Hardswish())


class Recognizer(nn.Layer):
    """PaddleOCR's CRNN recognizer at a small width: a conv backbone that pools the 32-pixel
    height to 1, a 2-layer bidirectional LSTM over the width, a CTC head with softmax."""

    def __init__(self, classes: int = 37) -> None:
        super().__init__()
        self.backbone = nn.Sequential(conv_bn(3, 16, stride=2), conv_bn(16, 32, stride=(2, 1)),
                                      conv_bn(32, 48, stride=(2, 1)), conv_bn(48, 64, stride=(2, 1)),
                                      nn.MaxPool2D(kernel_size=2, stride=2))
        self.lstm = nn.LSTM(64, 48, num_layers=2, direction="bidirect")
        self.head = nn.Linear(96, classes)

    def forward(self, x):
        x = self.backbone(x)  # [batch, 64, 1, width / 4]
        x = x.squeeze(2).transpose([0, 2, 1])  # [batch, time, 64]
        x, _ = self.lstm(x)
        return nn.functional.softmax(self.head(x), axis=2)


def crnn_bilstm(work: Path) -> dict[str, Path]:
    paddle.seed(SEED)
    return export(Recognizer(), work, [None, 3, 32, None])


def upsample_to(x, like):
    """Nearest-neighbour upsampling to the size of ``like`` (read with paddle.shape, so the
    graph computes it): paddle2onnx 2.1 fails on every ``scale_factor`` upsampling of a paddle
    3.3 model ("the 0th elementwise MUST be ir::FloatAttribute")."""
    return nn.functional.interpolate(x, size=[paddle.shape(like)[2], paddle.shape(like)[3]], mode="nearest")


class TextDetector(nn.Layer):
    """DBNet as PaddleOCR's text detector builds it, at a small width: a backbone with
    strides 4..32, a feature pyramid (nearest-neighbour upsampling to the finer level's
    size, added to it), every level upsampled to stride 4 and concatenated, and the probability head
    (conv, then two stride-2 transposed convs back to the input size, sigmoid)."""

    def __init__(self) -> None:
        super().__init__()
        widths = [16, 24, 32, 48]
        self.stem = nn.Sequential(conv_bn(3, 8, stride=2), conv_bn(8, 16, stride=2))
        self.stages = nn.LayerList()
        cin = 16
        for i, width in enumerate(widths):
            self.stages.append(conv_bn(cin, width, stride=1 if i == 0 else 2))
            cin = width
        self.lateral = nn.LayerList(nn.Conv2D(w, 32, 1) for w in widths)
        self.smooth = nn.LayerList(nn.Conv2D(32, 8, 3, padding=1) for _ in widths)
        self.head = nn.Sequential(conv_bn(32, 8), nn.Conv2DTranspose(8, 8, 2, stride=2), nn.BatchNorm2D(8),
                                  nn.ReLU(), nn.Conv2DTranspose(8, 1, 2, stride=2))

    def forward(self, x):
        x = self.stem(x)
        features = []
        for stage in self.stages:
            x = stage(x)
            features.append(x)
        laterals = [conv(f) for conv, f in zip(self.lateral, features)]
        for i in range(len(laterals) - 1, 0, -1):
            laterals[i - 1] = laterals[i - 1] + upsample_to(laterals[i], laterals[i - 1])
        maps = [conv(p) for conv, p in zip(self.smooth, laterals)]
        maps = [maps[0]] + [upsample_to(m, maps[0]) for m in maps[1:]]
        return nn.functional.sigmoid(self.head(paddle.concat(maps, axis=1)))


def dbnet(work: Path) -> dict[str, Path]:
    paddle.seed(SEED)
    return export(TextDetector(), work, [None, 3, None, None])
