"""The npm package as a web developer gets it: ``npm pack``, then the tarball installed into a
fresh folder.

- The tarball holds the browser runtime (every module, the workers, ``sampler.wgsl``, the
  manifest schema, the types) and nothing else; ``package.json`` is publishable.
- A strict TypeScript consumer (``npm_consumer/consumer.ts``, ``tsc --strict``, no
  ``skipLibCheck``) compiles with only the package installed, under TypeScript 7 (WebGPU's
  types in lib.dom) and 5.9 (none): a plain ``run`` needs no cast.
- A Vite app (``vite_app/``) importing ``relaxweb`` builds, and in Chromium runs a bundle
  built with ``--runtime none`` on WebGPU and on the wasm backend with 2 worker threads (the
  workers are assets of Vite's build), generates with a decoder (the sampler is one too) and
  chats with it through a Hugging Face tokenizer and chat template (the package's
  dependencies ``@huggingface/tokenizers`` and ``@huggingface/jinja``, installed with it and
  bundled by Vite), with the Python runtime's outputs, tokens, prompt and text.

Needs npm and the repository's ``npm install`` (vite, typescript); Vite and tsc come from
there, the app's vite from the npm cache it filled.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
import relaxweb
from examples.make_mlp import make_mlp
from tests.fixtures.tiny_decoder import BOUNDS, tiny_decoder
from tests.helpers import MODEL, assert_close, in_the_browser, rand
from tests.runtime.test_chat import TEMPLATE, byte_tokenizer

REPO = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
NODE_MODULES = REPO / "node_modules"
NPM = shutil.which("npm")

pytestmark = [
    pytest.mark.slow,  # npm and node in subprocesses, seconds each
    pytest.mark.skipif(NPM is None, reason="npm is not installed"),
    pytest.mark.skipif(not (NODE_MODULES / "vite").is_dir() or not (NODE_MODULES / "typescript").is_dir(),
                       reason="the repository's devDependencies are not installed: run npm install"),
]


def npm(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    done = subprocess.run([NPM, *args], cwd=cwd, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return done


def installed_version(package: str) -> str:
    return json.loads((NODE_MODULES / package / "package.json").read_text())["version"]


@pytest.fixture(scope="module")
def packed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, set[str]]:
    """``npm pack`` of the repository: the tarball and the paths it holds."""
    out = tmp_path_factory.mktemp("pack")
    [info] = json.loads(npm("pack", "--json", "--pack-destination", str(out), cwd=REPO).stdout)
    return out / info["filename"], {entry["path"] for entry in info["files"]}


def fresh_project(folder: Path, tarball: Path, *packages: str) -> Path:
    """``folder`` as a new npm project with the tarball (and ``packages``) installed."""
    folder.mkdir(exist_ok=True)
    (folder / "package.json").write_text(json.dumps({"name": folder.name, "private": True, "type": "module"}))
    npm("install", "--no-audit", "--no-fund", "--prefer-offline", str(tarball), *packages, cwd=folder)
    return folder


def test_the_tarball_holds_the_runtime_and_nothing_else(packed) -> None:
    tarball, files = packed
    runtime = {f"relaxweb/runtime_js/{path.name}" for path in (REPO / "relaxweb" / "runtime_js").iterdir() if path.is_file()}
    assert files == runtime | {"package.json", "README.md"}
    manifest = json.loads((REPO / "package.json").read_text())
    assert manifest["name"] == "relaxweb" and "private" not in manifest
    assert manifest["version"] == relaxweb.__version__  # the bundles a runtime reads are the same release's
    targets = [target for entry in manifest["exports"].values()
               for target in (entry.values() if isinstance(entry, dict) else [entry])]
    assert all(target.removeprefix("./") in files for target in targets)
    for asset in ("wasm_worker.js", "sampler.wgsl"):
        assert f"./{asset}" in manifest["exports"]


@pytest.mark.parametrize("typescript", ["typescript", "typescript-5"])
def test_a_strict_typescript_consumer_compiles_with_only_the_package(packed, tmp_path: Path, typescript: str) -> None:
    tarball, _ = packed
    project = fresh_project(tmp_path / "consumer", tarball)
    for name in ("consumer.ts", "tsconfig.json"):
        shutil.copy(HERE / "npm_consumer" / name, project / name)
    installed = {path.name for path in (project / "node_modules").iterdir()}
    assert "relaxweb" in installed and "@webgpu" not in installed and "typescript" not in installed
    compiler = NODE_MODULES / typescript / "bin" / "tsc"
    done = subprocess.run(["node", str(compiler), "-p", str(project)], capture_output=True, text=True, timeout=120)
    version = installed_version(typescript)
    assert done.returncode == 0, f"TypeScript {version}:\n{done.stdout}{done.stderr}"


@in_the_browser
def test_a_vite_app_builds_and_runs_bundles_with_the_package(packed, tmp_path: Path, device) -> None:
    from relaxweb import browser  # noqa: PLC0415 - Playwright only for the tests that use it

    tarball, _ = packed
    app = fresh_project(tmp_path / "app", tarball, f"vite@{installed_version('vite')}")
    for name in ("index.html", "main.js"):
        shutil.copy(HERE / "vite_app" / name, app / name)
    subprocess.run(["node", str(app / "node_modules" / "vite" / "bin" / "vite.js"), "build"], cwd=app, check=True,
                   capture_output=True, timeout=120)
    assets = {path.name.split("-")[0]: path for path in (app / "dist" / "assets").iterdir()}
    assert {"wasm_worker", "sampler"} <= set(assets)  # Vite copied what new URL(...) names
    assert assets["sampler"].read_bytes() == (REPO / "relaxweb" / "runtime_js" / "sampler.wgsl").read_bytes()

    mlp = relaxweb.build(make_mlp(), tmp_path / "mlp", bounds={"batch": 64}, runtime="none").path
    decoder = relaxweb.build(tiny_decoder(), tmp_path / "decoder", bounds=BOUNDS, runtime="none").path
    chat = relaxweb.build(tiny_decoder(), tmp_path / "chat", bounds=BOUNDS, runtime="none",
                          tokenizer=tokenizer_folder(tmp_path / "tokenizer")).path
    assert not any((bundle / "runtime").exists() for bundle in (mlp, decoder, chat))
    x = rand(3, 64, seed=4)
    expected = relaxweb.load(mlp, backend="wasm").run({"x": x})["probabilities"]
    expected_tokens = relaxweb.load(decoder, backend="webgpu").generate("ab", max_new_tokens=8).tokens
    chat_session = relaxweb.load(chat, backend="webgpu")
    expected_prompt = chat_session.apply_chat_template(MESSAGES)
    expected_reply = chat_session.chat(MESSAGES, max_new_tokens=8)

    with browser.sync_playwright() as playwright:
        chromium = browser.launch_chromium(playwright)
        try:
            page = chromium.new_page()
            for bundle, check in ((mlp, "run"), (decoder, "generate"), (chat, "chat")):
                server = browser.start_server(bundle, page_dir=app / "dist")  # cross-origin isolated: threads
                try:
                    page.goto(server.url)  # type: ignore[attr-defined]
                    page.wait_for_function("document.getElementById('status').textContent === 'ready'", timeout=30_000)
                    if check == "chat":
                        result = page.evaluate("([messages, count]) => window.chatReply(messages, count)", [MESSAGES, 8])
                        assert result == {"prompt": expected_prompt, "tokens": expected_reply.tokens,
                                          "text": expected_reply.text}
                        continue
                    if check == "generate":
                        result = page.evaluate("([prompt, count]) => window.generateTokens(prompt, count)", ["ab", 8])
                        assert result["tokens"] == expected_tokens
                        continue
                    for backend in ("webgpu", "wasm"):
                        result = page.evaluate("""async ([backend, x]) =>
                          window.runModel(backend, {x: {data: Float32Array.from(x), shape: [3, 64]}})""",
                                               [backend, x.reshape(-1).tolist()])
                        assert (result["backend"], result["threads"]) == (backend, 2 if backend == "wasm" else 1)
                        output = result["outputs"]["probabilities"]
                        assert_close(np.array(output["data"], np.float32).reshape(output["shape"]), expected, MODEL)
                finally:
                    browser.stop_server(server)
        finally:
            chromium.close()


#: A conversation short enough for the tiny decoder's bounds (65 tokens).
MESSAGES = [{"role": "user", "content": "Hi!"}]


def tokenizer_folder(folder: Path) -> Path:
    """A publisher's tokenizer folder whose ids are the tiny decoder's bytes (256 BOS, 257 EOS)."""
    folder.mkdir()
    byte_tokenizer().save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({"bos_token": "<s>", "eos_token": "</s>",
                                                             "chat_template": TEMPLATE}))
    return folder
