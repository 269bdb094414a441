"""Every code snippet of README.md runs, as written, and does what its comments say.

Each fenced block of the README is named by its first line in one of three tables:
:data:`RUN_HERE` (a test of this module runs it), :data:`RUN_ELSEWHERE` (another test runs it:
its file named) or :data:`NOT_RUN` (the test suite itself, and the hour-long model zoo, with
why). A block in none of them fails :func:`test_every_snippet_is_run`: a new snippet comes with
its test.

Python runs in this process, shell commands in subprocesses (``relaxweb`` is this checkout's),
JavaScript as a module in headless Chromium on a page that serves the bundles the snippet
names (``./dist/`` and so on) and maps ``relaxweb`` to the runtime (the npm snippet's import);
a snippet without an import of its own gets the first one's (``load``).
"""

from __future__ import annotations

import json
import os
import re
import stat
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import relaxweb
from examples.make_mlp import make_mlp
from tests.fixtures.tiny_decoder import BOUNDS, tiny_decoder
from tests.helpers import in_the_browser, make_model

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.slow  # the command line in subprocesses, Chromium pages


@dataclass(frozen=True)
class Snippet:
    """A fenced block of the README: its language (``""`` for plain text), its text, and the
    line of its opening fence."""

    language: str
    text: str
    line: int

    @property
    def key(self) -> str:
        return self.text.splitlines()[0].strip()

    @property
    def commands(self) -> list[str]:
        return [line.strip() for line in self.text.splitlines() if line.strip() and not line.startswith("#")]


def readme_snippets() -> list[Snippet]:
    text = (REPO / "README.md").read_text()
    return [Snippet(match["language"], match["text"], text.count("\n", 0, match.start()) + 1)
            for match in re.finditer(r"^```(?P<language>\w*)\n(?P<text>.*?)^```", text, re.S | re.M)]


def snippet(key: str) -> Snippet:
    [found] = [s for s in readme_snippets() if s.key == key]
    return found


# Python ----------------------------------------------------------------------------------------

PYTHON_API = "import numpy as np"


def test_the_python_api_example(device, tmp_path: Path, monkeypatch, capsys) -> None:
    (tmp_path / "examples").mkdir()
    onnx.save(make_mlp(), str(tmp_path / "examples" / "mlp.onnx"))
    monkeypatch.chdir(tmp_path)
    exec(compile(snippet(PYTHON_API).text, "README.md (Python API)", "exec"), {"__name__": "readme"})
    printed = capsys.readouterr().out
    assert printed.startswith("bundle of mlp.onnx (format relaxweb-bundle v3)\n")
    assert printed.endswith("input 'x': dimension 0 (batch) is 65, above its bound batch <= 64\n")
    assert (tmp_path / "dist" / "mlp" / "manifest.json").is_file()


# The command line ------------------------------------------------------------------------------

COMMANDS = "relaxweb build model.onnx -o dist/ --bound batch=64     # compile; bounds are optional"
ERROR_EXAMPLE = "$ relaxweb run dist/ --inputs batch65.npz"
PROFILE_OUTPUT = "profile: 5 dispatches of 5 kernels, 3.283 ms in kernels, method: timestamp queries (timed on the GPU: ...)"
TINY_LLAMA = "python3 scripts/tiny_llama.py    # the tiny Llama, trained once into .cache/tiny-llama/"


@pytest.fixture
def shell(tmp_path: Path) -> Callable[..., subprocess.CompletedProcess]:
    """Run a README command line in ``tmp_path`` with ``relaxweb`` this checkout's."""
    bin_dir = tmp_path / ".bin"
    bin_dir.mkdir()
    wrapper = bin_dir / "relaxweb"
    wrapper.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m relaxweb "$@"\n')
    wrapper.chmod(wrapper.stat().st_mode | stat.S_IEXEC)
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
           "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)}

    def run(command: str, cwd: Path = tmp_path, timeout: float = 300) -> subprocess.CompletedProcess:
        return subprocess.run(["bash", "-c", command], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)

    run.env = env  # type: ignore[attr-defined]
    return run


