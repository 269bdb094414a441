#!/usr/bin/env python3
"""The model corpus: real architectures exported by the exporters their users use, each built
once with relaxweb and checked against onnxruntime at two or more values of every dynamic
dimension on the Python runtime's WebGPU and wasm backends and on kernels.wasm in headless
Chromium without WebGPU (scripts/zoo/check.py).  Writes docs/model-zoo.md and docs/model-zoo.json.

    python3 scripts/model_zoo.py setup                 # the exporters' virtual environments (once)
    python3 scripts/model_zoo.py export [--only NAME]  # export into .cache/model-zoo/models/
    python3 scripts/model_zoo.py check [--only NAME]   # build, run, compare; write the docs
    python3 scripts/model_zoo.py check --paths batch --work-dir DIR   # one path; bundles and results in DIR
    python3 scripts/model_zoo.py all                   # export, then check
    python3 scripts/model_zoo.py check --fast          # CI's subset (tests/e2e/test_model_zoo.py)
    python3 scripts/model_zoo.py list                  # the models, their exporters and environments

The models and their shapes are listed in scripts/zoo/catalog.py.  Exporters that need
packages relaxweb's environment must not get (tensorflow, jax, paddlepaddle, torchvision with
another torch, ultralytics, optimum) run in virtual environments under .cache/model-zoo/
(``setup`` makes them with pip from PyPI); the others run with this Python (torch,
transformers, onnxruntime).  Each export and each check is its own process, with a time
limit.  ``--only`` updates those models' rows and keeps the others' from the last check.
``export --write-test-data`` also copies the committed models (``committed=True`` in the
catalog, each under 1 MB) to tests/data/model-zoo/.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))

from zoo.catalog import ENVIRONMENTS, EXPORTERS, MODELS, MODELS_BY_NAME, Model  # noqa: E402

CACHE = ROOT / ".cache" / "model-zoo"
MODELS_DIR = CACHE / "models"
BUNDLES_DIR = CACHE / "bundles"
RESULTS = CACHE / "results.json"
TEST_DATA = ROOT / "tests" / "data" / "model-zoo"
DOC = ROOT / "docs" / "model-zoo.md"
DOC_JSON = ROOT / "docs" / "model-zoo.json"
MAX_COMMITTED_BYTES = 1 << 20
EXPORT_TIMEOUT = 1800
CHECK_TIMEOUT = 900

COMMAND = "python3 scripts/model_zoo.py setup && python3 scripts/model_zoo.py all"


def venv_python(environment: str) -> Path:
    if environment == "main":
        return Path(sys.executable)
    return CACHE / f"venv-{environment}" / "bin" / "python"


def worker_env() -> dict[str, str]:
    """Workers import zoo.* from scripts/ and relaxweb from this checkout (never an installed one)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(ROOT / "scripts")])
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    env.setdefault("YOLO_OFFLINE", "1")
    return env


# setup ------------------------------------------------------------------------------------------


def setup(names: list[str]) -> int:
    """Make each exporter environment: python3 -m venv, then pip install its requirements.
    An environment whose requirements are already installed (its marker file) is kept."""
    failed = 0
    for name in names or [n for n in ENVIRONMENTS if n != "main"]:
        environment = ENVIRONMENTS[name]
        folder = CACHE / f"venv-{name}"
        marker = folder / "zoo-requirements.txt"
        wanted = "\n".join(environment.requirements) + "\n"
        if marker.exists() and marker.read_text() == wanted:
            print(f"{name}: ready ({folder})")
            continue
        print(f"{name}: pip install {' '.join(environment.requirements)} into {folder} ...", flush=True)
        subprocess.run([sys.executable, "-m", "venv", str(folder)], check=True)
        log = CACHE / f"venv-{name}.log"
        with log.open("w") as out:
            done = subprocess.run([str(folder / "bin" / "pip"), "install", *environment.requirements], stdout=out,
                                  stderr=subprocess.STDOUT)
        if done.returncode:
            failed += 1
            tail = log.read_text().strip().splitlines()[-3:]
            print(f"{name}: pip failed (see {log}):\n  " + "\n  ".join(tail))
        else:
            marker.write_text(wanted)
            print(f"{name}: ready")
    return 1 if failed else 0


