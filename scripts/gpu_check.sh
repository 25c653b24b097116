#!/usr/bin/env bash
# The CUDA checks for a machine with an NVIDIA GPU (issue 10). Two steps:
#
#   scripts/gpu_check.sh --fetch-wheels   here, with PyPI: the packages the GPU machine's image lacks
#                                         (gguf, pyyaml; the image has numpy, CuPy, NVRTC, llvmlite, pytest) as
#                                         wheels in .whl/ (git-ignored through .git/info/exclude); carry
#                                         .whl to the GPU machine
#   scripts/gpu_check.sh                  on the GPU machine: installs what is missing (from .whl/ when
#                                         present, else from PyPI), then, in order:
#     1. the CUDA tests marked gpu (every kernel, and the whole runtime on SmolLM2, against the IR
#        reference, bit for bit; the whole-model ones need the real models in Kinetic's models
#        folder and are left out, saying so, where they are not: the device machine cannot download
#        them, and a working tree over 64 MiB does not travel);
#     2. the GEMV bandwidth benchmark (python -m kinetic.codegen.cuda.bench);
#     3. the runtime on generated llama models (benchmarks/cuda_runtime.py --make): a tiny one per
#        weight type checked bit for bit against the reference interpreter for 4 steps, then decode
#        speed and the share of the GPU's bandwidth on 1B- and 3B-class models (Q4_0, Q4_K, Q8_0),
#        and a model split between the CPU and the GPU (-ngl);
#     4. where the real models are here: `kinetic bench --device cuda` on both;
#     5. mixture of experts (benchmarks/cuda_moe.py --make): a tiny qwen3moe checked bit for bit against
#        the CPU, then docs/moe.md's benchmark shape (32 experts top-4, Q4_0): decode tokens/s with every
#        expert on the GPU and with Flywheel caching a quarter of them (KINETIC_GPU_BYTES), logits
#        checked against the CPU's. (Step 1 runs the MoE tests marked gpu: the synthetic MoE files on
#        the GPU, all experts and a quarter, against the CPU.)
#
# Takes about five minutes. Results go to $OUT when set (the device tool's folder), else ./gpu-check/.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}

if [[ "${1:-}" == "--fetch-wheels" ]]; then
    mkdir -p .whl
    grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo '/.whl/' >>.git/info/exclude
    exec "$PY" -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 -d .whl "gguf>=0.17,<0.30" pyyaml
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
models=$("$PY" -c '
from kinetic import hub
names = {"smollm2-135m": "smollm2-135m", "gemma3-270m": "gemma-3-270m"}
files = [p.name.lower() for p in hub.models_dir().glob("*.gguf")]
print(" ".join(n for n, stem in names.items() if any(f.startswith(stem) for f in files)))')
skip=()
if [[ -z "$models" ]]; then
    echo "the real models are not in Kinetic's models folder: the whole-model tests (test_cuda_model.py) are" \
         "left out; step 3 checks the runtime on generated models"
    skip=(--ignore tests/codegen/cuda/test_cuda_model.py)
fi
# the GPU tests only: CI already runs everything else (the emulation) on every commit
timeout 400 "$PY" -m pytest -q -p no:cacheprovider -rs -m gpu tests/codegen/cuda "${skip[@]}" 2>&1 \
    | tee "$out/pytest.txt" || status=1
timeout 120 "$PY" -m kinetic.codegen.cuda.bench 2>&1 | tee "$out/gemv-bench.txt" || status=1
{
    for t in Q4_0 Q4_1 Q5_0 Q8_0 Q4_K Q6_K; do
        timeout 120 "$PY" benchmarks/cuda_runtime.py --make tiny --type "$t" --check 4 --tokens 32 || status=1
    done
    for shape in 1b 3b; do
        for t in Q4_0 Q4_K Q8_0; do
            timeout 300 "$PY" benchmarks/cuda_runtime.py --make "$shape" --type "$t" --tokens 128 || status=1
        done
    done
    # a split: the first 14 of 28 layers on the CPU (checked against the reference on the tiny model first)
    timeout 120 "$PY" benchmarks/cuda_runtime.py --make tiny --type Q4_K --check 4 --tokens 16 -ngl 1 || status=1
    timeout 300 "$PY" benchmarks/cuda_runtime.py --make 3b --type Q4_0 --tokens 32 -ngl 14 || status=1
} 2>&1 | tee "$out/runtime.txt"
{
    timeout 120 "$PY" benchmarks/cuda_moe.py --make tiny --tokens 8 || status=1
    timeout 300 "$PY" benchmarks/cuda_moe.py --make bench --tokens 64 || status=1
} 2>&1 | tee "$out/moe.txt"
for name in $models; do
    timeout 300 "$PY" -m kinetic.cli.main bench "$name" --device cuda -r 3 --edit-tokens 0 2>&1 | tee -a "$out/bench.txt" \
        || status=1
done
exit $status