def mlp_folder(folder: Path) -> Path:
    """``folder`` with the README's ``model.onnx`` (the example MLP) and ``in.npz`` (x at batch 4)."""
    onnx.save(make_mlp(), str(folder / "model.onnx"))
    np.savez(folder / "in.npz", x=np.random.default_rng(0).standard_normal((4, 64)).astype(np.float32))
    return folder


@in_the_browser
def test_the_command_lines(device, tmp_path: Path, shell) -> None:
    """Each line of the "Using it" block, in order, in one folder (``relaxweb serve`` until it
    serves; ``relaxweb generate`` on the tiny decoder, built where the line names it)."""
    mlp_folder(tmp_path)
    relaxweb.build(tiny_decoder(), tmp_path / "dist" / "llama", bounds=BOUNDS)
    for command in snippet(COMMANDS).commands:
        if command.startswith("relaxweb serve"):
            with subprocess.Popen(["bash", "-c", command.replace("dist/", "dist/ --port 0", 1)], cwd=tmp_path,
                                  env=shell.env, stdout=subprocess.PIPE, text=True) as server:
                try:
                    assert server.stdout.readline().startswith("Serving dist at http://127.0.0.1:")
                finally:
                    server.terminate()
            continue
        done = shell(command)
        assert done.returncode == 0, f"{command}\n{done.stderr}"
        assert "Traceback" not in done.stderr
    assert (tmp_path / "ir").is_dir() and (tmp_path / "out.npz").is_file()
    assert not (tmp_path / "dist" / "host.wat").exists() and not (tmp_path / "dist" / "runtime").exists()  # the last build's


def test_the_error_example(tmp_path: Path, shell) -> None:
    mlp_folder(tmp_path)
    np.savez(tmp_path / "batch65.npz", x=np.zeros((65, 64), np.float32))
    assert shell("relaxweb build model.onnx -o dist/ --bound batch=64").returncode == 0
    command, expected = snippet(ERROR_EXAMPLE).text.splitlines()
    done = shell(command.removeprefix("$ "))
    assert (done.returncode, done.stderr.splitlines()[-1]) == (2, expected)


def test_the_profile_output(device, tmp_path: Path, shell) -> None:
    mlp_folder(tmp_path)
    assert shell("relaxweb build model.onnx -o dist/ --bound batch=64").returncode == 0
    done = shell("relaxweb run dist/ --inputs in.npz --profile --backend webgpu")
    assert done.returncode == 0, done.stderr
    shown = snippet(PROFILE_OUTPUT).text.splitlines()
    printed = done.stdout.splitlines()
    start = next(index for index, line in enumerate(printed) if line.startswith("profile: "))
    assert re.fullmatch(r"profile: 5 dispatches of 5 kernels, [\d.]+ ms in kernels, method: .+", printed[start])
    assert printed[start + 1] == shown[1]  # the columns
    assert re.fullmatch(r"\w+ +1 +[\d.]+ +[\d.]+ +[\d.-]+ +[\d.-]+", printed[start + 2])


def test_the_tiny_llama_commands(device, tmp_path: Path, shell) -> None:
    """The tiny Llama's three commands, as written: trained once into the repository's
    ``.cache`` (tests/e2e/test_tiny_llama.py uses it too), built and generated from here."""
    (tmp_path / "scripts").symlink_to(REPO / "scripts")
    (tmp_path / ".cache").symlink_to(REPO / ".cache", target_is_directory=True)
    (REPO / ".cache").mkdir(exist_ok=True)
    text = snippet(TINY_LLAMA).text.replace("\\\n", " ")
    outputs = [shell(command, timeout=900) for command in text.splitlines() if command.strip()]
    assert [done.returncode for done in outputs] == [0, 0, 0], [done.stderr for done in outputs]
    assert re.search(r"\d+ tokens, stopped by (eos|length): prefill \d+ ms, [\d.]+ tokens/s", outputs[-1].stderr)
    assert outputs[-1].stdout.strip()  # text streamed to stdout


