"""ONNX's operator test suite (the backend "node" tests) through relaxweb's frontend.

    python scripts/onnx_node_tests.py generate [--out DIR] [--filter SUBSTRING]
    python scripts/onnx_node_tests.py run [--filter SUBSTRING] [--out RESULTS.json] [--doc PATH]

``generate`` regenerates the node test cases from the installed ``onnx`` package (the wheel
no longer ships their data) with ONNX's own test-data writer (``onnx/backend/test/
cmd_tools.py``, ``generate-data``): ``DIR/node/<case>/model.onnx`` and
``DIR/node/<case>/test_data_set_0/{input,output}_<i>.pb``, plus ``DIR/index.json`` (each
case's op type).  The default ``DIR`` is ``.cache/onnx-node-tests/`` (ignored by git).

``run`` imports each case with relaxweb's ONNX frontend, runs it in the reference
interpreter (``relaxweb.ir.interpreter.run_module``) and compares with the expected outputs
(shapes and dtypes exactly; floats with rtol 1e-3 / atol 1e-4, NaN equal to NaN; integers,
bools and strings exactly).  Each case is one of:

- ``pass``: every output matches;
- ``fail``: a wrong result (value, shape, dtype or number of outputs);
- ``unsupported``: ``UnsupportedModelError`` at import (an op type, an attribute value or
  an input type relaxweb does not support; ops of non-standard domains, training ops);
- ``error``: any other exception, at import or run time (its type and first line are
  recorded), a worker process that died, or a case that took longer than the timeout
  (20 s; it is skipped).

Cases run in worker processes (``--jobs``, default 2) so a converter bug, a crash or a hang
in one case never stops the run.  The results go to a JSON file (default
``.cache/onnx-node-tests/results.json``) and, for an unfiltered run, to the markdown table
``docs/onnx-node-tests.md`` (by op type, with totals, the command, the date and the onnx
version).  ``run`` generates the cases first when the folder holds none.

``run --compiled`` compiles each case into a bundle and runs it with the Python runtime
instead, on WebGPU (``--backend webgpu``, the default; table ``docs/onnx-node-tests-gpu.md``)
or on the bundle's kernels.wasm (``--backend wasm``; ``docs/onnx-node-tests-wasm.md``), or on
both (``--backend webgpu,wasm``: each case compiled once and its bundle run on each backend in
turn, the results of each in its own file, ``results-webgpu.json`` and ``results-wasm.json``
beside ``--out``'s name; CI's way, compiling takes most of a case's time).
"""

from __future__ import annotations

import os

if __name__ == "__main__":  # before numpy is imported: one BLAS thread per worker process
    for _variable in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(_variable, "1")

import argparse
import contextlib
import datetime
import importlib
import json
import multiprocessing
import re
import shlex
import signal
import sys
import tempfile
import time
import traceback
import warnings
from collections import Counter, defaultdict, deque
from dataclasses import dataclass
from multiprocessing.connection import wait
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Callable, Iterable
from unittest import mock

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import numpy as np  # noqa: E402
import onnx  # noqa: E402
from onnx import numpy_helper  # noqa: E402

from relaxweb.errors import UnsupportedModelError  # noqa: E402
from relaxweb.frontend.onnx import from_onnx, load_onnx  # noqa: E402
from relaxweb.ir.interpreter import run_module  # noqa: E402
from relaxweb.ops import DeductionError  # noqa: E402

DEFAULT_CASES = REPO / ".cache" / "onnx-node-tests"
DEFAULT_DOC = REPO / "docs" / "onnx-node-tests.md"
DEFAULT_COMPILED_DOC = REPO / "docs" / "onnx-node-tests-gpu.md"
DEFAULT_WASM_DOC = REPO / "docs" / "onnx-node-tests-wasm.md"
#: How ``--compiled`` runs a bundle (``relaxweb.load``'s backends), as the doc table says it.
BACKEND_WORDS = {
    "webgpu": ("WebGPU", "on WebGPU (wgpu; Mesa's lavapipe on a machine without a GPU; no bounds given),"),
    "wasm": ("kernels.wasm", "on its kernels.wasm (WebAssembly SIMD on wasmtime, one thread; no bounds given),"),
}
RTOL = 1e-3
ATOL = 1e-4
TIMEOUT_S = 20.0
HARD_KILL_GRACE_S = 10.0  # a worker that ignores the soft timeout is killed this much later
STATUSES = ("pass", "fail", "unsupported", "error")
EXPANDED = re.compile(r"^(?P<base>.+)_expanded(_ver\d+)?$")


# ------------------------------------------------------------------------------------------
# generate


def collect_cases(modules: Iterable[str] | None = None) -> list[Any]:
    """ONNX's node test cases (``onnx.backend.test.case.TestCase``), each name once.

    With ``modules`` (file names under ``onnx/backend/test/case/node/``, e.g. ``"add"``),
    only those are imported, which is much faster than collecting all of them.  Collecting
    runs ONNX's export functions, which reseed numpy's global generator: do it in a process
    of its own (as this script does).
    """
    from onnx.backend.test.case import node as node_cases

    if modules is None:
        cases = node_cases.collect_testcases()
    else:
        for module in modules:
            importlib.import_module(f"onnx.backend.test.case.node.{module}")
        cases = node_cases._NodeTestCases
    unique: dict[str, Any] = {}
    for case in cases:
        unique.setdefault(case.name, case)
    return list(unique.values())


