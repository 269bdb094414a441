"""The machine's WebAssembly SIMD128 peak, and relaxweb's matmul kernels as a fraction of it.

Usage (from the repository root; Chromium through Playwright for ``chromium``)::

    python3 bench/wasm_peak.py                                  # wasmtime and Chromium, the default matmuls
    python3 bench/wasm_peak.py --where chromium --matmuls 128x768x50257 --rounds 5

Measured in each engine (``--where``: ``wasmtime``, the Python runtime's, and ``chromium``, a
blank page of headless Chromium: V8, the browser runtime's), one thread, best of ``--rounds``:

- **f32x4 multiply-add**: loops of 10 or 12 independent f32x4 sums (enough to hide the
  latency on each one's chain), each step ``acc += x * y`` (as a micro-kernel does it) or
  ``acc = acc * x + y``, written as ``f32x4.mul`` then ``f32x4.add`` (plain SIMD128: 8 flops an
  instruction pair) and as one ``f32x4.relaxed_madd`` (relaxed SIMD: fused where the CPU has
  FMA).  GFLOP/s, counting 2 flops per lane; a form's peak is the faster of its two loops.
- **memory**: read (a 64 MiB buffer summed with 4 f32x4 accumulators) and copy (32 MiB moved by
  f32x4 loads and stores), in GB/s: the roof of kernels that stream their weights once
  (matrix-vector products).
- **relaxweb's matmul kernels**: for each ``--matmuls`` shape ``MxKxN``, the kernel the compiler
  writes for a one-node MatMul ([M, K] @ [K, N], the weight an initializer: its wasm schedule
  as ``schedule_programs`` chooses), relaxed and lowered to plain SIMD128, all of its
  units in one call, the memory laid out as a runtime lays it out; GFLOP/s and the fraction of
  the peak of the same form (plain against mul + add, relaxed against relaxed_madd) in the same
  engine.  The two forms' outputs are checked against each other and against a few dot
  products computed in float64.  Besides best against best, each round times one call of
  the kernel and one of its form's peak loop back to back, and the "paired" fraction is the
  median over the rounds of the kernel's rate over the loop's: on a shared machine whose
  speed moves for seconds at a time, best-of figures taken minutes apart can disagree (a
  matmul above its own "peak").

The defaults are the largest matmuls of the benchmark models (docs/benchmarks.md): GPT-2's LM
head at a 128-token prefill (128 x 768 x 50257), and the FFN of BERT-base and GPT-2 at 128 tokens
(128 x 768 x 3072, 128 x 3072 x 768).
"""

from __future__ import annotations

import argparse
import base64
import sys
import time
from pathlib import Path

import numpy as np
import wasmtime
from onnx import TensorProto, helper

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from relaxweb.compiler import compile_model  # noqa: E402
from relaxweb.cpu.kernels import KernelsWasm, emit_kernels_wasm  # noqa: E402
from relaxweb.ir.launch import dispatch_count  # noqa: E402
from relaxweb.ir.module import IRModule  # noqa: E402
from relaxweb.ir.pattern import analyze_matmul  # noqa: E402
from relaxweb.ir.symbolic import evaluate  # noqa: E402
from relaxweb.ir.tir import TensorProgram  # noqa: E402
from relaxweb.runtime.relaxed_simd import lower_relaxed_simd  # noqa: E402

ACCUMULATORS = 10  # (12 in the chain form) with x, its step and two factors: 14 of the 16 SIMD registers of x86-64
FMA_STEPS = 4_000_000  # loop iterations of one multiply-add call: 12 x 8 flops each
READ_BYTES = 64 << 20
COPY_BYTES = 32 << 20
RESERVED = 65536  # the runtimes' first 64 KiB hold no buffer (docs/bundle-format.md, "kernels.wasm")
DEFAULT_MATMULS = ["128x768x50257", "128x768x3072", "128x3072x768"]


