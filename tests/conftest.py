"""Shared pytest configuration."""


def pytest_configure(config):
    config.addinivalue_line(
        "markers",
        "browser: runs headless Chromium with WebGPU through Playwright (slow; needs chromium)",
    )
