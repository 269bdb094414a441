"""One Python session called from several threads (issue 29, item 4): its runs take turns.

A session (``webgpu.Session``, ``wasm_session.WasmSession``) holds one state of a run at a
time: the host module's, the storages', the wasm memory's.  Every entry point (``run``,
``run_batch``, ``profile``, ``generate``, ``chat``, reading a kept tensor) holds the session's
``run_lock`` for its whole work, readback included, so threads may share a session.  The test
hammers one session of a tiny model from 6 threads with single runs and batches of mixed sizes
and compares every result with the same call made on one thread.  Before the lock, the wasm
backend gave wrong values, wrong shapes and "call stack exhausted" errors, and wgpu aborted the
process (a Rust panic, "readback ... is still mapped").  CI runs 6 threads x 15 calls; the slow
test runs 6 x 100, and generation from 6 threads on the tiny Llama.
"""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto, helper

import relaxweb
from tests.helpers import load_bundle, make_model

THREADS = 6
BATCH_SIZES = (1, 3, 17, 64)
FEATURES = 16
CLASSES = 10


def classifier_model():
    """probabilities = softmax(x @ w + b): a batch of any size up to the bound."""
    rng = np.random.default_rng(0)
    nodes = [helper.make_node("MatMul", ["x", "w"], ["t"]), helper.make_node("Add", ["t", "b"], ["logits"]),
             helper.make_node("Softmax", ["logits"], ["probabilities"], axis=-1)]
    return make_model(nodes, [("x", TensorProto.FLOAT, ["batch", FEATURES])], ["probabilities"],
                      {"w": rng.standard_normal((FEATURES, CLASSES)).astype(np.float32),
                       "b": rng.standard_normal(CLASSES).astype(np.float32)})


@pytest.fixture(scope="module")
def classifier(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("threads") / "bundle"
    return relaxweb.build(classifier_model(), folder, bounds={"batch": max(BATCH_SIZES)}).path


def calls() -> list[tuple[str, object]]:
    """The calls the threads pick from: a single run at each batch size, and batches of mixed sizes."""
    rng = np.random.default_rng(1)

    def inputs(rows: int) -> dict[str, np.ndarray]:
        return {"x": rng.standard_normal((rows, FEATURES)).astype(np.float32)}

    single = [("run", inputs(rows)) for rows in BATCH_SIZES for _ in range(2)]
    batches = [("run_batch", [inputs(rows) for rows in sizes]) for sizes in ((64, 1), (3, 17, 64), (17,))]
    return single + batches


def call(session, kind: str, argument) -> list[dict[str, np.ndarray]]:
    return [session.run(argument)] if kind == "run" else session.run_batch(argument)


def hammer(session, runs_per_thread: int) -> None:
    """Every thread makes ``runs_per_thread`` calls picked at random; each result must be the
    one the same call gave on one thread, to the bit."""
    table = calls()
    expected = [call(session, kind, argument) for kind, argument in table]
    problems: list[str] = []
    start = threading.Barrier(THREADS)

    def work(seed: int) -> None:
        rng = np.random.default_rng(100 + seed)
        start.wait()
        for _ in range(runs_per_thread):
            index = int(rng.integers(len(table)))
            kind, argument = table[index]
            try:
                results = call(session, kind, argument)
            except Exception as error:  # noqa: BLE001  (every failure is a finding)
                problems.append(f"thread {seed}, call {index} ({kind}): {type(error).__name__}: {error}")
                continue
            for got, want in zip(results, expected[index], strict=True):
                if got["probabilities"].shape != want["probabilities"].shape:
                    problems.append(f"thread {seed}, call {index} ({kind}): shape {got['probabilities'].shape}, "
                                    f"expected {want['probabilities'].shape}")
                elif not np.array_equal(got["probabilities"], want["probabilities"]):
                    problems.append(f"thread {seed}, call {index} ({kind}): values differ from the single-threaded run")

    threads = [threading.Thread(target=work, args=(seed,)) for seed in range(THREADS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not problems, f"{len(problems)} of {THREADS * runs_per_thread} calls went wrong: " + "; ".join(problems[:8])


def test_one_session_is_safe_from_six_threads(classifier: Path, backend: str) -> None:
    hammer(load_bundle(classifier, backend), runs_per_thread=15)


@pytest.mark.slow
def test_one_session_is_safe_from_six_threads_for_a_hundred_calls_each(classifier: Path, backend: str) -> None:
    hammer(load_bundle(classifier, backend), runs_per_thread=100)