def fma_wat(relaxed: bool, accumulate: bool) -> str:
    """``run(n) -> f32``: n steps of independent f32x4 multiply-adds on ACCUMULATORS sums.

    ``accumulate``: ``acc += x * y`` as a matmul's micro-kernel does it (only the add, or the
    fused multiply-add, on each sum's chain; ``x`` moves every step, so no product is
    loop-invariant).  Otherwise ``acc = acc * x + y``, the multiply on the chain too.  Which is
    faster depends on the engine's code and the CPU's ports: the peak is the faster."""
    count = ACCUMULATORS if accumulate else ACCUMULATORS + 2
    locals_ = " ".join(f"(local $a{i} v128)" for i in range(count))
    step = ["(local.set $x (f32x4.add (local.get $x) (local.get $d)))"] if accumulate else []
    for i in range(count):
        x, y, a = "(local.get $x)", f"(local.get $y{i % 2})", f"(local.get $a{i})"
        if accumulate:
            value = f"(f32x4.relaxed_madd {x} {y} {a})" if relaxed else f"(f32x4.add {a} (f32x4.mul {x} {y}))"
        else:
            value = f"(f32x4.relaxed_madd {a} {x} {y})" if relaxed else f"(f32x4.add (f32x4.mul {a} {x}) {y})"
        step.append(f"(local.set $a{i} {value})")
    total = "(local.get $a0)"
    for i in range(1, count):
        total = f"(f32x4.add {total} (local.get $a{i}))"
    return f"""(module
  (func (export "run") (param $n i32) (result f32)
    (local $x v128) (local $d v128) (local $y0 v128) (local $y1 v128) {locals_}
    (local.set $x (f32x4.splat (f32.const 0.999)))
    (local.set $d (f32x4.splat (f32.const 1e-7)))
    (local.set $y0 (f32x4.splat (f32.const 0.001)))
    (local.set $y1 (f32x4.splat (f32.const 0.002)))
    (loop $step
      {' '.join(step)}
      (local.set $n (i32.sub (local.get $n) (i32.const 1)))
      (br_if $step (local.get $n)))
    (f32x4.extract_lane 0 {total})))"""


def fma_modules() -> dict[str, bytes]:
    """The four multiply-add loops by name: ``plain`` / ``relaxed``, ``chain`` / ``accumulate``."""
    return {f"{form} {kind}": wasmtime.wat2wasm(fma_wat(form == "relaxed", kind == "accumulate"))
            for form in ("plain", "relaxed") for kind in ("chain", "accumulate")}


def flops_per_call(name: str) -> int:
    return FMA_STEPS * 8 * (ACCUMULATORS if name.endswith("accumulate") else ACCUMULATORS + 2)


def memory_wat() -> str:
    """``read(bytes) -> f32`` sums [0, bytes) as f32x4 (4 accumulators, 64 bytes a step);
    ``copy(bytes)`` copies [0, bytes) to [bytes, 2 bytes) by f32x4 (64 bytes a step);
    ``fill(bytes)`` writes [0, bytes), so that the pages are the process's own (a page never
    written reads as the one shared zero page, from the cache)."""
    pages = (READ_BYTES + 2 * COPY_BYTES) // 65536 + 1
    loads = " ".join(f"(local.set $s{i} (f32x4.add (local.get $s{i}) (v128.load offset={16 * i} (local.get $p))))"
                     for i in range(4))
    copies = " ".join(f"(v128.store offset={16 * i} (i32.add (local.get $p) (local.get $n)) "
                      f"(v128.load offset={16 * i} (local.get $p)))" for i in range(4))
    return f"""(module
  (memory (export "memory") {pages})
  (func (export "read") (param $n i32) (result f32)
    (local $p i32) (local $s0 v128) (local $s1 v128) (local $s2 v128) (local $s3 v128)
    (loop $step
      {loads}
      (local.set $p (i32.add (local.get $p) (i32.const 64)))
      (br_if $step (i32.lt_u (local.get $p) (local.get $n))))
    (f32x4.extract_lane 0 (f32x4.add (f32x4.add (local.get $s0) (local.get $s1)) (f32x4.add (local.get $s2) (local.get $s3)))))
  (func (export "fill") (param $n i32)
    (memory.fill (i32.const 0) (i32.const 1) (local.get $n)))
  (func (export "copy") (param $n i32)
    (local $p i32)
    (loop $step
      {copies}
      (local.set $p (i32.add (local.get $p) (i32.const 64)))
      (br_if $step (i32.lt_u (local.get $p) (local.get $n))))))"""


