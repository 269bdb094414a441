"""Run bundles in a real browser: headless Chromium with WebGPU, driven by Playwright.

Two uses:

- :func:`run_in_browser` runs a bundle once on given inputs, with the browser runtime
  (``relaxweb/runtime_js/relaxweb.js``), and returns the outputs as numpy arrays
  (:func:`run_many_in_browser`: one load, several runs).  Tests use them to check that the
  browser computes what numpy does.
- :func:`serve` (``relaxweb serve DIR``) serves the web demo with a bundle for people to try
  (and the chat page, ``chat.html``, beside it).

Both serve files from 127.0.0.1 (a secure context, which WebGPU needs) with the same
layout: the page at ``/``, the bundle at ``/bundle/``, the runtime at ``/runtime/``.
"""

from __future__ import annotations

import base64
import contextlib
import functools
import http.server
import json
import os
import shutil
import sys
import tempfile
import threading
import urllib.parse
from pathlib import Path
from typing import Any, Iterator, NamedTuple

import numpy as np

from relaxweb.errors import InputShapeError, RelaxwebError
from relaxweb.runtime.generate import decoder_signature
from relaxweb.runtime.manifest import manifest_problem
from relaxweb.runtime.profile import KernelRow, Profile

PACKAGE_DIR = Path(__file__).resolve().parent

#: The browser runtime shipped with the package (bundles carry a copy in ``runtime/``).
RUNTIME_JS_DIR = PACKAGE_DIR / "runtime_js"

#: Chromium flags for headless WebGPU without a GPU: SwiftShader's Vulkan adapter.
CHROMIUM_FLAGS = (
    "--headless=new",
    "--no-sandbox",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--enable-unsafe-webgpu",
    "--use-webgpu-adapter=swiftshader",
)

#: The same without WebGPU: ``navigator.gpu.requestAdapter()`` gives null in this Chromium
#: (without ``--enable-unsafe-webgpu`` headless Linux has no adapter; ``--disable-features=WebGPU``
#: says so explicitly), so ``backend: "auto"`` loads bundles on the wasm backend.
CHROMIUM_FLAGS_WITHOUT_WEBGPU = (
    *(flag for flag in CHROMIUM_FLAGS if flag not in ("--enable-unsafe-webgpu", "--use-webgpu-adapter=swiftshader")),
    "--disable-features=WebGPU",
)

#: Headers that make a page cross-origin isolated (``crossOriginIsolated``: SharedArrayBuffer,
#: so the wasm backend runs threads); every file served needs them (the page, its workers).
ISOLATION_HEADERS = (
    ("Cross-Origin-Opener-Policy", "same-origin"),
    ("Cross-Origin-Embedder-Policy", "require-corp"),
)

#: numpy dtype name -> JavaScript typed array class, for passing arrays to the page.
TYPED_ARRAY_OF_DTYPE = {
    "float32": "Float32Array",
    "float64": "Float64Array",
    "int8": "Int8Array",
    "int16": "Int16Array",
    "int32": "Int32Array",
    "int64": "BigInt64Array",
    "uint8": "Uint8Array",
    "uint16": "Uint16Array",
    "uint32": "Uint32Array",
    "bool": "Uint8Array",
    "float16": "Uint16Array",  # the IEEE half bits, as the runtime takes and gives float16
}

#: The page run_in_browser loads: it imports the runtime and says when it is ready.
RUNNER_PAGE = """\
<!doctype html>
<meta charset="utf-8">
<title>relaxweb runner</title>
<script type="module">
  import * as relaxweb from "/runtime/relaxweb.js";
  window.relaxweb = relaxweb;
  window.relaxwebReady = true;
</script>
"""

