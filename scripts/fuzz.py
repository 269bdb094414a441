#!/usr/bin/env python3
"""Fuzz relaxweb with what strangers hand it: mutated ONNX files and tampered bundles.

    python3 scripts/fuzz.py onnx    [--count 1000] [--seed 0]   mutated and truncated models -> relaxweb.build
    python3 scripts/fuzz.py bundles [--count 500]  [--seed 0]   tampered bundles -> relaxweb.load(...).run(...), .run_batch(...)
    python3 scripts/fuzz.py all                                 both, at their default counts

Every case must end in one of two ways: it works, or it raises a RelaxwebError with a message
(one ``error:`` line from the command line).  Any other exception is a *traceback*, a case that runs past its
time limit is a *hang*, and a file opened outside the case's own folder (and outside Python's
and relaxweb's installation) is an *outside read*; the script prints each such case (seed,
mutation, what happened) and exits 1 when there is any.  Cases are reproducible from
``--seed``: case ``i`` uses ``random.Random(seed * 1_000_003 + i)``.

ONNX mutations are protobuf-level (truncation, flipped and inserted bytes) and graph-level
(an op type, attribute, dim, dtype, initializer length, opset, name or external-data
location changed to something hostile).  Bundle mutations change one manifest field (deleted,
wrong type, out of range, a path outside the folder) or one file (truncated, flipped bytes,
garbage, removed, replaced by a link out of the folder or by ``/dev/zero``).
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import random
import shutil
import signal
import sys
import tempfile
import traceback
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import relaxweb  # noqa: E402
from relaxweb.errors import RelaxwebError, shown  # noqa: E402

CASE_TIMEOUT_S = 60
HOSTILE_STRINGS = [
    "", "\n", "x\n(unreachable)\n;;", "../../../../etc/passwd", "/dev/zero", "%00", "\u2028", "a" * 5000,
    "kernels/../../x.wgsl", "weights/shard0.bin\n", "\x1b[31mred", "{value}{expected}",
]
HOSTILE_NUMBERS = [-1, 0, 1, 3, 7, 255, 2**31, 2**40, 2**53, 2**63, -(2**63), 1.5, float("1e300")]


# Source models ------------------------------------------------------------------------------


def source_models() -> dict[str, onnx.ModelProto]:
    """Small models that exercise different paths: dense layers, convolution, shape arithmetic
    with a symbolic dim, a value read back from the GPU, and a loop."""
    rng = np.random.default_rng(0)

    def weight(name: str, *shape: int) -> TensorProto:
        return numpy_helper.from_array(rng.standard_normal(shape).astype(np.float32), name)

    def model(nodes, inputs, outputs, initializers=(), opset=17) -> onnx.ModelProto:
        graph = helper.make_graph(nodes, "fuzz", inputs, outputs, list(initializers))
        return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])

    float_input = lambda name, shape: helper.make_tensor_value_info(name, TensorProto.FLOAT, shape)  # noqa: E731
    return {
        "mlp": model(
            [helper.make_node("Gemm", ["x", "w1", "b1"], ["h"], transB=1), helper.make_node("Relu", ["h"], ["r"]),
             helper.make_node("MatMul", ["r", "w2"], ["l"]), helper.make_node("Softmax", ["l"], ["y"], axis=-1)],
            [float_input("x", ["batch", 8])], [float_input("y", ["batch", 4])],
            [weight("w1", 16, 8), weight("b1", 16), weight("w2", 16, 4)]),
        "conv": model(
            [helper.make_node("Conv", ["x", "k"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("MaxPool", ["c"], ["p"], kernel_shape=[2, 2], strides=[2, 2]),
             helper.make_node("GlobalAveragePool", ["p"], ["y"])],
            [float_input("x", ["n", 3, "h", "w"])], [float_input("y", ["n", 4, 1, 1])], [weight("k", 4, 3, 3, 3)]),
        "shapes": model(
            [helper.make_node("Shape", ["x"], ["s"]),
             helper.make_node("Gather", ["s", "zero"], ["n"], axis=0),
             helper.make_node("Unsqueeze", ["n", "zero"], ["n1"]),
             helper.make_node("Concat", ["n1", "minus_one"], ["target"], axis=0),
             helper.make_node("Reshape", ["x", "target"], ["flat"]),
             helper.make_node("ReduceSum", ["flat", "one"], ["y"], keepdims=1)],
            [float_input("x", ["n", 2, 3])], [float_input("y", ["n", 1])],
            [numpy_helper.from_array(np.array(0, np.int64), "zero"),
             numpy_helper.from_array(np.array([-1], np.int64), "minus_one"),
             numpy_helper.from_array(np.array([1], np.int64), "one")]),
        "readback": model(
            [helper.make_node("NonZero", ["x"], ["nz"]), helper.make_node("Transpose", ["nz"], ["y"])],
            [float_input("x", ["n"])], [helper.make_tensor_value_info("y", TensorProto.INT64, ["k", 1])]),
    }


def feeds_for(bundle: relaxweb.Bundle, rng: random.Random) -> dict[str, np.ndarray]:
    """Random inputs for a bundle: every symbolic dim 1..4, every fixed dim as written."""
    sizes: dict[str, int] = {}
    feeds = {}
    for spec in bundle.inputs:
        shape = []
        for dim in spec.shape or ():
            if isinstance(dim, int):
                shape.append(dim)
            else:
                shape.append(sizes.setdefault(dim, rng.randint(1, 4)))
        dtype = np.dtype(spec.dtype) if spec.dtype != "bool" else np.dtype(bool)
        feeds[spec.name] = (np.random.default_rng(rng.randint(0, 2**31)).standard_normal(shape) * 3).astype(dtype)
    return feeds


# Outcomes ----------------------------------------------------------------------------------


class CaseTimeout(Exception):
    pass


@dataclass
class Report:
    kind: str
    outcomes: dict[str, int] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)

    def add(self, outcome: str, detail: str | None = None) -> None:
        self.outcomes[outcome] = self.outcomes.get(outcome, 0) + 1
        if detail is not None:
            self.failures.append(detail)

    @property
    def cases(self) -> int:
        return sum(self.outcomes.values())

    def summary(self) -> str:
        counts = ", ".join(f"{count} {outcome}" for outcome, count in sorted(self.outcomes.items()))
        return f"{self.kind}: {self.cases} cases: {counts}"


class OutsideReads:
    """An audit hook that records files opened outside the allowed folders while armed.

    Audit hooks cannot be removed, so there is one per process (``outside_reads()``)."""

    def __init__(self) -> None:
        self.allowed: tuple[str, ...] = ()
        self.seen: list[str] = []
        self.armed = False
        sys.addaudithook(self._hook)

    def arm(self, *folders: Path) -> None:
        installation = {sys.prefix, sys.base_prefix, str(ROOT / "relaxweb"), tempfile.gettempdir() + "/relaxweb-xdg-"}
        self.allowed = tuple(str(Path(f).resolve()) for f in folders) + tuple(installation)
        self.seen = []
        self.armed = True

    def disarm(self) -> list[str]:
        self.armed = False
        return self.seen

    def _hook(self, event: str, args: tuple) -> None:
        if not self.armed or event != "open" or not isinstance(args[0], (str, bytes, os.PathLike)):
            return
        path = os.path.realpath(os.fsdecode(args[0]))
        if not path.startswith(self.allowed) and not path.startswith(("/usr/", "/proc/self/", "/sys/", "/dev/null")):
            self.seen.append(path)


_OUTSIDE_READS: OutsideReads | None = None


def outside_reads() -> OutsideReads:
    """The process's one watch (made, and its hook added, on first use)."""
    global _OUTSIDE_READS
    if _OUTSIDE_READS is None:
        _OUTSIDE_READS = OutsideReads()
    return _OUTSIDE_READS