MANY_COMMANDS = "relaxweb build .cache/tiny-llama/model.onnx -o dist/many --bound batch_size=1 --bound sequence_length=64 \\"
MANY_PYTHON = "import relaxweb"
MANY_EXAMPLE = 'const model = await load("./dist/many/");'


def test_the_many_generations_commands(device, tmp_path: Path, shell, monkeypatch, capsys) -> None:
    """The paged build and three prompts at once (the tiny Llama trained by the commands above,
    in the repository's .cache), then the Python snippet on that bundle: two generations
    together and one more, and the scheduler's stats (nothing left live)."""
    (tmp_path / ".cache").symlink_to(REPO / ".cache", target_is_directory=True)
    if not (REPO / ".cache" / "tiny-llama" / "model.onnx").exists():
        assert shell(snippet(TINY_LLAMA).text.splitlines()[0], timeout=900).returncode == 0
    build, generate = snippet(MANY_COMMANDS).text.replace("\\\n", " ").splitlines()
    done = shell(build)
    assert done.returncode == 0, done.stderr
    done = shell(generate)
    assert done.returncode == 0, done.stderr
    assert [line for line in done.stdout.splitlines() if line.startswith("---")] == [
        "--- prompt 1 ---", "--- prompt 2 ---", "--- prompt 3 ---"]
    assert re.search(r"3 prompts together \(paged KV cache\): 192 tokens in [\d.]+ s", done.stderr), done.stderr
    monkeypatch.chdir(tmp_path)
    exec(compile(snippet(MANY_PYTHON).text, "README.md (many generations)", "exec"), {"__name__": "readme"})
    texts, stats = capsys.readouterr().out.splitlines()
    assert texts.startswith("[' ") and "SchedulerStats(live=0, queued=0, pages_in_use=0, pages=160" in stats


@in_the_browser
def test_the_many_generations_example(tmp_path: Path) -> None:
    relaxweb.build(REPO / ".cache" / "tiny-llama" / "model.onnx", tmp_path / "dist" / "many",
                   bounds={"batch_size": 1, "sequence_length": 64, "past_sequence_length": 256,
                           "total_sequence_length": 320}, kv_pages=160)
    [[story, listed, many, stats]] = run_js(tmp_path, snippet(MANY_EXAMPLE).text).logged()
    assert story and listed and len(many) == 2 and many[0].startswith(story)  # greedy: the same prompt's start
    assert (stats["live"], stats["queued"], stats["pagesInUse"], stats["pages"]) == (0, 0, 0, 160)


CHAT_COMMANDS = "relaxweb build model.onnx -o dist/chat --tokenizer my-model/   # tokenizer.json, tokenizer_config.json, ..."
CHAT_MESSAGES = [{"role": "user", "content": "What is WebGPU?"}]


def chat_model_folder(folder: Path) -> Path:
    """``folder`` with the chat snippets' ``model.onnx`` (the tiny decoder, ids its bytes) and
    ``my-model/``, a publisher's tokenizer folder for it (a byte-level BPE, a chat template)."""
    from tests.runtime.test_chat import TEMPLATE, byte_tokenizer  # noqa: PLC0415 - transformers only here

    onnx.save(tiny_decoder(), str(folder / "model.onnx"))
    (folder / "my-model").mkdir()
    byte_tokenizer().save(str(folder / "my-model" / "tokenizer.json"))
    (folder / "my-model" / "tokenizer_config.json").write_text(
        '{"bos_token": "<s>", "eos_token": "</s>", "chat_template": ' + json.dumps(TEMPLATE) + "}")
    return folder


