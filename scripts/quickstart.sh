#!/usr/bin/env bash
# Install relaxweb, then build and run the example MLP (the README's first command).
#
# On a machine without a GPU, the Python runtime runs WebGPU on Mesa's lavapipe (a Vulkan
# driver on the CPU); it is installed from Debian's packages when missing and we are root.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! ls /usr/share/vulkan/icd.d/*.json >/dev/null 2>&1 && command -v apt-get >/dev/null && [ "$(id -u)" = 0 ]; then
  echo "installing a Vulkan driver (mesa-vulkan-drivers) for WebGPU on the CPU..."
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq mesa-vulkan-drivers >/dev/null
fi

python3 -m pip install -q -e .
python3 examples/make_mlp.py
relaxweb build examples/mlp.onnx -o dist/mlp --bound batch=64
relaxweb run dist/mlp --inputs examples/mlp_inputs.npz --out dist/mlp_outputs.npz
echo "next: relaxweb serve dist/mlp   (then open the printed URL in a WebGPU browser)"
