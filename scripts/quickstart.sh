#!/usr/bin/env bash
# Install relaxweb, then build and run the example MLP (the README's first command).
#
# Where it installs: into the active virtual environment when there is one, else into .venv/
# here (made on first use), never into a Python that other projects share. It installs this
# checkout as a package (pip install ., not editable). An active environment that already has
# relaxweb from somewhere else (another checkout, a release) is left as it is: the script says
# so and stops; run it with --replace to install this checkout there anyway.
#
# On a machine without a GPU, the Python runtime runs WebGPU on Mesa's lavapipe (a Vulkan
# driver on the CPU); it is installed from Debian's packages when missing and we are root.
set -euo pipefail
cd "$(dirname "$0")/.."
here="$(pwd -P)"

replace=no
for argument in "$@"; do
  case "$argument" in
    --replace) replace=yes ;;
    *) echo "usage: bash scripts/quickstart.sh [--replace]" >&2; exit 2 ;;
  esac
done

if ! ls /usr/share/vulkan/icd.d/*.json >/dev/null 2>&1 && command -v apt-get >/dev/null && [ "$(id -u)" = 0 ]; then
  echo "installing a Vulkan driver (mesa-vulkan-drivers) for WebGPU on the CPU..."
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq mesa-vulkan-drivers >/dev/null
fi

if [ -n "${VIRTUAL_ENV:-}" ]; then
  python="$VIRTUAL_ENV/bin/python"
  where="the active virtual environment ($VIRTUAL_ENV)"
else
  if [ ! -x .venv/bin/python ]; then
    echo "making a virtual environment for relaxweb in .venv/ ..."
    python3 -m venv .venv
  fi
  python="$here/.venv/bin/python"
  where="$here/.venv/ (activate it with: source .venv/bin/activate)"
fi

# relaxweb already in that environment (its own site-packages, not one it inherits), and from where
# (-I: not the checkout's own relaxweb.egg-info, which a pip install here leaves in the current folder)
installed_from="$("$python" -I - <<'EOF'
import importlib.metadata, json, sys, sysconfig
from pathlib import Path
try:
    dist = importlib.metadata.distribution("relaxweb")
except importlib.metadata.PackageNotFoundError:
    sys.exit(0)
if Path(str(dist.locate_file(""))).resolve() != Path(sysconfig.get_paths()["purelib"]).resolve():
    sys.exit(0)  # inherited from outside the environment: an install here only shadows it
url = json.loads(dist.read_text("direct_url.json") or "{}").get("url", "")
print(url.removeprefix("file://") if url.startswith("file://") else f"release {dist.version}")
EOF
)"
if [ -n "$installed_from" ] && [ "$installed_from" != "$here" ] && [ "$replace" = no ]; then
  echo "relaxweb is already installed in $where, from $installed_from." >&2
  echo "This script leaves it as it is. To install this checkout ($here) there instead, run:" >&2
  echo "  bash scripts/quickstart.sh --replace" >&2
  echo "or deactivate the environment to use a virtual environment of its own (.venv/)." >&2
  exit 1
fi

echo "installing relaxweb from $here into $where ..."
"$python" -m pip install -q .
bin="$(dirname "$python")"
"$python" examples/make_mlp.py
"$bin/relaxweb" build examples/mlp.onnx -o dist/mlp --bound batch=64
"$bin/relaxweb" run dist/mlp --inputs examples/mlp_inputs.npz --out dist/mlp_outputs.npz
echo "relaxweb is installed in $where"
echo "next: relaxweb serve dist/mlp   (then open the printed URL in a WebGPU browser)"
