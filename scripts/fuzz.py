#!/usr/bin/env python3
"""Fuzz relaxweb with what strangers hand it: mutated ONNX files, tampered bundles, hostile
command lines; and compare its integer arithmetic with onnxruntime's.

    python3 scripts/fuzz.py onnx     [--count 1000] [--seed 0]  mutated and truncated models -> relaxweb.build
    python3 scripts/fuzz.py bundles  [--count 500]  [--seed 0]  tampered bundles -> relaxweb.load(...).run(...), .run_batch(...)
    python3 scripts/fuzz.py cli      [--count 200]  [--seed 0]  hostile `relaxweb` command lines and files (``fuzz_cli``)
    python3 scripts/fuzz.py integers [--count 100]  [--seed 0]  random integer graphs vs onnxruntime (``fuzz_integers``)
    python3 scripts/fuzz.py all                                 each, at its default count

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
garbage, removed, replaced by a link out of the folder or by ``/dev/zero``).  Command lines
and integer graphs have their own rules (``fuzz_cli``, ``fuzz_integers``); each failure is
printed as ``FAIL``, and a finding that is not relaxweb's (onnxruntime's inexact int64 sums)
as ``NOTE``.
"""

from __future__ import annotations

import argparse
import copy
import io
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import traceback
import zipfile
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
    notes: list[str] = field(default_factory=list)  # worth a look, not failures

    def add(self, outcome: str, detail: str | None = None, note: str | None = None) -> None:
        self.outcomes[outcome] = self.outcomes.get(outcome, 0) + 1
        if detail is not None:
            self.failures.append(detail)
        if note is not None:
            self.notes.append(note)

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


# Command lines -----------------------------------------------------------------------------

CLI_TIMEOUT_S = 90  # a case's subprocess; a run in Chromium or a generation fits well inside
CLI_EXITS = {0, 2, 141}  # done, one error line, a closed pipe (as a shell reports SIGPIPE)
LONG_NAME = "n" * 300
LONG_PATH = "/".join(["p" * 200] * 25)
NOT_UTF8 = os.fsdecode(b"\xff\xfename")  # a file name whose bytes are not UTF-8


def _npz_with_header(path: Path, header: dict, payload: bytes = bytes(64), version=(1, 0)) -> None:
    """An .npz whose one array ``x`` has ``header`` (any shape and descr), then ``payload``."""
    buffer = io.BytesIO()
    writer = {(1, 0): np.lib.format.write_array_header_1_0, (2, 0): np.lib.format.write_array_header_2_0}
    if version in writer:
        writer[version](buffer, header)
    else:  # a version numpy does not know
        buffer.write(np.lib.format.magic(*version) + b"\x10\x00" + b"{}".ljust(16))
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("x.npy", buffer.getvalue() + payload)