def case_metadata(cases: list[Any]) -> list[dict]:
    """Per case: its op type (the op the case tests; for an ``_expanded`` case, the op whose
    function body it is), its domain, and whether it is an expanded function body."""
    base_ops: dict[str, tuple[str, str]] = {}
    for case in cases:
        if not EXPANDED.match(case.name) and len(case.model.graph.node) == 1:
            node = case.model.graph.node[0]
            base_ops[case.name] = (node.op_type, node.domain)
    entries = []
    for case in cases:
        match = EXPANDED.match(case.name)
        expanded = bool(match) and match.group("base") in base_ops
        if expanded:
            op, domain = base_ops[match.group("base")]
        elif case.name in base_ops:
            op, domain = base_ops[case.name]
        else:
            op, domain = _op_of_graph(case.model.graph), ""
        entries.append({"name": case.name, "op": op, "domain": domain, "expanded": expanded,
                        "dir": f"{case.kind}/{case.name}"})
    return entries


def _op_of_graph(graph: onnx.GraphProto) -> str:
    op_types = sorted({n.op_type for n in graph.node})
    return op_types[0] if len(op_types) == 1 else "(graph)"


def write_cases(cases: list[Any], out: Path) -> None:
    """Write the cases with ONNX's own test-data writer (``cmd_tools.generate_data``).

    That writer takes its cases from ``onnx.backend.test.case.model.collect_testcases``
    (and, in older onnx versions, also from the node package); it is handed ours.
    """
    from onnx.backend.test import cmd_tools

    (out / "node").mkdir(parents=True, exist_ok=True)
    patches = [mock.patch.object(cmd_tools, "model_test", SimpleNamespace(collect_testcases=lambda: list(cases)))]
    if hasattr(cmd_tools, "node_test"):  # onnx < 1.16 also added every node case itself
        patches.append(mock.patch.object(cmd_tools, "node_test", SimpleNamespace(
            collect_testcases=lambda *args, **kwargs: [], collect_diff_testcases=lambda: [])))
    arguments = argparse.Namespace(output=str(out), op_type=None, clean=False, diff=False)
    with contextlib.ExitStack() as stack:
        for patch in patches:
            stack.enter_context(patch)
        cmd_tools.generate_data(arguments)


def generate(out: Path, substring: str | None = None, names: Iterable[str] | None = None,
             modules: Iterable[str] | None = None, log: Callable[[str], None] = print) -> list[dict]:
    """Regenerate the node test cases into ``out``; returns (and writes) the index."""
    started = time.perf_counter()
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        cases = collect_cases(modules)
    wanted = set(names) if names is not None else None
    cases = [c for c in cases
             if (wanted is None or c.name in wanted) and (not substring or substring.lower() in c.name.lower())]
    if wanted is not None and len(cases) != len(wanted):
        missing = sorted(wanted - {c.name for c in cases})
        raise SystemExit(f"no such node test case(s): {', '.join(missing)}")
    write_cases(cases, out)
    index = case_metadata(cases)
    (out / "index.json").write_text(json.dumps({"onnx_version": onnx.__version__, "cases": index}, indent=1) + "\n")
    log(f"wrote {len(cases)} node test cases of onnx {onnx.__version__} to {out} "
        f"in {time.perf_counter() - started:.1f} s")
    return index


# ------------------------------------------------------------------------------------------
# one case


class CaseTimeout(Exception):
    """A case ran past the time limit."""


def read_value(path: Path, type_proto: onnx.TypeProto) -> Any:
    """A value written by ONNX's test-data writer, read according to the graph's type."""
    data = path.read_bytes()
    if type_proto.HasField("sequence_type"):
        proto = onnx.SequenceProto()
        proto.ParseFromString(data)
        return numpy_helper.to_list(proto)
    if type_proto.HasField("optional_type"):
        proto = onnx.OptionalProto()
        proto.ParseFromString(data)
        return numpy_helper.to_optional(proto)
    if type_proto.HasField("map_type"):
        proto = onnx.MapProto()
        proto.ParseFromString(data)
        return numpy_helper.to_dict(proto)
    tensor = onnx.TensorProto()
    tensor.ParseFromString(data)
    return numpy_helper.to_array(tensor)


def _is_float(dtype: np.dtype) -> bool:
    return dtype.kind in "fc" or dtype.name.startswith(("bfloat16", "float8", "float4"))


