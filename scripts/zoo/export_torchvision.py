"""torchvision models (``weights=None``: random weights, nothing downloaded) exported with
torch.onnx, in the ``torch`` environment (torchvision does not import beside the main
environment's torch build)."""

from __future__ import annotations

from pathlib import Path

import torchvision
from torch import nn

from zoo.export_torch import IMAGE_DIMS, export, image, perturb, seeded


def classifier(model: nn.Module, work: Path, dynamo: bool) -> dict[str, Path]:
    return export(perturb(model), {"image": image()}, work / "model.onnx", {"image": IMAGE_DIMS}, ["logits"], dynamo)


def resnet18(work: Path) -> dict[str, Path]:
    seeded()
    return classifier(torchvision.models.resnet18(weights=None, num_classes=10), work, dynamo=False)


def mobilenet_v3_small(work: Path) -> dict[str, Path]:
    seeded()
    return classifier(torchvision.models.mobilenet_v3_small(weights=None, num_classes=10), work, dynamo=False)


def efficientnet_b0(work: Path) -> dict[str, Path]:
    seeded()
    return classifier(torchvision.models.efficientnet_b0(weights=None, num_classes=10), work, dynamo=True)


def shufflenet_v2(work: Path) -> dict[str, Path]:
    seeded()
    return classifier(torchvision.models.shufflenet_v2_x0_5(weights=None, num_classes=10), work, dynamo=False)


def convnext_tiny(work: Path) -> dict[str, Path]:
    seeded()
    model = torchvision.models.convnext_tiny(weights=None, num_classes=10)
    return export(perturb(model), {"image": image()}, work / "model.onnx", {"image": ["batch", 3, 64, 64]},
                  ["logits"], dynamo=True)


class OutputTensor(nn.Module):
    """Segmentation models return a dict; the exported graph returns its "out" tensor."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, image):
        return self.model(image)["out"]


def deeplabv3(work: Path) -> dict[str, Path]:
    seeded()
    model = torchvision.models.segmentation.deeplabv3_mobilenet_v3_large(weights=None, weights_backbone=None,
                                                                         num_classes=4, aux_loss=False)
    return export(perturb(OutputTensor(model)), {"image": image()}, work / "model.onnx", {"image": IMAGE_DIMS},
                  ["out"], dynamo=False)


class RetinaNetFeatures(nn.Module):
    """RetinaNet's backbone, feature pyramid and heads: per-anchor class logits and box
    regressions over every pyramid level (the box decoding and NMS stay outside)."""

    def __init__(self) -> None:
        super().__init__()
        from torchvision.models.detection import retinanet
        from torchvision.models.detection.backbone_utils import resnet_fpn_backbone
        from torchvision.ops.feature_pyramid_network import LastLevelP6P7

        self.backbone = resnet_fpn_backbone(backbone_name="resnet18", weights=None, trainable_layers=5,
                                            returned_layers=[2, 3, 4], extra_blocks=LastLevelP6P7(256, 256))
        self.head = retinanet.RetinaNetHead(256, 9, num_classes=5)

    def forward(self, image):
        features = list(self.backbone(image).values())
        out = self.head(features)
        return out["cls_logits"], out["bbox_regression"]


def retinanet_fpn(work: Path) -> dict[str, Path]:
    seeded()
    return export(perturb(RetinaNetFeatures()), {"image": image()}, work / "model.onnx", {"image": IMAGE_DIMS},
                  ["cls_logits", "bbox_regression"], dynamo=False)