def _hostile_files(folder: Path) -> None:
    """The files a command line may name besides the good ones (m.onnx, in.npz, dist/, llama/):
    broken models, .npz files with every kind of wrong array, and special files."""
    model = (folder / "m.onnx").read_bytes()
    (folder / "trunc.onnx").write_bytes(model[: len(model) // 3])
    (folder / "garbled.onnx").write_bytes(bytes(b ^ 0x5A if i % 97 == 0 else b for i, b in enumerate(model)))
    (folder / "empty.onnx").write_bytes(b"")
    (folder / "text.onnx").write_text("not a model\n")
    shutil.copy(folder / "in.npz", folder / "npz.onnx")
    good = {"x": np.zeros((2, 64), np.float32)}
    arrays = {
        "f64.npz": {"x": np.zeros((2, 64), np.float64)}, "i8.npz": {"x": np.zeros((2, 64), np.int8)},
        "c64.npz": {"x": np.zeros((2, 64), np.complex64)}, "str.npz": {"x": np.full((2, 64), "abc")},
        "bool.npz": {"x": np.zeros((2, 64), bool)}, "wrongname.npz": {"y": good["x"]},
        "extra.npz": {**good, "junk": np.ones(3)}, "empty.npz": {}, "scalar.npz": {"x": np.float32(3)},
        "rank3.npz": {"x": np.zeros((2, 64, 1), np.float32)}, "zero.npz": {"x": np.zeros((0, 64), np.float32)},
        "wide.npz": {"x": np.zeros((2, 65), np.float32)}, "big.npz": {"x": np.zeros((20000, 64), np.float32)},
        "nan.npz": {"x": np.full((2, 64), np.nan, np.float32)}, "fortran.npz": {"x": np.asfortranarray(np.zeros((2, 64), np.float32))},
        "bigendian.npz": {"x": np.zeros((2, 64), ">f4")}, "record.npz": {"x": np.zeros((2, 64), [("a", "<f4")])},
        "ids.npz": {"input_ids": np.array([[1, 2, 3]], np.int64), "past_key_values.0.key": np.zeros((1, 1, 0, 8), np.float32)},
        "ids_huge.npz": {"input_ids": np.array([[2**40, -5, 300]], np.int64),
                         "past_key_values.0.key": np.zeros((1, 1, 0, 8), np.float32)},
    }
    for name, content in arrays.items():
        np.savez(folder / name, **content)
    np.savez(folder / "pickle.npz", x=np.array([{"a": 1}, None], dtype=object))
    _npz_with_header(folder / "huge.npz", {"descr": "<f4", "fortran_order": False, "shape": (2**40, 4)})
    _npz_with_header(folder / "overflow.npz", {"descr": "<f4", "fortran_order": False, "shape": (2**62, 2**62)})
    _npz_with_header(folder / "objheader.npz", {"descr": "|O", "fortran_order": False, "shape": (2,)})
    _npz_with_header(folder / "version9.npz", {}, version=(9, 0))
    _npz_with_header(folder / "short.npz", {"descr": "<f4", "fortran_order": False, "shape": (2, 64)}, bytes(8))
    (folder / "notzip.npz").write_bytes(b"PK\x03\x04" + bytes(range(256)))
    (folder / "trunc.npz").write_bytes((folder / "in.npz").read_bytes()[:100])
    np.save(folder / "x.npy", good["x"])
    with zipfile.ZipFile(folder / "traversal.npz", "w") as archive:
        archive.writestr("../x.npy", (folder / "x.npy").read_bytes())
    (folder / "deep.json").write_text("[" * 100_000 + "]" * 100_000)
    (folder / "tok.json").write_text('{"kind": "byte", "vocab_size": 10, "eos_token_id": 9}')
    (folder / "folder.npz").mkdir()
    (folder / "folder.onnx").mkdir()
    (folder / "loop.npz").symlink_to("loop.npz")
    (folder / NOT_UTF8).write_bytes(b"")


def _special_files(folder: Path) -> None:
    """FIFOs, made in each case's folder (a copy cannot copy them): opening one to read waits
    for a writer that never comes."""
    os.mkfifo(folder / "fifo.npz")
    os.mkfifo(folder / "fifo.onnx")


# What a command line's paths may be (relative to the case's folder).
MODEL_PATHS = ["m.onnx", "llama.onnx", "trunc.onnx", "garbled.onnx", "empty.onnx", "text.onnx", "npz.onnx",
               "folder.onnx", "fifo.onnx", "missing.onnx", "dist", "/dev/null", "/dev/zero", LONG_NAME, LONG_PATH,
               NOT_UTF8, "", "-", "loop.npz"]
BUNDLE_PATHS = ["dist", "llama", "dist/", "m.onnx", "missing", "folder.npz", "/dev/null", "", LONG_NAME, NOT_UTF8, "/"]
NPZ_PATHS = ["in.npz", "in2.npz", "f64.npz", "i8.npz", "c64.npz", "str.npz", "bool.npz", "wrongname.npz", "extra.npz",
             "empty.npz", "scalar.npz", "rank3.npz", "zero.npz", "wide.npz", "big.npz", "nan.npz", "fortran.npz",
             "bigendian.npz", "record.npz", "ids.npz", "ids_huge.npz", "pickle.npz", "huge.npz", "overflow.npz",
             "objheader.npz", "version9.npz", "short.npz", "notzip.npz", "trunc.npz", "x.npy", "traversal.npz",
             "m.onnx", "folder.npz", "fifo.npz", "loop.npz", "missing.npz", "/dev/null", "/dev/zero", LONG_NAME,
             LONG_PATH, NOT_UTF8, ""]
# (no /dev/null: --out adds .npz, and /dev/null.npz would be a file made in /dev)
OUT_PATHS = ["out.npz", "out", "in.npz", "in", "dist", "dist/manifest.json", "folder.npz", "missing/out.npz",
             "fifo.npz", LONG_NAME, LONG_PATH, NOT_UTF8, "", ".", "m.onnx", "/proc/version"]
BUILD_OUTPUTS = ["out", "dist", "llama", "", ".", "m.onnx", "folder.npz", "missing/deeper/out", "/dev/null", "/proc",
                 LONG_NAME, LONG_PATH, NOT_UTF8, "fifo.npz", "in.npz"]
INTEGERS = ["0", "1", "-1", "5", "64", "2147483648", "99999999999999999999", "1e3", "0x10", "", "nan", "inf", "x"]
FLOATS = ["0", "0.5", "1", "-1", "2", "nan", "inf", "-inf", "1e308", "1e-320", "", "x"]
TEXTS = ["hello", "", "\n", "a" * 5000, "\x01\x7f", os.fsdecode(b"ab\xffc"), "\u2028", "{{ bos_token }}", "<|endoftext|>"]
BACKEND_CHOICES = ["auto", "webgpu", "wasm", "gpu", ""]
KERNEL_CHOICES = ["auto", "gpu", "cpu", "f16", "x"]


# Values that work, drawn half the time so that a case gets past argparse to the files and the
# model (with hostile values only, most cases would end at the first odd option).
GOOD_VALUES = {
    "build": ["m.onnx", "llama.onnx"], "run": ["dist", "llama"], "generate": ["llama"], "chat": ["llama"],
    "inspect": ["m.onnx", "dist", "llama.onnx"], "-o": ["out"], "--bound": ["batch=4", "sequence_length=8"],
    "--opt-level": ["0", "1"], "--weights": ["float16", "int8", "int4"], "--group-size": ["16", "32"],
    "--scale-dtype": ["float16", "float32"], "--runtime": ["copy", "none"], "--backend": ["auto", "webgpu", "wasm"],
    "--kernels": ["auto", "gpu", "cpu"], "--inputs": ["in.npz", "in2.npz", "ids.npz"], "--out": ["out.npz", "outs"],
    "--prompt": ["hello", "é€"], "--max-tokens": ["1", "8"], "--temperature": ["0", "0.7"], "--top-k": ["0", "5"],
    "--top-p": ["0.9", "1"], "--repetition-penalty": ["1", "1.3"], "--seed": ["0", "7"], "--message": ["user:hi"],
    "--system": ["be brief"], "--tokenizer": ["tok.json"], "--dump-ir": ["ir"],
}


def _pick(rng: random.Random, values: list[str], name: str = "") -> str:
    """A value for ``name`` (an option, or a command's positional): one that works half the
    time where there are such, else one of ``values``."""
    if name in GOOD_VALUES and rng.random() < 0.5:
        return rng.choice(GOOD_VALUES[name])
    return rng.choice(values)


# Each subcommand: its positional (a pool) and its options, each with the values it may take
# (an empty list: a flag).
CLI_COMMANDS: dict[str, tuple[list[str] | None, dict[str, list[str]]]] = {
    "build": (MODEL_PATHS, {
        "-o": BUILD_OUTPUTS, "--bound": ["batch=4", "batch=0", "batch=-1", "batch=2147483648", "=3", "batch", "batch=x",
                                         "nosuchdim=4", "batch=1e3", "sequence_length=2", "past_sequence_length=1"],
        "--opt-level": ["0", "1", "2", "-1", "x"], "--weights": ["float16", "int8", "int4", "bogus"],
        "--group-size": ["0", "-1", "3", "33", "2147483648", "x"], "--scale-dtype": ["float16", "float32", "int8"],
        "--tokenizer": ["tok.json", "deep.json", "folder.npz", "missing.json", "m.onnx", "/dev/zero", "fifo.npz", "",
                        LONG_NAME, NOT_UTF8, "loop.npz"],
        "--runtime": ["copy", "none", "bogus"], "--debug": [], "--dump-ir": ["ir", "m.onnx", "/dev/null", LONG_NAME, ""],
    }),
    "run": (BUNDLE_PATHS + MODEL_PATHS[:6], {
        "--inputs": NPZ_PATHS, "--out": OUT_PATHS, "--batch": [], "--reference": [], "--profile": [],
        "--backend": BACKEND_CHOICES, "--kernels": KERNEL_CHOICES, "--browser": [],
    }),
    "inspect": (MODEL_PATHS + BUNDLE_PATHS, {}),
    "generate": (BUNDLE_PATHS, {
        "--prompt": TEXTS, "--max-tokens": INTEGERS, "--temperature": FLOATS, "--top-k": INTEGERS,
        "--top-p": FLOATS, "--repetition-penalty": FLOATS, "--seed": INTEGERS, "--backend": BACKEND_CHOICES,
        "--kernels": KERNEL_CHOICES,
    }),
    "chat": (BUNDLE_PATHS, {
        "--system": TEXTS, "--message": ["user:hi", "user:" + os.fsdecode(b"\xfe"), "hi", ":x", "assistant:", "1:x"],
        "--max-tokens": INTEGERS, "--temperature": FLOATS, "--top-k": INTEGERS, "--backend": BACKEND_CHOICES,
    }),
    "serve": (BUNDLE_PATHS, {"--port": ["-1", "65536", "x", "", "99999999999999999999", "80.5"]}),
}
REQUIRED = {"build": ["-o"], "run": ["--inputs"], "generate": ["--prompt"]}
RARE = {"--browser": 0.03, "--profile": 0.2}  # options drawn less often (a Chromium start is slow)


def cli_arguments(rng: random.Random) -> list[str]:
    """One hostile command line: a subcommand, a positional from its pool (or none), required
    options (or one missing), random options with odd values, some given twice."""
    if rng.random() < 0.04:
        return rng.choice([[], ["--version"], ["--help"], ["nosuchcommand"], ["-x"], ["run"], ["build", "--help"]])
    command = rng.choice(sorted(CLI_COMMANDS))
    positionals, options = CLI_COMMANDS[command]
    args = [command]
    if rng.random() < 0.95:
        args.append(_pick(rng, positionals, command))
    names = [name for name in REQUIRED.get(command, []) if rng.random() < 0.9]
    names += [name for name in rng.sample(sorted(options), min(len(options), rng.randint(0, 4)))
              if rng.random() < RARE.get(name, 1.0)]
    if names and rng.random() < 0.3:
        names.append(rng.choice(names))  # an option twice
    for name in names:
        args += [name] if not options[name] else [name, _pick(rng, options[name], name)]
    if command == "serve" and "--port" not in args:
        args += ["--port", _pick(rng, options["--port"])]  # a port it refuses: serve never returns otherwise
    if rng.random() < 0.05:
        args.insert(rng.randrange(1, len(args) + 1), rng.choice(["--", "-", "--no-such-option", "-o"]))
    return args


def _cli_fixture(folder: Path) -> None:
    """The good files of every case: m.onnx and its bundle dist/, the tiny decoder (llama.onnx,
    llama/), in.npz and in2.npz (batches of 2 and 3), then the hostile ones."""
    from examples.make_mlp import make_mlp  # noqa: PLC0415 - examples/ and tests/ are found through ROOT
    from tests.fixtures.tiny_decoder import BOUNDS, tiny_decoder  # noqa: PLC0415

    onnx.save(make_mlp(), folder / "m.onnx")
    onnx.save(tiny_decoder(), folder / "llama.onnx")
    relaxweb.build(folder / "m.onnx", folder / "dist")
    relaxweb.build(folder / "llama.onnx", folder / "llama", bounds=BOUNDS)
    np.savez(folder / "in.npz", x=np.zeros((2, 64), np.float32))
    np.savez(folder / "in2.npz", x=np.ones((3, 64), np.float32))
    _hostile_files(folder)


def _fingerprints(folder: Path, names: list[str]) -> dict[str, bytes | None]:
    """The bytes of each regular file named (None for another kind or none), to check that a
    case loses nothing it was given to read."""
    prints = {}
    for name in names:
        path = folder / name
        try:
            prints[name] = path.read_bytes() if name and path.is_file() and not path.is_symlink() else None
        except OSError:
            prints[name] = None
    return prints


def _read_inputs(args: list[str]) -> list[str]:
    """The files a command line only reads: a build's model, run's --inputs, --tokenizer."""
    read = [value for option, value in zip(args, args[1:]) if option in ("--inputs", "--tokenizer")]
    if len(args) > 1 and args[0] == "build":
        read.append(args[1])
    return read


def cli_verdict(done_rc: int | None, stderr: str) -> str | None:
    """What is wrong with a finished command (None: nothing): a traceback, an exit status
    other than 0, 2 and 141, an exit 2 without an ``error:`` line."""
    if "Traceback (most recent call last)" in stderr:
        return "traceback"
    if done_rc not in CLI_EXITS:
        return "bad exit"
    if done_rc == 2 and not any(line.startswith("error: ") for line in stderr.splitlines()):
        return "no error line"
    return None


def fuzz_cli(count: int, seed: int, only: set[int] | None = None) -> Report:
    """Hostile ``relaxweb`` command lines as subprocesses (``python3 -m relaxweb``, stdin
    empty), each in a copy of the fixture folder: it must exit 0, 2 with an ``error:`` line,
    or 141 (a closed pipe); a traceback, another status, a run past ``CLI_TIMEOUT_S`` or a
    changed file it was only to read is a failure."""
    report = Report("cli")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    with tempfile.TemporaryDirectory(prefix="relaxweb-fuzz-cli-") as scratch:
        fixture = Path(scratch) / "fixture"
        fixture.mkdir()
        _cli_fixture(fixture)
        for case, rng, _, folder in _cases(count, seed, only, [""], Path(scratch)):
            shutil.copytree(fixture, folder, symlinks=True)
            _special_files(folder)
            args = cli_arguments(rng)
            label = f"cli case {case} (seed {seed}): relaxweb {' '.join(repr(a[:60]) for a in args)}"
            before = _fingerprints(folder, _read_inputs(args))
            try:
                done = subprocess.run([sys.executable, "-m", "relaxweb", *args], cwd=folder, env=env,
                                      stdin=subprocess.DEVNULL, capture_output=True, timeout=CLI_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                report.add("hang", f"{label}: still running after {CLI_TIMEOUT_S} s")
            else:
                stderr = done.stderr.decode("utf-8", "replace")
                problem = cli_verdict(done.returncode, stderr)
                if problem is None and _fingerprints(folder, list(before)) != before:
                    problem = "lost input"
                if problem is not None:
                    report.add(problem, f"{label}: exit {done.returncode}\n{stderr[-1500:]}")
                else:
                    report.add("ok" if done.returncode == 0 else "refused")
            shutil.rmtree(folder, ignore_errors=True)
    return report


# Integer differential ----------------------------------------------------------------------

INT32_VALUES = [0, 1, -1, 2, 3, -7, 46341, 65536, 2**30, 2**31 - 1, -(2**31), -(2**31) + 1]
INT64_VALUES = INT32_VALUES + [2**31, -(2**31) - 1, 2**32 + 5, 2**53, 2**53 + 1, -(2**53), -(2**53) - 1, 2**62]
INT_DTYPES = {"int32": (TensorProto.INT32, np.int32, INT32_VALUES), "int64": (TensorProto.INT64, np.int64, INT64_VALUES)}
INT_BINARY = ["Add", "Sub", "Mul", "Div", "Mod", "Min", "Max"]
INT_UNARY = ["Neg", "Abs", "Sign"]
INT_OTHER = ["ReduceSum", "CumSum", "Cast", "Gather"]
INT_PATHS = ["reference", "wasm", "webgpu"]


@dataclass
class IntGraph:
    """A random graph of integer ops being built: its nodes, constants, and each value's dtype
    and shape (tracked here so that every binary op gets operands it can broadcast)."""

    rng: random.Random
    nodes: list = field(default_factory=list)
    initializers: list = field(default_factory=list)
    values: dict[str, tuple[str, tuple[int, ...]]] = field(default_factory=dict)

    def constant(self, array: np.ndarray) -> str:
        name = f"c{len(self.initializers)}"
        self.initializers.append(numpy_helper.from_array(array, name))
        return name

    def data(self, dtype: str, shape: tuple[int, ...], narrow: bool = False) -> np.ndarray:
        """Values from ``dtype``'s pool; ``narrow``: mostly int32's (an input, that the devices
        check for 32 bits, from which results grow past them)."""
        _, numpy_type, pool = INT_DTYPES[dtype]
        if narrow and self.rng.random() < 0.8:
            pool = INT32_VALUES
        return np.array([self.rng.choice(pool) for _ in range(int(np.prod(shape)))], numpy_type).reshape(shape)

    def add(self, op: str, inputs: list[str], dtype: str, shape: tuple[int, ...], **attrs) -> None:
        name = f"v{len(self.nodes)}"
        self.nodes.append(helper.make_node(op, inputs, [name], name=f"{op.lower()}{len(self.nodes)}", **attrs))
        self.values[name] = (dtype, shape)

    def grow(self) -> str:
        """One random node on the values so far; returns what it is."""
        rng = self.rng
        source = rng.choice(sorted(self.values))
        dtype, shape = self.values[source]
        op = rng.choice(INT_BINARY * 2 + INT_UNARY + INT_OTHER)
        if op in INT_BINARY:
            same = [name for name, (d, s) in self.values.items() if d == dtype and s == shape]
            other = rng.choice(same) if rng.random() < 0.5 else self.constant(self.data(dtype, rng.choice([(), shape])))
            operands = [source, other] if rng.random() < 0.5 else [other, source]
            self.add(op, operands, dtype, shape)
        elif op in INT_UNARY:
            self.add(op, [source], dtype, shape)
        elif op == "ReduceSum" and shape:
            axis = rng.randrange(len(shape))
            keep = rng.randint(0, 1)
            reduced = tuple(1 if d == axis else n for d, n in enumerate(shape) if keep or d != axis)
            self.add(op, [source, self.constant(np.array([axis], np.int64))], dtype, reduced, keepdims=keep)
        elif op == "CumSum" and shape:
            axis = self.constant(np.array(rng.randrange(len(shape)), np.int64))
            self.add(op, [source, axis], dtype, shape, exclusive=rng.randint(0, 1), reverse=rng.randint(0, 1))
        elif op == "Gather" and shape:
            axis = rng.randrange(len(shape))
            indices = np.array([rng.randrange(-shape[axis], shape[axis]) for _ in range(rng.randint(1, 4))], np.int64)
            gathered = shape[:axis] + indices.shape + shape[axis + 1:]
            self.add(op, [source, self.constant(indices)], dtype, gathered, axis=axis)
        else:  # Cast, and ops that need an axis on a scalar
            to = "int32" if dtype == "int64" else "int64"
            self.add("Cast", [source], to, shape, to=INT_DTYPES[to][0])
        return op


def integer_model(rng: random.Random) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """A random graph of 1 to 5 integer ops on one or two inputs of int32 or int64 values near
    the edges of 32 and 53 bits, every node's result an output; and its inputs."""
    graph = IntGraph(rng)
    shape = rng.choice([(3,), (2, 3), (1, 4)])
    feeds, inputs = {}, []
    for index in range(rng.randint(1, 2)):
        dtype = rng.choice(sorted(INT_DTYPES))
        name = f"in{index}"
        feeds[name] = graph.data(dtype, shape, narrow=True)
        graph.values[name] = (dtype, shape)
        inputs.append(helper.make_tensor_value_info(name, INT_DTYPES[dtype][0], list(shape)))
    for _ in range(rng.randint(1, 5)):
        graph.grow()
    outputs = [helper.make_tensor_value_info(node.output[0], INT_DTYPES[graph.values[node.output[0]][0]][0], None)
               for node in graph.nodes]
    model = helper.make_model(helper.make_graph(graph.nodes, "integers", inputs, outputs, graph.initializers),
                              opset_imports=[helper.make_opsetid("", 17)])
    return model, feeds


def _beyond_32_bits(arrays) -> bool:
    """Whether an int64 array (an input, a constant, a result) holds a value outside int32
    (where a device of 32-bit words may refuse, with a RelaxwebError)."""
    return any(a.dtype == np.int64 and a.size and (a.min() < -(2**31) or a.max() >= 2**31) for a in arrays)


def _relaxweb_outputs(path: str, model_path: Path, bundle: Path, feeds) -> dict[str, np.ndarray]:
    if path == "reference":
        return relaxweb.run_reference(model_path, feeds)
    if not (bundle / "manifest.json").exists():
        relaxweb.build(model_path, bundle)
    return relaxweb.load(bundle, backend=path).run(feeds)


def _first_difference(expected: dict[str, np.ndarray], actual: dict[str, np.ndarray],
                      exact: dict[str, np.ndarray] | None = None) -> str | None:
    """The first output of ``actual`` that differs from ``expected`` (and from ``exact``, onnx's
    reference evaluator, where it is given: an output equal to either one is not a difference)."""
    for name, want in expected.items():
        got = actual.get(name)
        if exact is not None and got is not None and _equal(got, exact[name]):
            continue
        if got is None or not _equal(got, want):
            return f"{name}: onnxruntime {want.dtype}{list(want.shape)} {want.tolist()}, relaxweb " + (
                "nothing" if got is None else f"{got.dtype}{list(got.shape)} {got.tolist()}")
    return None


def _equal(got: np.ndarray, want: np.ndarray) -> bool:
    return got.dtype == want.dtype and got.shape == want.shape and np.array_equal(got, want)


def _saturated(expected: dict[str, np.ndarray], exact: dict[str, np.ndarray]) -> bool:
    """Whether onnxruntime saturated an int32 result (its int32 ReduceSum sums in 64 bits and
    clamps; onnx's evaluator wraps): the exact value is outside int32 there, so a device that
    refuses it (``the int32 result does not fit in 32 bits``) is not wrong."""
    bounds = (-(2**31), 2**31 - 1)
    return any(want.dtype == np.int32 and not _equal(want, exact[name]) and np.isin(want, bounds).any()
               for name, want in expected.items())


def _describe(model: onnx.ModelProto, feeds) -> str:
    """A case as one line: each node (``v1 = Mul(in0, c0)``), the inputs' and constants' values."""
    constants = {t.name: numpy_helper.to_array(t).tolist() for t in model.graph.initializer}
    nodes = "; ".join(f"{n.output[0]} = {n.op_type}({', '.join(n.input)}"
                      f"{''.join(f', {a.name}={helper.get_attribute_value(a)}' for a in n.attribute)})"
                      for n in model.graph.node)
    values = ", ".join(f"{name}={array.dtype}{array.tolist()}" for name, array in feeds.items())
    return f"{nodes} | inputs {values} | constants {constants}"


def fuzz_integers(count: int, seed: int, only: set[int] | None = None, paths: list[str] = INT_PATHS) -> Report:
    """Random graphs of integer ops (``integer_model``) on relaxweb's ``paths`` (the reference
    interpreter, kernels.wasm, wgpu) against onnxruntime.  Where onnxruntime answers, every
    output must be equal (dtype, shape and values): a *difference* otherwise.  Where it
    refuses (an integer division by zero), nothing is compared.  A RelaxwebError is allowed on
    ``webgpu`` where an int64 input or result does not fit 32 bits (the GPU computes int64 in
    32-bit words and refuses rather than wrap; counted as ``refused``), and on both devices
    where an int64 constant does not (the bundle holds weights as the GPU does: the build
    refuses it); ``wasm`` computes int64 exactly, so elsewhere it is a *difference*, as on the
    reference.  Any other exception is a traceback.
    onnxruntime's int64 ReduceSum is not exact past 2^53 (it sums in doubles): where relaxweb
    differs from onnxruntime but equals onnx's reference evaluator (``onnx.reference``), the
    case is ``onnxruntime inexact``, a note rather than a failure.  Its int32 ReduceSum sums in
    64 bits and saturates: where an int32 result is saturated, a device's refusal (the int32 sum
    does not fit 32 bits) is ``refused`` too."""
    import onnxruntime  # noqa: PLC0415 - only this mode needs it

    from onnx.reference import ReferenceEvaluator  # noqa: PLC0415

    report = Report("integers")
    with tempfile.TemporaryDirectory(prefix="relaxweb-fuzz-integers-") as scratch:
        for case, rng, _, folder in _cases(count, seed, only, [""], Path(scratch)):
            folder.mkdir()
            model, feeds = integer_model(rng)
            model_path = folder / "model.onnx"
            onnx.save(model, model_path)
            label = f"integers case {case} (seed {seed}: {_describe(model, feeds)})"
            try:
                quiet = onnxruntime.SessionOptions()
                quiet.log_severity_level = 4  # its refusals are expected here: not on stderr
                ort = onnxruntime.InferenceSession(str(model_path), quiet, providers=["CPUExecutionProvider"])
                names = [output.name for output in model.graph.output]
                expected = dict(zip(names, ort.run(None, feeds)))
            except Exception:  # noqa: BLE001 - onnxruntime refused (a division by zero): nothing to compare
                report.add("onnxruntime refused")
                shutil.rmtree(folder, ignore_errors=True)
                continue
            constants = [numpy_helper.to_array(tensor) for tensor in model.graph.initializer]
            wide_constant = _beyond_32_bits(constants)
            wide = wide_constant or _beyond_32_bits([*feeds.values(), *expected.values()])
            exact = ReferenceEvaluator(model).run(None, feeds)  # onnx's own numpy evaluator, the tie-break
            exact = {name: np.asarray(array) for name, array in zip(names, exact)}
            for path in paths:
                try:
                    actual = _relaxweb_outputs(path, model_path, folder / "dist", feeds)
                    difference = _first_difference(expected, actual)
                    outcome = "ok" if difference is None else "difference"
                    if difference is not None and _first_difference(expected, actual, exact) is None:
                        outcome = "onnxruntime inexact"  # relaxweb is exact where onnxruntime is not
                except RelaxwebError as error:
                    difference = f"RelaxwebError: {shown(str(error))[:300]}"
                    allowed = {"webgpu": wide, "wasm": wide_constant}.get(path, False) or (
                        path != "reference" and _saturated(expected, exact))
                    outcome = "refused" if allowed else "difference"
                except Exception:  # noqa: BLE001 - anything else is a traceback
                    outcome, difference = "traceback", traceback.format_exc(limit=-4)
                finding = f"{path}: {label}\n    {difference}"
                report.add(f"{path} {outcome}", finding if outcome in ("difference", "traceback") else None,
                           finding if outcome == "onnxruntime inexact" else None)
            shutil.rmtree(folder, ignore_errors=True)
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog=__doc__.split("\n\n", 1)[1])
    parser.add_argument("target", choices=["onnx", "bundles", "cli", "integers", "all"])
    parser.add_argument("--count", type=int, help="cases (default: 1000 ONNX files, 500 bundles)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--only", type=int, nargs="+", metavar="CASE", help="run only these case numbers (to reproduce one)")
    args = parser.parse_args(argv)
    reports = []
    if args.target in ("onnx", "all"):
        reports.append(fuzz_onnx(args.count or 1000, args.seed, only=set(args.only or ())))
    if args.target in ("bundles", "all"):
        reports.append(fuzz_bundles(args.count or 500, args.seed, only=set(args.only or ())))
    if args.target in ("cli", "all"):
        reports.append(fuzz_cli(args.count or 200, args.seed, only=set(args.only or ())))
    if args.target in ("integers", "all"):
        reports.append(fuzz_integers(args.count or 100, args.seed, only=set(args.only or ())))
    failed = False
    for report in reports:
        print(report.summary())
        for failure in report.failures:
            print(f"  FAIL {failure}")
        for note in report.notes:
            print(f"  NOTE {note}")
        failed |= bool(report.failures)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