#: Runs in the page: load the bundle once, run it on each set of inputs in turn, and return
#: the outputs of every run (or the first error) as JSON.
RUN_IN_PAGE = """\
async ({ runs, timeoutMs, profile, loadOptions, batch = false }) => {
  const typedArrays = { Float32Array, Float64Array, Int8Array, Int16Array, Int32Array,
                        BigInt64Array, Uint8Array, Uint16Array, Uint32Array };
  const decode = (text) => Uint8Array.from(atob(text), (c) => c.charCodeAt(0));
  const encode = (bytes) => {
    let text = "";
    for (let i = 0; i < bytes.length; i += 0x8000) {
      text += String.fromCharCode(...bytes.subarray(i, i + 0x8000));
    }
    return btoa(text);
  };
  let model = null;
  const profiles = [];
  // a sequence is an array of tensors both ways
  const toTensor = ({ base64, shape, arrayClass }) => ({ data: new typedArrays[arrayClass](decode(base64).buffer), shape });
  const fromTensor = ({ data, shape }) => ({
    base64: encode(new Uint8Array(data.buffer, data.byteOffset, data.byteLength)), shape, arrayClass: data.constructor.name });
  const toTensors = (inputs) => {
    const tensors = {};
    for (const [name, value] of Object.entries(inputs)) {
      tensors[name] = value === null ? null : Array.isArray(value) ? value.map(toTensor) : toTensor(value);
    }
    return tensors;
  };
  const encodeOutputs = (outputs) => {
    const encoded = {};
    for (const [name, value] of Object.entries(outputs)) {
      encoded[name] = value === null ? null : Array.isArray(value) ? value.map(fromTensor) : fromTensor(value);
    }
    return encoded;
  };
  // batch: every run is an instance of one model.runBatch, timed without the load
  let batchReport = null;
  // batch "one by one": the instances run with model.run one after another, timed the same way
  const runBatch = async () => {
    const instances = runs.map(toTensors);
    const start = performance.now();
    const outputs = [];
    if (batch === "one by one") {
      for (const inputs of instances) outputs.push(await model.run(inputs));
    } else {
      outputs.push(...await model.runBatch(instances));
    }
    const ms = performance.now() - start;
    batchReport = batch === "one by one" ? { mode: "one by one", reason: "", instances: runs.length, ms }
      : { ...model.lastBatch, ms };
    return outputs.map(encodeOutputs);
  };
  const runOnce = async (inputs) => {
    const tensors = toTensors(inputs);
    // profile: the last run is profiled (Model.profile warms up with one run first)
    const profiled = profile ? await model.profile(tensors) : null;
    if (profiled) profiles.push(profiled.profile);
    const outputs = profiled ? profiled.outputs : await model.run(tensors);
    return encodeOutputs(outputs);
  };
  const work = async () => {
    model = await window.relaxweb.load("/bundle/", { ...loadOptions, profile });
    if (batch) return runBatch();
    const results = [];
    for (const inputs of runs) results.push(await runOnce(inputs));
    return results;
  };
  const timeout = new Promise((_, reject) => setTimeout(
    () => reject(new Error(`the runs did not finish within ${timeoutMs / 1000} s`)), timeoutMs));
  try {
    const outputs = await Promise.race([work(), timeout]);
    return { outputs, profiles, backend: model.backend, threads: model.threads ?? null,
             unitsRunByWorkers: model.unitsRunByWorkers ?? null, batch: batchReport };
  } catch (error) {
    return { error: { name: error?.name ?? "Error", message: error?.message ?? String(error) } };
  } finally {
    model?.dispose();
  }
}
"""


def web_demo_dir() -> Path:
    """The web demo's folder: ``relaxweb/web_demo`` when installed, else the repository's."""
    for candidate in (PACKAGE_DIR / "web_demo", PACKAGE_DIR.parent / "web_demo"):
        if (candidate / "index.html").is_file():
            return candidate
    raise RelaxwebError("the web demo files (web_demo/index.html) are missing from this installation")


def runtime_dir_for(bundle_dir: Path) -> Path:
    """The runtime to serve with a bundle: the bundle's own copy if it has one."""
    bundled = bundle_dir / "runtime"
    return bundled if (bundled / "relaxweb.js").is_file() else RUNTIME_JS_DIR


def check_bundle_dir(bundle_dir: str | Path) -> Path:
    """``bundle_dir`` as a Path, or a RelaxwebError when it is not a bundle."""
    path = Path(bundle_dir)
    if not (path / "manifest.json").is_file():
        raise RelaxwebError(f"{path} is not a relaxweb bundle (no manifest.json)")
    return path


IDLE_CONNECTION_S = 30


class _Server(http.server.ThreadingHTTPServer):
    """The server of :func:`start_server`: a client that resets or drops its connection (a
    closed tab, a cancelled fetch) is the client's business, not an error with a traceback."""

    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        if isinstance(sys.exc_info()[1], (ConnectionError, TimeoutError)):
            return
        super().handle_error(request, client_address)


