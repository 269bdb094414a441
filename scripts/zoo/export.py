"""Export worker, run by ``model_zoo.py export`` with the Python of one environment:

    PYTHONPATH=scripts python -m zoo.export OUT_DIR MODEL...

Runs each model's export function once per group (an encoder and a decoder come from one
export) in a scratch folder and copies each role's file to ``OUT_DIR/NAME.onnx``, with a
sidecar ``OUT_DIR/NAME.export.json``: the exporter, the versions of its environment's
packages, the seconds it took, or the error that stopped it.
"""

from __future__ import annotations

import importlib
import json
import re
import shutil
import sys
import tempfile
import time
import traceback
from importlib import metadata
from pathlib import Path

from zoo.catalog import ENVIRONMENTS, EXPORTERS, MODELS_BY_NAME, Model


def versions(environment: str) -> dict[str, str]:
    found = {}
    for package in ENVIRONMENTS[environment].packages:
        try:
            found[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            found[package] = "not installed"
    return found


def first_line(error: BaseException) -> str:
    """The error's first line; for torch.onnx's dynamo errors, the line of their summary
    (their first line only says which of the exporter's steps failed)."""
    lines = [line.strip() for line in re.sub(r"\x1b\[[0-9;]*m", "", str(error)).splitlines() if line.strip()]
    if "## Exception summary" in lines[:-1]:
        return lines[lines.index("## Exception summary") + 1][:400]
    return f"{type(error).__name__}: {lines[0] if lines else ''}"[:400]


def export_group(group: str, models: list[Model], out_dir: Path) -> None:
    module_name, function_name = group.split(":")
    environment = models[0].environment
    start = time.perf_counter()
    error, written = None, {}
    with tempfile.TemporaryDirectory(prefix="zoo-export-") as scratch:
        try:
            function = getattr(importlib.import_module(f"zoo.{module_name}"), function_name)
            files = function(Path(scratch))
            for model in models:
                target = out_dir / f"{model.name}.onnx"
                shutil.copyfile(files[model.role], target)
                data = Path(str(files[model.role]) + "_data")  # external data beside it, if any
                if data.exists():
                    shutil.copyfile(data, out_dir / f"{model.name}.onnx_data")
                written[model.name] = target
        except Exception as caught:  # noqa: BLE001 - recorded per model, the others go on
            error = first_line(caught)
            traceback.print_exc()
    seconds = round(time.perf_counter() - start, 2)
    for model in models:
        sidecar = {"name": model.name, "exporter": model.exporter, "exporter_label": EXPORTERS[model.exporter].label,
                   "environment": environment, "versions": versions(environment), "export_seconds": seconds,
                   "error": None if model.name in written else (error or "the export wrote no file")}
        (out_dir / f"{model.name}.export.json").write_text(json.dumps(sidecar, indent=1) + "\n")
        print(f"{model.name}: {'exported' if model.name in written else 'FAILED: ' + sidecar['error']} ({seconds} s)",
              flush=True)


def main(argv: list[str]) -> int:
    out_dir, names = Path(argv[0]).resolve(), argv[1:]
    out_dir.mkdir(parents=True, exist_ok=True)
    groups: dict[str, list[Model]] = {}
    for name in names:
        model = MODELS_BY_NAME[name]
        groups.setdefault(model.group, []).append(model)
    for group, models in groups.items():
        export_group(group, models, out_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
