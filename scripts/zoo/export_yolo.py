"""ultralytics YOLO detectors built from their yaml (random weights: no .pt is downloaded)
and exported the way ultralytics users do, ``YOLO(...).export(format="onnx", dynamic=True)``,
in the ``torch`` environment."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

os.environ.setdefault("YOLO_OFFLINE", "1")  # no update checks, no font or asset downloads

from ultralytics import YOLO  # noqa: E402

from zoo.export_torch import seeded  # noqa: E402


def yolo(config: str, work: Path) -> dict[str, Path]:
    seeded()
    model = YOLO(config)  # builds the network from the packaged yaml
    with contextlib.chdir(work):  # ultralytics writes into the working directory
        path = model.export(format="onnx", dynamic=True, imgsz=64, simplify=False, opset=17)
    return {"model": work / path}


def yolov8n(work: Path) -> dict[str, Path]:
    return yolo("yolov8n.yaml", work)


def yolo11n(work: Path) -> dict[str, Path]:
    return yolo("yolo11n.yaml", work)