class _RoutingHandler(http.server.SimpleHTTPRequestHandler):
    """Serves files from a few folders, chosen by URL prefix; no caching.

    Only files: no directory listings (a folder serves its index.html or nothing), nothing
    that resolves outside its folder (``..``, symbolic links out), no control characters in
    paths, and only requests whose Host header names the address the server listens on (a
    page elsewhere cannot reach it by rebinding a DNS name to 127.0.0.1)."""

    #: URL prefix -> folder, longest prefix first; set by :func:`start_server`.
    routes: list[tuple[str, Path]] = []
    #: seconds a connection may sit idle (a keep-alive, a client that sends nothing) before it is
    #: closed, so that idle clients cannot hold the server's threads forever
    timeout = IDLE_CONNECTION_S
    quiet = True
    #: send ISOLATION_HEADERS with every response (the page is cross-origin isolated); on in
    #: :func:`start_server` by default, off for other users of this handler unless they ask
    isolated = False

    extensions_map = {
        **http.server.SimpleHTTPRequestHandler.extensions_map,
        ".js": "text/javascript",
        ".mjs": "text/javascript",
        ".wasm": "application/wasm",
        ".json": "application/json",
        ".wgsl": "text/plain",
        ".wat": "text/plain",
        ".ts": "text/plain",
    }

    def send_head(self):  # type: ignore[override]
        port = self.server.server_address[1]
        if self.headers.get("Host", "") not in (f"127.0.0.1:{port}", f"localhost:{port}"):
            self.send_error(403, "Host not allowed")
            return None
        file = self._file_for(self.path)
        if file is None:
            self.send_error(404, "File not found")
            return None
        try:
            handle = open(file, "rb")  # noqa: SIM115 - the base class closes it after copying
        except OSError:
            self.send_error(404, "File not found")
            return None
        stat = os.fstat(handle.fileno())
        self.send_response(200)
        self.send_header("Content-type", self.guess_type(str(file)))
        self.send_header("Content-Length", str(stat.st_size))
        self.end_headers()
        return handle

    def _file_for(self, raw_path: str) -> Path | None:
        """The regular file a URL path names inside its route's folder, or None."""
        try:
            url_path = urllib.parse.unquote(urllib.parse.urlsplit(raw_path).path, errors="strict")
        except (UnicodeDecodeError, ValueError):
            return None
        if any(ord(c) < 32 or c == "\x7f" for c in url_path) or "\\" in url_path:
            return None
        for prefix, folder in self.routes:
            if url_path.startswith(prefix):
                root = folder.resolve()
                candidate = (root / url_path[len(prefix):].lstrip("/")).resolve()
                if not candidate.is_relative_to(root):
                    return None
                if candidate.is_dir():
                    candidate = candidate / "index.html"
                    if not candidate.resolve().is_relative_to(root):
                        return None
                return candidate if candidate.is_file() else None
        return None

    def end_headers(self) -> None:
        self.send_header("Cache-Control", "no-store")
        if self.isolated:
            for name, value in ISOLATION_HEADERS:
                self.send_header(name, value)
        super().end_headers()

    def log_message(self, format: str, *args: Any) -> None:
        if not self.quiet:
            super().log_message(format, *args)


def start_server(
    bundle_dir: str | Path,
    port: int = 0,
    page_dir: str | Path | None = None,
    quiet: bool = True,
    isolated: bool = True,
) -> http.server.ThreadingHTTPServer:
    """Serve ``page_dir`` (default: the web demo) at ``/``, the bundle at ``/bundle/`` and the
    runtime at ``/runtime/`` on 127.0.0.1, from a daemon thread; with ``isolated`` every
    response carries ``ISOLATION_HEADERS`` (the page is cross-origin isolated: the wasm backend
    runs threads).

    ``port=0`` picks a free port.  The returned server has a ``url`` attribute
    (``http://127.0.0.1:PORT/``); stop it with :func:`stop_server`.
    """
    bundle = check_bundle_dir(bundle_dir).resolve()
    page = Path(page_dir) if page_dir is not None else web_demo_dir()
    routes = [("/bundle/", bundle), ("/runtime/", runtime_dir_for(bundle)), ("/", page.resolve())]
    handler = type("BundleHandler", (_RoutingHandler,), {"routes": routes, "quiet": quiet, "isolated": isolated})
    server = _Server(("127.0.0.1", port), functools.partial(handler, directory=str(page)))
    server.url = f"http://127.0.0.1:{server.server_address[1]}/"  # type: ignore[attr-defined]
    threading.Thread(target=server.serve_forever, name="relaxweb-server", daemon=True).start()
    return server


