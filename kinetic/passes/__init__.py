"""Graph -> Graph rewrites, run by one explicit pipeline (kinetic/passes/pipeline.py).

Owns: canonicalization, common-subexpression and dead-code elimination, fusion, batch invariance
(every reduction's order written into the IR), the rule engine they share, the pipeline with its
options and hash, the device phase (a device's fused forms, gated by the fusions it declares:
device_fusion.py) and cutting a graph between layers (split.py). Does not own device code: passes
only rewrite the IR, and every rewrite here is exact (bit for bit the same results on every input).
docs/ir.md, "Passes", describes each one.

    rewrite.py           Pat, Rule, Match, apply_rules: patterns and the engine that applies rule lists
    canonicalize.py      exact algebraic simplifications, then dead-code elimination and renumber
    cse.py               one node per distinct computation
    dce.py               drop what no output depends on
    fusion.py            silu/gelu(gate) * up -> swiglu/geglu
    batch_invariance.py  assign_reduction_orders: each reduction's per-row order (kinetic/ir/orders.py)
    pipeline.py          PassOptions, Phase, PIPELINE, run_pipeline, lower_for_device, pipeline_hash
    device_fusion.py     Fusions and the device phase's rules: add_rms_norm, rope_pair, quantize
    split.py             a model's graph cut into its first layers and the rest (CPU + GPU split)
"""

from kinetic.passes.canonicalize import canonicalize, renumber, simplify
from kinetic.passes.cse import eliminate_common_subexpressions
from kinetic.passes.dce import eliminate_dead_code
from kinetic.passes.device_fusion import Fusions
from kinetic.passes.fusion import fuse
from kinetic.passes.pipeline import PIPELINE, PassOptions, Phase, lower_for_device, pipeline_hash, run_pipeline
from kinetic.passes.rewrite import Match, Pat, Rule, apply_rules, pat, rule

__all__ = [
    "PIPELINE",
    "Fusions",
    "Match",
    "PassOptions",
    "Pat",
    "Phase",
    "Rule",
    "apply_rules",
    "canonicalize",
    "eliminate_common_subexpressions",
    "eliminate_dead_code",
    "fuse",
    "lower_for_device",
    "pat",
    "pipeline_hash",
    "renumber",
    "rule",
    "run_pipeline",
    "simplify",
]
