"""How the kernel table's rows for the ops that carry a recurrent state record a node: short_conv,
ssm_scan and delta_rule (kernels.py wraps each in `computed`).

Owns: each op's dispatch: its kernel at the node's shape (recurrent_scan.py, rendered once per device
through VulkanOps' cache), its bindings (the node's inputs, small f32 weights from
pass_states.f32_values, glibc's expf table, the pass's parents and the state's walk buffer from
pass_states.PassStates) and its grid (one invocation per state row; push constant: the pass's rows).
Does not own the arithmetic (recurrent_scan.py), staging or reading the states (pass_states.py), or
the recurrent_state leaf itself (it binds nothing: its op reads it through the walk).
"""

from __future__ import annotations

from kinetic.codegen.vulkan import recurrent_scan
from kinetic.codegen.vulkan.pass_states import f32_values
from kinetic.ir.graph import Node


def _state(p, node: Node) -> Node:
    return p.graph.node(node.inputs[-1])


def record_short_conv(p, node: Node, ins, out, n: int) -> None:
    """short_conv(x, kernel f32 [C, K], state rs[K-1, C]): one invocation per channel."""
    channels, taps = p.width(node), p.width(p.graph.node(node.inputs[1]))
    k = p.ops.kernel(("short_conv", channels, taps),
                     lambda: recurrent_scan.render_short_conv(p.ops.target, channels, taps))
    walk = p.states.walk(_state(p, node))
    bindings = [ins[0], f32_values(p.model, p.graph.node(node.inputs[1])), p.states.parents(), walk, out]
    p.dispatch(k, bindings, channels, recurrent_scan.WORKGROUP, n)


def record_ssm_scan(p, node: Node, ins, out, n: int) -> None:
    """ssm_scan(x, dt, A, B, C, D, state): one invocation per channel (head, value)."""
    a = node.attrs
    k = p.ops.kernel(("ssm_scan", a.n_head, a.head_dim, a.n_group, a.d_state),
                     lambda: recurrent_scan.render_ssm_scan(p.ops.target, a.n_head, a.head_dim, a.n_group,
                                                            a.d_state))
    weights = [f32_values(p.model, p.graph.node(node.inputs[i])) for i in (2, 5)]
    walk = p.states.walk(_state(p, node))
    bindings = [ins[0], ins[1], weights[0], ins[3], ins[4], weights[1], p.ops.expf_table(), p.states.parents(),
                walk, out]
    p.dispatch(k, bindings, a.n_head * a.head_dim, recurrent_scan.WORKGROUP, n)


def record_delta_rule(p, node: Node, ins, out, n: int) -> None:
    """delta_rule(q, k, v, alpha, beta, A, state): one invocation per value row of every value head."""
    a = node.attrs
    k = p.ops.kernel(("delta_rule", a.n_k_head, a.n_v_head, a.head_dim),
                     lambda: recurrent_scan.render_delta_rule(p.ops.target, a.n_k_head, a.n_v_head, a.head_dim))
    decay = f32_values(p.model, p.graph.node(node.inputs[5]))
    walk = p.states.walk(_state(p, node))
    bindings = [*ins[:5], decay, p.ops.expf_table(), p.states.parents(), walk, out]
    p.dispatch(k, bindings, a.n_v_head * a.head_dim, recurrent_scan.WORKGROUP, n)


# the inputs each op reads as small f32 weights
WEIGHT_INPUTS = {"short_conv": (1,), "ssm_scan": (2, 5), "delta_rule": (5,)}


def refuse_weights(graph, node: Node) -> str | None:
    """The kernels read the conv taps, A and D as uploaded f32 weights: refuse one computed in the graph."""
    for i in WEIGHT_INPUTS[node.op.value]:
        source = graph.node(node.inputs[i])
        if source.op.value != "param" or source.type.ggml_type.name != "F32":
            return f"{node.op.value} reads input {i} as an f32 weight on Vulkan (here: {source.op.value})"
    return None