def run_case(report: Report, label: str, work, watch: OutsideReads, folders: list[Path]) -> None:
    """Run ``work()``; record ``ok``, ``refused`` (a RelaxwebError) or a failure."""

    def expire(signum, frame):
        raise CaseTimeout()

    previous = signal.signal(signal.SIGALRM, expire)
    signal.alarm(CASE_TIMEOUT_S)
    # in the case's folder: relative names opened (shutil.rmtree opens entries relative to
    # their folder's descriptor) are then judged inside it
    working_folder = os.getcwd()
    os.chdir(folders[0])
    watch.arm(*folders)
    try:
        work()
        outcome, detail = "ok", None
    except RelaxwebError as error:
        # names from the model may hold line breaks: the command line escapes them (errors.shown)
        message = shown(str(error)).strip()
        if not message:
            outcome, detail = "bad message", f"{label}: a RelaxwebError with no message"
        else:
            outcome, detail = "refused", None
    except CaseTimeout:
        outcome, detail = "hang", f"{label}: still running after {CASE_TIMEOUT_S} s"
    except Exception:  # noqa: BLE001 - the point: anything else is a traceback
        outcome, detail = "traceback", f"{label}:\n{traceback.format_exc(limit=-4)}"
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
        outside = watch.disarm()
        os.chdir(working_folder)
    if outside and detail is None:
        outcome, detail = "outside read", f"{label}: opened {sorted(set(outside))[:3]}"
    report.add(outcome, detail)


