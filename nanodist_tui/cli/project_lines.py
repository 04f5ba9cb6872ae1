"""The context- and expert-parallel terms of a projected row in words, printed under `project`'s table
(engine.projection.context and engine.projection.expert compute them; the JSON rows carry `cp` and `ep`)."""

from __future__ import annotations

MB = 1e6


def context_parallel_lines(row: dict) -> list[str]:
    """A row's CP term: the ring's link, a hop's bytes and time per block and what of it the blocks do not
    hide, the step's hops, the layout's attention work on the busiest rank."""
    cp, c = row["cp"], row["cp"]["degree"]
    keys = ("kv_s", "block_forward_transfer_s", "block_backward_transfer_s", "block_forward_s",
            "block_backward_s", "step_s", "exposed_s")
    ms = {k: f"{cp[k] * 1e3:.3f} ms" for k in keys}
    return [f"context parallel {c} ({cp['layout']}) at {row['world_size']} ranks ({cp['rows']} row(s) per "
            f"micro-batch, s/{c} tokens each): the ring on the {cp['link']} link",
            f"  per block forward {c - 1} hop(s) of K, V ({cp['kv_bytes'] / MB:.3g} MB, {ms['kv_s']} each); "
            f"backward {c - 1} of K, V and {c} of dK, dV ({cp['grad_bytes'] / MB:.3g} MB): "
            f"{ms['block_forward_transfer_s']} + {ms['block_backward_transfer_s']}, of it exposed "
            f"{ms['block_forward_s']} + {ms['block_backward_s']}",
            f"  per step {cp['hops']} hops, {ms['step_s']}, {ms['exposed_s']} exposed: each hop moves beside "
            "the blocks of the chunk in hand, the last one home alone",
            f"  attention blocks on the busiest rank {cp['blocks_busiest']} (mean {cp['blocks_mean']:g}, "
            f"busiest/mean {cp['busiest_over_mean']:.2f}); its attention is "
            f"{cp['attention_factor']:.3g}x the full square of its queries"]


def expert_parallel_lines(row: dict) -> list[str]:
    """A row's EP term: the all-to-alls per MoE layer, their link and time, the load imbalance assumed,
    the experts' reduce."""
    ep, e = row["ep"], row["ep"]["degree"]
    chosen = {"given": "given", "calibrated": "as the calibrated model routed"}.get(
        ep["imbalance_chosen"], "default: balanced routing")
    return [f"expert parallel {e} at {row['world_size']} ranks (edp {ep['edp']}, {ep['rows']} row(s) per "
            f"micro-batch, {ep['moe_layers']} MoE layer(s)): the all-to-alls on the {ep['link']} link",
            f"  per MoE layer forward counts + dispatch + combine, backward their 2 mirrors; each rank sends "
            f"{ep['sent_bytes_per_all_to_all'] / MB:.3g} MB off-rank per dispatch: "
            f"{ep['layer_forward_s'] * 1e3:.3f} + {ep['layer_backward_s'] * 1e3:.3f} ms",
            f"  per step {ep['all_to_alls']} all-to-alls, {ep['step_s'] * 1e3:.3f} ms, all exposed; the "
            f"busiest rank's rows {ep['imbalance']:.2f}x the mean ({chosen}; "
            f"at most {ep['imbalance_bound']:.2f}x)",
            f"  the experts' gradients ({ep['expert_bytes'] / MB:.3g} MB a rank) reduced over edp after "
            f"backward: {ep['reduce_s'] * 1e3:.3f} ms"]