def test_the_chat_commands(device, tmp_path: Path, shell) -> None:
    """The build with a tokenizer folder, then one reply: the Python runtime's, printed."""
    chat_model_folder(tmp_path)
    build, chat = snippet(CHAT_COMMANDS).commands
    done = shell(build)
    assert done.returncode == 0, done.stderr
    assert sorted(path.name for path in (tmp_path / "dist" / "chat" / "tokenizer").iterdir()) == [
        "chat_template.jinja", "tokenizer.json", "tokenizer_config.json"]
    done = shell(chat)
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    reply = relaxweb.load(tmp_path / "dist" / "chat").chat(CHAT_MESSAGES)  # greedy: the folder has no sampling defaults
    assert done.stdout == reply.text + "\n"
    assert re.search(r"\d+ tokens, stopped by (eos|length): prefill \d+ ms", done.stderr)


# JavaScript in Chromium ------------------------------------------------------------------------

PAGE_EXAMPLE = 'import { load } from "./dist/runtime/relaxweb.js";'
NPM_EXAMPLE = 'import { load } from "relaxweb";'
THREADS_EXAMPLE = 'const model = await load("./dist/", { threads: 4 });'
PROFILE_EXAMPLE = 'const model = await load("./dist/", { profile: true });'
KEEP_ON_GPU_EXAMPLE = "// a bundle with inputs state_in and x, float32 [4, 8], and the output state_out = state_in + x"
GENERATE_EXAMPLE = 'const model = await load("./dist/llama/");'
CHAT_EXAMPLE = 'const model = await load("./dist/chat/");'

#: The page a snippet runs on: ``relaxweb`` mapped to the runtime, the ``#output`` element the
#: generate example writes to, and the console kept as JSON (typed arrays as arrays) in
#: ``window.consoleKept``, read after the snippet ran.
INDEX_HTML = """<!doctype html>
<meta charset="utf-8">
<script type="importmap">{"imports": {"relaxweb": "/runtime/relaxweb.js"}}</script>
<script>
  const plain = (value) => ArrayBuffer.isView(value) ? Array.from(value, Number)
    : Array.isArray(value) ? value.map(plain)
    : value && typeof value === "object" ? Object.fromEntries(Object.entries(value).map(([k, v]) => [k, plain(v)]))
    : typeof value === "bigint" ? Number(value) : value;
  window.consoleKept = [];
  for (const kind of ["log", "info", "table", "warn", "error"]) {
    const original = console[kind].bind(console);
    console[kind] = (...args) => { window.consoleKept.push([kind, args.map(plain)]); original(...args); };
  }
</script>
<pre id="output"></pre>
"""


def state_model() -> onnx.ModelProto:
    """state_out = state_in + x, float32 [4, 8]: the keepOnGpu example's model."""
    return make_model([helper.make_node("Add", ["state_in", "x"], ["state_out"])],
                      [("state_in", TensorProto.FLOAT, [4, 8]), ("x", TensorProto.FLOAT, [4, 8])], ["state_out"])


@dataclass
class Console:
    """What a snippet's page logged: each message's type and arguments (as JSON values)."""

    messages: list[tuple[str, list]]

    def logged(self, kind: str = "log") -> list[list]:
        return [args for message_kind, args in self.messages if message_kind == kind]


