#!/usr/bin/env python3
"""Greedy tokens of Kinetic's reference runtime against llama.cpp's golden continuations.

For every raw and chat case of both real models, feeds the golden prompt ids, generates greedily as
many tokens as llama.cpp did, and prints per case how many agree before the first divergence and
whether that divergence is a near-tie (top-2 within 0.1 nats); a divergence that is not gets the
float64 ground truth at that step (SmolLM2: benchmarks/perplexity_f64.py, variant "actq"), which
accepts it when the truth's gap is below 0.1 nats or picks our token (conformance.with_truth, the
rule tests/runtime/test_conformance.py applies). Exit 1 if any case fails.
--numerics picks the numerics mode (kinetic/ir/orders.py: "ggml", llama.cpp's decode-path orders, or
"fast"); without it, the default mode.

    python scripts/conformance.py [--model smollm2-135m|gemma3-270m] [--f32] [--numerics ggml|fast]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import kinetic
from kinetic.frontend.blocks import Options
from kinetic.ir.orders import NUMERICS
from kinetic.runtime.conformance import compare, with_truth

GOLDEN = Path(__file__).resolve().parent.parent / "tests" / "data" / "golden"
FILES = {"smollm2-135m": "smollm2-135m-instruct-q4_1.json", "gemma3-270m": "gemma-3-270m-q4_k_m.json"}
TRUTH_MODELS = ("smollm2-135m",)  # models benchmarks/perplexity_f64.py runs in float64
BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"


def truth_logits(model: kinetic.Model, tokens: list[int]):
    """The float64 ground truth's logits after `tokens` (benchmarks/perplexity_f64.py, "actq")."""
    if str(BENCHMARKS) not in sys.path:
        sys.path.insert(0, str(BENCHMARKS))  # it imports its sibling perplexity_common
    import perplexity_f64

    return perplexity_f64.logits_after(str(model.path), tokens)


def run_model(name: str, options: Options) -> bool:
    model = kinetic.Model(name, options=options)
    print(f"{name}: numerics {model.options.numerics}", flush=True)
    engine = model.engine
    golden = json.loads((GOLDEN / FILES[name]).read_text())
    all_ok = True
    for kind in ("raw", "chat"):
        for i, case in enumerate(golden[kind]):
            start = time.perf_counter()
            seq = engine.new_sequence()
            ours = list(engine.greedy(seq, case["prompt_ids"], len(case["ids"])))
            seconds = time.perf_counter() - start
            result = compare(ours, case["ids"], case["top2"])
            if result.needs_truth and name in TRUTH_MODELS:
                result = with_truth(result, truth_logits(model, case["prompt_ids"] + case["ids"][:result.diverged_at]))
            all_ok &= result.ok
            truth = "" if result.truth_gap is None else f", float64 truth's gap {result.truth_gap:.3f}"
            verdict = "all agree" if result.diverged_at is None else (
                f"diverges at {result.diverged_at} ({'near-tie' if result.near_tie else 'NOT a near-tie'}, "
                f"gap {result.gap:.3f}{truth})" if result.gap is not None else "too short")
            print(f"{name:13} {kind}[{i}]  {result.agreed:2d}/{result.total} agree  {verdict}  "
                  f"({len(ours)} tokens in {seconds:.1f} s)", flush=True)
    return all_ok


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=sorted(FILES), action="append")
    parser.add_argument("--f32", action="store_true", help="float activations instead of ggml's 8-bit ones")
    parser.add_argument("--numerics", choices=NUMERICS, help="the numerics mode (default: the engine's default)")
    args = parser.parse_args()
    options = Options(activations="f32" if args.f32 else "q8", numerics=args.numerics)
    ok = all([run_model(m, options) for m in (args.model or sorted(FILES, reverse=True))])
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
