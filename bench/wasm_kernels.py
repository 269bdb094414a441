"""How fast the WebAssembly backend's matmul-like kernels are (kernels.wasm, relaxweb/cpu):
the element form (one output element at a time) against the packed panels and
register-blocked micro-kernels of the wasm schedule the compiler chooses, under wasmtime on
one thread.

Usage (from the repository root)::

    python3 bench/wasm_kernels.py [--rounds 3]

Two shapes, float32, each compiled by relaxweb from a one-node ONNX model: a 256 x 768 x 768
matmul (a transformer's projection at 256 tokens), and the 3x3 convolution of 80 to 80
channels at 80 x 80 (the largest of YOLOv8n at 640, as in ``kernel_ceiling.py``: an implicit
GEMM of M = 80, N = 6400, K = 720).  One call runs all of a kernel's units; rounds interleave
the two forms, and the table gives each one's GFLOP/s in its best run and the ratio.  The
two forms' outputs are checked against each other.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import wasmtime
from onnx import TensorProto, helper

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from helpers import make_model, rand  # noqa: E402
from relaxweb.compiler import compile_model  # noqa: E402
from relaxweb.cpu.helpers import HELPER_FUNCTIONS  # noqa: E402
from relaxweb.cpu.math import MATH_FUNCTIONS  # noqa: E402
from relaxweb.cpu.module import KernelFunctions, assemble_kernels_module, wat_to_wasm  # noqa: E402
from relaxweb.cpu.schedules import render_program  # noqa: E402
from relaxweb.ir.pattern import analyze_matmul  # noqa: E402
from relaxweb.ir.wasm_schedule import MatrixVectorSchedule, WasmElementSchedule  # noqa: E402

MATMUL_SCRATCH_BYTES = MatrixVectorSchedule().scratch_bytes  # the most a matmul kernel of the compiler asks for

RESERVED = 65536  # bytes [0, 65536) are never a buffer (docs/bundle-format.md, "kernels.wasm")


class Kernel:
    """One kernel's text, instantiated over its inputs, callable on all its units."""

    def __init__(self, text: str, arrays: list[np.ndarray], output_shape: tuple[int, ...]) -> None:
        wat = assemble_kernels_module([KernelFunctions(0, "bench", text)], "bench", {**MATH_FUNCTIONS, **HELPER_FUNCTIONS})
        engine = wasmtime.Engine()
        self.store = wasmtime.Store(engine)
        self.output = np.zeros(output_shape, np.float32)
        buffers = [*arrays, self.output]
        total = RESERVED + 256 + sum(b.nbytes + 16 for b in buffers) + MATMUL_SCRATCH_BYTES + 2 * 65536
        self.memory = wasmtime.Memory(self.store, wasmtime.MemoryType(wasmtime.Limits(total // 65536 + 1, 65536)))
        instance = wasmtime.Instance(self.store, wasmtime.Module(engine, wat_to_wasm(wat)), [self.memory])
        self.memory.write(self.store, np.zeros(64, np.int32).tobytes(), RESERVED)  # no size variables: static shapes
        address, self.addresses = RESERVED + 256, []
        for buffer in buffers:
            self.addresses.append(address)
            self.memory.write(self.store, np.ascontiguousarray(buffer).tobytes(), address)
            address += (buffer.nbytes + 31) // 16 * 16
        self.scratch = address
        exports = instance.exports(self.store)
        self.main, self.units = exports["k0"], exports["k0_units"](self.store, RESERVED)

    def run(self) -> float:
        """Seconds of one call over every unit."""
        start = time.perf_counter()
        self.main(self.store, RESERVED, 0, self.units, self.scratch, *self.addresses)
        return time.perf_counter() - start

    def result(self) -> np.ndarray:
        at = self.addresses[-1]
        data = self.memory.read(self.store, at, at + self.output.nbytes)
        return np.frombuffer(data, np.float32).reshape(self.output.shape)


def matmul_program(model):
    module = compile_model(model)
    [program] = [p for p in module.programs.values() if analyze_matmul(p) is not None]
    return program


def cases():
    x, w = rand(256, 768), rand(768, 768, seed=1)
    matmul = make_model([helper.make_node("MatMul", ["x", "w"], ["y"])], [("x", TensorProto.FLOAT, [256, 768])], ["y"],
                        {"w": w})
    yield "matmul 256x768 @ 768x768", matmul_program(matmul), [x, w], 2 * 256 * 768 * 768
    data, weight = rand(1, 80, 80, 80), rand(80, 80, 3, 3, seed=1)
    conv = make_model([helper.make_node("Conv", ["x", "w"], ["y"], pads=[1] * 4)], [("x", TensorProto.FLOAT, [1, 80, 80, 80])],
                      ["y"], {"w": weight})
    yield "conv 3x3 80->80 at 80x80", matmul_program(conv), [data, weight], 2 * 80 * 80 * 9 * 80 * 80


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    print(f"{'kernel':<28} {'element':>16} {'micro-kernel':>16} {'ratio':>7}  (best of {args.rounds}, one thread)")
    for label, program, arrays, flops in cases():
        shape = tuple(int(d.value) for d in program.output.shape)
        kernels = {"element": Kernel(render_program(program, {}, WasmElementSchedule()), arrays, shape),
                   "micro-kernel": Kernel(render_program(program, {}), arrays, shape)}
        best = {name: float("inf") for name in kernels}
        for _ in range(args.rounds):  # interleaved: both forms see the same load on the machine
            for name, kernel in kernels.items():
                best[name] = min(best[name], kernel.run())
        # (tests/cpu/test_cpu_kernels.py checks both forms against the interpreter, at smaller shapes)
        np.testing.assert_allclose(kernels["micro-kernel"].result(), kernels["element"].result(), rtol=1e-4, atol=1e-3)
        rates = {name: flops / seconds / 1e9 for name, seconds in best.items()}
        print(f"{label:<28} {rates['element']:>10.2f} GFLOP/s {rates['micro-kernel']:>8.2f} GFLOP/s "
              f"{rates['micro-kernel'] / rates['element']:>6.1f}x")


if __name__ == "__main__":
    main()