def compare(name: str, actual: Any, expected: Any) -> str | None:
    """None when ``actual`` matches ``expected``; otherwise what differs, in one line."""
    if isinstance(expected, (list, tuple)):
        if not isinstance(actual, (list, tuple)):
            return f"output '{name}': expected a sequence of {len(expected)}, got {type(actual).__name__}"
        if len(actual) != len(expected):
            return f"output '{name}': sequence of {len(actual)}, expected {len(expected)}"
        for index, (a, e) in enumerate(zip(actual, expected)):
            problem = compare(f"{name}[{index}]", a, e)
            if problem:
                return problem
        return None
    if expected is None:
        return None if actual is None else f"output '{name}': expected an empty optional"
    expected = np.asarray(expected)
    if not isinstance(actual, np.ndarray) and not np.isscalar(actual):
        return f"output '{name}': expected a tensor, got {type(actual).__name__}"
    actual = np.asarray(actual)
    if actual.dtype != expected.dtype:
        return f"output '{name}': dtype {actual.dtype}, expected {expected.dtype}"
    if actual.shape != expected.shape:
        return f"output '{name}': shape {list(actual.shape)}, expected {list(expected.shape)}"
    if actual.size == 0:
        return None
    if _is_float(expected.dtype):
        a = actual.astype(np.complex128 if expected.dtype.kind == "c" else np.float64)
        e = expected.astype(a.dtype)
        with np.errstate(all="ignore"):
            close = np.isclose(a, e, rtol=RTOL, atol=ATOL, equal_nan=True)
            difference = np.where(close, 0.0, np.abs(a - e))
    else:
        close = np.asarray(actual == expected)
        difference = None
    if close.all():
        return None
    wrong = int((~close).sum())
    if difference is not None and np.isfinite(difference).any() and difference.max() > 0:
        flat = int(np.nanargmax(np.where(np.isfinite(difference), difference, -1.0)))
    else:
        flat = int(np.flatnonzero(~close.reshape(-1))[0])
    index = np.unravel_index(flat, expected.shape) if expected.ndim else ()
    where = f"[{', '.join(str(int(i)) for i in index)}]" if index else ""
    return (f"output '{name}': {wrong} of {expected.size} element(s) differ; at {where or 'the scalar'}: "
            f"got {actual[index]!r}, expected {expected[index]!r}")


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else ""


@dataclass(frozen=True)
class RunOptions:
    """How cases run: ``constant_inputs`` (see :func:`inline_constant_inputs`), and
    ``compiled``: through the whole compiler and the Python runtime instead of the
    reference interpreter, on each of ``backends`` ("webgpu": wgpu, "wasm": kernels.wasm on
    wasmtime), one bundle for all of them."""

    constant_inputs: bool = False
    compiled: bool = False
    backends: tuple[str, ...] = ("webgpu",)


def run_case(case_dir: Path | str, timeout: float | None = None, constant_inputs: bool = False,
             compiled: bool = False, backend: str | tuple[str, ...] = "webgpu") -> dict:
    """Import, run and check one case; never raises (except KeyboardInterrupt).

    With ``timeout`` (seconds) and in the main thread, a SIGALRM timer stops the case.  See
    :class:`RunOptions` for the other arguments.  With several backends (a tuple), the result
    holds each one's own outcome (status, message, stage) under ``"backends"``
    (:func:`backend_result` reads one), and its own status is the first backend's that did not
    pass (else "pass").
    """
    options = RunOptions(constant_inputs, compiled, (backend,) if isinstance(backend, str) else tuple(backend))
    case_dir = Path(case_dir)
    result: dict[str, Any] = {"name": case_dir.name, "status": "error", "stage": "load", "message": ""}
    started = time.perf_counter()
    timer = timeout is not None and timeout > 0 and hasattr(signal, "setitimer") and _in_main_thread()
    if timer:
        def on_alarm(signum, frame):
            raise CaseTimeout(f"took more than {timeout:g} s (skipped)")

        previous = signal.signal(signal.SIGALRM, on_alarm)
        signal.setitimer(signal.ITIMER_REAL, timeout)
    try:
        with warnings.catch_warnings(), np.errstate(all="ignore"):
            warnings.simplefilter("ignore")
            _run_case_steps(case_dir, result, options)
    except KeyboardInterrupt:
        raise
    except CaseTimeout as error:
        result.update(status="error", error_type="Timeout", message=str(error))
    except BaseException as error:  # noqa: BLE001 - a case must never stop the run
        result.update(status="error", error_type=type(error).__name__, message=_first_line(error))
        result["where"] = _innermost_frame(error)
    finally:
        if timer:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous)
    result["seconds"] = round(time.perf_counter() - started, 3)
    return result


CONSTANT_INPUT_TYPES = (onnx.TensorProto.INT32, onnx.TensorProto.INT64)


def inline_constant_inputs(model: onnx.ModelProto, values: dict[str, Any]) -> list[str]:
    """Turn the integer inputs of rank <= 1 other than the first into initializers holding
    the case's data, as exporters write shapes, axes, pads and counts.  ONNX's node tests
    feed them as graph inputs, which relaxweb's converters (that need them at compile time)
    reject.  The first input always stays an input, so the node is not folded away.
    Returns the names made constant."""
    graph = model.graph
    made = []
    for position, value in enumerate(graph.input):
        array = values.get(value.name)
        if (position == 0 or not value.type.HasField("tensor_type")
                or value.type.tensor_type.elem_type not in CONSTANT_INPUT_TYPES
                or not isinstance(array, np.ndarray) or array.ndim > 1):
            continue
        graph.initializer.append(numpy_helper.from_array(array, value.name))
        made.append(value.name)
    kept = [value for value in graph.input if value.name not in made]
    del graph.input[:]
    graph.input.extend(kept)
    return made


