#!/usr/bin/env bash
# The CUDA checks for a machine with an NVIDIA GPU (issue 10). Two steps:
#
#   scripts/gpu_check.sh --fetch-wheels   here, with PyPI: the packages the GPU machine's image lacks
#                                         (gguf; the image has numpy, CuPy, NVRTC, llvmlite, pytest) as
#                                         wheels in .whl/ (git-ignored through .git/info/exclude); carry
#                                         .whl to the GPU machine
#   scripts/gpu_check.sh                  on the GPU machine: installs what is missing (from .whl/ when
#                                         present, else from PyPI), runs the CUDA tests (the GPU ones
#                                         compare every kernel with the IR reference, bit for bit), then
#                                         the GEMV bandwidth benchmark
#
# Takes about two minutes. Results go to $OUT when set (the device tool's folder), else ./gpu-check/.
# Not yet here: the identity gates and `kinetic bench --device cuda` on the real models, which need the
# CUDA runtime (issue 10, part 2); the script says so at the end.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}

if [[ "${1:-}" == "--fetch-wheels" ]]; then
    mkdir -p .whl
    grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo '/.whl/' >>.git/info/exclude
    exec "$PY" -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 -d .whl "gguf>=0.17,<0.30"
fi

if ! nvidia-smi -L >/dev/null 2>&1; then
    echo "no NVIDIA GPU here (nvidia-smi finds none): nothing to check, nothing installed" >&2
    exit 1
fi
out=${OUT:-gpu-check}
mkdir -p "$out"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv 2>&1 | tee "$out/gpu.txt"

missing=$("$PY" - <<'EOF'
import importlib.util
need = {"gguf": "gguf", "numpy": "numpy", "yaml": "pyyaml", "llvmlite": "llvmlite", "pytest": "pytest",
        "cupy": "cupy-cuda12x"}
print(" ".join(pkg for mod, pkg in need.items() if importlib.util.find_spec(mod) is None))
EOF
)
if [[ -n "$missing" ]]; then
    echo "installing: $missing"
    if compgen -G ".whl/*.whl" >/dev/null; then
        "$PY" -m pip install -q --no-index --no-deps --no-compile --target /tmp/kinetic-site .whl/*.whl || exit 1
        export PYTHONPATH=/tmp/kinetic-site${PYTHONPATH:+:$PYTHONPATH}
    else
        "$PY" -m pip install -q $missing nvidia-cuda-nvrtc-cu12 || { echo "cannot install: $missing"; exit 1; }
    fi
fi
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1

"$PY" - <<'EOF' 2>&1 | tee "$out/status.txt"
from kinetic.codegen.cuda import device, nvrtc
print("NVRTC", nvrtc.version(), "from", nvrtc.library()._name)
print("CUDA usable:", device.unavailable_reason() or "yes")
EOF

status=0
timeout 400 "$PY" -m pytest -q -p no:cacheprovider -rs tests/codegen/cuda 2>&1 | tee "$out/pytest.txt" || status=1
timeout 120 "$PY" -m kinetic.codegen.cuda.bench 2>&1 | tee "$out/gemv-bench.txt" || status=1
echo "not run yet: identity gates and 'kinetic bench --device cuda' (they need the CUDA runtime, issue 10 part 2)"
exit $status
