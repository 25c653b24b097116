"""The graph IR: one node type, one op table, a text form and the reference that defines every op.

Owns: graphs and their verifier (graph.py), value types (types.py), the op table with one `OpSpec`
per op (ops.py: attributes, shape inference, groups, reference, reduction order), the text form
(text.py), what each op computes (reference.py) and the interpreter that runs a graph with it
(interpreter.py), the reference numerics after ggml's CPU backend (numerics/, quant_dots.py),
per-quant-type facts (quants.py: QUANT_TYPES), the named reduction orders (orders.py) and the row
table of a pass with the cache view runners see (rows.py: PassRows, KVView). Does not own rewrites
(kinetic/passes), devices (kinetic/codegen) or scheduling (kinetic/runtime). docs/ir.md describes
the IR; docs/numerics.md the arithmetic.

    graph.py        Node, Graph, GraphBuilder, verify
    types.py        TensorType: an element type and a shape (symbolic T, R)
    ops.py          Op, the attribute dataclasses, OPS (one OpSpec per op), groups
    text.py         print_graph / parse_graph, round-tripping exactly
    reference.py    one reference function per op, on numpy values
    interpreter.py  Interpreter: a graph evaluated by its ops' references (also a Runner)
    rows.py         PassRows, visibility, KVView / SequenceKV, PassResult
    orders.py       ORDERS: the per-row orders of summation reductions name
    quants.py       QUANT_TYPES: block sizes, bytes, activation formats, dot orders; dequantization
    quant_dots.py   the integer side of ggml's dots for Q2_K, Q3_K, Q5_K, IQ4_NL, IQ4_XS, MXFP4
    numerics/       activations, weights, dots, pointwise, attention, floats
"""