def _run_case_steps(case_dir: Path, result: dict, options: RunOptions) -> None:
    model = load_onnx(case_dir / "model.onnx")
    graph = model.graph
    result["ops"] = sorted({(f"{n.domain}." if n.domain not in ("", "ai.onnx") else "") + n.op_type
                            for n in graph.node})
    data_dir = case_dir / "test_data_set_0"
    initializers = {i.name for i in graph.initializer}
    graph_inputs = [value for value in graph.input if value.name not in initializers]
    input_files = {value.name: (data_dir / f"input_{index}.pb", value.type) for index, value in enumerate(graph_inputs)}
    expected_types = [value.type for value in graph.output]
    output_names = [value.name for value in graph.output]
    inputs: dict[str, Any] | None = None
    if options.constant_inputs:
        result["stage"] = "inputs"
        inputs = {name: read_value(path, type_proto) for name, (path, type_proto) in input_files.items()}
        made = inline_constant_inputs(model, inputs)
        if made:
            result["constant_inputs"] = made
            inputs = {name: value for name, value in inputs.items() if name not in made}
    result["stage"] = "import"
    try:
        module = from_onnx(model, case_dir.name)
    except UnsupportedModelError as error:
        result.update(status="unsupported", error_type=type(error).__name__, message=_first_line(error))
        return
    result["stage"] = "inputs"
    if inputs is None:
        inputs = {name: read_value(path, type_proto) for name, (path, type_proto) in input_files.items()}
    expected = [read_value(data_dir / f"output_{index}.pb", type_proto) for index, type_proto in enumerate(expected_types)]
    result["stage"] = "run"
    if not options.compiled:
        _compare_outputs(run_module(module, inputs), output_names, expected, result)
        return
    _run_compiled(module, inputs, case_dir.name, options.backends,
                  lambda outputs, outcome: _compare_outputs(outputs, output_names, expected, outcome), result)


def _compare_outputs(outputs: list[Any], output_names: list[str], expected: list[Any], result: dict) -> None:
    """Sets ``result``'s status: "pass" where every output matches its expected value, else "fail"."""
    result["stage"] = "compare"
    if len(outputs) != len(expected):
        result.update(status="fail", message=f"{len(outputs)} output(s), expected {len(expected)}")
        return
    for name, actual, wanted in zip(output_names, outputs, expected):
        problem = compare(name, actual, wanted)
        if problem:
            result.update(status="fail", message=problem)
            return
    result.update(status="pass", message="")


#: Errors that make a case "unsupported" when compiling or running a bundle: no lowering, dtype
#: or known shape yet.
UNSUPPORTED_ERRORS = (UnsupportedModelError, DeductionError)


def _run_compiled(module, inputs: dict[str, Any], name: str, backends: tuple[str, ...],
                  check: Callable[[list[Any], dict], None], result: dict) -> None:
    """Compile the imported module into one bundle and run it with the Python runtime on each
    of ``backends``, ``check`` setting the status from its outputs: in ``result`` for one
    backend; for several, in ``result["backends"][backend]``, each caught on its own (a crash
    on one backend leaves the others' results)."""
    from relaxweb.bundle import write_bundle
    from relaxweb.compiler import compile_module
    from relaxweb.runtime.backend import load_session

    result["stage"] = "compile"
    with tempfile.TemporaryDirectory(prefix="relaxweb-case-") as folder:
        try:
            manifest = write_bundle(compile_module(module, {}), folder, name)
        except UNSUPPORTED_ERRORS as error:
            result.update(status="unsupported", error_type=type(error).__name__, message=_first_line(error))
            return

        def run_on(backend: str, outcome: dict) -> None:
            outcome["stage"] = "run"
            try:
                outputs = load_session(Path(folder), backend).run(inputs)
            except UNSUPPORTED_ERRORS as error:
                outcome.update(status="unsupported", error_type=type(error).__name__, message=_first_line(error))
                return
            check([outputs[item["name"]] for item in manifest["outputs"]], outcome)

        if len(backends) == 1:
            run_on(backends[0], result)
            return
        result["backends"] = {}
        for backend in backends:
            outcome: dict[str, Any] = {"status": "error", "message": ""}
            try:
                run_on(backend, outcome)
            except (KeyboardInterrupt, CaseTimeout):
                raise
            except Exception as error:  # noqa: BLE001 - one backend's crash must not hide the others'
                outcome.update(status="error", error_type=type(error).__name__, message=_first_line(error),
                               where=_innermost_frame(error))
            result["backends"][backend] = outcome
        worst = next((o for o in result["backends"].values() if o["status"] != "pass"), None)
        result.update(stage="run", **({"status": "pass", "message": ""} if worst is None else
                                      {key: worst[key] for key in ("status", "message") if key in worst}))


