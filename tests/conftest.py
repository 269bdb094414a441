"""Shared pytest configuration."""


def pytest_configure(config):
    config.addinivalue_line(
        "markers",
        "browser: runs headless Chromium with WebGPU through Playwright (slow; needs chromium)",
    )


import pytest  # noqa: E402


@pytest.fixture(scope="session")
def device():
    """The runtime's shared wgpu device (lavapipe on CI); skipped without any adapter."""
    from relaxweb.errors import RelaxwebError
    from relaxweb.runtime.webgpu import default_device

    try:
        return default_device()
    except RelaxwebError as error:  # pragma: no cover - machines without any WebGPU adapter
        pytest.skip(str(error))
