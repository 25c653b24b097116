"""The two competing tokens' logit gap at a greedy divergence, three ways: Kinetic's fast and ggml
numerics modes and a float64 ground truth in each of benchmarks/perplexity_f64.py's variants (the same
quantized weights; "actq" is the one kinetic/runtime/conformance.py's with_truth judges by).

Owns only the comparison at one divergence step of a golden conformance case (tests/data/golden);
the forward passes belong to the engine and to perplexity_f64.py.

    PYTHONPATH=/work/main:benchmarks python benchmarks/conformance_f64.py smollm2-135m raw 2 9
"""

from __future__ import annotations

import sys

import numpy as np
import perplexity_f64 as f64  # beside this script


def main() -> None:
    name, kind, index, step = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    from tests.conftest import load_golden, model_path
    from tests.runtime.test_conformance import teacher_forced

    case = load_golden(name)[kind][index]
    prompt, ref = case["prompt_ids"], case["ids"]
    tokens = prompt + ref[:step]
    a = int(ref[step])  # llama.cpp's token
    rows = {}
    for mode in ("fast", "ggml"):
        logits = teacher_forced(name, tokens, len(tokens), mode)[-1]
        rows[mode] = logits.astype(np.float64)
    for variant in f64.VARIANTS:
        rows[f"f64-{variant}"] = f64.logits_after(str(model_path(name)), tokens, variant)
    b = int(rows["fast"].argmax()) if int(rows["fast"].argmax()) != a else int(np.argsort(rows["fast"])[-2])
    print(f"{name} {kind}[{index}] step {step}: llama.cpp token A={a}, competitor B={b}; "
          f"llama-server top2 {case['top2'][step]}")
    for key, row in rows.items():
        print(f"  {key:10s} A={row[a]:.6f} B={row[b]:.6f} gap A-B={row[a] - row[b]:+.6f} picks {int(row.argmax())}")


if __name__ == "__main__":
    main()