def backend_result(result: dict, backend: str) -> dict:
    """One backend's view of a case's result from a run on several (:func:`run_case`): its own
    outcome over the shared fields.  A case that stopped before running (unsupported at
    import or compile, a timeout) has the same result on every backend."""
    shared = {key: value for key, value in result.items() if key != "backends"}
    if "backends" not in result or backend not in result["backends"]:
        return shared
    own = result["backends"][backend]
    return {**{k: v for k, v in shared.items() if k not in ("error_type", "where")}, **own}


def _in_main_thread() -> bool:
    import threading

    return threading.current_thread() is threading.main_thread()


def _innermost_frame(error: BaseException) -> str:
    frames = traceback.extract_tb(error.__traceback__)
    if not frames:
        return ""
    frame = frames[-1]
    path = Path(frame.filename)
    try:
        path = path.relative_to(REPO)
    except ValueError:
        pass
    return f"{path}:{frame.lineno} in {frame.name}"


# ------------------------------------------------------------------------------------------
# many cases, in worker processes


def _worker_main(connection, timeout: float | None, memory_limit_bytes: int | None,
                 options: RunOptions = RunOptions()) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent handles ^C and stops us
    if memory_limit_bytes:  # a case allocating without bound gets a MemoryError, not the machine
        try:
            import resource

            with open("/proc/self/statm") as statm:  # the address space already mapped (fork)
                mapped = int(statm.read().split()[0]) * resource.getpagesize()
            limit = mapped + memory_limit_bytes
            soft, hard = resource.getrlimit(resource.RLIMIT_AS)
            if hard == resource.RLIM_INFINITY or limit < hard:
                resource.setrlimit(resource.RLIMIT_AS, (limit, hard))
        except (ImportError, ValueError, OSError):
            pass
    while True:
        try:
            task = connection.recv()
        except (EOFError, OSError):
            return
        if task is None:
            return
        connection.send(run_case(Path(task), timeout, options.constant_inputs, options.compiled, options.backends))


class _Worker:
    def __init__(self, context, timeout: float | None, memory_limit_bytes: int | None, options: RunOptions) -> None:
        self.connection, child = context.Pipe()
        self.process = context.Process(target=_worker_main, args=(child, timeout, memory_limit_bytes, options),
                                       daemon=True)
        self.process.start()
        child.close()
        self.task: Path | None = None
        self.started = 0.0

    def give(self, task: Path) -> None:
        self.task, self.started = task, time.monotonic()
        self.connection.send(str(task))

    def stop(self, kill: bool = False) -> None:
        if kill:
            self.process.kill()
        else:
            try:
                self.connection.send(None)
            except (OSError, ValueError):
                pass
        self.process.join(5)
        if self.process.is_alive():
            self.process.kill()
            self.process.join()
        self.connection.close()


def run_cases(case_dirs: list[Path], jobs: int = 2, timeout: float | None = TIMEOUT_S,
              progress: Callable[[int, int, dict], None] | None = None,
              hard_kill_grace: float = HARD_KILL_GRACE_S, memory_limit_gb: float | None = 4.0,
              options: RunOptions = RunOptions()) -> list[dict]:
    """Run every case; results in the order of ``case_dirs``.

    ``jobs`` worker processes (0: in this process, with only the SIGALRM timeout).  A worker
    still busy ``hard_kill_grace`` seconds after the timeout is killed and replaced, and so
    is one that dies; its case is an ``error``.  Each worker may map ``memory_limit_gb`` more
    than it had at its start (Linux).
    """
    results: dict[Path, dict] = {}

    def record(case_dir: Path, result: dict) -> None:
        results[case_dir] = result
        if progress:
            progress(len(results), len(case_dirs), result)

    if jobs <= 0:
        for case_dir in case_dirs:
            record(case_dir, run_case(case_dir, timeout, options.constant_inputs, options.compiled, options.backends))
        return [results[c] for c in case_dirs]

    methods = multiprocessing.get_all_start_methods()
    context = multiprocessing.get_context("fork" if "fork" in methods else "spawn")
    memory_limit = int(memory_limit_gb * (1 << 30)) if memory_limit_gb else None
    pending = deque(case_dirs)
    workers = [_Worker(context, timeout, memory_limit, options) for _ in range(max(1, min(jobs, len(case_dirs))))]
    deadline = (timeout or 0) + hard_kill_grace if timeout else None
    try:
        while pending or any(w.task is not None for w in workers):
            for worker in workers:
                if worker.task is None and pending:
                    worker.give(pending.popleft())
            busy = [w for w in workers if w.task is not None]
            ready = wait([w.connection for w in busy], timeout=0.25)
            for index, worker in enumerate(workers):
                if worker.task is None:
                    continue
                replace = False
                if worker.connection in ready:
                    try:
                        result = worker.connection.recv()
                    except (EOFError, OSError):
                        worker.process.join(1)
                        code = worker.process.exitcode
                        result = {"name": worker.task.name, "status": "error", "error_type": "WorkerCrashed",
                                  "message": f"the worker process died (exit code {code})", "stage": "?",
                                  "seconds": round(time.monotonic() - worker.started, 3)}
                        replace = True
                elif deadline is not None and time.monotonic() - worker.started > deadline:
                    result = {"name": worker.task.name, "status": "error", "error_type": "Timeout",
                              "message": f"took more than {timeout:g} s (skipped; the worker was killed)",
                              "stage": "?", "seconds": round(time.monotonic() - worker.started, 3)}
                    replace = True
                else:
                    continue
                task, worker.task = worker.task, None
                record(task, result)
                if replace:
                    worker.stop(kill=True)
                    workers[index] = _Worker(context, timeout, memory_limit, options)
    finally:
        for worker in workers:
            worker.stop(kill=worker.task is not None)
    return [results[c] for c in case_dirs]