def _cases(count: int, seed: int, only: set[int] | None, sources: list[str], scratch: Path):
    """Each case to run: its number, its random generator, its source (in turn) and its folder."""
    for case in range(count):
        if not only or case in only:
            yield case, random.Random(seed * 1_000_003 + case), sources[case % len(sources)], scratch / f"case{case}"


# ONNX mutations ----------------------------------------------------------------------------


def mutate_bytes(data: bytes, rng: random.Random) -> tuple[bytes, str]:
    choice = rng.randrange(4)
    if choice == 0:
        cut = rng.randrange(len(data))
        return data[:cut], f"truncated at byte {cut} of {len(data)}"
    buffer = bytearray(data)
    if choice == 1:
        places = [rng.randrange(len(buffer)) for _ in range(rng.randint(1, 8))]
        for place in places:
            buffer[place] ^= 1 << rng.randrange(8)
        return bytes(buffer), f"flipped bits at bytes {places}"
    if choice == 2:
        place = rng.randrange(len(buffer))
        junk = bytes(rng.randrange(256) for _ in range(rng.randint(1, 16)))
        return bytes(buffer[:place] + junk + buffer[place:]), f"inserted {len(junk)} bytes at {place}"
    start = rng.randrange(len(buffer))
    end = min(len(buffer), start + rng.randint(1, 64))
    return bytes(buffer[:end] + buffer[start:]), f"duplicated bytes {start}..{end}"


OP_TYPES = ["Add", "Relu", "Reshape", "Conv", "Gather", "Concat", "MatMul", "Softmax", "Loop", "If", "Slice",
            "Resize", "NoSuchOp", "Expand", "Tile", "Range", "TopK", "LSTM", "Cast", "Pad", "Split", "Einsum"]


