"""The op groups' attribute dataclasses and shape inference, one module per group.

kinetic/ir/ops.py binds them into the op table and is the import surface: import every name from
kinetic.ir.ops, not from here.

| module | ops |
| --- | --- |
| checks.py | none: `VerifyError` and the checks every group's inference uses |
| lookups.py | input, param, embed, matmul, take_rows, columns, concat, quantize |
| attention.py | state, rms_norm, layer_norm, rope, attention, add_rms_norm, rope_pair |
| recurrent.py | recurrent_state, short_conv, ssm_scan, delta_rule, head_columns |
| moe.py | moe_gate, moe_select, moe_weights, moe_matmul, moe_sum |
| elementwise.py | add, add_bias, mul, scale, silu, sigmoid, gelu, softcap, swiglu, geglu |
"""
