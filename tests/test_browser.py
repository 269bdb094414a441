"""Tests of the browser runtime (``relaxweb/runtime_js``) in headless Chromium with WebGPU.

They run the handmade bundle (``tests/fixtures/handmade_bundle.py``: ``z = (x + w) * 2``
with ``x: float32[n, 4]``, ``n <= 16``) through Playwright, on whatever adapter Chromium
offers (SwiftShader without a GPU), and are skipped when Playwright or Chromium is missing.
"""

from __future__ import annotations

import importlib.util
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from relaxweb import browser
from relaxweb.browser import open_runner_page, run_in_browser, start_server, stop_server
from relaxweb.errors import InputShapeError, RelaxwebError
from tests.fixtures.handmade_bundle import DEFAULT_BOUND, HANDMADE_WEIGHT, write_handmade_bundle

ARTIFACTS_DIR = Path(__file__).resolve().parent.parent / "test-artifacts"


def _chromium_available() -> bool:
    try:
        browser.find_chromium()
    except RelaxwebError:
        return False
    return True


pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(importlib.util.find_spec("playwright") is None, reason="playwright is not installed"),
    pytest.mark.skipif(not _chromium_available(), reason="chromium is not installed"),
]


def expected_output(x: np.ndarray) -> np.ndarray:
    """What the handmade model computes, in float32 like the GPU."""
    return (x + HANDMADE_WEIGHT) * np.float32(2)


def random_input(rows: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).uniform(-10, 10, size=(rows, 4)).astype(np.float32)


def edit_manifest(bundle_dir: Path, change: Callable[[dict[str, Any]], None]) -> None:
    """Apply ``change`` to the bundle's manifest.json in place."""
    manifest_path = bundle_dir / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    change(manifest)
    manifest_path.write_text(json.dumps(manifest))


@pytest.fixture
def bundle_dir(tmp_path: Path) -> Path:
    write_handmade_bundle(tmp_path / "bundle")
    return tmp_path / "bundle"


@pytest.fixture
def unbounded_bundle_dir(tmp_path: Path) -> Path:
    write_handmade_bundle(tmp_path / "unbounded", bound=None)
    return tmp_path / "unbounded"


#: Runs in the runner page: load the bundle with `options`, run it for each row count, and
#: return per run either {shape, data} of z or {error: name: message}.
RUN_ROWS_IN_PAGE = """
async ({ options, rowCounts }) => {
  const results = [];
  let model;
  try {
    model = await window.relaxweb.load("/bundle/", options);
  } catch (error) {
    return { loadError: `${error.name}: ${error.message}` };
  }
  for (const rows of rowCounts) {
    const x = Float32Array.from({ length: rows * 4 }, (_, i) => i * 0.25 - 3);
    try {
      const { z } = await model.run({ x: { data: x, shape: [rows, 4] } });
      results.push({ shape: z.shape, data: Array.from(z.data), input: Array.from(x) });
    } catch (error) {
      results.push({ error: `${error.name}: ${error.message}` });
    }
  }
  model.dispose();
  return { results, symbolicVars: model.symbolicVars };
}
"""


def run_rows(bundle: Path, row_counts: list[int], options: dict | None = None) -> dict:
    """Load ``bundle`` once in the browser and run it for each row count."""
    with open_runner_page(bundle) as page:
        return page.evaluate(RUN_ROWS_IN_PAGE, {"options": options or {}, "rowCounts": row_counts})


def check_run_result(result: dict, rows: int) -> None:
    """A run result from RUN_ROWS_IN_PAGE is z = (x + w) * 2 for x of `rows` rows."""
    assert "error" not in result, result
    assert result["shape"] == [rows, 4]
    x = np.array(result["input"], dtype=np.float32).reshape(rows, 4)
    z = np.array(result["data"], dtype=np.float32).reshape(rows, 4)
    np.testing.assert_allclose(z, expected_output(x), atol=1e-5)


@pytest.mark.parametrize("rows", [1, 5])
def test_run_in_browser_matches_numpy(bundle_dir: Path, rows: int) -> None:
    x = random_input(rows, seed=rows)
    outputs = run_in_browser(bundle_dir, {"x": x})
    assert set(outputs) == {"z"}
    assert outputs["z"].dtype == np.float32
    assert outputs["z"].shape == (rows, 4)
    np.testing.assert_allclose(outputs["z"], expected_output(x), atol=1e-5)


def test_run_above_the_bound_raises_input_shape_error(bundle_dir: Path) -> None:
    with pytest.raises(InputShapeError) as raised:
        run_in_browser(bundle_dir, {"x": random_input(17)})
    message = str(raised.value)
    assert message == "input 'x': dimension 0 (n) is 17, above its bound 16"
    for part in ("'x'", "dimension 0", "17", "16"):
        assert part in message


