"""qwen35's prediction block as RAD-1's "mtp" drafter: decode tokens/s with drafting off, on (the
policy choosing among context and seen, then with mtp too), and with the mtp drafter forced on every step, and how
many of its guesses were kept (docs/rad1.md, "A model's prediction block").

    python benchmarks/mtp.py [--model PATH] [--device cpu] [--tokens 64] [--repeat 3]

The default model is the synthetic qwen35 file (random weights: its block is untrained, so its
guesses are rarely right; this shows the mechanism and its cost, not a trained block's speed-up).
Every run's tokens are checked equal to plain decoding's.
"""

from __future__ import annotations

import argparse
import statistics
import time

from kinetic.compiler import compile_graph
from kinetic.frontend.blocks import Options
from kinetic.frontend.gguf_file import open_gguf
from kinetic.numerics_mode import default_numerics
from kinetic.runtime import speculative
from kinetic.runtime.drafting import DraftPolicy, ForcedDraft, NgramIndex
from kinetic.runtime.engine import Engine
from kinetic.runtime.speculative import SpeculativeDecoder
from kinetic.runtime.weights import GGUFWeights

SYNTHETIC = "/work/shared/golden/synthetic/qwen35/qwen35.gguf"
PROMPT = [504, 613, 901, 278, 720, 94, 275, 1324, 544, 382, 851, 690, 504, 613]


def run(engine: Engine, mode: str, tokens: int, max_rows: int) -> tuple[list[int], float, dict]:
    """(tokens, decode tokens/s from the first generated token to the last, per-source [guessed, kept])."""
    policy, drafters_for = speculative.DraftPolicy, speculative.drafters_for
    speculative.DraftPolicy = ForcedDraft if mode == "forced" else DraftPolicy
    if mode == "no-mtp":
        speculative.drafters_for = lambda *a: [d for d in drafters_for(*a) if d.name != "mtp"]
    try:
        decoder = SpeculativeDecoder(engine, draft=mode != "off", max_rows=max_rows, seen=NgramIndex(1 << 12, (4, 2)))
        out, first = [], None
        for token in decoder.generate(engine.new_sequence(), PROMPT, tokens):
            first = first or time.perf_counter()
            out.append(token)
        return out, (len(out) - 1) / (time.perf_counter() - first), decoder.stats.by_source
    finally:
        speculative.DraftPolicy, speculative.drafters_for = policy, drafters_for


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=SYNTHETIC)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--max-rows", type=int, default=4, help="guessed rows a pass verifies at most")
    args = ap.parse_args()
    gguf = open_gguf(args.model)
    options = Options(numerics=default_numerics(args.device))  # what Model compiles for the device
    engine = Engine(compile_graph(gguf, options), GGUFWeights(gguf), n_ctx=512, device=args.device, threads=1)
    plain, _, _ = run(engine, "off", args.tokens, args.max_rows)  # also warms the kernels up
    run(engine, "forced", 8, args.max_rows)
    for mode in ("off", "no-mtp", "policy", "forced"):
        speeds, counts = [], {}
        for _ in range(args.repeat):
            out, speed, by_source = run(engine, mode, args.tokens, args.max_rows)
            assert out == plain, f"{mode}: drafted tokens differ from plain decoding's"
            speeds.append(speed)
            counts = by_source
        mtp = counts.get("mtp", [0, 0])
        rate = f"{mtp[1]} of {mtp[0]} mtp guesses kept" if mtp[0] else "no mtp guess verified"
        print(f"{mode:7} {statistics.median(speeds):7.1f} t/s (median of {args.repeat}: "
              f"{', '.join(f'{s:.1f}' for s in speeds)})  {rate}; all sources {counts}")


if __name__ == "__main__":
    main()
