"""What a build writes beside the kernels, and what it shows while it writes.

- ``debug`` (``relaxweb build --debug``): ``host.wat`` and ``kernels.wat``, text for people
  (on DistilBERT kernels.wat outweighs the weights), only then; a rebuild without it removes
  them.
- ``runtime`` (``--runtime copy|none``): the bundle's copy of the browser runtime, or none for
  a page that imports the npm package; anything else is refused before the compile.
- ``advance`` and the command line's bar: the bytes of weights written, on a terminal drawn
  in place and cleared; off a terminal, lines only.
"""

from __future__ import annotations

import io
import os
import pty
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto, helper

import relaxweb
from relaxweb.cli import BuildProgress
from tests.helpers import make_model, rand

REPO = Path(__file__).resolve().parents[2]


def matmul_model(rows: int = 8):
    """y = x @ w with ``rows`` x 4 float32 weights: one kernel, one weight."""
    return make_model([helper.make_node("MatMul", ["x", "w"], ["y"])], [("x", TensorProto.FLOAT, ["batch", rows])],
                      ["y"], {"w": rand(rows, 4)})


def test_debug_text_is_written_only_with_debug(tmp_path: Path) -> None:
    relaxweb.build(matmul_model(), tmp_path, debug=True)
    assert (tmp_path / "host.wat").read_text().startswith(";; relaxweb host module")
    assert (tmp_path / "kernels.wat").read_text().startswith(";; kernels.wasm of")
    relaxweb.build(matmul_model(), tmp_path)  # the same folder, without debug: the text goes
    assert not (tmp_path / "host.wat").exists() and not (tmp_path / "kernels.wat").exists()
    assert (tmp_path / "host.wasm").is_file() and (tmp_path / "kernels.wasm").is_file()


def test_runtime_none_leaves_the_runtime_out_and_the_bundle_still_runs(tmp_path: Path) -> None:
    relaxweb.build(matmul_model(), tmp_path)
    assert (tmp_path / "runtime" / "relaxweb.js").is_file()
    relaxweb.build(matmul_model(), tmp_path, runtime="none")
    assert not (tmp_path / "runtime").exists()  # the last build's copy is gone too
    x = rand(3, 8)
    outputs = relaxweb.load(tmp_path, backend="wasm").run({"x": x})
    np.testing.assert_allclose(outputs["y"], x @ rand(8, 4), rtol=1e-5, atol=1e-6)


def test_an_unknown_runtime_choice_is_refused_before_the_compile(tmp_path: Path) -> None:
    lines: list[str] = []
    with pytest.raises(relaxweb.RelaxwebError, match="runtime 'cdn' is not one of copy, none"):
        relaxweb.build(matmul_model(), tmp_path, runtime="cdn", progress=lines.append)
    assert lines == [] and not tmp_path.joinpath("manifest.json").exists()


def test_advance_counts_the_weight_bytes_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # three weights of 4 KiB, one shard each: 0, then one call per shard, up to the total
    monkeypatch.setattr("relaxweb.bundle.SHARD_BYTES", 4096)
    model = make_model([helper.make_node("MatMul", ["x", "a"], ["t"]), helper.make_node("MatMul", ["t", "b"], ["u"]),
                        helper.make_node("MatMul", ["u", "c"], ["y"])], [("x", TensorProto.FLOAT, ["batch", 32])],
                       ["y"], {"a": rand(32, 32, seed=1), "b": rand(32, 32, seed=2), "c": rand(32, 32, seed=3)})
    calls: list[tuple[str, int, int]] = []
    bundle = relaxweb.build(model, tmp_path, advance=lambda *call: calls.append(call))
    total = sum(shard["nbytes"] for shard in bundle.manifest["shards"])
    assert len(bundle.manifest["shards"]) == 3
    assert calls == [("writing weights", done, total) for done in (0, 4096, 8192, 12288)]


class FakeTerminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_the_bar_is_drawn_in_place_on_a_terminal_and_cleared() -> None:
    screen = FakeTerminal()
    progress = BuildProgress(screen)
    progress.line("emitted 1 WGSL kernels for 1 call sites")
    for done in (0, 250_000_000, 250_000_000, 500_000_000):
        progress.advance("writing weights", done, 500_000_000)
    progress.line("wrote the bundle")
    text = screen.getvalue()
    assert text.count("\r\033[K  writing weights [") == 2  # drawn at 0% and 50%, not again for the same text
    assert "[###############...............]  50% (250 of 500 MB)" in text
    # the bar is cleared when the step ends, and the next line starts at the line's start
    assert text.endswith("50% (250 of 500 MB)\r\033[K  wrote the bundle\n")


def test_off_a_terminal_there_are_lines_only() -> None:
    log = io.StringIO()
    progress = BuildProgress(log)
    progress.line("writing the weights: 3 tensors, 12.0 MB")
    progress.advance("writing weights", 6_000_000, 12_000_000)
    progress.line("wrote the bundle")
    assert log.getvalue() == "  writing the weights: 3 tensors, 12.0 MB\n  wrote the bundle\n"


@pytest.mark.slow
def test_the_command_line_draws_the_bar_on_a_terminal(tmp_path: Path) -> None:
    """``relaxweb build`` on a pseudo-terminal (stderr a tty) draws the bar; with stderr a
    pipe it prints the same lines without it."""
    model_path = tmp_path / "model.onnx"
    model_path.write_bytes(matmul_model(rows=512).SerializeToString())  # 8 KiB of weights
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    command = [sys.executable, "-m", "relaxweb", "build", str(model_path), "-o", str(tmp_path / "dist")]
    leader, follower = pty.openpty()
    with subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=follower,
                          env=env) as process:
        os.close(follower)
        chunks = []
        while True:
            try:
                chunk = os.read(leader, 4096)
            except OSError:  # the child closed the terminal
                break
            if not chunk:
                break
            chunks.append(chunk)
        assert process.wait(timeout=120) == 0
    os.close(leader)
    on_terminal = b"".join(chunks).decode()
    assert "writing weights [" in on_terminal and "\r\033[K" in on_terminal
    piped = subprocess.run(command, capture_output=True, text=True, env=env, timeout=120)
    assert piped.returncode == 0 and "writing weights [" not in piped.stderr and "\033" not in piped.stderr
    assert "  writing the weights: 1 tensor, 8192 bytes\n" in piped.stderr