def test_wrong_dtype_and_rank_raise_input_shape_error(bundle_dir: Path) -> None:
    with pytest.raises(InputShapeError, match=r"input 'x': expected float32 data"):
        run_in_browser(bundle_dir, {"x": np.zeros((2, 4), dtype=np.float64)})
    with pytest.raises(InputShapeError, match=r"input 'x': expected 2 dimensions"):
        run_in_browser(bundle_dir, {"x": np.zeros(4, dtype=np.float32)})
    with pytest.raises(InputShapeError, match=r"input 'x' is missing"):
        run_in_browser(bundle_dir, {})


def test_one_model_runs_many_sizes_and_reports_progress(bundle_dir: Path) -> None:
    script = """
    async () => {
      const progress = [];
      const model = await window.relaxweb.load("/bundle/", { onProgress: (p) => progress.push(p) });
      const shapes = [];
      for (const rows of [3, 0, 16, 2]) {
        const { z } = await model.run({ x: { data: new Float32Array(rows * 4), shape: [rows, 4] } });
        shapes.push(z.shape);
      }
      model.dispose();
      let afterDispose = null;
      try { await model.run({ x: { data: new Float32Array(4), shape: [1, 4] } }); }
      catch (error) { afterDispose = error.message; }
      return { progress, shapes, afterDispose };
    }
    """
    with open_runner_page(bundle_dir) as page:
        result = page.evaluate(script)
    assert result["shapes"] == [[3, 4], [0, 4], [16, 4], [2, 4]]
    assert result["progress"][0] == {"loaded": 0, "total": 16}
    assert result["progress"][-1] == {"loaded": 16, "total": 16}
    assert "disposed" in result["afterDispose"]


def test_tighter_bounds_are_enforced(bundle_dir: Path) -> None:
    outcome = run_rows(bundle_dir, [3, 4], {"bounds": {"n": 3}})
    assert outcome["symbolicVars"] == [{"name": "n", "bound": 3}]
    check_run_result(outcome["results"][0], 3)
    assert outcome["results"][1]["error"] == "InputShapeError: input 'x': dimension 0 (n) is 4, above its bound 3"


def test_a_bound_above_the_build_bound_is_refused(bundle_dir: Path) -> None:
    outcome = run_rows(bundle_dir, [1], {"bounds": {"n": DEFAULT_BOUND + 1}})
    assert "the bound of 'n' is 17, above the bound 16" in outcome["loadError"]


def test_unbounded_storages_grow(unbounded_bundle_dir: Path) -> None:
    outcome = run_rows(unbounded_bundle_dir, [2, 300, 1, 1000])
    assert outcome["symbolicVars"] == [{"name": "n", "bound": None}]
    for result, rows in zip(outcome["results"], [2, 300, 1, 1000]):
        check_run_result(result, rows)


def test_a_limit_the_adapter_lacks_is_named(bundle_dir: Path) -> None:
    edit_manifest(bundle_dir, lambda m: m["required_limits"].update(maxStorageBuffersPerShaderStage=100000))
    assert "maxStorageBuffersPerShaderStage = 100000" in run_rows(bundle_dir, [1])["loadError"]
    edit_manifest(bundle_dir, lambda m: m.update(required_limits={"maxImaginaryThings": 1}))
    assert "maxImaginaryThings" in run_rows(bundle_dir, [1])["loadError"]


def test_a_corrupt_shard_is_refused(bundle_dir: Path) -> None:
    shard = bundle_dir / "weights" / "shard0.bin"
    shard.write_bytes(bytes(16))
    with pytest.raises(RelaxwebError, match=r"weight shard weights/shard0.bin is corrupt: sha256"):
        run_in_browser(bundle_dir, {"x": random_input(1)})


def test_a_kernel_that_does_not_compile_is_reported(bundle_dir: Path) -> None:
    (bundle_dir / "kernels" / "multiply_by_two.wgsl").write_text("this is not wgsl")
    with pytest.raises(RelaxwebError, match=r"kernel multiply_by_two does not compile"):
        run_in_browser(bundle_dir, {"x": random_input(1)})


def test_demo_page_runs_and_shows_outputs(bundle_dir: Path) -> None:
    ARTIFACTS_DIR.mkdir(exist_ok=True)
    server = start_server(bundle_dir)
    try:
        with browser.sync_playwright() as playwright:
            chromium = browser.launch_chromium(playwright)
            try:
                page = chromium.new_page()
                page.goto(server.url)  # type: ignore[attr-defined]
                page.wait_for_selector("#run:not([disabled])", timeout=60_000)
                assert page.input_value("#var-n") == "1"
                assert page.get_attribute("#var-n", "max") == str(DEFAULT_BOUND)
                page.fill("#var-n", "3")
                page.click("#run")
                page.wait_for_selector("#outputs pre", timeout=60_000)
                assert "[3, 4]" in page.inner_text("#outputs")
                assert "ms" in page.inner_text("#time")
                assert page.inner_text("#error") == ""
                page.screenshot(path=str(ARTIFACTS_DIR / "demo.png"), full_page=True)

                page.fill("#var-n", "17")
                page.click("#run")
                page.wait_for_function("document.getElementById('error').textContent !== ''")
                assert "above its bound 16" in page.inner_text("#error")
            finally:
                chromium.close()
    finally:
        stop_server(server)
