"""Shared pytest configuration: the wgpu device, and the ``gpu`` mark of the tests that use it.

The marks ``gpu``, ``browser`` and ``slow`` are registered in pyproject.toml; every test runs
by default, and ``python3 -m pytest -m "not gpu and not browser and not slow"`` is the unit
tier.  A test gets ``gpu`` here when it uses a wgpu device fixture, or the ``backend``
fixture at its "webgpu" value; tests that run a bundle with the Python runtime ``Session``
without either are marked where they are written.

``backend``: each test that compares a bundle's outputs with onnxruntime takes it and loads
the bundle with ``tests.helpers.load_bundle(folder, backend)``, so it runs once on WebGPU
(wgpu) and once on the bundle's kernels.wasm (wasmtime; no GPU, so no ``gpu`` mark).
"""

import pytest

from relaxweb.errors import RelaxwebError
from relaxweb.passes.context import VERIFY_ENVIRONMENT_VARIABLE
from relaxweb.runtime.webgpu import default_device

#: Fixtures that hold a wgpu device (tests/runtime/test_runtime_python.py has its own).
GPU_FIXTURES = {"device", "gpu_device"}
#: The Python runtime's backends every onnxruntime comparison runs on (``backend`` below).
BACKENDS = ("webgpu", "wasm")


def pytest_collection_modifyitems(items):
    for item in items:
        callspec = getattr(item, "callspec", None)
        on_webgpu = callspec is not None and callspec.params.get("backend") == "webgpu"
        if on_webgpu or GPU_FIXTURES.intersection(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.gpu)


@pytest.fixture(scope="session", autouse=True)
def verify_the_ir_after_every_pass():
    """Every pass pipeline the tests run, here and in the ``relaxweb`` processes they start,
    checks the module's well-formedness after each pass (and names a pass that breaks it)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(VERIFY_ENVIRONMENT_VARIABLE, "1")
        yield


@pytest.fixture(scope="session", autouse=True)
def one_chromium_for_all_pages():
    """The pages the tests open (``relaxweb.browser``'s functions, in this process) share one
    headless Chromium per WebGPU setting, each page in a fresh context, instead of launching
    one each (about 1.2 s of CPU a launch, some 300 launches).  Started at the first page."""
    from relaxweb import browser  # noqa: PLC0415 - Playwright only once a test opens a page

    with browser.keep_chromium():
        yield


@pytest.fixture(scope="module", params=BACKENDS)
def backend(request) -> str:
    """The backend the test's bundles run on: "webgpu" (skipped without any adapter, like
    ``device``) or "wasm".  Module-scoped: module fixtures that load a bundle can take it, and
    pytest runs a module's webgpu tests, then its wasm tests, keeping the module's other
    fixtures (exports, builds) for both."""
    if request.param == "webgpu":
        request.getfixturevalue("device")
    return request.param


@pytest.fixture(scope="session")
def device():
    """The runtime's shared wgpu device (lavapipe on CI); skipped without any adapter."""
    try:
        return default_device()
    except RelaxwebError as error:  # pragma: no cover - machines without any WebGPU adapter
        pytest.skip(str(error))