def mutate_graph(model: onnx.ModelProto, rng: random.Random) -> str:
    """Change ``model`` in place in one hostile way; returns what was done."""
    graph = model.graph
    choice = rng.randrange(13)
    node = rng.choice(graph.node)
    if choice == 0:
        old, node.op_type = node.op_type, rng.choice(OP_TYPES)
        return f"op {old} -> {node.op_type}"
    if choice == 1 and node.input:
        del node.input[rng.randrange(len(node.input))]
        return f"removed an input of {node.op_type}"
    if choice == 2:
        node.input.append(rng.choice(["", "missing_tensor", node.output[0]]))
        return f"added input {node.input[-1]!r} to {node.op_type}"
    if choice == 3:
        name = rng.choice(["axis", "perm", "pads", "kernel_shape", "strides", "transB", "keepdims", "to", "mode"])
        value = rng.choice([n for n in HOSTILE_NUMBERS if isinstance(n, int) and abs(n) < 2**63])
        node.attribute.append(helper.make_attribute(name, rng.choice([value, [value, value]])))
        return f"attribute {name}={value} on {node.op_type}"
    if choice == 4 and graph.initializer:
        tensor = rng.choice(graph.initializer)
        data = tensor.raw_data or numpy_helper.to_array(tensor).tobytes()
        tensor.ClearField("float_data")
        tensor.ClearField("int64_data")
        tensor.raw_data = data[: rng.randrange(len(data) + 1)] if rng.random() < 0.5 else data + b"\0" * rng.randint(1, 9)
        return f"initializer {tensor.name} data of {len(tensor.raw_data)} bytes for dims {list(tensor.dims)}"
    if choice == 5 and graph.initializer:
        tensor = rng.choice(graph.initializer)
        tensor.data_type = rng.choice([0, 8, 13, 16, 17, 21, 22, 99, 1000])
        return f"initializer {tensor.name} data type {tensor.data_type}"
    if choice == 6:
        value_info = rng.choice([*graph.input, *graph.output])
        dims = value_info.type.tensor_type.shape.dim
        if dims:
            dim = rng.choice(dims)
            dim.dim_value = rng.choice([-5, 0, 2**40, 2**62])
            return f"{value_info.name} dim_value {dim.dim_value}"
        return "no dims to change"
    if choice == 7:
        model.opset_import[0].version = rng.choice([0, 1, 6, 99, 2**40])
        return f"opset {model.opset_import[0].version}"
    if choice == 8:
        value_info = rng.choice(graph.input)
        value_info.type.tensor_type.shape.dim.extend([onnx.TensorShapeProto.Dimension(dim_value=1)] * rng.randint(1, 9))
        return f"{value_info.name} rank {len(value_info.type.tensor_type.shape.dim)}"
    if choice == 9 and graph.initializer:
        tensor = rng.choice(graph.initializer)
        tensor.data_location = TensorProto.EXTERNAL
        tensor.ClearField("raw_data")
        tensor.ClearField("float_data")
        location = rng.choice(["../../../../etc/passwd", "/dev/zero", "missing.bin", "model.onnx", "/etc/hostname"])
        entries = {"location": location, "offset": str(rng.choice([0, -8, 2**40])), "length": str(rng.choice([4, 64, -1]))}
        del tensor.external_data[:]
        for key, value in entries.items():
            tensor.external_data.add(key=key, value=value)
        return f"initializer {tensor.name} external data {entries}"
    if choice == 10:
        new_name = rng.choice(HOSTILE_STRINGS)
        old = node.output[0]
        node.output[0] = new_name
        for other in graph.node:
            for index, name in enumerate(other.input):
                if name == old:
                    other.input[index] = new_name
        for output in graph.output:
            if output.name == old:
                output.name = new_name
        return f"renamed {old!r} to {new_name[:40]!r}"
    if choice == 11:
        node.domain = rng.choice(["com.microsoft", "com.evil", "ai.onnx.ml"])
        return f"{node.op_type} in domain {node.domain}"
    graph.output[0].type.tensor_type.elem_type = rng.choice([0, 2, 7, 9, 10, 16])
    return f"output dtype {graph.output[0].type.tensor_type.elem_type}"


def fuzz_onnx(count: int, seed: int, run_every: int = 3, only: set[int] | None = None) -> Report:
    report = Report("onnx")
    watch = outside_reads()
    sources = source_models()
    names = sorted(sources)
    with tempfile.TemporaryDirectory(prefix="relaxweb-fuzz-onnx-") as scratch:
        for case, rng, source, folder in _cases(count, seed, only, names, Path(scratch)):
            folder.mkdir()
            model = copy.deepcopy(sources[source])
            if rng.random() < 0.4:
                data, what = mutate_bytes(model.SerializeToString(), rng)
            else:
                what = mutate_graph(model, rng)
                data = model.SerializeToString()
            (folder / "model.onnx").write_bytes(data)
            label = f"onnx case {case} (seed {seed}, {source}: {what})"

            def work(folder=folder, rng=rng, case=case) -> None:
                bundle = relaxweb.build(folder / "model.onnx", folder / "dist")
                if case % run_every == 0:
                    relaxweb.load(folder / "dist").run(feeds_for(bundle, rng))

            run_case(report, label, work, watch, [folder])
            shutil.rmtree(folder, ignore_errors=True)
    return report


# Bundle tampering --------------------------------------------------------------------------