def run_js(site: Path, code: str, *, webgpu: bool = True, isolated: bool = True) -> Console:
    """Run ``code`` as a module of a page at the root of ``site`` (its bundles in their
    folders; ``/runtime/`` the package's runtime) in a fresh headless Chromium; its console."""
    from relaxweb import browser  # noqa: PLC0415 - Playwright only for the tests that use it

    if "import " not in code.split("\n", 1)[0]:
        code = 'import { load } from "/runtime/relaxweb.js";\n' + code
    (site / "snippet.js").write_text(code)
    (site / "index.html").write_text(INDEX_HTML)
    some_bundle = next(path.parent for path in sorted(site.rglob("manifest.json")))
    server = browser.start_server(some_bundle, page_dir=site, isolated=isolated)
    try:
        with browser.sync_playwright() as playwright:
            chromium = browser.launch_chromium(playwright, webgpu=webgpu)
            try:
                page = chromium.new_page()
                page.goto(server.url + "index.html")  # type: ignore[attr-defined]
                messages = page.evaluate("async () => { await import('/snippet.js'); return window.consoleKept; }")
            finally:
                chromium.close()
    finally:
        browser.stop_server(server)
    return Console([(kind, args) for kind, args in messages])


@pytest.fixture
def mlp_site(tmp_path: Path) -> Path:
    relaxweb.build(make_mlp(), tmp_path / "dist", bounds={"batch": 64})
    return tmp_path


@in_the_browser
def test_the_page_example(mlp_site: Path) -> None:
    console = run_js(mlp_site, snippet(PAGE_EXAMPLE).text)
    progress = [args for args in console.logged() if len(args) == 2 and all(isinstance(a, int) for a in args)]
    assert progress[0][0] == 0 and progress[-1][0] == progress[-1][1]  # onProgress: from 0 to all the bytes
    [shape, data] = console.logged()[-1]
    assert shape == [5, 10] and len(data) == 50


@in_the_browser
def test_the_npm_example_with_a_bundle_without_a_runtime(tmp_path: Path) -> None:
    relaxweb.build(make_mlp(), tmp_path / "models" / "mlp", runtime="none")
    assert not (tmp_path / "models" / "mlp" / "runtime").exists()
    console = run_js(tmp_path, snippet(NPM_EXAMPLE).text)
    assert console.logged()[-1] == [[2, 10]]


@in_the_browser
@pytest.mark.parametrize("isolated", [True, False], ids=["cross-origin isolated", "not isolated"])
def test_the_threads_example_says_why_it_has_one_thread(mlp_site: Path, isolated: bool) -> None:
    console = run_js(mlp_site, snippet(THREADS_EXAMPLE).text, webgpu=False, isolated=isolated)
    assert console.logged()[-1] == (["wasm", 4, True] if isolated else ["wasm", 1, False])
    [line] = [args[0] for args in console.logged("info") if "the wasm backend runs this model" in str(args)]
    readme = " ".join((REPO / "README.md").read_text().split())
    if isolated:
        assert line == "relaxweb: the wasm backend runs this model (4 threads)"
    else:
        assert line.startswith("relaxweb: the wasm backend runs this model (1 thread: this page is not cross-origin "
                               "isolated") and f"`{line}`" in readme  # the README quotes it whole


@in_the_browser
def test_the_profile_example(mlp_site: Path) -> None:
    console = run_js(mlp_site, snippet(PROFILE_EXAMPLE).text)
    [[rows]] = console.logged("table")
    assert sum(row["calls"] for row in rows) == 5 and all(row["totalMs"] >= 0 for row in rows)


@in_the_browser
def test_the_keep_on_gpu_example(tmp_path: Path) -> None:
    relaxweb.build(state_model(), tmp_path / "dist" / "state")
    [data, buffers_created, input_bytes_written] = run_js(tmp_path, snippet(KEEP_ON_GPU_EXAMPLE).text).logged()[-1]
    assert data == [6.0] * 32  # 1 + 2 + 3, kept on the GPU from step to step
    assert (buffers_created, input_bytes_written) == (0, 128)  # as the comment says: warm, and only x written


@in_the_browser
def test_the_generate_example(tmp_path: Path) -> None:
    relaxweb.build(tiny_decoder(), tmp_path / "dist" / "llama", bounds=BOUNDS)
    console = run_js(tmp_path, snippet(GENERATE_EXAMPLE).text)
    [[live_bytes]] = console.logged()
    assert isinstance(live_bytes, int) and live_bytes > 0


