"""The identity checks every device runner passes on SmolLM2 (Vulkan, CUDA on its emulation and on a
GPU, a model split between the CPU and the GPU): each takes an Engine whose runner is the one
under test and asserts bit-for-bit equality with the reference interpreter or with itself."""

from __future__ import annotations

import numpy as np

from kinetic.ir.rows import PassRows
from kinetic.runtime.drafting import PassCosts
from kinetic.runtime.engine import Engine

PROMPT = [504, 3575, 282, 4649, 314, 7042]  # "The capital of France is Paris"
REPEATING = [81, 278, 265, 253, 278, 265, 253, 278, 265, 253]  # "a b c a b c a b c a": the drafter guesses


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    """The same float32 values bit for bit (NaN payloads and signed zeros included)."""
    a, b = np.ascontiguousarray(a, np.float32), np.ascontiguousarray(b, np.float32)
    return a.shape == b.shape and np.array_equal(a.view(np.uint32), b.view(np.uint32))


def same_cache(a, b, layers, n: int) -> bool:
    """Keys and values of the given layers, the first n entries, bit for bit."""
    return all(np.array_equal(x[layer][:n].view(np.uint16), y[layer][:n].view(np.uint16))
               for layer in layers for x, y in ((a.k, b.k), (a.v, b.v)))


def greedy(engine: Engine, prompt: list[int], n: int):
    """Prompt then n greedy tokens: (tokens, the logits of every step, the sequence)."""
    seq = engine.new_sequence()
    logits = engine.prefill(seq, prompt)
    tokens, seen = [], [logits]
    for _ in range(n):
        tokens.append(int(np.argmax(logits)))
        logits = engine.decode(seq, tokens[-1])
        seen.append(logits)
    return tokens, seen, seq


def check_greedy_equals(engine: Engine, reference: Engine, n: int, layers=(0, 29)):
    """The same greedy tokens as the reference, bit-identical logits at every step, the same cache."""
    got_tokens, got_logits, seq = greedy(engine, PROMPT, n)
    ref_tokens, ref_logits, ref_seq = greedy(reference, PROMPT, n)
    assert got_tokens == ref_tokens
    for got, ref in zip(got_logits, ref_logits, strict=True):
        assert same_bits(got, ref)
    assert same_cache(seq.cache, ref_seq.cache, layers, seq.cache.length)
    return seq


def check_row_in_a_pass_equals_row_alone(engine: Engine, layers=(0, 29)) -> None:
    """Batch invariance: the prompt in one pass gives each row the logits it gets one token at a
    time, and the cache holds the same bits either way."""
    whole = engine.new_sequence()
    batched = engine.forward(PassRows.chain(PROMPT[:4], 0, outputs="all"), {0: whole})
    alone = engine.new_sequence()
    singles = np.stack([engine.decode(alone, t) for t in PROMPT[:4]])
    assert same_bits(batched, singles)
    assert same_cache(whole.cache, alone.cache, layers, 4)


class FixedCosts(PassCosts):
    """Pass costs that ignore the clock, so drafting decisions do not depend on the machine's load or
    the device's speed."""

    def observe(self, guessed_rows: int, seconds: float) -> None:
        pass


def check_drafted_equals_plain(engine: Engine, layers=(0, 29)) -> None:
    """Drafted greedy decoding (verify passes of draft rows with parents, keep() committing the
    runner's new cache rows) gives plain greedy's tokens with guesses kept, and leaves the cache bit
    for bit as plain decoding does."""
    from kinetic.runtime.drafting import NgramIndex
    from kinetic.runtime.speculative import GreedyPicker, SpeculativeDecoder, plain_decode

    plain_seq = engine.new_sequence()
    plain = list(plain_decode(engine, plain_seq, REPEATING, 12, picker=GreedyPicker()))
    decoder = SpeculativeDecoder(engine, max_rows=4, seen=NgramIndex(1 << 12, (4, 2)), costs=FixedCosts())
    seq = engine.new_sequence()
    drafted = list(decoder.generate(seq, REPEATING, 12, picker=GreedyPicker()))
    assert drafted == plain
    assert decoder.stats.accepted > 0 and decoder.stats.passes < len(plain) - 1
    n = seq.cache.length
    assert n == plain_seq.cache.length == len(REPEATING) + len(plain) - 1
    assert same_cache(seq.cache, plain_seq.cache, layers, n)


def check_tree_rows_equal_paths(engine: Engine, layers=(0, 29)) -> None:
    """A verify pass of a tree with branches (rows see the committed cache and their ancestors only):
    each row's logits are the bits its path gets decoded one token at a time; keep() of a path whose
    row moves down a slot, then a decode step that must read the moved row (a device keeping its own
    copy of the cache has to follow the host's move)."""
    prefix = REPEATING[:6]
    tokens, parents = [265, 253, 81, 278], [-1, 0, 0, 1]  # root, two children, a grandchild under the first
    seq = engine.new_sequence()
    engine.prefill(seq, prefix)
    rows = PassRows(tokens=np.asarray(tokens, np.int32), positions=np.asarray([6, 7, 7, 8], np.int32),
                    seqs=np.zeros(4, np.int32), parents=np.asarray(parents, np.int32),
                    output_rows=np.arange(4, dtype=np.int32))
    tree = engine.verify(seq, rows)
    alone = engine.new_sequence()  # the same rows decoded one at a time along each path
    engine.prefill(alone, prefix)
    want = {0: engine.decode(alone, 265), 1: engine.decode(alone, 253), 3: engine.decode(alone, 278)}
    engine.rollback(alone, 7)
    want[2] = engine.decode(alone, 81)
    for row in range(4):
        assert same_bits(tree[row], want[row]), row
    engine.keep(seq, [0, 2])  # row 2 moves from slot 8 to slot 7 on the host
    assert seq.tokens == alone.tokens == prefix + [265, 81]
    assert same_cache(seq.cache, alone.cache, layers, 8)
    assert same_bits(engine.decode(seq, 278), engine.decode(alone, 278))


def check_refuses_soft_capping(unsupported, graph) -> None:
    """A runner's `unsupported(graph)` accepts SmolLM2's graph and names soft-capping once an attention
    node asks for it (an op attribute no device kernel covers yet)."""
    from dataclasses import replace

    from kinetic.ir.ops import Op

    assert unsupported(graph) is None
    attention = next(n for n in graph.nodes if n.op is Op.ATTENTION)
    capped = replace(graph, nodes=[replace(n, attrs=replace(n.attrs, softcap=30.0)) if n is attention else n
                                   for n in graph.nodes])
    assert "soft-capping" in unsupported(capped)
