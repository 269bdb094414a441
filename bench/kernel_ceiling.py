"""How fast relaxweb's generated matmul kernels are, against a hand-written ceiling, and how long
a bundle's kernels take to compile.

Usage (from the repository root; needs Playwright and Chromium, onnx, and wgpu for lavapipe)::

    python3 bench/kernel_ceiling.py speed [--rounds 3]
    python3 bench/kernel_ceiling.py compile OLD_BUNDLE NEW_BUNDLE [--rounds 3]
    python3 bench/kernel_ceiling.py models OLD_BUNDLE NEW_BUNDLE --input images=1,3,320,320 [--rounds 3]

``speed``: two shapes, float32 -- a 1024 x 1024 x 1024 matmul, and the 3x3 convolution of
80 to 80 channels at 80 x 80 (the largest of YOLOv8n at 640, in its class head: an implicit
GEMM of M = 80, N = 6400, K = 720).  Each is compiled by relaxweb from a one-node ONNX model (the weights
are initializers, so a run uploads the input and reads the output back), and run in the same
Chromium page (WebGPU on SwiftShader, the benchmark's adapter) as the hand-written kernels of
``kernel_ceiling.js``, which do the same upload and read-back around one dispatch.  Rounds
interleave the systems; the table gives each one's GFLOP/s in its best and its median run,
and the ratio to the best hand-written kernel's.

``compile``: the WGSL bytes of two bundles' kernels, then the time to create every kernel's
compute pipeline, interleaved over rounds: in Chromium (``createComputePipelineAsync`` of all
of them, one after another) and on wgpu (lavapipe; ``create_compute_pipeline``).  Each round
appends a comment naming the round to every shader, so no compilation cache can serve it.

``models``: two bundles of one model (built before and after a change), loaded in one
Chromium page and run alternately on the same float32 inputs: the run time of each.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx
import wgpu
from onnx import TensorProto, helper, numpy_helper

BENCH_DIR = Path(__file__).resolve().parent
REPO = BENCH_DIR.parent
sys.path.insert(0, str(REPO))

from relaxweb import build  # noqa: E402
from relaxweb.browser import (  # noqa: E402
    RUNNER_PAGE, launch_chromium, open_runner_page, start_server, stop_server, sync_playwright,
)

WORK = BENCH_DIR / "build" / "kernel_ceiling"

# In the page: time `rounds` runs of each hand-written kernel and of the bundle, interleaved.
SPEED_PAGE = """async ({ family, shape, input, output, flops, rounds }) => {
  const adapter = await navigator.gpu.requestAdapter();
  const device = await adapter.requestDevice();
  const kernels = window.KERNEL_CEILING[family];
  const model = await window.relaxweb.load('/bundle/');
  await model.ready;
  const values = (n, seed) => new Float32Array(n).map((_, i) => ((i * seed) % 13) / 13 - 0.5);
  const prepared = {};
  for (const [name, make] of Object.entries(kernels)) {
    const kernel = make(shape);
    const buffers = kernel.sizes.map((n, i) => {
      const buffer = device.createBuffer({ size: n * 4, usage: GPUBufferUsage.STORAGE | GPUBufferUsage.COPY_DST | GPUBufferUsage.COPY_SRC });
      device.queue.writeBuffer(buffer, 0, values(n, 7 + i));
      return buffer;
    });
    const module = device.createShaderModule({ code: kernel.code });
    const pipeline = await device.createComputePipelineAsync({ layout: 'auto', compute: { module, entryPoint: 'main' } });
    const bindGroup = device.createBindGroup({ layout: pipeline.getBindGroupLayout(0),
      entries: buffers.map((buffer, binding) => ({ binding, resource: { buffer } })) });
    const readBack = device.createBuffer({ size: kernel.sizes.at(-1) * 4, usage: GPUBufferUsage.MAP_READ | GPUBufferUsage.COPY_DST });
    prepared[name] = { kernel, buffers, pipeline, bindGroup, readBack };
  }
  const inputData = values(input.size, 7);
  // the same work as a model run around the dispatch: upload the input, read the output back
  const runKernel = async ({ kernel, buffers, pipeline, bindGroup, readBack }) => {
    device.queue.writeBuffer(buffers[0], 0, inputData);
    const encoder = device.createCommandEncoder();
    const pass = encoder.beginComputePass();
    pass.setPipeline(pipeline);
    pass.setBindGroup(0, bindGroup);
    pass.dispatchWorkgroups(...kernel.workgroups);
    pass.end();
    encoder.copyBufferToBuffer(buffers.at(-1), 0, readBack, 0, kernel.sizes.at(-1) * 4);
    device.queue.submit([encoder.finish()]);
    await readBack.mapAsync(GPUMapMode.READ);
    const result = new Float32Array(readBack.getMappedRange().slice(0));
    readBack.unmap();
    return result;
  };
  const feeds = { [input.name]: { data: inputData, shape: input.shape } };
  const runModel = async () => (await model.run(feeds))[output];
  const times = Object.fromEntries([...Object.keys(prepared), 'relaxweb'].map((name) => [name, []]));
  for (const name of Object.keys(prepared)) await runKernel(prepared[name]);  // warm up
  await runModel();
  for (let round = 0; round < rounds; round++) {
    for (const name of Object.keys(times)) {
      const start = performance.now();
      if (name === 'relaxweb') await runModel(); else await runKernel(prepared[name]);
      times[name].push(performance.now() - start);
    }
  }
  model.dispose();
  return Object.fromEntries(Object.entries(times).map(([name, ms]) =>
    [name, { ms, gflops: flops / Math.min(...ms) / 1e6 }]));
}"""

COMPILE_PAGE = """async ({ bundles, rounds }) => {
  const adapter = await navigator.gpu.requestAdapter();
  const device = await adapter.requestDevice({ requiredLimits: {
    maxComputeWorkgroupStorageSize: adapter.limits.maxComputeWorkgroupStorageSize,
    maxStorageBuffersPerShaderStage: adapter.limits.maxStorageBuffersPerShaderStage } });
  const times = Object.fromEntries(Object.keys(bundles).map((name) => [name, []]));
  for (let round = 0; round < rounds; round++) {
    for (const [name, sources] of Object.entries(bundles)) {
      const start = performance.now();
      for (const code of sources) {
        const module = device.createShaderModule({ code: code + `\\n// round ${round}\\n` });
        await device.createComputePipelineAsync({ layout: 'auto', compute: { module, entryPoint: 'main' } });
      }
      times[name].push(performance.now() - start);
    }
  }
  return times;
}"""


MODELS_PAGE = """async ({ feeds, rounds }) => {
  const inputs = Object.fromEntries(Object.entries(feeds).map(([name, shape]) => [name,
    { data: new Float32Array(shape.reduce((a, b) => a * b, 1)).map((_, i) => (i % 17) / 17), shape }]));
  const models = { old: await window.relaxweb.load('/bundle/'), new: await window.relaxweb.load('/new/') };
  const times = { old: [], new: [] };
  const firsts = {};
  for (const [name, model] of Object.entries(models)) {
    await model.ready;
    const start = performance.now();
    await model.run(inputs);  // creates the pipelines of the shapes
    firsts[name] = performance.now() - start;
  }
  for (let round = 0; round < rounds; round++) {
    for (const [name, model] of Object.entries(models)) {
      const start = performance.now();
      await model.run(inputs);
      times[name].push(performance.now() - start);
    }
  }
  for (const model of Object.values(models)) model.dispose();
  return { times, firsts };
}"""


def model_times(bundles: list[Path], feeds: dict[str, list[int]], rounds: int) -> None:
    with tempfile.TemporaryDirectory(prefix="relaxweb-ceiling-") as page_dir:
        (Path(page_dir) / "index.html").write_text(RUNNER_PAGE)
        shutil.copytree(bundles[1], Path(page_dir) / "new")  # the server follows no links
        server = start_server(bundles[0], page_dir=page_dir)
        try:
            with sync_playwright() as playwright:
                browser = launch_chromium(playwright)
                try:
                    page = browser.new_page()
                    page.set_default_timeout(0)
                    page.goto(server.url)
                    page.wait_for_function("window.relaxwebReady === true")
                    result = page.evaluate(MODELS_PAGE, {"feeds": feeds, "rounds": rounds})
                finally:
                    browser.close()
        finally:
            stop_server(server)
    print(f"Chromium (SwiftShader), inputs {feeds}, first run then {rounds} interleaved rounds:")
    for name, bundle in zip(("old", "new"), bundles):
        ms = result["times"][name]
        print(f"  {bundle}: first run {result['firsts'][name]:.0f} ms, best {min(ms):.0f} ms"
              f"  (ms: {', '.join(f'{t:.0f}' for t in ms)})")


def matmul_model(size: int):
    weight = np.random.default_rng(0).standard_normal((size, size), dtype=np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])], "matmul",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [size, size])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [size, size])],
        [numpy_helper.from_array(weight, "w")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def conv_model(channels_in: int, channels_out: int, height: int, width: int):
    rng = np.random.default_rng(0)
    weight = rng.standard_normal((channels_out, channels_in, 3, 3), dtype=np.float32)
    bias = rng.standard_normal(channels_out, dtype=np.float32)
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w", "b"], ["y"], pads=[1, 1, 1, 1])], "conv",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, channels_in, height, width])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, channels_out, height, width])],
        [numpy_helper.from_array(weight, "w"), numpy_helper.from_array(bias, "b")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def compiled(name: str, model) -> Path:
    WORK.mkdir(parents=True, exist_ok=True)
    path = WORK / f"{name}.onnx"
    onnx.save(model, path)
    bundle = WORK / name
    build(str(path), str(bundle))
    return bundle


def speed(rounds: int) -> None:
    size, (cin, cout, height, width) = 1024, (80, 80, 80, 80)
    cases = [
        ("matmul", compiled("matmul", matmul_model(size)), {"M": size, "N": size, "K": size},
         {"name": "x", "shape": [size, size], "size": size * size}, 2 * size ** 3),
        ("conv", compiled("conv", conv_model(cin, cout, height, width)), {"I": cin, "O": cout, "H": height, "W": width},
         {"name": "x", "shape": [1, cin, height, width], "size": cin * height * width}, 2 * cout * height * width * cin * 9),
    ]
    script = (BENCH_DIR / "kernel_ceiling.js").read_text()
    for family, bundle, shape, input_, flops in cases:
        with open_runner_page(bundle, timeout_s=600) as page:
            page.add_script_tag(content=script)
            page.set_default_timeout(0)
            results = page.evaluate(SPEED_PAGE, {"family": family, "shape": shape, "input": input_, "output": "y",
                                                 "flops": flops, "rounds": rounds})
        medians = {name: flops / statistics.median(r["ms"]) / 1e6 for name, r in results.items()}
        ceiling = max(r["gflops"] for name, r in results.items() if name != "relaxweb")
        median_ceiling = max(g for name, g in medians.items() if name != "relaxweb")
        print(f"{family} {shape}: {rounds} interleaved rounds; GFLOP/s of the best and of the median run")
        for name, r in results.items():
            ms = ", ".join(f"{t:.0f}" for t in r["ms"])
            print(f"  {name:12s} best {r['gflops']:5.2f} ({r['gflops'] / ceiling:4.0%} of the ceiling)"
                  f"  median {medians[name]:5.2f} ({medians[name] / median_ceiling:4.0%})  ms: {ms}")


def compile_times(bundles: list[Path], rounds: int) -> None:
    sources = {str(b): [f.read_text() for f in sorted((b / "kernels").glob("*.wgsl"))] for b in bundles}
    for name, texts in sources.items():
        print(f"{name}: {len(texts)} kernels, {sum(len(t.encode()) for t in texts)} bytes of WGSL")
    with open_runner_page(bundles[0], timeout_s=600) as page:
        page.set_default_timeout(0)
        chromium = page.evaluate(COMPILE_PAGE, {"bundles": sources, "rounds": rounds})
    print(f"Chromium (SwiftShader), createComputePipelineAsync of every kernel, {rounds} interleaved rounds:")
    for name, ms in chromium.items():
        print(f"  {name}: best {min(ms):.0f} ms  (ms: {', '.join(f'{t:.0f}' for t in ms)})")
    device = wgpu.gpu.request_adapter_sync(power_preference="high-performance").request_device_sync()
    lavapipe: dict[str, list[float]] = {name: [] for name in sources}
    for round_ in range(rounds):
        for name, texts in sources.items():
            start = time.perf_counter()
            for text in texts:
                module = device.create_shader_module(code=f"{text}\n// round {round_}\n")
                device.create_compute_pipeline(layout="auto", compute={"module": module, "entry_point": "main"})
            lavapipe[name].append((time.perf_counter() - start) * 1000)
    print(f"wgpu (lavapipe), create_compute_pipeline of every kernel, {rounds} interleaved rounds:")
    for name, ms in lavapipe.items():
        print(f"  {name}: best {min(ms):.0f} ms  (ms: {', '.join(f'{t:.0f}' for t in ms)})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    speed_parser = commands.add_parser("speed", help="generated matmul and convolution against the ceiling")
    speed_parser.add_argument("--rounds", type=int, default=3)
    compile_parser = commands.add_parser("compile", help="WGSL bytes and pipeline creation time of two bundles")
    compile_parser.add_argument("bundles", nargs=2, type=Path)
    compile_parser.add_argument("--rounds", type=int, default=3)
    models_parser = commands.add_parser("models", help="run time of two bundles of one model, alternately")
    models_parser.add_argument("bundles", nargs=2, type=Path)
    models_parser.add_argument("--input", action="append", required=True, help="NAME=D0,D1,... (float32)")
    models_parser.add_argument("--rounds", type=int, default=3)
    arguments = parser.parse_args()
    if arguments.command == "speed":
        speed(arguments.rounds)
    elif arguments.command == "compile":
        compile_times(arguments.bundles, arguments.rounds)
    else:
        feeds = {name: [int(d) for d in dims.split(",")] for name, dims in (i.split("=") for i in arguments.input)}
        model_times(arguments.bundles, feeds, arguments.rounds)


if __name__ == "__main__":
    main()