# ------------------------------------------------------------------------------------------
# reports


def load_index(cases_dir: Path) -> list[dict]:
    """The generated cases: from ``index.json``, or by looking for ``*/model.onnx``."""
    index_path = cases_dir / "index.json"
    if index_path.is_file():
        entries = json.loads(index_path.read_text())["cases"]
        return [e for e in entries if (cases_dir / e["dir"] / "model.onnx").is_file()]
    entries = []
    for model_path in sorted(cases_dir.glob("*/*/model.onnx")):
        try:
            graph = onnx.load(str(model_path), load_external_data=False).graph
            op = _op_of_graph(graph)
            domain = graph.node[0].domain if len(graph.node) == 1 else ""
        except Exception:  # noqa: BLE001
            op, domain = "(unreadable)", ""
        name = model_path.parent.name
        entries.append({"name": name, "op": op, "domain": domain, "expanded": bool(EXPANDED.match(name)),
                        "dir": str(model_path.parent.relative_to(cases_dir))})
    return entries


def op_label(entry: dict) -> str:
    domain = entry.get("domain") or ""
    label = entry["op"] if domain in ("", "ai.onnx") else f"{domain}.{entry['op']}"
    return label + (" (expanded)" if entry.get("expanded") else "")


def totals(results: list[dict]) -> dict[str, int]:
    counts = Counter(r["status"] for r in results)
    return {"cases": len(results), **{status: counts.get(status, 0) for status in STATUSES}}


def by_op(results: list[dict]) -> list[tuple[str, dict[str, int]]]:
    groups: dict[str, list[dict]] = defaultdict(list)
    for result in results:
        groups[result["op_label"]].append(result)
    return sorted(((label, totals(group)) for label, group in groups.items()),
                  key=lambda item: (item[0].lower(), item[0]))


