"""Every kernels.wasm call runs under a deadline (issue 29, item 5), in the Python runtime.

A built bundle's kernels.wasm is replaced by one whose kernels loop forever
(tests/fixtures/looping_kernels.py): the run fails with one error naming the kernel and its
call site (``RelaxwebError``; ``relaxweb run --backend wasm``: one ``error:`` line, exit 2),
and the bundle, its kernels.wasm put back, loads again and matches onnxruntime.  CI lowers
the limit (``kernel_timeout_s``) so that the looping kernel burns a fraction of a second; the
slow test runs the command line with the default limit, which must end the run within 15 s.
The browser's twins are in tests/runtime_js/test_wasm_browser.py.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import relaxweb
from relaxweb.cli import main as cli_main
from relaxweb.errors import RelaxwebError
from relaxweb.runtime import wasm_backend
from tests.fixtures.looping_kernels import restore_kernels, write_looping_kernels
from tests.helpers import assert_close, onnxruntime_outputs, F32
from tests.runtime.test_threads import FEATURES, classifier, classifier_model  # noqa: F401  (a fixture)

STOPPED = r"kernel \S+ at call site 0 \(.*\) ran for more than {} s and was stopped"


@pytest.fixture
def looping(classifier: Path, tmp_path: Path) -> tuple[Path, dict[str, bytes]]:  # noqa: F811
    """A copy of the classifier bundle with looping kernels, and its own kernel modules' bytes."""
    folder = tmp_path / "looping"
    subprocess.run(["cp", "-r", str(classifier), str(folder)], check=True)
    return folder, write_looping_kernels(folder)


def inputs() -> dict[str, np.ndarray]:
    return {"x": np.random.default_rng(3).standard_normal((5, FEATURES)).astype(np.float32)}


def test_a_looping_kernel_fails_the_run_and_the_bundle_loads_again(looping: tuple[Path, dict[str, bytes]]) -> None:
    folder, original = looping
    session = relaxweb.load(folder, backend="wasm", kernel_timeout_s=0.3)
    started = time.monotonic()
    with pytest.raises(RelaxwebError, match=STOPPED.format("0.3")) as caught:
        session.run(inputs())
    assert time.monotonic() - started < 5
    assert "raise kernel_timeout_s" in str(caught.value) and "\n" not in str(caught.value)
    restore_kernels(folder, original)
    again = relaxweb.load(folder, backend="wasm")
    (want,) = onnxruntime_outputs(classifier_model(), inputs())
    assert_close(again.run(inputs())["probabilities"], want, F32)


def test_the_command_line_says_it_in_one_line(looping: tuple[Path, dict[str, bytes]], tmp_path: Path, capsys,
                                              monkeypatch) -> None:
    folder, _ = looping
    np.savez(tmp_path / "in.npz", **inputs())
    monkeypatch.setattr(wasm_backend, "KERNEL_SECONDS_PER_CALL", 0.3)  # the default, lowered for CI
    capsys.readouterr()
    assert cli_main(["run", str(folder), "--inputs", str(tmp_path / "in.npz"), "--backend", "wasm"]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("error: ") and "ran for more than 0.3 s and was stopped" in line


def test_the_limit_is_checked(classifier: Path) -> None:  # noqa: F811
    for bad in (0, -1, float("nan"), True, "10"):
        with pytest.raises(ValueError, match="kernel_timeout_s must be a number of seconds"):
            relaxweb.load(classifier, backend="wasm", kernel_timeout_s=bad)
    with pytest.raises(ValueError, match="kernel_timeout_s is a wasm option"):
        relaxweb.load(classifier, backend="webgpu", kernel_timeout_s=1)


@pytest.mark.slow
def test_with_the_default_limit_the_command_line_ends_within_15_seconds(looping: tuple[Path, dict[str, bytes]],
                                                                         tmp_path: Path) -> None:
    folder, _ = looping
    np.savez(tmp_path / "in.npz", **inputs())
    started = time.monotonic()
    result = subprocess.run([sys.executable, "-m", "relaxweb", "run", str(folder), "--inputs", str(tmp_path / "in.npz"),
                             "--backend", "wasm"], capture_output=True, text=True, timeout=60)
    assert time.monotonic() - started < 15
    assert result.returncode == 2, result.stderr
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith("error: ") and "ran for more than 10 s and was stopped" in line