def stop_server(server: http.server.ThreadingHTTPServer) -> None:
    """Stop a server from :func:`start_server` and free its port."""
    server.shutdown()
    server.server_close()


def generates_text(bundle_dir: Path) -> bool:
    """Whether the chat page (``web_demo/chat.html``) can talk with the bundle: a decoder with a
    KV cache in the signature generate takes, and a tokenizer (a malformed manifest: no)."""
    try:
        manifest = json.loads((bundle_dir / "manifest.json").read_text(encoding="utf-8"))
        if manifest_problem(manifest) is not None or "tokenizer" not in manifest:
            return False
        decoder_signature(manifest)
    except (OSError, ValueError, RelaxwebError):
        return False
    return True


def serve(bundle_dir: str | Path, port: int = 8000) -> None:
    """Serve the web demo with a bundle on 127.0.0.1 until Ctrl-C (``relaxweb serve DIR``); for
    a bundle that generates text, also print the chat page's address."""
    try:
        server = start_server(bundle_dir, port, quiet=False)
    except OSError as error:
        raise RelaxwebError(f"cannot listen on 127.0.0.1:{port}: {error.strerror}") from error
    print(f"Serving {bundle_dir} at {server.url} (Ctrl-C to stop)", flush=True)  # type: ignore[attr-defined]
    if generates_text(Path(bundle_dir)):
        print(f"Chat with it at {server.url}chat.html", flush=True)  # type: ignore[attr-defined]
    try:
        threading.Event().wait()
    except KeyboardInterrupt:
        print("stopped")
    finally:
        stop_server(server)


def find_chromium() -> str:
    """The path of the Chromium executable, or a RelaxwebError saying what to install."""
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable"):
        path = shutil.which(name)
        if path:
            return path
    raise RelaxwebError("Chromium is not installed: install it (Debian: apt-get install chromium)")


def launch_chromium(playwright: Any, webgpu: bool = True, *, own: bool = False) -> Any:
    """Launch headless Chromium from a Playwright instance: with WebGPU (``CHROMIUM_FLAGS``),
    or with ``webgpu=False`` without an adapter (``CHROMIUM_FLAGS_WITHOUT_WEBGPU``).

    While :func:`keep_chromium` is on in this thread (``playwright`` is then its instance),
    the Chromium it keeps, lent (:class:`_LentBrowser`: closing it closes only the contexts
    and pages opened through it); ``own``: a browser of its own all the same (a test that
    kills its GPU process)."""
    kept = _kept_here()
    if kept is not None and playwright is kept.playwright and not own:
        return _LentBrowser(kept.browser(webgpu))
    executable = find_chromium()
    flags = CHROMIUM_FLAGS if webgpu else CHROMIUM_FLAGS_WITHOUT_WEBGPU
    try:
        return playwright.chromium.launch(executable_path=executable, args=list(flags), headless=True)
    except Exception as error:
        raise RelaxwebError(f"could not start Chromium ({executable}): {error}") from error


def sync_playwright() -> Any:
    """Playwright's ``sync_playwright()``, or a RelaxwebError saying what to install.  While
    :func:`keep_chromium` is on in this thread, its running instance (one thread can run one:
    Playwright refuses a second), left running on exit."""
    kept = _kept_here()
    if kept is not None:
        return contextlib.nullcontext(kept.start())
    return _start_playwright()


def _start_playwright() -> Any:
    """A new ``sync_playwright()`` context manager (a RelaxwebError without Playwright)."""
    try:
        from playwright.sync_api import sync_playwright as start
    except ImportError as error:
        raise RelaxwebError("Playwright is not installed: pip install playwright") from error
    return start()