# export -----------------------------------------------------------------------------------------


def export(models: list[Model], write_test_data: bool) -> int:
    MODELS_DIR.mkdir(parents=True, exist_ok=True)
    for environment in ENVIRONMENTS:
        chosen = [m.name for m in models if m.environment == environment]
        if not chosen:
            continue
        python = venv_python(environment)
        if not python.exists():
            for name in chosen:
                note_export_error(name, f"environment '{environment}' not set up: run scripts/model_zoo.py setup")
            continue
        print(f"== export with {environment}: {', '.join(chosen)}", flush=True)
        log = CACHE / f"export-{environment}.log"
        with log.open("w") as out:
            try:
                subprocess.run([str(python), "-m", "zoo.export", str(MODELS_DIR), *chosen], stdout=out,
                               stderr=subprocess.STDOUT, env=worker_env(), cwd=ROOT, timeout=EXPORT_TIMEOUT)
            except subprocess.TimeoutExpired:
                print(f"   timed out after {EXPORT_TIMEOUT} s (see {log})")
        for name in chosen:
            sidecar = read_sidecar(name)
            if sidecar is None:
                note_export_error(name, f"the export worker wrote nothing (see {log.relative_to(ROOT)})")
                sidecar = read_sidecar(name)
            print(f"   {name}: {'FAILED: ' + sidecar['error'] if sidecar['error'] else 'exported'}")
    if write_test_data:
        copy_test_data(models)
    return 0


def note_export_error(name: str, error: str) -> None:
    model = MODELS_BY_NAME[name]
    (MODELS_DIR / f"{name}.onnx").unlink(missing_ok=True)
    sidecar = {"name": name, "exporter": model.exporter, "exporter_label": EXPORTERS[model.exporter].label,
               "environment": model.environment, "versions": {}, "export_seconds": None, "error": error}
    (MODELS_DIR / f"{name}.export.json").write_text(json.dumps(sidecar, indent=1) + "\n")


def read_sidecar(name: str) -> dict | None:
    path = MODELS_DIR / f"{name}.export.json"
    return json.loads(path.read_text()) if path.exists() else None


def copy_test_data(models: list[Model]) -> None:
    TEST_DATA.mkdir(parents=True, exist_ok=True)
    for model in models:
        if not model.committed:
            continue
        source = MODELS_DIR / f"{model.name}.onnx"
        if not source.exists():
            print(f"   {model.name}: not exported, not copied to {TEST_DATA.relative_to(ROOT)}")
        elif source.stat().st_size > MAX_COMMITTED_BYTES:
            print(f"   {model.name}: {source.stat().st_size} bytes, over the 1 MB limit: not copied")
        else:
            shutil.copyfile(source, TEST_DATA / source.name)
            print(f"   {model.name}: copied to {TEST_DATA.relative_to(ROOT)} ({source.stat().st_size} bytes)")


# check ------------------------------------------------------------------------------------------


def model_path(model: Model, fast: bool) -> Path:
    """CI's subset reads committed models from tests/data/model-zoo (no exporter environment)."""
    committed = TEST_DATA / f"{model.name}.onnx"
    if model.committed and (fast or not (MODELS_DIR / committed.name).exists()) and committed.exists():
        return committed
    return MODELS_DIR / f"{model.name}.onnx"


def check_one(model: Model, fast: bool, paths: list[str], bundles_dir: Path = BUNDLES_DIR) -> dict:
    path = model_path(model, fast)
    sidecar = read_sidecar(model.name) or {}
    base = {"name": model.name, "category": model.category, "architecture": model.architecture,
            "exporter": model.exporter, "environment": model.environment, "note": model.note,
            "export_seconds": sidecar.get("export_seconds"), "file": str(path.relative_to(ROOT))}
    if sidecar.get("error") and not path.exists():
        return {**base, "status": "export error", "error": sidecar["error"]}
    if not path.exists():
        return {**base, "status": "not exported", "error": "run scripts/model_zoo.py export first"}
    bundle = bundles_dir / model.name
    shutil.rmtree(bundle, ignore_errors=True)
    command = [sys.executable, "-m", "zoo.check", str(path), str(bundle), model.name, *([",".join(paths)] if paths else [])]
    start = time.perf_counter()
    try:
        done = subprocess.run(command, capture_output=True, text=True, env=worker_env(), cwd=ROOT,
                              timeout=CHECK_TIMEOUT)
    except subprocess.TimeoutExpired:
        return {**base, "status": "timeout", "error": f"build and check took over {CHECK_TIMEOUT} s"}
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    if not lines:
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        return {**base, "status": "check error", "error": f"the check process exited {done.returncode}: {tail}"[:500]}
    return {**base, **json.loads(lines[-1][len("RESULT "):]), "check_seconds": round(time.perf_counter() - start, 1)}