def write_markdown(results: list[dict], path: Path, command: str, date: str, onnx_version: str,
                   compiled: bool = False, backend: str = "webgpu") -> None:
    total = totals(results)
    rate = 100.0 * total["pass"] / total["cases"] if total["cases"] else 0.0
    backend_name, backend_how = BACKEND_WORDS[backend]
    how = ("relaxweb's frontend, compiled by the whole pipeline into a bundle and run by the Python runtime",
           backend_how) if compiled else (
           "relaxweb's frontend and run in the reference interpreter (`relaxweb.ir.interpreter.run_module`),", "")
    lines = [
        "# ONNX operator test suite" + (f" through the compiler and {backend_name}" if compiled else ""),
        "",
        "ONNX's backend node tests (one model per case, from the installed `onnx` package), imported by",
        *(line for line in how if line),
        f"compared with ONNX's expected outputs (floats: rtol {RTOL:g}, atol {ATOL:g}; integers and bools",
        "exactly; shapes and dtypes exactly). Generated by `scripts/onnx_node_tests.py`; do not edit by hand.",
        "",
        f"- command: `{command}`",
        f"- date: {date}",
        f"- onnx version: {onnx_version}",
        f"- totals: **{total['cases']} cases: {total['pass']} passed ({rate:.1f}%), {total['fail']} failed, "
        f"{total['unsupported']} unsupported, {_plural(total['error'], 'error')}**",
        "",
        "Statuses: *passed*; *failed* (a wrong value, shape, dtype or output count); *unsupported*",
        "(`UnsupportedModelError` at import: an op type, attribute value or input type relaxweb does not",
        "support yet, ops of non-standard domains and training ops included); *error* (any other exception,",
        "a crashed worker, or a case over the 20 s time limit). Rows marked *(expanded)* are ONNX's",
        "function-body versions of an op's cases (the op written as a graph of simpler ops).",
        "",
        "| op | cases | passed | failed | unsupported | error |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for label, counts in by_op(results):
        lines.append(f"| {label} | {counts['cases']} | {counts['pass']} | {counts['fail']} | "
                     f"{counts['unsupported']} | {counts['error']} |")
    lines.append(f"| **total** | **{total['cases']}** | **{total['pass']}** | **{total['fail']}** | "
                 f"**{total['unsupported']}** | **{total['error']}** |")
    problems = [r for r in results if r["status"] in ("fail", "error")]
    if problems:
        lines += ["", "## Failed and error cases", "", "| case | status | what |", "|---|---|---|"]
        for result in sorted(problems, key=lambda r: r["name"]):
            what = result.get("message", "")
            if result["status"] == "error":
                what = f"{result.get('error_type', '?')} ({result.get('stage', '?')}): {what}"
            lines.append(f"| {result['name']} | {result['status']} | {_cell(what)} |")
    missing: Counter = Counter()
    reasons: Counter = Counter()
    for result in results:
        if result["status"] == "unsupported":
            ops = _unsupported_ops(result.get("message", ""))
            for op in ops:
                missing[op] += 1
            if not ops:
                reasons[re.sub(r" node '[^']*'", "", result.get("message", ""))] += 1
    if missing:
        lines += ["", "## Unsupported op types, by number of cases they block", "",
                  ", ".join(f"{op} ({count})" for op, count in sorted(missing.items(), key=lambda i: (-i[1], i[0])))]
    if reasons:
        lines += ["", "## Other reasons for unsupported cases (attribute values, dtypes, input types)", "",
                  "| cases | reason |", "|---:|---|"]
        for reason, count in sorted(reasons.items(), key=lambda i: (-i[1], i[0])):
            lines.append(f"| {count} | {_cell(reason)} |")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")


def _plural(count: int, word: str) -> str:
    return f"{count} {word}{'' if count == 1 else 's'}"


def _unsupported_ops(message: str) -> list[str]:
    """The op types named by the frontend's 'unsupported op type(s): A (nodes: ...); B (...)'."""
    _, marker, rest = message.partition("unsupported op type(s): ")
    if not marker:
        return []
    return [part.split(" (nodes:")[0].strip() for part in rest.split("; ") if part.strip()]


def _cell(text: str, limit: int = 200) -> str:
    text = text.replace("|", "\\|").replace("\n", " ")
    return text if len(text) <= limit else text[: limit - 1] + "…"


# ------------------------------------------------------------------------------------------
# command line


def command_generate(args: argparse.Namespace) -> int:
    names = args.names.split(",") if args.names else None
    modules = args.modules.split(",") if args.modules else None
    generate(Path(args.out), args.filter, names, modules)
    return 0


def command_run(args: argparse.Namespace) -> int:
    cases_dir = Path(args.cases)
    if not load_index(cases_dir):
        print(f"no generated cases in {cases_dir}: generating them first", file=sys.stderr)
        generate(cases_dir, log=lambda text: print(text, file=sys.stderr))
    if args.backend != ("webgpu",) and not args.compiled:
        print("--backend picks how --compiled runs a bundle: give --compiled too", file=sys.stderr)
        return 2
    if len(args.backend) > 1 and args.doc:
        print("--doc names one table: give it with one --backend (several write each backend's default "
              "table on an unfiltered run; --doc \"\" writes none)", file=sys.stderr)
        return 2
    entries = load_index(cases_dir)
    if args.filter:
        entries = [e for e in entries if args.filter.lower() in e["name"].lower()]
    if args.per_op:
        entries = first_per_op(entries, args.per_op)
    if not entries:
        print(f"no case matches --filter {args.filter!r}", file=sys.stderr)
        return 1
    started = time.perf_counter()
    running = Counter()

    def progress(done: int, count: int, result: dict) -> None:
        running[result["status"]] += 1
        if args.verbose:
            print(f"{result['status']:<11} {result['name']}  {result.get('message', '')[:150]}", file=sys.stderr)
        if done % 200 == 0 or done == count:
            summary = ", ".join(f"{running[s]} {s}" for s in STATUSES)
            print(f"  {done}/{count} cases ({summary}) {time.perf_counter() - started:.0f} s", file=sys.stderr)

    dirs = [cases_dir / e["dir"] for e in entries]
    results = run_cases(dirs, args.jobs, args.timeout if args.timeout > 0 else None, progress,
                        options=RunOptions(args.constant_inputs, args.compiled, args.backend),
                        # wasmtime reserves gigabytes of address space for a module's memory
                        memory_limit_gb=None if args.compiled else 4.0)
    for entry, result in zip(entries, results):
        result["name"] = entry["name"]
        result["op"] = entry["op"]
        result["domain"] = entry.get("domain", "")
        result["expanded"] = entry.get("expanded", False)
        result["op_label"] = op_label(entry)
    command = "python scripts/onnx_node_tests.py " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    out = Path(args.out)
    several = len(args.backend) > 1
    bad = []
    for backend in args.backend if args.compiled else (None,):
        these = [backend_result(result, backend) for result in results] if several else results
        bad += _report(args, these, backend, out.with_name(f"{out.stem}-{backend}{out.suffix}") if several else out,
                       command, time.perf_counter() - started)
    if args.check:
        # a wrong value, a crash or a timeout fails the check; a clean one-line RelaxwebError
        # (a model relaxweb refuses with a message, e.g. shapes it cannot prove) does not
        for backend, result in bad:
            print(f"{result['status']}: {result['name']}{f' on {backend}' if several else ''}: "
                  f"{result.get('message', '')[:300]}", file=sys.stderr)
        return 1 if bad else 0
    return 0


def _report(args: argparse.Namespace, results: list[dict], backend: str | None, out: Path, command: str,
            seconds: float) -> list[tuple[str | None, dict]]:
    """Writes one backend's results (``backend`` None: the interpreter's) to ``out`` and, for
    an unfiltered run or with ``--doc``, its markdown table; prints its counts.  Returns its
    cases that fail ``--check``, each with the backend."""
    date = datetime.date.today().isoformat()
    total = totals(results)
    report = {"command": command, "date": date, "onnx_version": onnx.__version__, "rtol": RTOL, "atol": ATOL,
              "timeout_s": args.timeout, "constant_inputs": args.constant_inputs, "compiled": args.compiled,
              "backend": backend, "seconds": round(seconds, 1), "totals": total,
              "by_op": {label: counts for label, counts in by_op(results)}, "cases": results}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1) + "\n")
    print(f"wrote {out}", file=sys.stderr)
    default_doc = DEFAULT_DOC if backend is None else DEFAULT_WASM_DOC if backend == "wasm" else DEFAULT_COMPILED_DOC
    subset = args.filter or args.constant_inputs or args.per_op
    doc = args.doc if args.doc is not None else (None if subset else str(default_doc))
    if doc:
        write_markdown(results, Path(doc), command, date, onnx.__version__, backend is not None, backend or "webgpu")
        print(f"wrote {doc}", file=sys.stderr)
    print(f"{total['cases']} cases{f' on {backend}' if len(args.backend) > 1 else ''}: {total['pass']} passed, "
          f"{total['fail']} failed, {total['unsupported']} unsupported, {_plural(total['error'], 'error')} "
          f"({seconds:.0f} s, onnx {onnx.__version__})")
    return [(backend, r) for r in results
            if r["status"] == "fail" or (r["status"] == "error" and r.get("error_type") != "RelaxwebError")]


