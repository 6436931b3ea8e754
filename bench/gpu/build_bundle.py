"""Builds the bundle that carries the CUDA vLLM (and what `slotune tune --local` imports) to a GPU
machine that has no network: PyPI wheels, installed into one folder, stripped, packed as
`.tar.xz` and split into chunks small enough for one device call each.

Run here, where PyPI is reachable; the output goes to `bench/gpu/.bundle/` (ignored by git):
one folder per chunk (`1/`, `2/`, ...) so that each call carries exactly one, plus
`manifest.txt` (sha256 of the whole archive) in `1/`. `bench/gpu/on-device.sh` joins and
unpacks them there.

The device image already holds torch 2.11 (cu130), triton, transformers and most of the
scientific stack (the list below is the image's package list from the device README); only
what it lacks is fetched. The requirement closure is walked from the wheels' own metadata
for CPython 3.12 on x86-64 Linux. vLLM's optional kernel packages are left out, and so is
the FlashAttention-2 library (Hopper runs FlashAttention-3) and the `vllm-rs` binary.
"""

from __future__ import annotations

import argparse
import hashlib
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

from packaging.markers import Marker
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

VLLM = "vllm==0.24.0"
# What `slotune tune --local` imports that the image lacks (pyproject pins).
SLOTUNE_ROOTS = ("optuna==5.0.0", "pydantic==2.14.4")

IMAGE_PACKAGES = """
absl-py accelerate aiofiles aiohappyeyeballs aiohttp aiosignal annotated-doc anyio attrs
botorch build certifi charset-normalizer chex click cloudpickle cmake colorama contourpy
coverage cuda-bindings cuda-core cuda-pathfinder cuda-toolkit cupy-cuda13x cycler cython
diffrax e3nn einops equinox etils execnet filelock flatbuffers flax fonttools formulaic
frozenlist fsspec gpytorch grpcio h11 h5py hf-xet httpcore httpx huggingface-hub humanize
hypothesis idna imageio iniconfig interface-meta jax jax-cuda13-pjrt jax-cuda13-plugin jaxlib
jaxtyping jinja2 joblib kiwisolver lazy-loader lightning lightning-utilities linear-operator
lineax llvmlite lxml markdown markdown-it-py markupsafe matplotlib mdurl meson ml-dtypes
mpi4py mpmath msgpack multidict multipledispatch mypy-extensions nanobind narwhals networkx
ninja numba numba-cuda numpy numpyro nvidia-cublas nvidia-cuda-cupti nvidia-cuda-nvrtc
nvidia-cuda-runtime nvidia-cudnn-cu13 nvidia-cufft nvidia-cufile nvidia-curand
nvidia-cusolver nvidia-cusparse nvidia-cusparselt-cu13 nvidia-ml-py nvidia-nccl-cu13
nvidia-nvjitlink nvidia-nvshmem-cu13 nvidia-nvtx onnx onnx-ir onnxruntime onnxscript
opencv-python-headless optax opt-einsum opt-einsum-fx optimistix orbax-checkpoint packaging
pandas pathspec patsy peft pillow pip pluggy portalocker prometheus-client propcache protobuf
psutil pyarrow pybind11 py-cpuinfo pygments pyparsing pyproject-hooks pyre-extensions pytest
pytest-benchmark pytest-cov pytest-mock pytest-timeout pytest-xdist python-dateutil
pytorch-lightning pyyaml regex requests rich sacrebleu safetensors scikit-build-core
scikit-image scikit-learn scipy seaborn sentencepiece sentence-transformers setuptools
shellingham simplejson six sortedcontainers statsmodels sympy tabulate tensorboard
tensorboard-data-server tensorstore threadpoolctl tifffile tiktoken timm tokenizers toolz torch
torchaudio torchdiffeq torch-geometric torchmetrics torchvision tqdm transformers treescope
triton typer typing-extensions typing-inspect urllib3 uvloop wadler-lindig werkzeug wheel wrapt
xarray xxhash yarl zipp
""".split()  # noqa: SIM905 - the device README's list, pasted as is

# vLLM's optional kernel packages (not needed to serve a Llama on Hopper with FLASH_ATTN).
LEFT_OUT = {
    "flashinfer-cubin",
    "tilelang",
    "nvidia-cutlass-dsl",
    "quack-kernels",
    "tokenspeed-mla",
    "humming-kernels",
    "nvidia-cudnn-frontend",
    "fastsafetensors",
}
# Versions the walk must not take as it finds them: the newest xgrammar (0.2.6+) needs
# apache-tvm-ffi >= 0.1.10, but vLLM 0.24 pins apache-tvm-ffi==0.1.9; with 0.2.9 the engine
# exits at start ("load_lib_module() got an unexpected keyword argument 'extra_lib_paths'").
OVERRIDES = {
    "xgrammar": "xgrammar==0.2.5.post1",
    # 1.45.3 came out after the SDK 1.45.2 that vLLM's requirement picks, which pins its API.
    "opentelemetry-api": "opentelemetry-api==1.45.2",
}
STRIPPED = ("vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so", "vllm/vllm-rs")

PLATFORMS = [f"manylinux_2_{n}_x86_64" for n in (39, 38, 36, 35, 34, 31, 28, 27, 24, 17, 12, 5)] + [
    "manylinux2014_x86_64",
    "manylinux2010_x86_64",
    "manylinux1_x86_64",
    "linux_x86_64",
]
ENVIRONMENT = {
    "python_version": "3.12",
    "python_full_version": "3.12.3",
    "sys_platform": "linux",
    "platform_system": "Linux",
    "platform_machine": "x86_64",
    "os_name": "posix",
    "implementation_name": "cpython",
    "platform_python_implementation": "CPython",
}
CHUNK_BYTES = 58 * 1024 * 1024


