"""Tokenizer speed: build time (cold and cached) and tokenizing 100 kB of English, per model.

Run: python benchmarks/tokenize_speed.py [--models smollm2-135m gemma3-270m]
The text is tests/data/golden/apache-2.0.txt repeated to at least 100,000 bytes. Each timing is the
best of --repeat runs. Prints one line per measurement; the target is under 1 s for 100 kB.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from kinetic import hub
from kinetic.frontend.gguf_file import open_gguf
from kinetic.frontend.tokenizer import Tokenizer

TEXT = Path(__file__).resolve().parent.parent / "tests" / "data" / "golden" / "apache-2.0.txt"


def english_100kb() -> str:
    base = TEXT.read_text(encoding="utf-8")
    text = base
    while len(text.encode("utf-8")) < 100_000:
        text += "\n" + base
    return text


def best_of(repeat: int, fn) -> tuple[float, object]:
    best, result = float("inf"), None
    for _ in range(repeat):
        start = time.perf_counter()
        result = fn()
        best = min(best, time.perf_counter() - start)
    return best, result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["smollm2-135m", "gemma3-270m"])
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    text = english_100kb()
    print(f"text: {len(text.encode('utf-8'))} bytes of English ({TEXT.name} repeated)")
    for name in args.models:
        path = hub.pull(name, out=lambda _line: None, progress=False)
        with tempfile.TemporaryDirectory() as cache:
            def build(path=path, cache=cache):
                return Tokenizer.from_gguf(open_gguf(path), cache_dir=Path(cache))

            cold, _ = best_of(1, build)
            cached, tok = best_of(args.repeat, build)
        seconds, ids = best_of(args.repeat, lambda tok=tok: tok.encode(text, add_special=False))
        special, _ = best_of(args.repeat, lambda tok=tok: tok.encode(text, parse_special=True))
        print(f"{name}: build cold {cold:.2f} s, cached {cached:.2f} s; "
              f"100 kB -> {len(ids)} tokens in {seconds * 1000:.0f} ms "
              f"({len(text) / seconds / 1e6:.2f} MB/s), with parse_special {special * 1000:.0f} ms")


if __name__ == "__main__":
    main()