class MatmulCase:
    """relaxweb's kernel of an [M, K] @ [K, N] MatMul, both modules, and its memory layout."""

    def __init__(self, shape: str) -> None:
        self.label = shape
        self.m, self.k, self.n = (int(part) for part in shape.split("x"))
        weight = np.zeros((self.k, self.n), np.float32)  # the values are the harness's; the shape is what matters
        model = helper.make_model(helper.make_graph(
            [helper.make_node("MatMul", ["x", "w"], ["y"])], "matmul",
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, [self.m, self.k])],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, [self.m, self.n])],
            [helper.make_tensor("w", TensorProto.FLOAT, weight.shape, weight.tobytes(), raw=True)]),
            opset_imports=[helper.make_opsetid("", 17)])
        module = compile_model(model)
        [program] = [p for p in module.programs.values() if isinstance(p, TensorProgram) and analyze_matmul(p)]
        self.schedule = str(program.schedule.wasm) if program.schedule else "?"
        kernels = emit_kernels_wasm(IRModule(functions={}, programs={program.name: program}), [(program.name, {})])
        assert isinstance(kernels, KernelsWasm) and kernels.relaxed_madd_sites
        self.modules = {"plain": lower_relaxed_simd(kernels.wasm, kernels.relaxed_madd_sites), "relaxed": kernels.wasm}
        self.flops = 2 * self.m * self.k * self.n
        params = [int(evaluate(dispatch_count(program), {}))]
        self.params = RESERVED
        self.x = _aligned(RESERVED + 16 * max(1, len(params)))
        self.w = _aligned(self.x + 4 * self.m * self.k)
        self.y = _aligned(self.w + 4 * self.k * self.n)
        self.scratch = _aligned(self.y + 4 * self.m * self.n)
        self.end = _aligned(self.scratch + kernels.scratch_bytes) + 65536
        self.pages = self.end // 65536 + 1
        self.param_words = params

    def layout(self) -> dict:
        return {"params": self.params, "x": self.x, "w": self.w, "y": self.y, "scratch": self.scratch,
                "pages": self.pages, "words": self.param_words, "m": self.m, "k": self.k, "n": self.n}


def _aligned(value: int) -> int:
    return (value + 15) // 16 * 16


def inputs(case: MatmulCase) -> tuple[np.ndarray, np.ndarray]:
    """The harness's x and w: values in [-1, 1), the same in every engine (the page computes
    the same sequence: ``fill`` in PAGE_SCRIPT)."""
    def fill(count: int, seed: int) -> np.ndarray:
        index = np.arange(count, dtype=np.uint64)
        return (((index * np.uint64(2654435761) + np.uint64(seed)) % np.uint64(2048)).astype(np.float32) / 1024 - 1)
    return fill(case.m * case.k, 1).reshape(case.m, case.k), fill(case.k * case.n, 7).reshape(case.k, case.n)


