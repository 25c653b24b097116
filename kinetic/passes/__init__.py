"""Graph -> Graph rewrites, run by one explicit pipeline (kinetic/passes/pipeline.py).

Owns: canonicalization, common-subexpression and dead-code elimination, fusion, the rule engine they
share, the pipeline with its options and hash, and the device phase (a device's fused forms, gated by
the fusions it declares: device_fusion.py). Does not own device code: passes only rewrite the
IR, and every rewrite here is exact (bit for bit the same results on every input).
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
