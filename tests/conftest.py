"""Shared pytest configuration."""


def pytest_configure(config):
    config.addinivalue_line(
        "markers",
        "browser: runs headless Chromium with WebGPU through Playwright (slow; needs chromium)",
    )


import pytest  # noqa: E402

from relaxweb.passes.context import VERIFY_ENVIRONMENT_VARIABLE  # noqa: E402


@pytest.fixture(scope="session", autouse=True)
def verify_the_ir_after_every_pass():
    """Every pass pipeline the tests run, here and in the ``relaxweb`` processes they start,
    checks the module's well-formedness after each pass (and names a pass that breaks it)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(VERIFY_ENVIRONMENT_VARIABLE, "1")
        yield


@pytest.fixture(scope="session")
def device():
    """The runtime's shared wgpu device (lavapipe on CI); skipped without any adapter."""
    from relaxweb.errors import RelaxwebError
    from relaxweb.runtime.webgpu import default_device

    try:
        return default_device()
    except RelaxwebError as error:  # pragma: no cover - machines without any WebGPU adapter
        pytest.skip(str(error))