def spot_checks(case: MatmulCase) -> list[tuple[int, int, float]]:
    """A few (row, column, value) of the product, in float64."""
    x, w = inputs(case)
    picks = [(0, 0), (case.m - 1, case.n - 1), (case.m // 2, case.n // 3), (1 % case.m, case.n - 5)]
    return [(r, c, float(x[r].astype(np.float64) @ w[:, c].astype(np.float64))) for r, c in picks]


# -- wasmtime ------------------------------------------------------------------------------------------------


def best_seconds(call, rounds: int) -> float:
    call()
    best = float("inf")
    for _ in range(rounds):
        start = time.perf_counter()
        call()
        best = min(best, time.perf_counter() - start)
    return best


def time_once(call) -> float:
    start = time.perf_counter()
    call()
    return time.perf_counter() - start


def paired_fraction(kernel_seconds_per_flop, peak_seconds_per_flop, rounds: int) -> float:
    """The kernel's rate over the peak loop's, each round timing one call of each back to back
    (a shared machine's load moves both alike): the median over the rounds."""
    ratios = sorted(peak_seconds_per_flop() / kernel_seconds_per_flop() for _ in range(rounds))
    return ratios[len(ratios) // 2]


def wasmtime_figures(cases: list[MatmulCase], rounds: int) -> dict:
    engine = wasmtime.Engine()
    figures: dict = {}
    fma_runs = {}
    for name, wasm in fma_modules().items():
        store = wasmtime.Store(engine)
        run = wasmtime.Instance(store, wasmtime.Module(engine, wasm), []).exports(store)["run"]
        fma_runs[name] = lambda run=run, store=store: run(store, FMA_STEPS)
        figures[f"fma {name}"] = flops_per_call(name) / best_seconds(fma_runs[name], rounds) / 1e9
    store = wasmtime.Store(engine)
    exports = wasmtime.Instance(store, wasmtime.Module(engine, wasmtime.wat2wasm(memory_wat())), []).exports(store)
    exports["fill"](store, READ_BYTES + 2 * COPY_BYTES)
    figures["read"] = READ_BYTES / best_seconds(lambda: exports["read"](store, READ_BYTES), rounds) / 1e9
    figures["copy"] = 2 * COPY_BYTES / best_seconds(lambda: exports["copy"](store, COPY_BYTES), rounds) / 1e9
    for case in cases:
        x, w = inputs(case)
        outputs = {}
        for form, wasm in case.modules.items():
            store = wasmtime.Store(engine)
            memory = wasmtime.Memory(store, wasmtime.MemoryType(wasmtime.Limits(case.pages, 65536)))
            instance = wasmtime.Instance(store, wasmtime.Module(engine, wasm), [memory])
            words = np.zeros(4, np.int32)
            words[:len(case.param_words)] = case.param_words
            memory.write(store, words.tobytes(), case.params)
            memory.write(store, x.tobytes(), case.x)
            memory.write(store, w.tobytes(), case.w)
            main = instance.exports(store)["k0"]
            units = instance.exports(store)["k0_units"](store, case.params)
            call = lambda: main(store, case.params, 0, units, case.scratch, case.x, case.w, case.y)  # noqa: E731
            seconds = best_seconds(call, rounds)
            figures[f"{case.label} {form}"] = case.flops / seconds / 1e9
            peak = max((name for name in fma_runs if name.startswith(form)), key=lambda name: figures[f"fma {name}"])
            figures[f"{case.label} {form} paired"] = paired_fraction(
                lambda: time_once(call) / case.flops, lambda: time_once(fma_runs[peak]) / flops_per_call(peak), rounds)
            outputs[form] = np.frombuffer(memory.read(store, case.y, case.y + 4 * case.m * case.n), np.float32)
        check(case, outputs["plain"], outputs["relaxed"])
    return figures


def check(case: MatmulCase, plain: np.ndarray, relaxed: np.ndarray) -> None:
    """Both forms give the product: within float32 rounding of each other and of float64."""
    np.testing.assert_allclose(plain, relaxed, rtol=1e-4, atol=1e-3, err_msg=case.label)
    for row, column, value in spot_checks(case):
        got = plain[row * case.n + column]
        assert abs(got - value) <= 1e-3 + 1e-4 * abs(value), (case.label, row, column, got, value)


# -- Chromium ------------------------------------------------------------------------------------------------

PAGE_SCRIPT = """
async ({ fma, memory, cases, rounds, steps, readBytes, copyBytes }) => {
  const bytes = (text) => Uint8Array.from(atob(text), (c) => c.charCodeAt(0));
  const best = (call) => {
    call();
    let seconds = Infinity;
    for (let r = 0; r < rounds; r++) {
      const start = performance.now();
      call();
      seconds = Math.min(seconds, (performance.now() - start) / 1000);
    }
    return seconds;
  };
  const once = (call) => {
    const start = performance.now();
    call();
    return performance.now() - start;
  };
  // the kernel's rate over the peak loop's, timed back to back each round: the median
  const paired = (kernel, kernelFlops, peak, peakFlops) => {
    const ratios = [];
    for (let r = 0; r < rounds; r++) ratios.push((once(peak) / peakFlops) / (once(kernel) / kernelFlops));
    return ratios.sort((a, b) => a - b)[Math.floor(rounds / 2)];
  };
  const figures = {};
  const fmaRuns = {};
  for (const [name, [text, flops]] of Object.entries(fma)) {
    const { instance } = await WebAssembly.instantiate(bytes(text));
    fmaRuns[name] = [() => instance.exports.run(steps), flops];
    figures[`fma ${name}`] = flops / best(fmaRuns[name][0]) / 1e9;
  }
  const { instance } = await WebAssembly.instantiate(bytes(memory));
  instance.exports.fill(readBytes + 2 * copyBytes);
  figures.read = readBytes / best(() => instance.exports.read(readBytes)) / 1e9;
  figures.copy = 2 * copyBytes / best(() => instance.exports.copy(copyBytes)) / 1e9;
  const fill = (view, seed) => {
    // (i * 2654435761 + seed) mod 2048, as numpy computes it in uint64: the low 11 bits only
    for (let i = 0; i < view.length; i++) view[i] = (((Math.imul(i, 2654435761) + seed) >>> 0) % 2048) / 1024 - 1;
  };
  const outputs = {};
  for (const c of cases) {
    outputs[c.label] = {};
    for (const [form, text] of Object.entries(c.modules)) {
      const mem = new WebAssembly.Memory({ initial: c.layout.pages, maximum: 65536 });
      const { instance: kernel } = await WebAssembly.instantiate(bytes(text), { env: { memory: mem } });
      const L = c.layout;
      new Int32Array(mem.buffer, L.params, 4).set(L.words);
      fill(new Float32Array(mem.buffer, L.x, L.m * L.k), 1);
      fill(new Float32Array(mem.buffer, L.w, L.k * L.n), 7);
      const units = kernel.exports.k0_units(L.params);
      const call = () => kernel.exports.k0(L.params, 0, units, L.scratch, L.x, L.w, L.y);
      const seconds = best(call);
      figures[`${c.label} ${form}`] = c.flops / seconds / 1e9;
      const peak = Object.keys(fmaRuns).filter((name) => name.startsWith(form))
        .reduce((a, b) => (figures[`fma ${a}`] >= figures[`fma ${b}`] ? a : b));
      figures[`${c.label} ${form} paired`] = paired(call, c.flops, ...fmaRuns[peak]);
      const y = new Float32Array(mem.buffer, L.y, L.m * L.n);
      outputs[c.label][form] = btoa(String.fromCharCode(...new Uint8Array(y.buffer, L.y, Math.min(L.m * L.n, 4096) * 4)));
      outputs[c.label][form + "_spots"] = c.spots.map(([r, col]) => y[r * L.n + col]);
    }
  }
  return { figures, outputs };
}
"""


def chromium_figures(cases: list[MatmulCase], rounds: int) -> dict:
    from relaxweb.browser import launch_chromium, sync_playwright

    encode = lambda data: base64.b64encode(data).decode()  # noqa: E731
    payload = {
        "fma": {name: [encode(wasm), flops_per_call(name)] for name, wasm in fma_modules().items()},
        "memory": encode(wasmtime.wat2wasm(memory_wat())),
        "cases": [{"label": c.label, "flops": c.flops, "layout": c.layout(), "spots": [[r, col] for r, col, _ in spot_checks(c)],
                   "modules": {form: encode(wasm) for form, wasm in c.modules.items()}} for c in cases],
        "rounds": rounds, "steps": FMA_STEPS, "readBytes": READ_BYTES, "copyBytes": COPY_BYTES,
    }
    with sync_playwright() as playwright:
        browser = launch_chromium(playwright, webgpu=False)
        try:
            page = browser.new_page()
            page.goto("about:blank")
            result = page.evaluate(PAGE_SCRIPT, payload)
        finally:
            browser.close()
    for case in cases:
        out = result["outputs"][case.label]
        first = {form: np.frombuffer(base64.b64decode(out[form]), np.float32) for form in ("plain", "relaxed")}
        np.testing.assert_allclose(first["plain"], first["relaxed"], rtol=1e-4, atol=1e-3, err_msg=case.label)
        for form in ("plain", "relaxed"):
            for (row, column, value), got in zip(spot_checks(case), out[f"{form}_spots"]):
                assert abs(got - value) <= 1e-3 + 1e-4 * abs(value), (case.label, form, row, column, got, value)
    return result["figures"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--where", nargs="+", default=["wasmtime", "chromium"], choices=["wasmtime", "chromium"])
    parser.add_argument("--matmuls", nargs="*", default=DEFAULT_MATMULS, metavar="MxKxN")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    cases = [MatmulCase(shape) for shape in args.matmuls]
    for case in cases:
        print(f"matmul {case.label}: wasm schedule {case.schedule}", file=sys.stderr)
    print("| engine | mul + add, chain | mul + add, accumulate | relaxed_madd, chain | relaxed_madd, accumulate | "
          "read (GB/s) | copy (GB/s) |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    results = {}
    for where in args.where:
        f = results[where] = (wasmtime_figures if where == "wasmtime" else chromium_figures)(cases, args.rounds)
        for form in ("plain", "relaxed"):
            f[f"peak {form}"] = max(f[f"fma {form} chain"], f[f"fma {form} accumulate"])
        print(f"| {where} | " + " | ".join(f"{f[f'fma {name}']:.1f}" for name in fma_modules())
              + f" | {f['read']:.1f} | {f['copy']:.1f} |")
    print("\n(GFLOP/s of f32x4 multiply-adds; a form's peak is its faster loop.)")
    if cases:
        print()
        print("| engine | matmul M x K x N | plain SIMD128 (GFLOP/s) | of the mul + add peak | paired | "
              "relaxed SIMD (GFLOP/s) | of the relaxed_madd peak | paired | of the better peak |")
        print("|---|---|---:|---:|---:|---:|---:|---:|---:|")
        for where, f in results.items():
            best_peak = max(f["peak plain"], f["peak relaxed"])
            for case in cases:
                plain, relaxed = f[f"{case.label} plain"], f[f"{case.label} relaxed"]
                print(f"| {where} | {case.label} | {plain:.1f} | {plain / f['peak plain']:.0%} | "
                      f"{f[f'{case.label} plain paired']:.0%} | {relaxed:.1f} | {relaxed / f['peak relaxed']:.0%} | "
                      f"{f[f'{case.label} relaxed paired']:.0%} | {max(plain, relaxed) / best_peak:.0%} |")
        print("\n(Best of the rounds against the best peak; paired: the median over the rounds of the kernel's "
              "rate over the form's peak loop's, one call of each back to back.)")


if __name__ == "__main__":
    main()
