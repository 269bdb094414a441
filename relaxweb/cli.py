"""The ``relaxweb`` command line.

    relaxweb build MODEL.onnx -o DIR [--bound NAME=INT ...] [--target-limits NAME=INT|LIMITS.json ...] [--runtime copy|none] [--debug]
    relaxweb run DIR --inputs IN.npz [--out OUT.npz] [--browser] [--profile] [--backend auto|webgpu|wasm]
    relaxweb run DIR --inputs A.npz --inputs B.npz ... [--batch] [--out FOLDER] [--browser]
    relaxweb run MODEL.onnx --inputs IN.npz [--out OUT.npz] --reference
    relaxweb inspect MODEL.onnx|DIR
    relaxweb generate DIR --prompt TEXT [--max-tokens N --temperature T --top-k K --top-p P --repetition-penalty R --seed S]
                      [--backend auto|webgpu|wasm]
    relaxweb chat DIR [--system TEXT] [--message ROLE:TEXT ...] [the sampling options of generate] [--backend ...]
    relaxweb serve DIR [--port PORT]

Each command calls the Python API (``api.py``: ``relaxweb.build``, ``relaxweb.load`` ...), so
the two cannot drift.  User errors (a bad file, an unsupported op, a wrong input shape or
dtype, a bound exceeded) are RelaxwebErrors: one ``error: ...`` line on stderr, exit status 2.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from typing import NoReturn, TextIO
import zipfile
from pathlib import Path

import numpy as np

from . import __version__
from .api import (
    attention_listing, build, check_bundle_folder, format_attention, format_coverage, inspect, load, profile_in_browser,
    run_batch_in_browser, run_in_browser, run_reference,
)
from .browser import serve
from .bundle import RUNTIME_CHOICES
from .ir.launch import WEBGPU_DEFAULT_LIMITS
from .runtime import load_manifest
from .runtime.webgpu_device import webgpu_unavailable
from .errors import RelaxwebError, path_kind, shortened, shown
from .frontend.validation import MAX_DIM
from .frontend.onnx import default_opset, from_onnx, load_onnx, op_coverage, symbolic_vars
from .passes import DEFAULT_KV_PAGE_SIZE, DEFAULT_OPT_LEVEL, OPT_LEVELS
from .passes.context import SCALE_DTYPES, WEIGHT_FORMATS
from .runtime import BACKENDS
from .runtime.webgpu import KERNEL_VARIANTS

EXIT_USER_ERROR = 2
EXIT_BROKEN_PIPE = 141  # as a shell reports a program stopped by SIGPIPE


def _parse_bound(text: str) -> tuple[str, int]:
    """``NAME=INT`` as a pair; the value is checked (at least 1) by ``relaxweb.build``."""
    name, separator, value = text.partition("=")
    if not separator or not name:
        raise argparse.ArgumentTypeError(f"--bound expects NAME=INT, got {text!r}")
    try:
        bound = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--bound {name}: {value!r} is not an integer") from None
    if bound >= MAX_DIM:
        raise argparse.ArgumentTypeError(f"{name}={bound} is too large (dims must be below {MAX_DIM})")
    return name, bound


#: The largest --target-limits JSON file read (an adapter's limits are a few KB).
MAX_LIMITS_FILE_BYTES = 1 << 20


def target_limits(specs: list[str]) -> dict[str, int]:
    """The limits of ``--target-limits``: each ``NAME=INT``, or a JSON file holding an object
    of limits (a page can write ``adapter.limits``' fields; names the build does not check are
    skipped there).  Later ones win; the names and values are checked by ``relaxweb.build``."""
    limits: dict[str, int] = {}
    for spec in specs:
        name, separator, value = spec.partition("=")
        if separator:
            try:
                limits[name] = int(value)
            except ValueError:
                raise RelaxwebError(f"--target-limits {shortened(shown(name))}: {shortened(shown(value))!r} is not an integer") from None
            continue
        path = Path(spec)
        try:
            if path.stat().st_size > MAX_LIMITS_FILE_BYTES:
                raise RelaxwebError(f"--target-limits {shortened(spec)}: larger than {MAX_LIMITS_FILE_BYTES} bytes")
            given = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as error:
            raise RelaxwebError(f"--target-limits {shortened(spec)}: neither NAME=INT nor a readable JSON file "
                                f"({getattr(error, 'strerror', None) or error})") from None
        if not isinstance(given, dict):
            raise RelaxwebError(f"--target-limits {shortened(spec)}: the file must hold a JSON object of limits")
        limits.update({name: value for name, value in given.items() if name in WEBGPU_DEFAULT_LIMITS})
    return limits


class BuildProgress:
    """A build's progress on ``stream`` (stderr): a line per step and, on a terminal, a bar for a
    long step (the weights being written), redrawn in place and cleared when the step ends;
    off a terminal (a log file, a pipe) the lines only."""

    WIDTH = 30  # characters of the bar

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream
        self.terminal = stream.isatty()
        self.drawn = ""  # the bar on the screen now ("" when none)

    def line(self, message: str) -> None:
        self.clear()
        print(f"  {message}", file=self.stream, flush=True)

    def advance(self, step: str, done: int, total: int) -> None:
        """``done`` of ``total`` bytes of ``step``: the bar, redrawn when its text changes."""
        if not self.terminal or total <= 0:
            return
        if done >= total:
            self.clear()
            return
        filled = self.WIDTH * done // total
        bar = (f"  {step} [{'#' * filled}{'.' * (self.WIDTH - filled)}] {100 * done // total:3d}% "
               f"({done / 1e6:.0f} of {total / 1e6:.0f} MB)")
        if bar != self.drawn:
            self.stream.write(f"\r\033[K{bar}")
            self.stream.flush()
            self.drawn = bar

    def clear(self) -> None:
        """Take the bar off the screen (nothing when none is drawn)."""
        if self.drawn:
            self.stream.write("\r\033[K")
            self.stream.flush()
            self.drawn = ""


def command_build(args: argparse.Namespace) -> int:
    started = time.perf_counter()
    screen = BuildProgress(sys.stderr)
    limits = target_limits(args.target_limits or [])
    try:
        bundle = build(args.model, args.output, bounds=dict(args.bound or []), opt_level=args.opt_level,
                       dump_ir=args.dump_ir, progress=screen.line, advance=screen.advance, weights=args.weights,
                       group_size=args.group_size, scale_dtype=args.scale_dtype, tokenizer=args.tokenizer,
                       debug=args.debug, runtime=args.runtime, target_limits=limits, kv_pages=args.kv_pages,
                       kv_page_size=args.kv_page_size)
    finally:
        screen.clear()  # an error's line starts on a line of its own
    for spec in bundle.inputs:
        print(f"  input  {spec}", file=sys.stderr)
    for spec in bundle.outputs:
        print(f"  output {spec}", file=sys.stderr)
    unbounded = [name for name, bound in bundle.symbolic_vars.items() if bound is None]
    if unbounded:
        print(f"  note: no --bound for {', '.join(unbounded)}: storages grow at run time as needed", file=sys.stderr)
    for warning in bundle.warnings:
        print(f"warning: {warning}", file=sys.stderr)
    print(f"built {args.model} -> {args.output}/ in {time.perf_counter() - started:.1f} s", file=sys.stderr)
    return 0


def load_npz(path: str) -> dict[str, np.ndarray]:
    kind = path_kind(path)
    if kind == "other":  # a FIFO or /dev/zero would be read for ever
        raise RelaxwebError(f"{path}: not a regular file (a device, FIFO or socket), expected an .npz file")
    if kind == "folder":
        raise RelaxwebError(f"{path}: is a directory, expected an .npz file")
    if kind == "file" and not zipfile.is_zipfile(path):
        raise RelaxwebError(f"{path}: not an .npz file (write one with numpy.savez(path, name=array, ...))")
    try:
        _check_npz_sizes(path)
        with np.load(path, allow_pickle=False) as data:
            return {name: data[name] for name in data.files}
    except FileNotFoundError:
        raise RelaxwebError(f"{path}: no such file") from None
    except (zipfile.BadZipFile, ValueError, OSError, EOFError) as error:
        raise RelaxwebError(f"{path}: not a readable .npz file ({error or type(error).__name__})") from None
    except MemoryError:
        raise RelaxwebError(f"{path}: its arrays do not fit in this machine's memory") from None


def _check_npz_sizes(path: str) -> None:
    """Refuse an array whose header claims more bytes than its file holds (a shape of 2^40
    rows in a 200-byte file), before numpy allocates what the header says."""
    readers = {(1, 0): np.lib.format.read_array_header_1_0, (2, 0): np.lib.format.read_array_header_2_0}
    with zipfile.ZipFile(path) as archive:
        for info in archive.infolist():
            if not info.filename.endswith(".npy"):
                continue
            with archive.open(info) as member:
                version = np.lib.format.read_magic(member)
                if version not in readers:
                    continue  # numpy says what is wrong with it
                shape, _, dtype = readers[version](member)
                claimed = int(np.prod(shape, dtype=object)) * dtype.itemsize
                if claimed > info.file_size:
                    raise RelaxwebError(f"{path}: array '{info.filename[:-4]}' claims shape {tuple(shape)} ({claimed} "
                                        f"bytes) but its file holds {info.file_size} bytes")


def _run_target(args: argparse.Namespace) -> Path:
    """The path ``relaxweb run`` was given, checked against ``--reference``."""
    target = Path(args.target)
    kind = path_kind(target)
    if args.reference:
        if args.browser or args.profile:
            raise RelaxwebError(f"--reference and {'--browser' if args.browser else '--profile'} exclude each other: "
                                "--reference runs an .onnx model in the reference interpreter (numpy, no GPU)")
        if args.kernels != "auto":
            raise RelaxwebError("--kernels picks a bundle's shaders; --reference runs no shader")
        if args.backend != "auto":
            raise RelaxwebError("--backend picks what runs a bundle's kernels; --reference runs the model in numpy")
        if kind == "folder":
            raise RelaxwebError(f"{target}: is a folder; --reference runs an .onnx model in the reference "
                                "interpreter (a bundle folder runs without --reference)")
    elif kind == "file":
        raise RelaxwebError(f"{target}: is a file, not a bundle folder; build it with 'relaxweb build {target} "
                            "-o DIR' and run DIR, or add --reference to run the model in the reference "
                            "interpreter (numpy, no GPU)")
    else:
        check_bundle_folder(args.target)
    if args.backend == "wasm" and args.kernels != "auto":
        raise RelaxwebError("--kernels picks WebGPU shaders; --backend wasm runs the bundle's kernels.wasm")
    if args.browser and args.kernels != "auto":
        raise RelaxwebError("--kernels applies to the Python runtime; in the browser the runtime picks the shaders "
                            "from the adapter")
    return target


def _load_session(target: Path, backend: str, **options):
    """``relaxweb.load`` of the bundle, with one line on stderr saying why ``--backend auto``
    did not take WebGPU (``session.backend_reason``); ``--backend webgpu`` of a bundle WebGPU
    cannot run (its manifest's ``webgpu.unavailable``) is one error saying what to run it with."""
    if backend == "webgpu":
        unavailable = webgpu_unavailable(load_manifest(target))
        if unavailable:
            raise RelaxwebError(f"{unavailable}; run it with --backend wasm (or the default, --backend auto)")
    session = load(target, backend=backend, **options)
    if session.backend_reason:
        print(f"note: running on kernels.wasm: {session.backend_reason}", file=sys.stderr)
    return session


_BACKEND_NAMES = {"webgpu": "wgpu", "wasm": "kernels.wasm on wasmtime"}  # what "ran in ..." says
_BROWSER_BACKENDS = {"auto": "WebGPU, else kernels.wasm", "webgpu": "WebGPU", "wasm": "kernels.wasm"}


def command_run(args: argparse.Namespace) -> int:
    target = _run_target(args)
    if len(args.inputs) > 1 or args.batch:
        return _run_instances(args, target)
    out = _out_file(args.out, args.inputs) if args.out is not None else None  # before the run
    inputs = load_npz(args.inputs[0])
    started = time.perf_counter()
    if args.reference:
        outputs = run_reference(target, inputs)
        where = "the reference interpreter (numpy)"
        including = "including import"
    elif args.browser and args.profile:
        profile = profile_in_browser(target, inputs, backend=args.backend)
        outputs = profile.outputs
        where = f"headless Chromium ({_BROWSER_BACKENDS[args.backend]}), profiled"
        including = "including load"
    elif args.browser:
        outputs = run_in_browser(target, inputs, backend=args.backend)
        where = f"headless Chromium ({_BROWSER_BACKENDS[args.backend]})"
        including = "including load"
    elif args.profile:
        session = _load_session(target, args.backend, profiling=True, kernels=args.kernels)
        profile = session.profile(inputs)
        outputs = profile.outputs
        where = f"Python runtime ({_BACKEND_NAMES[session.backend]}), profiled"
        including = "including load"
    else:
        session = _load_session(target, args.backend, kernels=args.kernels)
        outputs = session.run(inputs)
        where = f"Python runtime ({_BACKEND_NAMES[session.backend]})"
        including = "including load"
    elapsed = time.perf_counter() - started
    for name, array in outputs.items():
        preview = np.array2string(array.reshape(-1)[:6], precision=5, separator=", ")
        print(f"{name}: {array.dtype}{list(array.shape)} {preview}{' ...' if array.size > 6 else ''}")
    if args.profile:
        print(profile.table())
    print(f"ran in {where} in {elapsed:.2f} s ({including})", file=sys.stderr)
    if out is not None:
        _write_npz(out, outputs)
        print(f"wrote {out}", file=sys.stderr)
    return 0


def _out_file(given: str, inputs: list[str]) -> Path:
    """The file ``--out`` names, as it will be written (``.npz`` added where missing, as numpy
    does); refused before the run when it cannot be: no name, an inputs file, no such folder."""
    if not given.strip():
        raise RelaxwebError("--out is empty: give the .npz file to write the outputs to")
    out = Path(given if given.endswith(".npz") else f"{given}.npz")
    try:
        if any(out.exists() and out.samefile(path) for path in inputs):
            raise RelaxwebError(f"--out {out} is an --inputs file: writing the outputs would replace the inputs; "
                                "name another file")
        if not out.parent.is_dir():
            raise RelaxwebError(f"--out {out}: the folder {out.parent} does not exist")
        if path_kind(out) == "other":  # writing into a FIFO waits for a reader for ever
            raise RelaxwebError(f"--out {out}: not a regular file (a device, FIFO or socket); name an .npz file")
    except OSError as error:
        raise RelaxwebError(f"--out {shortened(given)}: {error.strerror or error}") from None
    return out


def _write_npz(path: Path, arrays: dict) -> None:
    try:
        np.savez(path, **arrays)
    except OSError as error:
        raise RelaxwebError(f"cannot write {shortened(str(path))}: {error.strerror or error}") from None


def _run_instances(args: argparse.Namespace, target: Path) -> int:
    """``relaxweb run DIR --inputs A.npz --inputs B.npz ... [--batch]``: each file one instance,
    run one after another (or as one batch), one output file per instance, and the time of
    the runs alone (without load) printed."""
    if args.profile or args.reference:
        raise RelaxwebError(f"{'--profile' if args.profile else '--reference'} runs one input file; "
                            f"got {len(args.inputs)}{' and --batch' if args.batch else ''}")
    instances = [load_npz(path) for path in args.inputs]
    out_dir = Path(args.out) if args.out else None
    names = [f"{index}.{Path(path).stem}.npz" for index, path in enumerate(args.inputs)]
    if args.browser:
        started = time.perf_counter()
        result = run_batch_in_browser(target, instances, backend=args.backend, batch=args.batch)
        outputs, run_s = result.outputs, result.ms / 1000
        where = f"headless Chromium ({_BROWSER_BACKENDS[args.backend]})"
        load_s = time.perf_counter() - started - run_s
        how = result.report["mode"] + (f" ({result.report['reason']})" if result.report.get("reason") else "")
    else:
        started = time.perf_counter()
        session = _load_session(target, args.backend, kernels=args.kernels)
        load_s = time.perf_counter() - started
        started = time.perf_counter()
        if args.batch:
            outputs = session.run_batch(instances)
            how = session.last_batch.mode + (f" ({session.last_batch.reason})" if session.last_batch.reason else "")
        else:
            outputs = []
            for index, (path, inputs) in enumerate(zip(args.inputs, instances)):
                try:
                    outputs.append(session.run(inputs))
                except RelaxwebError as error:
                    raise type(error)(f"instance {index} ({path}): {error}") from None
            how = "one by one"
        run_s = time.perf_counter() - started
        where = f"Python runtime ({_BACKEND_NAMES[session.backend]})"
    for name, instance_outputs in zip(names, outputs):
        print(f"{name.removesuffix('.npz')}:")
        for output_name, array in instance_outputs.items():
            preview = np.array2string(array.reshape(-1)[:6], precision=5, separator=", ")
            print(f"  {output_name}: {array.dtype}{list(array.shape)} {preview}{' ...' if array.size > 6 else ''}")
        if out_dir is not None:
            try:
                out_dir.mkdir(parents=True, exist_ok=True)
            except OSError as error:
                raise RelaxwebError(f"cannot make the --out folder {shortened(str(out_dir))}: {error.strerror or error}") from None
            _write_npz(out_dir / name, instance_outputs)
    mode = "as one batch" if args.batch else "one after another"
    print(f"ran {len(instances)} instances {mode} ({how}) in {where} in {run_s * 1000:.1f} ms "
          f"(without load, but a first run: kernels compile on first use; load {load_s:.2f} s)", file=sys.stderr)
    if out_dir is not None:
        print(f"wrote {len(instances)} files to {out_dir}/", file=sys.stderr)
    return 0


def command_inspect(args: argparse.Namespace) -> int:
    path = Path(args.target)
    if path_kind(path) == "folder":
        print(inspect(path))
        return 0
    # What relaxweb.inspect(path) gives, printed as it goes: the coverage before the error of
    # a model with unsupported ops.
    model = load_onnx(path)
    print(format_coverage(path.name, default_opset(model), op_coverage(model)), flush=True)
    module = from_onnx(model, path.name)  # unsupported ops: the coverage is out, then the error
    print()
    print(module, end="")
    names = symbolic_vars(module.main)
    print(f"symbolic vars: {', '.join(names) if names else '(none)'}")
    for line in format_attention(attention_listing(module, model)):
        print(line)
    return 0


def _sampling(args: argparse.Namespace) -> dict:
    """The generate options of ``generate`` and ``chat`` (None: the bundle's default)."""
    return {"max_new_tokens": args.max_tokens, "temperature": args.temperature, "top_k": args.top_k,
            "top_p": args.top_p, "repetition_penalty": args.repetition_penalty, "seed": args.seed}


class _TextPrinter:
    """An ``on_token`` that prints the text to stdout as it grows."""

    def __init__(self) -> None:
        self.printed = 0

    def __call__(self, token: int, text: str) -> None:
        sys.stdout.write(text[self.printed:])
        sys.stdout.flush()
        self.printed = len(text)


def _report(result) -> None:
    print(f"{len(result.tokens)} tokens, stopped by {result.stopped}: prefill {result.prefill_ms:.0f} ms, "
          f"{result.tokens_per_second:.1f} tokens/s", file=sys.stderr)


def _generating_session(args: argparse.Namespace):
    """The bundle of ``generate`` or ``chat`` loaded on ``--backend`` with ``--kernels``."""
    if args.backend == "wasm" and args.kernels != "auto":
        raise RelaxwebError("--kernels picks WebGPU shaders; --backend wasm runs the bundle's kernels.wasm")
    return _load_session(check_bundle_folder(args.bundle), args.backend, kernels=args.kernels)


def command_generate(args: argparse.Namespace) -> int:
    session = _generating_session(args)
    prompts = [_utf8_text(prompt, "--prompt") if isinstance(prompt, str) else prompt for prompt in args.prompt]
    if len(prompts) == 1:
        printer = _TextPrinter()
        result = session.generate(prompts[0], on_token=printer, **_sampling(args))
        print(result.text[printer.printed:], flush=True)
        _report(result)
        return 0
    options = _sampling(args)
    seed = options.pop("seed")
    started = time.perf_counter()
    results = session.generate_many(prompts, seeds=[seed + index for index in range(len(prompts))], **options)
    elapsed = time.perf_counter() - started
    for index, result in enumerate(results, 1):
        print(f"--- prompt {index} ---", flush=True)
        print(result.text, flush=True)
        print(f"prompt {index}: ", end="", file=sys.stderr)
        _report(result)
    together = ("together (paged KV cache)" if session.manifest.get("kv_pool")
                else "one after another (build with --kv-pages to run them together)")
    print(f"{len(prompts)} prompts {together}: {sum(len(r.tokens) for r in results)} tokens in {elapsed:.2f} s, "
          f"{sum(len(r.tokens) for r in results) / elapsed:.1f} tokens/s", file=sys.stderr)
    return 0


def _utf8_text(text: str, what: str) -> str:
    """``text`` when it is UTF-8 (a command line or stdin with other bytes gives Python
    surrogate escapes: refused here, naming the first byte, rather than deep in the tokenizer)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as error:
        byte = text[error.start].encode("utf-8", "surrogateescape")
        raise RelaxwebError(f"{what} is not UTF-8 text: byte 0x{byte.hex()} at character {error.start}") from None
    return text


def _parse_message(text: str) -> dict[str, str]:
    """``ROLE:TEXT`` as a chat message."""
    role, separator, content = text.partition(":")
    if not separator or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_-]{0,31}", role):
        raise argparse.ArgumentTypeError(f"--message expects ROLE:TEXT (e.g. user:Hello), got {text[:60]!r}")
    return {"role": role, "content": content}


def command_chat(args: argparse.Namespace) -> int:
    """One reply to the --message conversation; without --message, a conversation read from
    stdin, one user message a line, each reply printed after it."""
    session = _generating_session(args)
    messages = ([{"role": "system", "content": args.system}] if args.system is not None else []) + (args.message or [])
    for message in messages:
        _utf8_text(message["content"], f"the {message['role']} message")
    if getattr(session.tokenizer, "chat_template", None) is None:
        session.apply_chat_template([{"role": "user", "content": ""}])  # says there is no template, before reading
    if args.message:
        _reply(session, messages, args)
        return 0
    interactive = sys.stdin.isatty()
    while True:
        if interactive:
            print("> ", end="", file=sys.stderr, flush=True)
        line = sys.stdin.buffer.readline().decode("utf-8", "surrogateescape")
        if not line:
            return 0
        _utf8_text(line, "the line read")
        if not line.strip():
            continue
        messages.append({"role": "user", "content": line.rstrip("\n")})
        messages.append({"role": "assistant", "content": _reply(session, messages, args).text})


def _reply(session, messages: list[dict], args: argparse.Namespace):
    printer = _TextPrinter()
    result = session.chat(messages, on_token=printer, **_sampling(args))
    print(result.text[printer.printed:], flush=True)
    _report(result)
    return result


def command_serve(args: argparse.Namespace) -> int:
    serve(check_bundle_folder(args.bundle), args.port)
    return 0


def make_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="relaxweb",
        description="Compile ONNX models into static WebGPU bundles that run at any batch size "
        "or sequence length without recompiling.",
    )
    parser.add_argument("--version", action="version", version=f"relaxweb {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND", parser_class=_Parser)

    build = commands.add_parser("build", help="compile an ONNX model into a bundle folder",
                                description="Compile MODEL.onnx into a bundle folder (manifest.json, host.wasm, "
                                "WGSL kernels, weight shards, the JS runtime).")
    build.add_argument("model", help="the .onnx file")
    build.add_argument("-o", "--output", required=True, help="the bundle folder to write (created if missing)")
    build.add_argument("--bound", action="append", type=_parse_bound, metavar="NAME=INT",
                       help="upper bound of a symbolic dimension (e.g. batch=64); storages are then "
                       "allocated once at load time, and larger inputs are rejected. Repeatable.")
    build.add_argument("--target-limits", action="append", metavar="NAME=INT|LIMITS.json",
                       help="the WebGPU limits of the devices the bundle is for, as NAME=INT (repeatable) or a JSON "
                       "file of an adapter's limits; the build warns (a 'warning:' line; the bundle is still "
                       "written) where a storage at the bounds or a kernel needs more, naming the storage, what it "
                       "holds, its size and the bounds to lower. Checked: " + ", ".join(WEBGPU_DEFAULT_LIMITS)
                       + "; by default WebGPU's default limits (maxStorageBufferBindingSize 134217728, "
                       "maxBufferSize 268435456, ...)")
    build.add_argument("--dump-ir", metavar="DIR", help="write the module as text after each pass into DIR")
    build.add_argument("--opt-level", type=int, choices=OPT_LEVELS, default=DEFAULT_OPT_LEVEL,
                       help="1 (default): fuse kernels and schedule each by its pattern (tiled matmuls, "
                       "workgroup reductions); 0: one kernel per op, one invocation per output element "
                       "(for comparison)")
    build.add_argument("--weights", choices=WEIGHT_FORMATS, default="float32",
                       help="how matmul, gather and convolution weights are stored: float32 (default, as the "
                       "model stores them), float16, or int8 / int4 quantized in groups; the kernels that read "
                       "them decode the packed words")
    build.add_argument("--group-size", type=int, default=32, metavar="N",
                       help="int8 / int4: values per scale, along the reduction (matmul, convolution) or the "
                       "row (embedding) (default 32)")
    build.add_argument("--scale-dtype", choices=SCALE_DTYPES, default="float16",
                       help="int8 / int4: the dtype of the scales (default float16)")
    build.add_argument("--kv-pages", type=int, metavar="N",
                       help="a decoder's KV caches as pools of N pages per layer, shared by every sequence a run "
                       "advances: 'relaxweb generate' then serves several prompts at once (continuous batching). "
                       "Size it for the sequences to serve at once: each needs ceil(its length / page size) pages, "
                       "at most ceil(capacity / page size), the capacity being the bound of the past length plus "
                       "one step. Needs a position_ids input. Default: no paging (one cache, one sequence at a time)")
    build.add_argument("--kv-page-size", type=int, default=DEFAULT_KV_PAGE_SIZE, metavar="P",
                       help=f"with --kv-pages: positions per page (default {DEFAULT_KV_PAGE_SIZE}); smaller pages waste "
                       "less memory at a sequence's end")
    build.add_argument("--tokenizer", metavar="PATH",
                       help="the tokenizer for the bundle (for 'relaxweb generate' and 'chat'): a Hugging Face "
                       "tokenizer folder as save_pretrained writes it (tokenizer.json, and tokenizer_config.json, "
                       "chat_template.jinja, generation_config.json where there), a tokenizer.json, or a JSON byte "
                       "tokenizer, e.g. {\"kind\": \"byte\", \"vocab_size\": 258, \"eos_token_id\": 257}; by default "
                       "the model's metadata_props[\"relaxweb.tokenizer\"] when it has one")
    build.add_argument("--runtime", choices=RUNTIME_CHOICES, default="copy",
                       help="; ".join(f"{name}: {what}" for name, what in RUNTIME_CHOICES.items())
                       + " (the bundle's runtime/ folder)")
    build.add_argument("--debug", action="store_true",
                       help="also write host.wat and kernels.wat, the text of the bundle's two WebAssembly modules, "
                       "for reading (no runtime loads them; left out by default: a page does not need them)")
    build.set_defaults(handler=command_build)

    run = commands.add_parser("run", help="run a bundle (or a model, with --reference) on inputs from an .npz file",
                              description="Run a bundle with the Python runtime (wgpu, or its kernels.wasm: --backend), or in headless Chromium "
                              "with --browser; or run an .onnx model in the reference interpreter (numpy, no "
                              "GPU) with --reference. Inputs and outputs are keyed by the ONNX names.")
    run.add_argument("target", metavar="DIR|MODEL.onnx", help="the bundle folder (or the .onnx file with --reference)")
    run.add_argument("--inputs", required=True, action="append", metavar="IN.npz",
                     help=".npz file with one array per model input. Repeat it to run several instances (each with "
                          "its own sizes) one after another in one process, or as one batch with --batch")
    run.add_argument("--batch", action="store_true",
                     help="run the --inputs files as one batch: each kernel dispatched once for every instance, over "
                          "each instance's own sizes, packed without padding (instances whose If branches differ "
                          "share all but the branches); prints the time of the runs without load")
    run.add_argument("--out", help=".npz file to write the outputs to; with several --inputs (or --batch), a folder "
                          "that gets one file per instance, K.STEM.npz (K its position, STEM its inputs file's name)")
    run.add_argument("--browser", action="store_true", help="run in headless Chromium on WebGPU instead")
    run.add_argument("--profile", action="store_true",
                     help="time every kernel (timestamp queries where the adapter has them, else one submit per "
                          "dispatch) and print a table of the slowest: calls, ms, share, GFLOP/s, GB/s")
    run.add_argument("--kernels", choices=KERNEL_VARIANTS, default="auto",
                     help="for kernels that have a second shader (matmuls and convolutions: without workgroup memory for CPU "
                          "adapters, in f16 for adapters with shader-f16), which to compile: auto (the CPU one on a CPU "
                          "adapter such as lavapipe, else the f16 one where the adapter has shader-f16; the default), gpu, "
                          "cpu or f16 (gpu, with a warning, where shader-f16 is missing)")
    run.add_argument("--backend", choices=BACKENDS, default="auto",
                     help="what runs the bundle's kernels in the Python runtime: webgpu (the WGSL shaders on wgpu), "
                          "wasm (the bundle's kernels.wasm, WebAssembly SIMD on one CPU thread with wasmtime: no GPU "
                          "needed), or auto (the default: webgpu when this machine's adapter meets the bundle's "
                          "required limits and features, else wasm); the last line says which ran. With --browser: "
                          "the browser runtime's backend option (auto: WebGPU where Chromium has an adapter that fits, "
                          "else kernels.wasm, on worker threads)")
    run.add_argument("--reference", action="store_true",
                     help="run an .onnx model (not a bundle) in the reference interpreter: numpy, no GPU")
    run.set_defaults(handler=command_run)

    inspect = commands.add_parser("inspect", help="print a model's op coverage and IR, or a bundle's manifest",
                                  description="For an .onnx file, print its op coverage (each op type with its "
                                  "node count, supported or not), the imported IR and its symbolic variables; "
                                  "for a bundle folder, print its inputs, symbolic variables, storages and kernels.")
    inspect.add_argument("target", help="an .onnx file or a bundle folder")
    inspect.set_defaults(handler=command_inspect)

    generate = commands.add_parser(
        "generate", help="generate text with a decoder bundle, streamed to stdout",
        description="Generate text after a prompt with a decoder bundle (inputs input_ids, past_key_values.*, "
        "optionally attention_mask and position_ids; outputs logits and present.*; a tokenizer in the bundle: "
        "'relaxweb build' copies the model's, or give one with --tokenizer) on the Python runtime (wgpu). The "
        "prompt runs once, then one run per new token with the cache kept on the GPU; the next token is picked "
        "on the GPU. Text goes to stdout as it comes, tokens/s to stderr at the end. Several --prompt: all "
        "are generated, together in each run on a bundle built with --kv-pages.",
        epilog="example: relaxweb generate dist/ --prompt 'The if statement' --max-tokens 100 --temperature 0.8 --top-k 20")
    generate.add_argument("bundle", metavar="DIR", help="the bundle folder")
    generate.add_argument("--prompt", required=True, action="append",
                          help="the text to continue; repeat it for several prompts, generated together on a bundle "
                          "built with --kv-pages (continuous batching), else one after another; each prompt's text "
                          "is printed after a '--- prompt N ---' line, prompt N drawing from seed + N - 1")
    _add_sampling_options(generate)
    generate.set_defaults(handler=command_generate)

    chat = commands.add_parser(
        "chat", help="chat with a decoder bundle that has a chat template",
        description="Chat with a decoder bundle whose tokenizer has a chat template (build it with --tokenizer FOLDER, "
        "a Hugging Face tokenizer folder). With --message, print the reply to that conversation and exit (for "
        "scripts); without, read one user message a line from stdin and print each reply after it, until the end "
        "of the input. Each reply stops at an end-of-turn token (every EOS id of the model's configs).",
        epilog="example: relaxweb chat dist/ --message 'user:What is WebGPU?' --max-tokens 200")
    chat.add_argument("bundle", metavar="DIR", help="the bundle folder")
    chat.add_argument("--system", metavar="TEXT", help="a system message to start the conversation with")
    chat.add_argument("--message", action="append", type=_parse_message, metavar="ROLE:TEXT",
                      help="a message of the conversation (e.g. user:Hello); repeat it for several, in order")
    _add_sampling_options(chat)
    chat.set_defaults(handler=command_chat)

    serve = commands.add_parser("serve", help="serve the web demo with a bundle on 127.0.0.1",
                                description="Serve web_demo/ with the bundle at /bundle/ on 127.0.0.1: the demo at /, "
                                "the chat page at /chat.html (printed for a bundle that generates text).")
    serve.add_argument("bundle", help="the bundle folder")
    serve.add_argument("--port", type=_port, default=8000, help="port (default 8000; 0 picks a free one)")
    serve.set_defaults(handler=command_serve)
    return parser


def _add_sampling_options(command: argparse.ArgumentParser) -> None:
    """The options of ``generate`` and ``chat``: how many tokens, how each is picked, the shaders."""
    command.add_argument("--max-tokens", type=int, default=64, metavar="N",
                         help="new tokens at most (default 64); it also stops at an end-of-text token of the tokenizer")
    command.add_argument("--temperature", type=float, metavar="T",
                         help="0: greedy, the most likely token each time; above 0: sample from softmax(logits / T), "
                         "higher is more random (default: the bundle's generation_config.json, else 0)")
    command.add_argument("--top-k", type=int, metavar="K",
                         help="with a temperature: sample among the K most likely tokens only (1 .. 256; 0: all; "
                         "default: the bundle's generation_config.json, else 0)")
    command.add_argument("--top-p", type=float, metavar="P",
                         help="with a temperature: sample among the most likely tokens that make up P of the probability "
                         "(above 0, at most 1; 1: all; default: the bundle's generation_config.json, else 1)")
    command.add_argument("--repetition-penalty", type=float, metavar="R",
                         help="divide the logits of tokens already in the text by R (above 1: repeat less; 1: none; "
                         "default: the bundle's generation_config.json, else 1)")
    command.add_argument("--seed", type=int, default=0, metavar="S",
                         help="seed of the random numbers (default 0): the same seed gives the same text")
    command.add_argument("--kernels", choices=KERNEL_VARIANTS, default="auto",
                         help="which shaders of kernels with a CPU variant to compile (as for 'run')")
    command.add_argument("--backend", choices=BACKENDS, default="auto",
                         help="what runs the model: webgpu (each token picked on the GPU), wasm (the bundle's "
                         "kernels.wasm on the CPU, each token picked by the same algorithm there), or auto (the "
                         "default: webgpu when this machine's adapter fits the bundle, else wasm), as for 'run'")


class _Parser(argparse.ArgumentParser):
    """argparse with its errors as one ``error:`` line (and exit 2) like every other error."""

    def error(self, message: str) -> NoReturn:
        print(f"error: {shown(message)} (see '{self.prog} --help')", file=sys.stderr)
        sys.exit(EXIT_USER_ERROR)


def _port(text: str) -> int:
    try:
        port = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"{port} is not a port number (0 .. 65535)")
    return port


def main(argv: list[str] | None = None) -> int:
    args = make_parser().parse_args(argv)
    try:
        return args.handler(args)
    except RelaxwebError as error:
        print(f"error: {shown(str(error))}", file=sys.stderr)
        return EXIT_USER_ERROR
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # the reader of our output went away (`relaxweb inspect ... | head -1`)
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error at exit
        return EXIT_BROKEN_PIPE


if __name__ == "__main__":
    sys.exit(main())