def merge_paths(previous: dict | None, result: dict, paths: list[str]) -> dict:
    """``result`` of a check of some ``paths`` only, with the other paths' results kept from
    ``previous`` (the model's last row), status and error recomputed over all of them."""
    if not paths or not previous or "paths" not in previous or "paths" not in result:
        return result
    kept = {where: checked for where, checked in previous["paths"].items() if where not in paths}
    merged = {**result, "paths": {**kept, **result["paths"]}}
    merged.pop("error", None)
    first_bad = next((where for where, checked in merged["paths"].items() if checked["status"] != "ok"), None)
    merged["status"] = merged["paths"][first_bad]["status"] if first_bad else "ok"
    if first_bad:
        merged["error"] = f"{first_bad}: {merged['paths'][first_bad].get('error', '')}"
    merged["runs"] = next(iter(merged["paths"].values()))["runs"]
    diffs = [checked["max_abs_diff"] for checked in merged["paths"].values() if "max_abs_diff" in checked]
    if diffs:
        merged["max_abs_diff"] = max(diffs)
    return merged


def check(models: list[Model], fast: bool, write_docs: bool, paths: list[str] | None = None,
          work_dir: Path = CACHE) -> int:
    """Check ``models`` (on ``paths``, all by default), bundles built under ``work_dir``/bundles;
    the results merged into ``work_dir``/results.json (started from the corpus's own when
    ``work_dir`` has none yet)."""
    paths = paths or []
    results_file = work_dir / "results.json"
    source = results_file if results_file.exists() else RESULTS
    previous = json.loads(source.read_text())["models"] if source.exists() else {}
    results = {}
    for model in models:
        print(f"== {model.name} ({model.exporter})", flush=True)
        result = merge_paths(previous.get(model.name), check_one(model, fast, paths, work_dir / "bundles"), paths)
        results[model.name] = result
        diff = f", max |diff| {result['max_abs_diff']:.2g}" if "max_abs_diff" in result else ""
        batch = result.get("paths", {}).get("batch")
        mode = f" [batch: {batch['mode']}{' (' + batch['reason'] + ')' if batch.get('reason') else ''}]" \
            if batch and "mode" in batch else ""
        print(f"   {result['status']}{diff}{mode}" + (f": {result['error']}" if result.get("error") else ""), flush=True)
    merged = {name: results.get(name, previous.get(name)) for name in MODELS_BY_NAME
              if name in results or name in previous}
    results_file.parent.mkdir(parents=True, exist_ok=True)
    report = {"date": datetime.date.today().isoformat(), "machine": machine(), "versions": environment_versions(),
              "models": merged}
    results_file.write_text(json.dumps(report, indent=1, default=float) + "\n")
    if write_docs:
        DOC_JSON.write_text(json.dumps(report, indent=1, default=float) + "\n")
        DOC.write_text(render_doc(report))
        print(f"wrote {DOC.relative_to(ROOT)} and {DOC_JSON.relative_to(ROOT)}")
    bad = [name for name, r in results.items() if r["status"] != "ok"]
    print(f"{len(results) - len(bad)} of {len(results)} ok" + (f"; not ok: {', '.join(bad)}" if bad else ""))
    return 1 if bad else 0