def _backends(text: str) -> tuple[str, ...]:
    """``--backend``'s value: one backend or several, comma-separated."""
    names = tuple(name.strip() for name in text.split(",") if name.strip())
    unknown = [name for name in names if name not in BACKEND_WORDS]
    if not names or unknown or len(set(names)) != len(names):
        raise argparse.ArgumentTypeError(f"{text!r}: give webgpu, wasm or both (webgpu,wasm), each once")
    return names


def first_per_op(entries: list[dict], count: int) -> list[dict]:
    """The first ``count`` cases (by name) of each op label: a subset that touches every op."""
    kept: dict[str, list[dict]] = {}
    for entry in sorted(entries, key=lambda e: e["name"]):
        group = kept.setdefault(op_label(entry), [])
        if len(group) < count:
            group.append(entry)
    return [e for group in kept.values() for e in group]


def make_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="onnx_node_tests.py", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    gen = commands.add_parser("generate", help="regenerate ONNX's node test cases from the installed onnx")
    gen.add_argument("--out", default=str(DEFAULT_CASES), help="folder to write (default: %(default)s)")
    gen.add_argument("--filter", help="only cases whose name contains this (case-insensitive)")
    gen.add_argument("--names", help="only these cases (comma-separated exact names)")
    gen.add_argument("--modules", help="collect only these files of onnx/backend/test/case/node/ "
                     "(comma-separated, e.g. add,relu): much faster than collecting all")
    gen.set_defaults(handler=command_generate)
    run = commands.add_parser("run", help="run the generated cases through relaxweb's frontend and interpreter")
    run.add_argument("--cases", default=str(DEFAULT_CASES), help="the generated cases (default: %(default)s)")
    run.add_argument("--filter", help="only cases whose name contains this (case-insensitive)")
    run.add_argument("--out", default=str(DEFAULT_CASES / "results.json"), help="results JSON (default: %(default)s)")
    run.add_argument("--doc", help=f"markdown table to write (default: {DEFAULT_DOC.relative_to(REPO)} for an "
                     "unfiltered run, none with --filter or --constant-inputs)")
    run.add_argument("--jobs", type=int, default=2, help="worker processes (default 2; 0 runs in this process)")
    run.add_argument("--timeout", type=float, default=TIMEOUT_S, help="seconds per case (default %(default)g)")
    run.add_argument("--constant-inputs", action="store_true",
                     help="feed integer inputs of rank <= 1 (other than the first) as initializers, as exporters "
                     "write shapes and axes; not the default, which runs ONNX's cases as written")
    run.add_argument("--compiled", action="store_true",
                     help="compile each case into a bundle and run it with the Python runtime (wgpu) instead of "
                     "the reference interpreter; compile errors (no GPU lowering, dtypes) count as unsupported")
    run.add_argument("--backend", type=_backends, default=("webgpu",), metavar="webgpu|wasm|webgpu,wasm",
                     help="with --compiled: run each bundle on WebGPU (wgpu, default), on its kernels.wasm "
                     f"(wasmtime; an unfiltered run writes {DEFAULT_WASM_DOC.relative_to(REPO)}), or on both: "
                     "each case compiled once, each backend's results to --out's name with -webgpu and -wasm added")
    run.add_argument("--per-op", type=int, default=0, metavar="N",
                     help="only the first N cases (by name) of each op type: the subset CI runs")
    run.add_argument("--check", action="store_true",
                     help="exit 1 when a case fails, crashes or times out (CI); a case refused with a clean "
                     "RelaxwebError message does not count")
    run.add_argument("-v", "--verbose", action="store_true", help="print each case's status")
    run.set_defaults(handler=command_run)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = make_parser().parse_args(argv)
    return args.handler(args)


if __name__ == "__main__":
    sys.exit(main())