class _KeptChromium:
    """What :func:`keep_chromium` keeps: one Playwright instance and one Chromium per WebGPU
    setting, started at the first page the thread opens and relaunched if one has gone."""

    def __init__(self) -> None:
        self.thread = threading.get_ident()
        self.playwright: Any = None
        self.browsers: dict[bool, Any] = {}

    def start(self) -> Any:
        if self.playwright is None:
            self.playwright = _start_playwright().start()
        return self.playwright

    def browser(self, webgpu: bool) -> Any:
        """The kept Chromium of this WebGPU setting (launched now if it is not running)."""
        browser = self.browsers.get(webgpu)
        if browser is None or not browser.is_connected():
            browser = self.browsers[webgpu] = launch_chromium(self.start(), webgpu, own=True)
        return browser

    def close(self) -> None:
        for browser in self.browsers.values():
            with contextlib.suppress(Exception):  # one that has gone: nothing to close
                browser.close()
        self.browsers.clear()
        if self.playwright is not None:
            self.playwright.stop()
            self.playwright = None


class _LentBrowser:
    """A kept Chromium as one caller's browser, with the part of Playwright's ``Browser``
    that relaxweb, its tests and benchmarks use: each page opens in a context of its own (as
    ``Browser.new_page`` does), and closing closes the contexts opened through it, not the
    browser."""

    def __init__(self, browser: Any) -> None:
        self._browser = browser
        self._contexts: list[Any] = []
        self._closed = False

    @property
    def version(self) -> str:
        return self._browser.version

    def is_connected(self) -> bool:
        return not self._closed and self._browser.is_connected()

    def new_context(self, **options: Any) -> Any:
        context = self._browser.new_context(**options)
        self._contexts.append(context)
        return context

    def new_page(self, **options: Any) -> Any:
        return self.new_context(**options).new_page()

    def close(self) -> None:
        self._closed = True
        for context in self._contexts:
            with contextlib.suppress(Exception):  # closed already, or its browser gone
                context.close()
        self._contexts.clear()


_kept: _KeptChromium | None = None


def _kept_here() -> _KeptChromium | None:
    """The kept Chromium where this thread may use it (the thread that turned keeping on)."""
    kept = _kept
    return kept if kept is not None and kept.thread == threading.get_ident() else None


@contextlib.contextmanager
def keep_chromium() -> Iterator[None]:
    """While open, the pages this thread opens (:func:`open_runner_page`, and any
    ``launch_chromium(sync_playwright())``) share one Playwright instance and one headless
    Chromium per WebGPU setting instead of launching their own (about 1.2 s of CPU each), each
    page in a fresh browser context; closed on exit.  For a process that opens many pages one
    after another: the test suite (``tests/conftest.py``).  Other threads launch their own."""
    global _kept
    if _kept is not None:
        raise RuntimeError("keep_chromium is already on")
    _kept = _KeptChromium()
    try:
        yield
    finally:
        kept, _kept = _kept, None
        kept.close()


@contextlib.contextmanager
def open_runner_page(bundle_dir: str | Path, timeout_s: float = 60.0, *, webgpu: bool = True,
                     isolated: bool = True, own_browser: bool = False) -> Iterator[Any]:
    """A Playwright page in a fresh headless Chromium (without WebGPU when ``webgpu`` is
    false; a fresh context of the kept one under :func:`keep_chromium`, unless
    ``own_browser``), with the bundle served at ``/bundle/`` and the runtime imported as
    ``window.relaxweb``; cross-origin isolated unless ``isolated`` is false.  Closes the
    browser and server on exit.
    """
    bundle = check_bundle_dir(bundle_dir)
    with tempfile.TemporaryDirectory(prefix="relaxweb-runner-") as page_dir:
        (Path(page_dir) / "index.html").write_text(RUNNER_PAGE)
        server = start_server(bundle, page_dir=page_dir, isolated=isolated)
        try:
            with sync_playwright() as playwright:
                browser = launch_chromium(playwright, webgpu=webgpu, own=own_browser)
                try:
                    yield _open_runner(browser, server.url, timeout_s)  # type: ignore[attr-defined]
                finally:
                    browser.close()
        finally:
            stop_server(server)


def _open_runner(browser: Any, url: str, timeout_s: float) -> Any:
    """Open the runner page and wait until it has imported the runtime."""
    page_errors: list[str] = []
    page = browser.new_page()
    page.on("pageerror", lambda error: page_errors.append(str(error)))
    page.goto(url)
    try:
        page.wait_for_function("window.relaxwebReady === true", timeout=timeout_s * 1000)
    except Exception as error:
        details = "; ".join(page_errors) or str(error)
        raise RelaxwebError(f"the browser runtime did not load: {details}") from error
    return page


