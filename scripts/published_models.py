#!/usr/bin/env python3
"""Published ONNX models that ship inside popular Python packages, built with relaxweb and
checked against onnxruntime: the models users actually have (PaddleOCR's detector,
recognizer and direction classifier through rapidocr, ddddocr's captcha recognizer and
detector, Magika's file-type classifier, Silero VAD and its variants).

    python3 scripts/published_models.py            # download the wheels (PyPI, no deps), check all
    python3 scripts/published_models.py silero     # one model (names: --list)

The wheels are fetched with ``pip download --no-deps`` into .cache/published-models/ (ignored;
nothing is installed and nothing reaches a model hub) and the .onnx files are read from them.
Each model is built once and run with the Python runtime at one to three input shapes; the
line per model gives the largest min(absolute, relative) difference of any output.  Exit
status 1 when a model that should build does not, or differs by more than 1e-3.

A dynamically quantized model ('quantized') is checked as its users read it: the argmax of
the last dim (the character ddddocr decodes at each step) equal to onnxruntime's everywhere,
and the logits within 0.5 (the difference above; the quantization itself moves them by up to
7.4 from the float model's).
Its activations are quantized again after each float op, and onnxruntime's Sigmoid (MLAS's
rational approximation) differs from relaxweb's in the last bit: the first difference moves
a DynamicQuantizeLinear scale by one ulp, which moves rounding steps (of the activations and
of the bias, quantized at run time by Floor(bias / scale)) through 21 re-quantized layers.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import relaxweb  # noqa: E402

CACHE = ROOT / ".cache" / "published-models"
PACKAGES = ("rapidocr_onnxruntime", "ddddocr", "magika", "silero-vad")
TOLERANCE = 1e-3
QUANTIZED_TOLERANCE = 0.5  # logits of a dynamically quantized model (see the docstring)


def _images(rng, *shapes):
    return [rng.random(shape, dtype=np.float32) for shape in shapes]


def _silero_state(rng, batch: int, samples: int, rate: int | None, state: str = "state") -> dict:
    feeds = {"input": rng.standard_normal((batch, samples)).astype(np.float32),
             state: (rng.standard_normal((2, batch, 128)) * 0.1).astype(np.float32)}
    if rate is not None:
        feeds["sr"] = np.array(rate, np.int64)
    return feeds


def cases(rng) -> dict[str, tuple[str, list[dict], str]]:
    """name -> (path inside the unpacked wheels, feeds per run, what is expected: 'match',
    'quantized' (see the module docstring) or 'unsupported' (a clean one-line refusal))."""
    ocr = "rapidocr_onnxruntime/models/"
    silero = "silero_vad/data/"
    return {
        "ppocr_det": (ocr + "ch_PP-OCRv4_det_infer.onnx",
                      [{"x": x} for x in _images(rng, (1, 3, 64, 96), (2, 3, 96, 128), (1, 3, 160, 64))], "match"),
        "ppocr_rec": (ocr + "ch_PP-OCRv4_rec_infer.onnx",
                      [{"x": x} for x in _images(rng, (1, 3, 48, 160), (2, 3, 48, 320))], "match"),
        "ppocr_cls": (ocr + "ch_ppocr_mobile_v2.0_cls_infer.onnx",
                      [{"x": x} for x in _images(rng, (1, 3, 48, 192), (3, 3, 48, 192))], "match"),
        "ddddocr_common": ("ddddocr/common.onnx",
                           [{"input1": x} for x in _images(rng, (1, 1, 64, 128), (1, 1, 64, 200))], "match"),
        "ddddocr_det": ("ddddocr/common_det.onnx", [{"images": x * 255} for x in _images(rng, (1, 3, 416, 416))], "match"),
        # dynamically quantized (ConvInteger, MatMulInteger, DynamicQuantizeLSTM ...)
        "ddddocr_old": ("ddddocr/common_old.onnx",
                        [{"input1": x} for x in _images(rng, (1, 1, 64, 128), (1, 1, 64, 200))], "quantized"),
        "magika": ("magika/models/standard_v3_3/model.onnx",
                   [{"bytes": rng.integers(0, 257, (batch, 2048)).astype(np.int32)} for batch in (1, 3)], "match"),
        "silero": (silero + "silero_vad.onnx", [_silero_state(rng, 1, 512, 16000), _silero_state(rng, 2, 256, 8000),
                                                _silero_state(rng, 3, 512, 16000)], "match"),
        "silero_op15": (silero + "silero_vad_16k_op15.onnx",
                        [_silero_state(rng, 1, 512, 16000), _silero_state(rng, 2, 512, 16000)], "match"),
        "silero_half": (silero + "silero_vad_half.onnx", [_silero_state(rng, 1, 512, None), _silero_state(rng, 2, 512, None)],
                        "match"),
        "silero_ifless": (silero + "silero_vad_op18_ifless.onnx",
                          [_silero_state(rng, 1, 512, 16000), _silero_state(rng, 2, 256, 8000)], "match"),
        "silero_openvino": (silero + "silero_vad_openvino_16k.onnx", [_silero_state(rng, 1, 576, None)], "match"),
        "silero_sequence": (silero + "silero_vad_16k_sequence.onnx",
                            [{"input": rng.standard_normal((steps, 576)).astype(np.float32),
                              "h": (rng.standard_normal((1, 1, 128)) * 0.1).astype(np.float32),
                              "c": (rng.standard_normal((1, 1, 128)) * 0.1).astype(np.float32)} for steps in (3, 7)],
                            "match"),
    }


def fetch() -> Path:
    """The wheels, downloaded once and unpacked under .cache/published-models/unpacked/."""
    wheels, unpacked = CACHE / "wheels", CACHE / "unpacked"
    if not unpacked.exists():
        wheels.mkdir(parents=True, exist_ok=True)
        print(f"downloading {', '.join(PACKAGES)} (pip download --no-deps) into {wheels}", flush=True)
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", str(wheels), *PACKAGES],
                       check=True)
        for wheel in sorted(wheels.glob("*.whl")):
            with zipfile.ZipFile(wheel) as archive:
                archive.extractall(unpacked)
    return unpacked


def difference(actual: np.ndarray, expected: np.ndarray) -> float:
    if actual.shape != expected.shape:
        return float("inf")
    gap = np.abs(actual.astype(np.float64) - expected.astype(np.float64))
    relative = gap / np.maximum(np.abs(expected.astype(np.float64)), np.finfo(np.float64).tiny)
    return float(np.max(np.minimum(gap, relative))) if gap.size else 0.0


def check(name: str, path: Path, runs: list[dict], expect: str) -> bool:
    import onnxruntime

    bundle = CACHE / "bundles" / name
    shutil.rmtree(bundle, ignore_errors=True)
    start = time.perf_counter()
    try:
        relaxweb.build(path, bundle)
    except relaxweb.RelaxwebError as error:
        first = str(error).splitlines()[0]
        print(f"{name}: does not build: {first[:300]}", flush=True)
        return expect == "unsupported"
    built = time.perf_counter() - start
    session = relaxweb.load(bundle)
    options = onnxruntime.SessionOptions()
    options.log_severity_level = 3
    reference = onnxruntime.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    worst, same_argmax = 0.0, True
    for feeds in runs:
        actual = session.run(feeds)
        for output, expected in zip(reference.get_outputs(), reference.run(None, feeds)):
            worst = max(worst, difference(actual[output.name], expected))
            if expect == "quantized":
                same_argmax &= bool(np.array_equal(actual[output.name].argmax(-1), expected.argmax(-1)))
    ok = worst <= TOLERANCE if expect == "match" else expect == "quantized" and same_argmax and worst <= QUANTIZED_TOLERANCE
    argmax = f", argmax {'equal' if same_argmax else 'DIFFERS'}" if expect == "quantized" else ""
    print(f"{name}: built in {built:.1f} s, {len(runs)} run(s), max difference {worst:.1e}{argmax}: "
          f"{'ok' if ok else 'NOT OK'}", flush=True)
    return ok


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("names", nargs="*", help="models to check (default: all)")
    parser.add_argument("--list", action="store_true", help="list the models and exit")
    args = parser.parse_args(argv)
    table = cases(np.random.default_rng(0))
    if args.list:
        for name, (path, runs, expect) in table.items():
            print(f"{name:18} {path}  ({expect})")
        return 0
    unknown = [name for name in args.names if name not in table]
    if unknown:
        parser.error(f"unknown model(s): {', '.join(unknown)} (see --list)")
    unpacked = fetch()
    failed = [name for name in (args.names or list(table))
              if not check(name, unpacked / table[name][0], table[name][1], table[name][2])]
    print(f"{len(args.names or table) - len(failed)} of {len(args.names or table)} as expected"
          + (f"; not: {', '.join(failed)}" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
