"""The web demo (web_demo/, what ``relaxweb serve DIR`` serves) in headless Chromium.

The example MLP (``x[batch, 64] -> probabilities[batch, 10]``, built with ``batch <= 64``)
is served with the demo; the test clicks through it once: the bundle loads (progress in
bytes), the input shows its symbolic shape and bound, a size is set, the model runs, a
latency sweep over ``batch`` draws its chart; then another bundle URL is loaded from the
URL field (a missing one, then the served one with its weights cached).  Screenshots go to test-artifacts/ (git-ignored).
"""

from __future__ import annotations

import json
from pathlib import Path

import onnx
import pytest

from examples.make_mlp import make_mlp
from relaxweb.compiler import build_bundle
from tests.helpers import demo_page as served_demo_page
from tests.runtime_js.test_browser import pytestmark as browser_marks

pytestmark = browser_marks

ARTIFACTS_DIR = Path(__file__).resolve().parents[2] / "test-artifacts"
TIMEOUT_MS = 60_000


@pytest.fixture(scope="module")
def mlp_bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("demo-mlp")
    onnx.save(make_mlp(), str(folder / "mlp.onnx"))
    build_bundle(folder / "mlp.onnx", folder / "bundle", {"batch": 64})
    return folder / "bundle"


@pytest.fixture
def demo_page(mlp_bundle: Path):
    """A headless Chromium page on the demo, served as ``relaxweb serve`` serves it."""
    with served_demo_page(mlp_bundle) as page:
        yield page


def weight_bytes(bundle: Path) -> int:
    return sum(shard["nbytes"] for shard in json.loads((bundle / "manifest.json").read_text())["shards"])


def test_demo_loads_runs_and_sweeps(demo_page, mlp_bundle: Path) -> None:
    page = demo_page
    ARTIFACTS_DIR.mkdir(exist_ok=True)
    page.wait_for_selector("#run:not([disabled])", timeout=TIMEOUT_MS)

    total = weight_bytes(mlp_bundle)
    assert page.inner_text("#progress-text") == f"Loaded: {total} / {total} bytes of weights."
    assert page.input_value("#bundle-url") == "bundle/"
    inputs = page.inner_text("#inputs")
    assert "x" in inputs and "float32" in inputs and "[batch, 64]" in inputs and "batch ≤ 64" in inputs
    assert "[batch, 10]" in page.inner_text("#output-specs")
    assert page.get_attribute("#var-batch", "max") == "64"
    assert page.is_hidden("#generate-section")  # not a decoder (tests/runtime/test_generate.py shows a decoder's)

    page.fill("#var-batch", "3")
    page.click("#run")
    page.wait_for_selector("#outputs pre", timeout=TIMEOUT_MS)
    assert "probabilities shape [3, 10]" in page.inner_text("#outputs")
    assert "ms" in page.inner_text("#time")
    assert page.inner_text("#error") == ""

    assert page.input_value("#sweep-var") == "batch"
    assert page.input_value("#sweep-values") == "1, 2, 4, 8, 16, 32, 64"
    page.fill("#sweep-values", "1, 8, 32")
    page.fill("#sweep-repeats", "3")
    page.click("#sweep")
    page.wait_for_function("document.querySelectorAll('#chart svg circle.point').length === 3", timeout=TIMEOUT_MS)
    page.wait_for_selector("#sweep:not([disabled])", timeout=TIMEOUT_MS)
    points = page.eval_on_selector_all(
        "#chart svg circle.point", "(nodes) => nodes.map((n) => [Number(n.dataset.x), Number(n.dataset.ms)])")
    assert [x for x, _ in points] == [1, 8, 32]
    assert all(ms > 0 for _, ms in points)
    assert page.inner_text("#sweep-status").startswith("done: 3 values, 3 runs each")
    assert page.inner_text("#error") == ""
    page.screenshot(path=str(ARTIFACTS_DIR / "demo-sweep.png"), full_page=True)

    page.fill("#var-batch", "65")  # above the bound: the host module's message
    page.click("#run")
    page.wait_for_function("document.getElementById('error').textContent !== ''")
    assert "input 'x': dimension 0 (batch) is 65, above its bound" in page.inner_text("#error")


def test_demo_loads_the_bundle_the_url_field_names(demo_page) -> None:
    page = demo_page
    page.wait_for_selector("#run:not([disabled])", timeout=TIMEOUT_MS)
    page.fill("#bundle-url", "no-such-bundle/")
    page.click("#load")
    page.wait_for_function("document.getElementById('error').textContent !== ''", timeout=TIMEOUT_MS)
    assert "no-such-bundle/manifest.json" in page.inner_text("#error")
    assert "HTTP 404" in page.inner_text("#error")
    assert page.inner_text("#progress-text") == "Loading failed."
    assert page.is_disabled("#run")

    page.fill("#bundle-url", "/bundle/manifest.json")
    page.check("#cache-weights")  # the shards go to the Cache API too
    page.click("#load")
    page.wait_for_selector("#run:not([disabled])", timeout=TIMEOUT_MS)
    assert page.inner_text("#error") == ""
    cached = page.evaluate("async () => (await (await caches.open('relaxweb')).keys()).map((r) => new URL(r.url).pathname)")
    assert cached and all(path.startswith("/bundle/weights/") for path in cached)
    page.click("#run")
    page.wait_for_selector("#outputs pre", timeout=TIMEOUT_MS)
    assert "probabilities shape [1, 10]" in page.inner_text("#outputs")
