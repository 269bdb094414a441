"""relaxweb installed as a user installs it: ``pip install .`` (not editable) into a fresh
virtual environment, by ``scripts/quickstart.sh`` run in a copy of the repository's tracked
files.

The quick start runs on the installed package (not the copy's sources): the example MLP is
built and run, its outputs those of the reference interpreter; the installed package holds
what it needs at run time (the browser runtime, the host template, the web demo, which
``relaxweb serve`` serves). Run again from another checkout into that environment, the quick
start leaves the installation as it is and says why.

The environment sees the system's packages (``--system-site-packages``: numpy, onnx, wgpu...
are not downloaded again); relaxweb goes into its own site-packages.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import urllib.request
from pathlib import Path

import numpy as np
import pytest

import relaxweb

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.slow  # a venv, pip and the quick start in subprocesses: ~15 s


def tracked_copy(destination: Path) -> Path:
    """The repository's tracked files (what a clone has), copied to ``destination``."""
    listed = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True, timeout=60).stdout
    for name in filter(None, listed.decode().split("\0")):
        if (REPO / name).is_file():
            (destination / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, destination / name)
    return destination


def in_venv(venv: Path) -> dict[str, str]:
    """The environment of a shell with ``venv`` active, and nothing pointing at a checkout."""
    env = {name: value for name, value in os.environ.items() if name not in ("PYTHONPATH", "PYTHONHOME")}
    return {**env, "VIRTUAL_ENV": str(venv), "PATH": f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"}


@pytest.mark.skipif(shutil.which("git") is None or not (REPO / ".git").exists(), reason="needs the git checkout")
def test_pip_install_runs_the_quick_start_and_keeps_other_installations(tmp_path: Path) -> None:
    checkout = tracked_copy(tmp_path / "checkout")
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)], check=True, timeout=120)
    env = in_venv(venv)

    done = subprocess.run(["bash", "scripts/quickstart.sh"], cwd=checkout, env=env, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"relaxweb is installed in the active virtual environment ({venv})" in done.stdout
    outputs = np.load(checkout / "dist" / "mlp_outputs.npz")
    inputs = np.load(checkout / "examples" / "mlp_inputs.npz")
    expected = relaxweb.run_reference(checkout / "examples" / "mlp.onnx", dict(inputs))
    np.testing.assert_allclose(outputs["probabilities"], expected["probabilities"], rtol=1e-4, atol=1e-6)
    assert not (checkout / "dist" / "mlp" / "kernels.wat").exists()  # debug text only with --debug

    # what ran is the installed package, whole: not the checkout's sources
    python = venv / "bin" / "python"
    where = subprocess.run([str(python), "-c", "import relaxweb, pathlib; print(pathlib.Path(relaxweb.__file__).parent)"],
                           cwd=tmp_path, env=env, capture_output=True, text=True, check=True, timeout=60).stdout.strip()
    installed = Path(where)
    assert installed.is_relative_to(venv), installed
    for needed in ("runtime_js/relaxweb.js", "runtime_js/sampler.wgsl", "runtime_js/manifest-schema.json",
                   "runtime_js/relaxweb.d.ts", "wasm/templates/host.wat.j2", "web_demo/index.html"):
        assert (installed / needed).is_file(), needed

    # relaxweb serve serves the installed demo and runtime
    with subprocess.Popen([str(venv / "bin" / "relaxweb"), "serve", str(checkout / "dist" / "mlp"), "--port", "0"],
                          cwd=tmp_path, env=env, stdout=subprocess.PIPE, text=True) as server:
        try:
            url = server.stdout.readline().split(" at ")[1].split()[0]
            for path in ("", "runtime/relaxweb.js", "bundle/manifest.json"):
                with urllib.request.urlopen(url + path, timeout=30) as response:
                    assert response.status == 200, path
        finally:
            server.terminate()

    # from another checkout, the quick start leaves this installation as it is, and says so
    refused = subprocess.run(["bash", str(REPO / "scripts" / "quickstart.sh")], env=env, capture_output=True, text=True,
                             timeout=120)
    assert refused.returncode == 1
    assert f"relaxweb is already installed in the active virtual environment ({venv}), from {checkout}." in refused.stderr
    assert "bash scripts/quickstart.sh --replace" in refused.stderr
    still = subprocess.run([str(python), "-c", "import relaxweb; print(relaxweb.__file__)"], cwd=tmp_path, env=env,
                           capture_output=True, text=True, check=True, timeout=60).stdout.strip()
    assert Path(still).parent == installed