def download(spec: str, into: Path) -> Path:
    """One wheel (no dependencies) for CPython 3.12 on x86-64 Linux; returns its path."""
    before = set(into.glob("*.whl"))
    platforms = [arg for p in PLATFORMS for arg in ("--platform", p)]
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
         "--python-version", "3.12", "--implementation", "cp", *platforms, "-d", str(into),
         spec],
        check=True,
    )  # fmt: skip
    new = set(into.glob("*.whl")) - before
    name = canonicalize_name(Requirement(spec).name)
    found = new or {w for w in into.glob("*.whl") if _wheel_name(w) == name}
    return sorted(found)[0]


def _wheel_name(wheel: Path) -> str:
    return canonicalize_name(wheel.name.split("-")[0])


def requirements(wheel: Path, extras: set[str]) -> list[Requirement]:
    """The wheel's Requires-Dist that apply on the device (with the asked-for extras)."""
    with zipfile.ZipFile(wheel) as archive:
        meta = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
        text = archive.read(meta).decode()
    found = []
    for line in text.splitlines():
        if not line.startswith("Requires-Dist:"):
            continue
        req = Requirement(line.split(":", 1)[1].strip())
        marker: Marker | None = req.marker
        if marker is None or any(
            marker.evaluate({**ENVIRONMENT, "extra": extra}) for extra in (extras or {""})
        ):
            found.append(req)
    return found


def closure(wheels: Path) -> list[Path]:
    """vLLM and slotune's roots plus every requirement the image lacks, as wheels."""
    have = {canonicalize_name(n) for n in IMAGE_PACKAGES}
    skip = have | LEFT_OUT
    queue = [Requirement(s) for s in (*SLOTUNE_ROOTS, VLLM)]
    seen: dict[str, Path] = {}
    while queue:
        req = queue.pop(0)
        name = canonicalize_name(req.name)
        if name in seen or name in skip:
            continue
        spec = OVERRIDES.get(name, f"{req.name}{req.specifier}")
        print(f"Fetching {spec}", flush=True)
        seen[name] = download(spec, wheels)
        queue += requirements(seen[name], set(req.extras))
    check_consistent(list(seen.values()))
    return list(seen.values())


def check_consistent(wheels: list[Path]) -> None:
    """Every bundled wheel's requirements hold for the bundled versions (the walk takes the
    first version it meets; a later, stricter requirement is caught here, not at start-up)."""
    versions = {_wheel_name(w): Version(w.name.split("-")[1]) for w in wheels}
    problems = [
        f"{w.name}: needs {req}, the bundle has {versions[canonicalize_name(req.name)]}"
        for w in wheels
        for req in requirements(w, set())
        if canonicalize_name(req.name) in versions
        and not req.specifier.contains(versions[canonicalize_name(req.name)], prereleases=True)
    ]
    if problems:
        listed = "\n  ".join(problems)
        raise SystemExit(f"Inconsistent bundle (add an OVERRIDES entry):\n  {listed}")


def install(wheels: list[Path], site: Path) -> None:
    """Installs the wheels, unpacked, into one folder for PYTHONPATH."""
    platforms = [arg for p in PLATFORMS for arg in ("--platform", p)]
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-compile",
         "--only-binary=:all:", "--python-version", "3.12", "--implementation", "cp",
         *platforms, "--target", str(site), *map(str, wheels)],
        check=True,
    )  # fmt: skip
    for rel in STRIPPED:
        (site / rel).unlink()
    shutil.rmtree(site / "bin", ignore_errors=True)


def pack(site: Path, bundle: Path) -> None:
    """site.tar.xz, split into chunk folders 1/, 2/, ..., with the archive's sha256."""
    archive = bundle.parent / ".build" / "site.tar.xz"
    print(f"Packing {site} (xz, a few minutes)", flush=True)
    pipeline = f"tar -C {site} -cf - . | xz -T0 -6 > {archive}"
    subprocess.run(pipeline, shell=True, check=True)  # noqa: S602 - our own paths, a pipe
    digest = hashlib.sha256(archive.read_bytes()).hexdigest()
    shutil.rmtree(bundle, ignore_errors=True)
    data = archive.read_bytes()
    count = (len(data) + CHUNK_BYTES - 1) // CHUNK_BYTES
    for index in range(count):
        folder = bundle / str(index + 1)
        folder.mkdir(parents=True)
        part = data[index * CHUNK_BYTES : (index + 1) * CHUNK_BYTES]
        (folder / f"site.tar.xz.{index + 1:02d}").write_bytes(part)
    (bundle / "1" / "manifest.txt").write_text(f"{digest}  site.tar.xz\nchunks {count}\n")
    print(f"Wrote {count} chunks of at most {CHUNK_BYTES >> 20} MiB ({len(data) >> 20} MiB)")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    here = Path(__file__).resolve().parent
    parser.add_argument("--work", type=Path, default=here / ".build")
    parser.add_argument("--bundle", type=Path, default=here / ".bundle")
    args = parser.parse_args()
    wheels = args.work / "wheels"
    site = args.work / "site"
    wheels.mkdir(parents=True, exist_ok=True)
    chosen = closure(wheels)
    sizes = sum(w.stat().st_size for w in chosen)
    print(f"{len(chosen)} wheels, {sizes >> 20} MiB:")
    for wheel in sorted(chosen):
        print(f"  {wheel.name}  {wheel.stat().st_size >> 10} KiB")
    shutil.rmtree(site, ignore_errors=True)
    install(chosen, site)
    (args.work / "wheels.txt").write_text("\n".join(sorted(w.name for w in chosen)) + "\n")
    shutil.copy(args.work / "wheels.txt", site / "slotune-bundle-wheels.txt")
    pack(site, args.bundle)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
