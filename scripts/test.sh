#!/usr/bin/env bash
# Install what the tests need and run them all (the README's second command; CI runs it).
#
# Debian packages: chromium (headless WebGPU on SwiftShader for the browser tests) and
# mesa-vulkan-drivers (lavapipe, for wgpu in the Python runtime). Installed when missing
# and we are root; otherwise they must already be there.
set -euo pipefail
cd "$(dirname "$0")/.."

missing=()
command -v chromium >/dev/null || missing+=(chromium)
ls /usr/share/vulkan/icd.d/*.json >/dev/null 2>&1 || missing+=(mesa-vulkan-drivers)
command -v node >/dev/null || missing+=(nodejs)
if [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "installing Debian packages: ${missing[*]}"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
  else
    echo "missing: ${missing[*]} (install them, e.g. with apt-get, and run again)" >&2
    exit 1
  fi
fi

python3 -m pip install -q -e ".[test]"
# The JS side's devDependencies (package.json): vite and typescript for the npm package's tests
# (tests/runtime_js/test_npm_package.py), onnxruntime-web for the benchmarks.
npm install --no-audit --no-fund --loglevel=error
python3 -m pytest -q
npm test
# ONNX's operator test suite (all ~1900 cases, regenerated from the installed onnx package)
# through the whole compiler and the Python runtime: each case compiled once and its bundle run
# on wgpu and then on its kernels.wasm (wasmtime, no GPU), so the wasm backend must match ONNX's
# outputs wherever the WebGPU path does. Prints each backend's counts by status and fails on a
# wrong value, a crash or a timeout (docs/onnx-node-tests-gpu.md and -wasm.md have the tables).
python3 scripts/onnx_node_tests.py run --compiled --backend webgpu,wasm --check --timeout 120 \
  --cases .cache/ci-onnx-node-tests --out .cache/ci-onnx-node-tests/results.json --doc ""