@in_the_browser
def test_the_chat_example(tmp_path: Path) -> None:
    """The prompt is the template's text as the Python runtime renders it (transformers' own, by
    tests/tokenizer), the reply's text the ``tokenizers`` decoding of its tokens."""
    from tokenizers import Tokenizer  # noqa: PLC0415

    (tmp_path / "model").mkdir()
    folder = chat_model_folder(tmp_path / "model")
    bundle = relaxweb.build(folder / "model.onnx", tmp_path / "dist" / "chat", tokenizer=folder / "my-model")
    [[prompt, tokens, text, stopped]] = run_js(tmp_path, snippet(CHAT_EXAMPLE).text).logged()
    assert prompt == relaxweb.load(bundle.path, backend="wasm").apply_chat_template(CHAT_MESSAGES)
    assert text == Tokenizer.from_file(str(folder / "my-model" / "tokenizer.json")).decode(tokens)
    assert stopped in ("eos", "length") and 0 < len(tokens) <= 200


# Every snippet ---------------------------------------------------------------------------------

#: snippet (its first line) -> the test of this module that runs it
RUN_HERE: dict[str, Callable] = {
    PYTHON_API: test_the_python_api_example,
    COMMANDS: test_the_command_lines,
    ERROR_EXAMPLE: test_the_error_example,
    PROFILE_OUTPUT: test_the_profile_output,
    TINY_LLAMA: test_the_tiny_llama_commands,
    PAGE_EXAMPLE: test_the_page_example,
    NPM_EXAMPLE: test_the_npm_example_with_a_bundle_without_a_runtime,
    THREADS_EXAMPLE: test_the_threads_example_says_why_it_has_one_thread,
    PROFILE_EXAMPLE: test_the_profile_example,
    KEEP_ON_GPU_EXAMPLE: test_the_keep_on_gpu_example,
    GENERATE_EXAMPLE: test_the_generate_example,
    CHAT_COMMANDS: test_the_chat_commands,
    MANY_COMMANDS: test_the_many_generations_commands,
    MANY_PYTHON: test_the_many_generations_commands,
    MANY_EXAMPLE: test_the_many_generations_example,
    CHAT_EXAMPLE: test_the_chat_example,
}

#: snippet -> (the test file that runs it, what it checks)
RUN_ELSEWHERE: dict[str, tuple[str, str]] = {
    "bash scripts/quickstart.sh": ("tests/e2e/test_pip_install.py", "runs scripts/quickstart.sh in a fresh virtual "
                                   "environment: pip install ., the MLP built and run, other installations kept"),
}

#: snippet -> why no test runs it
NOT_RUN: dict[str, str] = {
    "bash scripts/test.sh": "the test suite itself (CI's .ci/run is this command)",
    'python3 -m pytest -m "not gpu and not browser and not slow"': "a part of the test suite itself",
    "python3 scripts/model_zoo.py setup && python3 scripts/model_zoo.py all   # ~1 h the first time":
        "an hour of exports in virtual environments of their own; tests/e2e/test_model_zoo.py checks a subset of "
        "the corpus it writes",
}


def test_every_snippet_is_run() -> None:
    snippets = readme_snippets()
    keys = [s.key for s in snippets]
    unrun = [f"README.md:{s.line}: {s.key}" for s in snippets if s.key not in {*RUN_HERE, *RUN_ELSEWHERE, *NOT_RUN}]
    assert not unrun, f"README snippets no test runs (add them to tests/e2e/test_readme.py): {unrun}"
    gone = [key for key in (*RUN_HERE, *RUN_ELSEWHERE, *NOT_RUN) if key not in keys]
    assert not gone, f"snippets no longer in the README: {gone}"
    for file, _ in RUN_ELSEWHERE.values():
        assert "scripts/quickstart.sh" in (REPO / file).read_text()