def machine() -> dict:
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor()) if Path("/proc/cpuinfo").exists() else ""
    info = {"platform": platform.platform(), "python": platform.python_version(), "cpu": cpu,
            "cores": os.cpu_count()}
    try:
        import wgpu

        adapter = wgpu.gpu.request_adapter_sync()
        info["adapter"] = f"{adapter.info['device']} ({adapter.info['description']}, {adapter.info['backend_type']})"
    except Exception as error:  # noqa: BLE001 - recorded, not needed
        info["adapter"] = f"unknown ({error})"
    return info


def environment_versions() -> dict[str, dict[str, str]]:
    """Each environment's package versions: as its export workers recorded them, and the
    main environment's (which also runs relaxweb) read here."""
    from importlib import metadata

    found: dict[str, dict[str, str]] = {}
    for sidecar_path in sorted(MODELS_DIR.glob("*.export.json")):
        sidecar = json.loads(sidecar_path.read_text())
        if sidecar.get("versions") and sidecar["environment"] != "main":
            found.setdefault(sidecar["environment"], sidecar["versions"])
    main = {}
    for package in (*ENVIRONMENTS["main"].packages, "numpy", "wgpu", "wasmtime"):
        try:
            main[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            main[package] = "not installed"
    found["main"] = main
    return found


# the doc ----------------------------------------------------------------------------------------

SETUP_NOTES = """\
Environments.  The exporters that need packages relaxweb's environment must not get run in
virtual environments under `.cache/model-zoo/` (ignored), made by `model_zoo.py setup` with
pip from PyPI; relaxweb's own environment and CI are untouched.  The exporters that need only
torch, transformers and onnxruntime run with relaxweb's Python, so CI can export them.

| environment | pip install | used by |
|---|---|---|
{environments}

What installed and what did not (x86_64, Python 3.11, pip from PyPI):
{install_notes}
"""

INSTALL_NOTES = """\
- `torch`: torch 2.14.1 and torchvision 0.29.1 (the pair this machine's pip takes from its
  disk: a CUDA build, run on the CPU; ~5.5 GB in the venv), ultralytics, optimum-onnx (which
  pins transformers 4.57: optimum exports with it, not with the main environment's 5.x),
  onnxruntime, onnxscript.  torchvision is not installable beside the main environment's
  torch 2.13 CPU build (`operator torchvision::nms does not exist`), hence this environment.
- `tf`: tensorflow-cpu 2.21, keras 3, tf2onnx 1.17, jax 0.10 (with `jax.experimental.jax2tf`).
- `paddle`: paddlepaddle 3.3 and paddle2onnx 2.1.
"""


def fmt_diff(value) -> str:
    if value is None:
        return ""
    return "inf" if value == float("inf") else f"{value:.1e}"


#: The doc's column of each path zoo/check.py runs (zoo.check.PATHS; not imported here, which
#: would import relaxweb and onnxruntime into the driver).
PATH_COLUMNS = {"webgpu": "wgpu", "wasm": "wasm (wasmtime)", "chromium-wasm": "wasm (Chromium, no WebGPU)",
                "batch": "batch (wgpu)"}


def path_cell(result: dict, path: str) -> str:
    """One path's largest difference, or its status in bold when it is not ok; empty when the
    check stopped before the paths ran (build error), "not checked" for a row of a check
    older than the path."""
    if "paths" not in result:
        return "not checked" if result["status"] == "ok" else ""
    checked = result["paths"].get(path)
    if checked is None:
        return "not checked" if path == "batch" and result["status"] != "build error" else ""
    cell = fmt_diff(checked.get("max_abs_diff")) if checked["status"] == "ok" else f"**{checked['status']}**"
    if path == "batch" and "mode" in checked:
        cell += " ragged" if checked["mode"] == "ragged" else " one by one*"
    return cell


def render_doc(report: dict) -> str:
    models = report["models"]
    counts: dict[str, int] = {}
    for result in models.values():
        counts[result["status"]] = counts.get(result["status"], 0) + 1
    exporters_used = sorted({r["exporter"] for r in models.values()})
    ok_exporters = sorted({r["exporter"] for r in models.values() if r["status"] == "ok"})
    lines = [
        "# The model corpus",
        "",
        "Real architectures, exported by the exporters their users use, each built **once** with",
        "relaxweb and run at two or more values of every dynamic dimension on four paths: the",
        "Python runtime on WebGPU (wgpu), the Python runtime on the bundle's kernels.wasm",
        "(wasmtime), kernels.wasm in headless Chromium started without WebGPU (one page per",
        "model, `backend: \"auto\"` picking wasm), and every shape at once as one batch of",
        "instances of different sizes on wgpu (`run_batch`: ragged dispatches, or one instance",
        "after another where the bundle cannot batch).  Every output of every path is compared with",
        "onnxruntime's (CPU) on the same inputs, and a model is ok only when every path is.  Random",
        "weights from tiny configs (no model hub: transformers, torchvision, Keras and Paddle build",
        "every model from its config).  Generated by `scripts/model_zoo.py`; the models, their",
        "exporters and their shapes are in `scripts/zoo/catalog.py`.",
        "",
        "```bash",
        COMMAND + "    # everything (minutes; setup once)",
        "python3 scripts/model_zoo.py check --only NAME        # one model's row",
        "python3 scripts/model_zoo.py check --paths batch      # one path's column (the others kept)",
        "python3 -m pytest tests/e2e/test_model_zoo.py             # CI's subset (slow, browser marks)",
        "```",
        "",
        f"Checked on {report['date']} on {report['machine']['platform']}, {report['machine']['cpu']}, "
        f"{report['machine']['cores']} cores, adapter {report['machine']['adapter']}.",
        "",
        f"**{counts.get('ok', 0)} of {len(models)} models ok**, from {len(exporters_used)} exporters "
        f"({len(ok_exporters)} with at least one model ok)"
        + "".join(f"; {n} {s}" for s, n in sorted(counts.items()) if s != "ok") + ".",
        "",
        "Tolerance: an output element matches when it is within 1e-3 of onnxruntime's, absolutely",
        "or relatively (float32).  Models that onnxruntime computes in float16 (`ort-float16`):",
        "1e-2 absolutely or relatively, ten float16 ulps at 1.0, because onnxruntime rounds every",
        "intermediate value to float16 (unit roundoff 4.9e-4) while relaxweb computes them in",
        "float32 on devices without `shader-f16`, so the two differ by the rounding accumulated",
        "over the network.  Integer and bool outputs must be equal.  Each path's column is the",
        "largest |relaxweb - onnxruntime| over every output and shape on that path (or what went",
        "wrong there); the batch column also says how the batch ran: `ragged` (one dispatch of",
        "each kernel's ragged form for all the instances that run it) or `one by one` (why: below).",
        "",
        "| model | category | architecture | exporter | ops | dynamic dims (as written) | build s | shapes | "
        + " | ".join(PATH_COLUMNS.values()) + " | status |",
        "|---|---|---|---|---:|---|---:|---|" + "---:|" * len(PATH_COLUMNS) + "---|",
    ]
    for name, r in models.items():
        dims = ", ".join(f"`{d}`" for d in r.get("dynamic_dims", [])) or "none"
        shapes = "; ".join(" ".join(f"{k}={v}" for k, v in run["dims"].items()) for run in r.get("runs", []))
        status = r["status"] if r["status"] == "ok" else f"**{r['status']}**"
        lines.append(f"| {name} | {r['category']} | {r['architecture']} | {r['exporter']} | {r.get('ops', '')} | "
                     f"{dims} | {r.get('build_seconds', '')} | {shapes} | "
                     + "".join(f"{path_cell(r, path)} | " for path in PATH_COLUMNS) + f"{status} |")
    one_by_one = {name: r["paths"]["batch"] for name, r in models.items()
                  if r.get("paths", {}).get("batch", {}).get("mode", "ragged") != "ragged"}
    if one_by_one:
        lines += ["", "\\* The batch ran one instance after another (`last_batch.reason`):", ""]
        for name, checked in one_by_one.items():
            lines.append(f"- **{name}**: {checked.get('reason', '')}")
    failures = {name: r for name, r in models.items() if r["status"] != "ok"}
    if failures:
        lines += ["", "## What stops the others", "",
                  "The first line of each error (build errors list every unsupported op of the model):", ""]
        for name, r in failures.items():
            error = r.get("error", "").replace("|", "\\|")
            lines.append(f"- **{name}** ({r['status']}): {error}")
    lines += ["", "## Exporters", "", "| exporter | how | environment | models |", "|---|---|---|---:|"]
    for key, exporter in EXPORTERS.items():
        used = sum(1 for r in models.values() if r["exporter"] == key)
        lines.append(f"| {key} | {exporter.label} | {exporter.environment} | {used} |")
    lines += ["", "## Versions", ""]
    for environment, packages in sorted(report["versions"].items()):
        lines.append(f"- **{environment}**: " + ", ".join(f"{p} {v}" for p, v in packages.items()))
    environments = "\n".join(
        f"| {e.name} | {' '.join(f'`{r}`' for r in e.requirements) or '(relaxweb’s own: `pip install -e .[test]`)'} | "
        f"{', '.join(k for k, x in EXPORTERS.items() if x.environment == e.name)} |" for e in ENVIRONMENTS.values())
    lines += ["", "## Setup", "", SETUP_NOTES.format(environments=environments, install_notes=INSTALL_NOTES).rstrip()]
    lines += ["", "## Op types per model", "", "| model | inputs (as annotated) | op types |", "|---|---|---|"]
    for name, r in models.items():
        inputs = "<br>".join(f"`{k}: {v}`" for k, v in r.get("inputs", {}).items())
        lines.append(f"| {name} | {inputs} | {', '.join(r.get('op_types', []))} |")
    lines += ["", "## CI", "",
              "`tests/e2e/test_model_zoo.py` (marked slow) exports the models marked `fast` in the catalog with",
              "relaxweb's own environment and checks them on the Python runtime's two backends (WebGPU",
              "and wasm), with the committed small models of other exporters in `tests/data/model-zoo/`",
              "(under 1 MB each; the command that regenerates them is in the README there); two of them",
              "also run in headless Chromium, with WebGPU and without it (kernels.wasm) (browser mark).  CI's subset holds only models that pass today: " +
              ", ".join(m.name for m in MODELS if m.fast or m.committed) + "."]
    return "\n".join(lines) + "\n"


# main -------------------------------------------------------------------------------------------


def select(only: list[str], fast: bool) -> list[Model]:
    unknown = [name for name in only if name not in MODELS_BY_NAME]
    if unknown:
        sys.exit(f"error: unknown model(s) {', '.join(unknown)}; see scripts/model_zoo.py list")
    chosen = [m for m in MODELS if (not only or m.name in only)]
    return [m for m in chosen if m.fast or m.committed] if fast else chosen


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    parser.add_argument("command", choices=["setup", "export", "check", "all", "list"])
    parser.add_argument("--only", action="append", default=[], metavar="NAME",
                        help="this model only (repeatable; for setup: an environment name)")
    parser.add_argument("--fast", action="store_true", help="CI's subset: the fast and the committed models")
    parser.add_argument("--write-test-data", action="store_true",
                        help="export: copy the committed models to tests/data/model-zoo/")
    parser.add_argument("--no-docs", action="store_true", help="check: do not rewrite docs/model-zoo.*")
    parser.add_argument("--paths", default="", metavar="PATH,...",
                        help="check: these paths only (of webgpu, wasm, chromium-wasm, batch); the row keeps the "
                             "others' results from the last check")
    parser.add_argument("--work-dir", type=Path, default=CACHE, metavar="DIR",
                        help="check: build bundles into DIR/bundles and keep results in DIR/results.json "
                             "(default .cache/model-zoo; the exported models are read from there)")
    args = parser.parse_args(argv)
    if args.command == "setup":
        return setup(args.only)
    if args.command == "list":
        for m in MODELS:
            flags = " ".join(f for f, on in (("fast", m.fast), ("committed", m.committed)) if on)
            print(f"{m.name:28} {m.category:15} {m.exporter:20} {m.environment:7} {flags}")
        return 0
    models = select(args.only, args.fast)
    status = 0
    if args.command in ("export", "all"):
        status = export(models, args.write_test_data)
    if args.command in ("check", "all"):
        status = check(models, args.fast, write_docs=not args.no_docs and not args.fast,
                       paths=[p for p in args.paths.split(",") if p], work_dir=args.work_dir.resolve())
    return status


if __name__ == "__main__":
    sys.exit(main())