def run_in_browser(
    bundle_dir: str | Path,
    inputs: dict[str, np.ndarray],
    timeout_s: float = 120.0,
    backend: str = "auto",
) -> dict[str, np.ndarray]:
    """Run a bundle once in headless Chromium (WebGPU, or the wasm backend: ``backend`` is the
    runtime's load option) and return its outputs.

    Errors raised in the page become :class:`InputShapeError` (the inputs were rejected) or
    :class:`RelaxwebError`, with the page's message.  The browser and the server are always
    closed.
    """
    return run_many_in_browser(bundle_dir, [inputs], timeout_s, load_options={"backend": backend})[0]


def profile_in_browser(bundle_dir: str | Path, inputs: dict[str, np.ndarray], timeout_s: float = 120.0,
                       backend: str = "auto") -> Profile:
    """Load a bundle in headless Chromium with ``{profile: true, backend}`` and profile one run
    (``model.profile(inputs)`` of the browser runtime, after one warm-up run): the
    :class:`~relaxweb.runtime.profile.Profile` with the outputs, as the Python runtime gives it."""
    runs = browser_runs(bundle_dir, [inputs], timeout_s, profile=True, load_options={"backend": backend})
    (rows,) = runs.profiles
    profile = Profile(rows["method"], rows["dispatches"], [
        KernelRow(row["kernel"], row["calls"], row["totalMs"], row["percent"], row["flops"], row["bytes"])
        for row in rows["rows"]])
    profile.outputs = runs.outputs[0]
    return profile


def run_many_in_browser(
    bundle_dir: str | Path,
    runs: list[dict[str, np.ndarray]],
    timeout_s: float = 120.0,
    load_options: dict | None = None,
) -> list[dict[str, np.ndarray]]:
    """Load a bundle once in headless Chromium and run it on each set of inputs in turn
    (shapes may differ from run to run); return the outputs of each run.

    The first failing run stops them all, with the errors of :func:`run_in_browser`;
    ``timeout_s`` covers the load and all the runs.  ``load_options`` are JSON options of the
    browser runtime's ``load`` (``{"kernels": "gpu", "limits": {...}}``, ``{"backend": "wasm"}``).
    """
    return browser_runs(bundle_dir, runs, timeout_s, load_options=load_options).outputs


class BrowserBatch(NamedTuple):
    """What :func:`run_batch_in_browser` gives: each instance's outputs, ``ms`` the time of the
    ``runBatch`` call in the page (the load not included), and ``report``, the browser
    runtime's ``model.lastBatch`` (``mode`` "ragged" or "one by one", ``reason``, ``instances``,
    ``dispatches``, ``rounds``)."""

    outputs: list[dict[str, np.ndarray]]
    ms: float
    report: dict


def run_batch_in_browser(
    bundle_dir: str | Path,
    instances: list[dict[str, np.ndarray]],
    timeout_s: float = 120.0,
    load_options: dict | None = None,
    batch: bool = True,
) -> BrowserBatch:
    """Load a bundle in headless Chromium and run ``instances`` as one batch (the browser
    runtime's ``model.runBatch``: each instance its own inputs, of its own sizes); return each
    instance's outputs, the batch's time and how it ran (:class:`BrowserBatch`).

    An instance the runtime refuses raises :class:`InputShapeError` (inputs or sizes rejected)
    or :class:`RelaxwebError`, the message naming the instance (``instance K of the batch:``).
    ``load_options`` are JSON options of the runtime's ``load`` (``{"backend": "wasm"}`` runs
    the instances one by one).  ``batch=False`` runs them with ``model.run`` one after another,
    timed the same way (the report's mode is then "one by one")."""
    runs = browser_runs(bundle_dir, instances, timeout_s, load_options=load_options,
                        batch=True if batch else "one by one")
    report = dict(runs.batch or {})
    ms = float(report.pop("ms", 0.0))
    return BrowserBatch(runs.outputs, ms, report)


