"""The package's one build step that pyproject.toml cannot say: the web demo (web_demo/, the
page ``relaxweb serve`` shows) goes into the installed package as ``relaxweb/web_demo``, where
``relaxweb/browser.py`` looks for it (an editable install uses the repository's folder)."""

from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

WEB_DEMO = Path(__file__).resolve().parent / "web_demo"


class BuildWithWebDemo(build_py):
    def run(self) -> None:
        super().run()
        if not self.editable_mode:
            self.copy_tree(str(WEB_DEMO), str(Path(self.build_lib) / "relaxweb" / "web_demo"))


setup(cmdclass={"build_py": BuildWithWebDemo})
