"""Constrained output: GBNF grammars, JSON Schemas and forced tool calls, as a token mask.

Owns: parsing llama.cpp's GBNF (gbnf.py) into a tree (gbnf_ast.py), lowering it to byte-level rules
(compile.py), JSON Schema to GBNF (json_schema.py, json_objects.py, regex.py), tool-call grammars
(tool_calls.py), the vocabulary's byte trie (vocab.py), the matcher (matcher.py) and the mask hook
for sampling (sampling.py: apply_mask and ConstrainedSampler, a Sampler held to a grammar).
Does not own: sampling itself, HTTP, chat templates. Every user mistake raises GrammarError (a
KineticError), which the server answers with a 400.

Use:
    vocab = TokenVocab.from_tokenizer(tokenizer)          # once per model
    matcher = GrammarMatcher(json_schema_grammar(schema), vocab)  # once per grammar
    state = matcher.start()                               # per sequence
    apply_mask(logits, state); token = sample(logits); state.accept(token)
    state.is_complete  # end of generation allowed
"""

from kinetic.grammar.gbnf import parse_gbnf
from kinetic.grammar.gbnf_ast import Grammar, GrammarError
from kinetic.grammar.json_schema import json_object_grammar, json_schema_grammar, json_schema_to_gbnf
from kinetic.grammar.matcher import DEAD, GrammarMatcher, GrammarState
from kinetic.grammar.sampling import ConstrainedSampler, apply_mask
from kinetic.grammar.tool_calls import TOOL_STYLES, tool_call_grammar
from kinetic.grammar.vocab import TokenVocab

__all__ = [
    "DEAD", "TOOL_STYLES", "ConstrainedSampler", "Grammar", "GrammarError", "GrammarMatcher", "GrammarState",
    "TokenVocab", "apply_mask", "json_object_grammar", "json_schema_grammar", "json_schema_to_gbnf", "parse_gbnf",
    "tool_call_grammar",
]