class BrowserRuns(NamedTuple):
    """What :func:`browser_runs` gives: each run's outputs, with ``profile`` each run's profile
    as the browser runtime gives it, and the loaded model's ``backend``, ``threads`` and the units
    its worker threads ran (both None on WebGPU)."""

    outputs: list[dict[str, np.ndarray]]
    profiles: list[dict]
    backend: str
    threads: int | None
    units_run_by_workers: int | None
    #: with ``batch=True``: ``model.lastBatch`` of the browser runtime (mode, reason, instances,
    #: dispatches, rounds, varValues) and ``ms``, the runBatch call's time without the load
    batch: dict | None = None


def browser_runs(bundle_dir: str | Path, runs: list[dict[str, np.ndarray]], timeout_s: float = 120.0, *,
                 profile: bool = False, load_options: dict | None = None, webgpu: bool = True,
                 isolated: bool = True, batch: bool | str = False) -> BrowserRuns:
    """:func:`run_many_in_browser` in a Chromium with or without WebGPU (``webgpu``), on a page
    that is cross-origin isolated or not (``isolated``), telling which backend ran; with
    ``batch`` the runs are the instances of one ``model.runBatch`` (:func:`run_batch_in_browser`)."""
    encoded_runs = [{name: None if value is None else [_encode_array(name, element) for element in value]
                     if isinstance(value, (list, tuple)) else _encode_array(name, value) for name, value in inputs.items()}
                    for inputs in runs]
    with open_runner_page(bundle_dir, timeout_s, webgpu=webgpu, isolated=isolated) as page:
        payload = {"runs": encoded_runs, "timeoutMs": int(timeout_s * 1000), "profile": profile,
                   "loadOptions": load_options or {}, "batch": batch}
        try:
            result = page.evaluate(RUN_IN_PAGE, payload)
        except Exception as error:  # the page crashed or closed: no message of ours to pass on
            raise RelaxwebError(f"the browser page failed: {error}") from error
    if "error" in result:
        error = result["error"]
        if error["name"] == "InputShapeError":
            raise InputShapeError(error["message"])
        raise RelaxwebError(f"the browser run failed: {error['name']}: {error['message']}")
    manifest = json.loads((Path(bundle_dir) / "manifest.json").read_text())
    return BrowserRuns([_decode_outputs(manifest, outputs) for outputs in result["outputs"]], result["profiles"],
                       result["backend"], result["threads"], result["unitsRunByWorkers"], result.get("batch"))


def _decode_outputs(manifest: dict, encoded: dict) -> dict[str, np.ndarray]:
    """The outputs of one run from the page as numpy arrays."""
    outputs = {name: None if output is None else [_decode_array(element) for element in output]
               if isinstance(output, list) else _decode_array(output) for name, output in encoded.items()}
    # A bool output comes back as a Uint8Array of 0/1 and a float16 one as a Uint16Array of
    # half bits: give them the manifest's dtype again.
    again = {"bool": lambda value: value != 0, "float16": lambda value: value.view(np.float16)}
    for spec in manifest["outputs"]:
        if spec["dtype"] in again and spec["name"] in outputs and outputs[spec["name"]] is not None:
            value, convert = outputs[spec["name"]], again[spec["dtype"]]
            outputs[spec["name"]] = [convert(e) for e in value] if isinstance(value, list) else convert(value)
    return outputs


def _encode_array(name: str, array: np.ndarray) -> dict:
    """An input array as JSON for the page: base64 of its little-endian bytes, shape, class."""
    array = np.asarray(array)
    array_class = TYPED_ARRAY_OF_DTYPE.get(array.dtype.name)
    if array_class is None:
        raise InputShapeError(f"input '{name}': dtype {array.dtype.name} cannot be passed to the browser")
    little_endian = np.ascontiguousarray(array, dtype=array.dtype.newbyteorder("<"))
    return {
        "base64": base64.b64encode(little_endian.tobytes()).decode("ascii"),
        "shape": [int(d) for d in array.shape],
        "arrayClass": array_class,
    }


def _decode_array(output: dict) -> np.ndarray:
    """An output from the page as a numpy array (dtype from the typed array it came from)."""
    dtype_of_class = {array_class: dtype for dtype, array_class in TYPED_ARRAY_OF_DTYPE.items()
                      if dtype not in ("bool", "float16")}
    dtype = np.dtype(dtype_of_class[output["arrayClass"]]).newbyteorder("<")
    data = np.frombuffer(base64.b64decode(output["base64"]), dtype=dtype)
    return data.astype(dtype.newbyteorder("="), copy=True).reshape(output["shape"])
