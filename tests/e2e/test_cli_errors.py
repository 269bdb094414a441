"""The command line's answers to hostile or mistaken arguments and files (issue 29, "Tracebacks
instead of one error line" and "Smaller"): one ``error:`` line and exit 2, never a traceback,
nothing written where it should not be.
"""

from __future__ import annotations

import io
import os
import socket
import struct
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import numpy as np
import onnx
import pytest

import relaxweb
from relaxweb.browser import IDLE_CONNECTION_S, start_server, stop_server
from examples.make_mlp import make_mlp
from tests.fixtures.tiny_decoder import BOUNDS, tiny_decoder

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.slow  # the command line in subprocesses


def cli(folder: Path, *args: str, shell: str | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    command = shell if shell is not None else None
    if command is not None:
        return subprocess.run(["bash", "-c", f"set -o pipefail; {command}"], cwd=folder, env=env, capture_output=True,
                              timeout=120)
    return subprocess.run([sys.executable, "-m", "relaxweb", *args], cwd=folder, env=env, capture_output=True, timeout=120)


def one_error(done: subprocess.CompletedProcess) -> str:
    """The one error line of a refused command (exit 2, nothing else on stderr but notes)."""
    stderr = done.stderr.decode("utf-8", "replace")
    assert done.returncode == 2 and "Traceback" not in stderr, stderr
    [line] = [line for line in stderr.splitlines() if line.startswith("error: ")]
    return line


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    """A folder with the MLP as m.onnx, its bundle dist/, in.npz, the tiny decoder's bundle and a FIFO."""
    folder = tmp_path_factory.mktemp("cli")
    onnx.save(make_mlp(), str(folder / "m.onnx"))
    relaxweb.build(folder / "m.onnx", folder / "dist")
    relaxweb.build(tiny_decoder(), folder / "llama", bounds=BOUNDS)
    np.savez(folder / "in.npz", x=np.zeros((2, 64), np.float32))
    os.mkfifo(folder / "fifo.npz")  # opened to read or write, a FIFO waits for the other end for ever
    return folder


def test_inspect_into_a_closed_pipe_ends_quietly(folder: Path) -> None:
    done = cli(folder, shell=f"'{sys.executable}' -m relaxweb inspect m.onnx | head -1")
    assert done.stdout.decode().startswith("model m.onnx")
    assert done.stderr == b"" and done.returncode == 141  # as a shell reports a program stopped by SIGPIPE


@pytest.mark.parametrize("out, message", [
    ("missing/out.npz", "error: --out missing/out.npz: the folder missing does not exist"),
    ("a" * 300, "error: --out " + "a" * 197 + "...: File name too long"),
    ("in.npz", "error: --out in.npz is an --inputs file: writing the outputs would replace the inputs; name another file"),
    ("in", "error: --out in.npz is an --inputs file: writing the outputs would replace the inputs; name another file"),
    ("", "error: --out is empty: give the .npz file to write the outputs to"),
    ("fifo.npz", "error: --out fifo.npz: not a regular file (a device, FIFO or socket); name an .npz file"),
], ids=["missing folder", "300-byte name", "the inputs", "the inputs without .npz", "empty", "a FIFO"])
def test_run_out_is_checked_before_the_run(folder: Path, out: str, message: str) -> None:
    before = (folder / "in.npz").read_bytes()
    assert one_error(cli(folder, "run", "dist", "--inputs", "in.npz", "--out", out)) == message
    assert (folder / "in.npz").read_bytes() == before


def test_run_out_says_the_file_it_wrote(folder: Path) -> None:
    done = cli(folder, "run", "dist", "--inputs", "in.npz", "--out", "result")
    assert done.returncode == 0 and done.stderr.decode().splitlines()[-1] == "wrote result.npz"
    assert set(np.load(folder / "result.npz").files) == {"probabilities"}


def test_an_npz_header_claiming_terabytes_is_refused(folder: Path) -> None:
    header = io.BytesIO()
    np.lib.format.write_array_header_1_0(header, {"descr": "<f4", "fortran_order": False, "shape": (2**40, 4)})
    with zipfile.ZipFile(folder / "huge.npz", "w") as archive:
        archive.writestr("x.npy", header.getvalue() + bytes(64))
    assert one_error(cli(folder, "run", "dist", "--inputs", "huge.npz")) == (
        "error: huge.npz: array 'x' claims shape (1099511627776, 4) (17592186044416 bytes) but its file holds 192 bytes")


@pytest.mark.parametrize("output, message", [
    ("b" * 300, "error: cannot write the bundle to " + "b" * 197 + "...: File name too long"),
    ("/".join(["c" * 200] * 25), "error: cannot write the bundle to " + ("c" * 200)[:197] + "...: File name too long"),
    ("", "error: the output (-o) is empty: name the bundle's folder (it is made where missing)"),
], ids=["300-byte name", "5,000-character path", "empty"])
def test_build_output_names_the_file_system_refuses(tmp_path: Path, output: str, message: str) -> None:
    onnx.save(make_mlp(), str(tmp_path / "m.onnx"))
    assert one_error(cli(tmp_path, "build", "m.onnx", "-o", output)) == message
    assert sorted(path.name for path in tmp_path.iterdir()) == ["m.onnx"]  # nothing written here


@pytest.mark.parametrize("args, message", [
    (["generate", "llama", "--prompt", b"ab\xffc"], "error: --prompt is not UTF-8 text: byte 0xff at character 2"),
    (["chat", "llama", "--message", b"user:a\xfeb"], "error: the user message is not UTF-8 text: byte 0xfe at character 1"),
], ids=["generate", "chat"])
def test_prompts_that_are_not_utf8_are_refused(folder: Path, args: list, message: str) -> None:
    assert one_error(cli(folder, *[os.fsdecode(arg) if isinstance(arg, bytes) else arg for arg in args])) == message


def test_a_sampling_option_beyond_float32_is_refused(folder: Path) -> None:
    """Found by ``scripts/fuzz.py cli``: an OverflowError packing the sampler's parameters."""
    assert one_error(cli(folder, "generate", "llama", "--prompt", "a", "--repetition-penalty", "1e308",
                         "--backend", "wasm")) == (
        "error: repetition_penalty must be a number above 0 (1: none), got 1e+308 (outside float32's range, 1.2e-38 to "
        "3.4e38, which the samplers compute in)")


@pytest.mark.parametrize("value, message", [
    ("[" * 200_000 + "]" * 200_000, "JSON nested too deeply to read"),
    ('{"kind": "byte", "vocab_size": ' + "9" * 5000 + "}", "not readable JSON (Exceeds the limit (4300 digits)"),
], ids=["nested 200,000 deep", "5,000 digits"])
def test_hostile_tokenizer_metadata_is_one_error(tmp_path: Path, value: str, message: str) -> None:
    model = make_mlp()
    model.metadata_props.add(key="relaxweb.tokenizer", value=value)
    onnx.save(model, str(tmp_path / "m.onnx"))
    line = one_error(cli(tmp_path, "build", "m.onnx", "-o", "dist"))
    assert line.startswith("error: the tokenizer in m.onnx's metadata_props['relaxweb.tokenizer']: " + message), line


def test_serve_says_nothing_when_clients_reset_their_connections(folder: Path) -> None:
    """Five clients ask for the weights and reset the connection (a closed tab): no traceback."""
    server = subprocess.Popen([sys.executable, "-m", "relaxweb", "serve", "dist", "--port", "0"], cwd=folder,
                              env={**os.environ, "PYTHONPATH": str(REPO)}, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
    try:
        port = int(server.stdout.readline().split("127.0.0.1:")[1].split("/")[0])
        for _ in range(5):
            with socket.create_connection(("127.0.0.1", port)) as client:
                client.sendall(f"GET /bundle/weights/shard0.bin HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n".encode())
                client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # close with a reset
        time.sleep(1)
    finally:
        server.terminate()
        _, stderr = server.communicate(timeout=10)
    assert "Traceback" not in stderr and "Error" not in stderr, stderr


def test_an_idle_connection_is_closed(folder: Path) -> None:
    """A client that connects and sends nothing does not hold a server thread for ever."""
    server = start_server(folder / "dist")
    handler = server.RequestHandlerClass.func  # type: ignore[attr-defined]
    assert handler.timeout == IDLE_CONNECTION_S == 30
    handler.timeout = 0.5  # not to wait 30 s here
    try:
        with socket.create_connection(server.server_address) as client:
            client.settimeout(10)
            started = time.monotonic()
            assert client.recv(1) == b""  # closed by the server
            assert time.monotonic() - started < 5
    finally:
        stop_server(server)


@pytest.mark.parametrize("args, message", [
    (["inspect", "n" * 300], "error: " + "n" * 197 + "...: File name too long"),
    (["chat", "n" * 300], "error: " + "n" * 197 + "...: File name too long"),
    (["run", "dist", "--inputs", "n" * 300], "error: " + "n" * 197 + "...: File name too long"),
    (["inspect", "/dev/zero"], "error: /dev/zero: not a regular file (a device, FIFO or socket), expected an .onnx file"),
    (["run", "dist", "--inputs", "fifo.npz"],
     "error: fifo.npz: not a regular file (a device, FIFO or socket), expected an .npz file"),
], ids=["inspect a 300-byte name", "chat a 300-byte name", "inputs a 300-byte name",
        "inspect /dev/zero", "inputs a FIFO"])
def test_paths_that_cannot_be_looked_up_or_read_to_an_end_are_refused(folder: Path, args: list[str], message: str) -> None:
    """Found by ``scripts/fuzz.py cli``: a name too long for the file system was an OSError from
    ``Path.is_file``; /dev/zero and a FIFO were read for ever."""
    assert one_error(cli(folder, *args)) == message


@pytest.mark.parametrize("args, message", [
    (["--tokenizer", "t" * 300], "error: " + "t" * 197 + "...: File name too long"),
    (["--dump-ir", "d" * 300], "error: cannot make the IR dump folder (--dump-ir) " + "d" * 197 + "...: File name too long"),
    (["--dump-ir="], "error: the IR dump folder (--dump-ir) is empty: name the folder to write the module's text to"),
], ids=["tokenizer a 300-byte name", "dump-ir a 300-byte name", "dump-ir empty"])
def test_build_refuses_tokenizer_and_dump_paths_it_cannot_use(tmp_path: Path, args: list[str], message: str) -> None:
    """Found by ``scripts/fuzz.py cli``: OSError and FileExistsError tracebacks (the empty
    --dump-ir wrote the module's text into the current folder)."""
    onnx.save(make_mlp(), str(tmp_path / "m.onnx"))
    assert one_error(cli(tmp_path, "build", "m.onnx", "-o", "dist", *args)) == message
    assert sorted(path.name for path in tmp_path.iterdir()) == ["m.onnx"]


def test_a_tokenizer_larger_than_the_logits_is_refused(tmp_path: Path) -> None:
    """Ids past the model's logits would be tokens the model never saw: another model's tokenizer."""
    onnx.save(tiny_decoder(), str(tmp_path / "model.onnx"))
    (tmp_path / "tokenizer.json").write_text('{"kind": "byte", "vocab_size": 300, "eos_token_id": 257}')
    bounds = [f"--bound={name}={bound}" for name, bound in BOUNDS.items()]
    assert one_error(cli(tmp_path, "build", "model.onnx", "-o", "dist", "--tokenizer", "tokenizer.json", *bounds)) == (
        "error: the tokenizer has 300 token ids, but the model's logits have 258 entries: it is not this model's "
        "tokenizer")
    assert not (tmp_path / "dist").exists()