def manifest_paths(value, prefix=()) -> list[tuple]:
    """Every path to a value in a manifest (keys and list indices), containers included."""
    paths = [prefix] if prefix else []
    if isinstance(value, dict):
        for key, item in value.items():
            paths += manifest_paths(item, (*prefix, key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            paths += manifest_paths(item, (*prefix, index))
    return paths


def tamper_manifest(manifest: dict, rng: random.Random) -> str:
    path = rng.choice(manifest_paths(manifest))
    parent = manifest
    for step in path[:-1]:
        parent = parent[step]
    key = path[-1]
    choice = rng.randrange(4)
    if choice == 0 and isinstance(parent, dict):
        del parent[key]
        return f"deleted {'.'.join(map(str, path))}"
    if choice == 1:
        parent[key] = rng.choice([None, True, [], {}, "x", 1.5])
    elif choice == 2:
        parent[key] = rng.choice(HOSTILE_NUMBERS)
    else:
        parent[key] = rng.choice(HOSTILE_STRINGS)
    return f"{'.'.join(map(str, path))} = {json.dumps(parent[key])[:40]}"


def tamper_file(folder: Path, rng: random.Random) -> str:
    files = sorted(p for p in folder.rglob("*") if p.is_file() and "runtime" not in p.parts and p.name != "host.wat")
    target = rng.choice(files)
    relative = target.relative_to(folder)
    choice = rng.randrange(6)
    data = target.read_bytes()
    if choice == 0:
        target.write_bytes(data[: rng.randrange(len(data) + 1)])
        return f"truncated {relative}"
    if choice == 1 and data:
        buffer = bytearray(data)
        for _ in range(rng.randint(1, 8)):
            buffer[rng.randrange(len(buffer))] ^= 1 << rng.randrange(8)
        target.write_bytes(bytes(buffer))
        return f"flipped bits in {relative}"
    if choice == 2:
        target.write_bytes(bytes(rng.randrange(256) for _ in range(rng.randint(0, 300))))
        return f"garbage in {relative}"
    if choice == 3:
        target.unlink()
        return f"removed {relative}"
    target.unlink()
    outside = rng.choice(["/etc/hostname", "/etc", "/dev/zero", "/proc/self/environ", "../../outside"])
    target.symlink_to(outside)
    return f"{relative} -> symlink to {outside}"


def run_and_batch(folder: Path, feeds: dict[str, np.ndarray]) -> None:
    """Load a bundle, run it, then run a batch of two instances (the ragged kernels and the
    batch's own checks see the tampered bundle too)."""
    session = relaxweb.load(folder)
    session.run(feeds)
    session.run_batch([feeds, feeds])


def fuzz_bundles(count: int, seed: int, only: set[int] | None = None) -> Report:
    report = Report("bundles")
    watch = outside_reads()
    with tempfile.TemporaryDirectory(prefix="relaxweb-fuzz-bundles-") as scratch:
        originals = {}
        for name, model in source_models().items():
            onnx.save(model, Path(scratch) / f"{name}.onnx")
            bounds = {"batch": 8} if name == "mlp" else None
            originals[name] = relaxweb.build(Path(scratch) / f"{name}.onnx", Path(scratch) / name, bounds=bounds)
        names = sorted(originals)
        for case, rng, source, folder in _cases(count, seed, only, names, Path(scratch)):
            shutil.copytree(Path(scratch) / source, folder, symlinks=True)
            if rng.random() < 0.6:
                manifest = json.loads((folder / "manifest.json").read_text())
                what = tamper_manifest(manifest, rng)
                (folder / "manifest.json").write_text(json.dumps(manifest))
            else:
                what = tamper_file(folder, rng)
            label = f"bundle case {case} (seed {seed}, {source}: {what})"
            feeds = feeds_for(originals[source], rng)
            run_case(report, label, lambda folder=folder, feeds=feeds: run_and_batch(folder, feeds), watch, [folder])
            shutil.rmtree(folder, ignore_errors=True)
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog=__doc__.split("\n\n", 1)[1])
    parser.add_argument("target", choices=["onnx", "bundles", "all"])
    parser.add_argument("--count", type=int, help="cases (default: 1000 ONNX files, 500 bundles)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--only", type=int, nargs="+", metavar="CASE", help="run only these case numbers (to reproduce one)")
    args = parser.parse_args(argv)
    reports = []
    if args.target in ("onnx", "all"):
        reports.append(fuzz_onnx(args.count or 1000, args.seed, only=set(args.only or ())))
    if args.target in ("bundles", "all"):
        reports.append(fuzz_bundles(args.count or 500, args.seed, only=set(args.only or ())))
    failed = False
    for report in reports:
        print(report.summary())
        for failure in report.failures:
            print(f"  FAIL {failure}")
        failed |= bool(report.failures)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
