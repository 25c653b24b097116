"""Graph -> Graph rewrites, run by one explicit pipeline (kinetic/passes/pipeline.py).

Owns: canonicalization, common-subexpression and dead-code elimination, fusion, the rule engine they
share, and the pipeline with its options and hash. Does not own device code: passes only rewrite the
IR, and every rewrite here is exact (bit for bit the same results on every input).
"""

from kinetic.passes.canonicalize import canonicalize, renumber, simplify
from kinetic.passes.cse import eliminate_common_subexpressions
from kinetic.passes.dce import eliminate_dead_code
from kinetic.passes.fusion import fuse
from kinetic.passes.pipeline import PIPELINE, PassOptions, Phase, pipeline_hash, run_pipeline
from kinetic.passes.rewrite import Match, Pat, Rule, apply_rules, pat, rule

__all__ = [
    "PIPELINE",
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
    "pat",
    "pipeline_hash",
    "renumber",
    "rule",
    "run_pipeline",
    "simplify",
]
