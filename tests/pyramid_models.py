"""The feature-pyramid and U-Net models of tests/passes/test_runtime_assumptions.py, exported with torch.onnx.

    python3 -m tests.pyramid_models OUT_DIR

writes ``fpn_legacy.onnx``, ``fpn_dynamo.onnx`` and ``unet_legacy.onnx`` (input
``image[1, 3, height, width]``, output ``out``).  Both models rely on a fact about the input
that no prover sees: the FPN adds ``Resize(stride-32 map, x2)`` (height
``(height + 31) // 32 * 2``) to the stride-16 map (``(height + 15) // 16``), equal when height
is a multiple of 32; the U-Net concatenates the upsampled map (``(height + 1) // 2 * 2``)
with the skip connection (``height``), equal when height is even.  Weights come from a fixed
seed.  The tests read the exports committed in ``tests/data/pyramids/`` (exporting them took
CI about 7 s of CPU time); its README says how to write them again.
"""

from __future__ import annotations

import sys
import warnings
from pathlib import Path

MODELS = ("fpn_legacy", "fpn_dynamo", "unet_legacy")
CHANNELS = 4


def build(family: str):
    import torch
    from torch import nn
    from torch.nn import functional

    class FeaturePyramid(nn.Module):
        """Five stride-2 convolutions; the stride-32 map, upsampled x2, added to the stride-16 one."""

        def __init__(self) -> None:
            super().__init__()
            self.stem = nn.Conv2d(3, CHANNELS, 3, 2, 1)
            self.downs = nn.ModuleList(nn.Conv2d(CHANNELS, CHANNELS, 3, 2, 1) for _ in range(4))
            self.lateral = nn.Conv2d(CHANNELS, CHANNELS, 1)

        def forward(self, image):
            x = torch.relu(self.stem(image))
            maps = []
            for down in self.downs:
                x = torch.relu(down(x))
                maps.append(x)
            return self.lateral(maps[-2]) + functional.interpolate(maps[-1], scale_factor=2.0, mode="nearest")

    class UNet(nn.Module):
        """One level: a stride-2 convolution, a stride-2 transposed one, the skip concatenated."""

        def __init__(self) -> None:
            super().__init__()
            self.encode = nn.Conv2d(3, CHANNELS, 3, 1, 1)
            self.down = nn.Conv2d(CHANNELS, CHANNELS, 3, 2, 1)
            self.up = nn.ConvTranspose2d(CHANNELS, CHANNELS, 2, 2)
            self.head = nn.Conv2d(2 * CHANNELS, 2, 1)

        def forward(self, image):
            skip = torch.relu(self.encode(image))
            up = self.up(torch.relu(self.down(skip)))
            return self.head(torch.cat([up, skip], 1))

    torch.manual_seed(0)
    return (FeaturePyramid if family == "fpn" else UNet)().eval()


def export(name: str, path: Path) -> None:
    import torch

    family, exporter = name.split("_")
    model = build(family)
    example = torch.randn(1, 3, 64, 64)
    if exporter == "dynamo":
        height, width = torch.export.Dim("height", min=32, max=1024), torch.export.Dim("width", min=32, max=1024)
        torch.onnx.export(model, (example,), str(path), dynamo=True, input_names=["image"], output_names=["out"],
                          dynamic_shapes={"image": {2: height, 3: width}})
    else:
        torch.onnx.export(model, (example,), str(path), dynamo=False, opset_version=17, input_names=["image"],
                          output_names=["out"], dynamic_axes={"image": {2: "height", 3: "width"}})


def main(argv: list[str]) -> int:
    out = Path(argv[0])
    out.mkdir(parents=True, exist_ok=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for name in MODELS:
            export(name, out / f"{name}.onnx")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
