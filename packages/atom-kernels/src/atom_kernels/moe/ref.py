"""Pure-torch references for the fused-MoE family: routing and the experts, written plainly (fp32 math)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from atom_kernels.moe.expert_mlp import SILU, ExpertActivation, ExpertBiases
from atom_kernels.moe.grouping import GroupedRouting


def topk_softmax_ref(
    logits: torch.Tensor, top_k: int, renormalize: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """logits: [T, E] -> (weights [T, k] fp32, ids [T, k] int32): the k largest softmax probabilities."""
    probs = torch.softmax(logits.float(), dim=-1)
    weights, ids = probs.topk(top_k, dim=-1)
    if renormalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights, ids.to(torch.int32)


def grouped_topk_ref(
    logits: torch.Tensor, top_k: int, routing: GroupedRouting, bias: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """DeepSeek-V3 routing. logits: [T, E]; bias: [E] (chooses experts, does not weight them).

    A group's score is the sum of its two best biased scores (the best alone without a bias); the
    topk_groups best groups are kept and top_k experts are chosen among them. Weights are the unbiased
    scores of the chosen experts, renormalized to sum 1 if asked, times scaling.
    Returns (weights [T, k] fp32, ids [T, k] int32).
    """
    num_groups, topk_groups = routing.num_groups, routing.topk_groups
    scores = (
        torch.sigmoid(logits.float())
        if routing.scoring == "sigmoid"
        else torch.softmax(logits.float(), dim=-1)
    )
    tokens, experts = scores.shape
    choice = scores + bias.float() if bias is not None else scores
    grouped = choice.view(tokens, num_groups, experts // num_groups)
    group_score = grouped.topk(2, dim=-1).values.sum(-1) if bias is not None else grouped.amax(-1)
    keep = torch.zeros_like(group_score, dtype=torch.bool)
    keep.scatter_(1, group_score.topk(topk_groups, dim=-1).indices, True)
    choice = grouped.masked_fill(~keep[..., None], float("-inf")).view(tokens, experts)
    ids = choice.topk(top_k, dim=-1).indices
    weights = scores.gather(1, ids)
    if routing.renormalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights * routing.scaling, ids.to(torch.int32)


def fused_experts_ref(
    x: torch.Tensor,
    w13: torch.Tensor,
    w2: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    activation: ExpertActivation = SILU,
    biases: ExpertBiases | None = None,
) -> torch.Tensor:
    """out[t] = sum_j w[t, j] * (W2[e] @ act(W1[e] @ x[t] + b1[e], W3[e] @ x[t] + b3[e]) + b2[e]),
    e = ids[t, j]; act: silu(gate) * up unless `activation` says otherwise; no b without `biases`.

    x: [T, H]; w13: [E, 2I, H] (gate rows then up rows); w2: [E, H, I]. One loop per expert hit.
    """
    out = torch.zeros(x.shape, dtype=torch.float32, device=x.device)
    inter = w2.shape[2]
    for expert in topk_ids.unique().tolist():
        token, slot = (topk_ids == expert).nonzero(as_tuple=True)
        h = x[token].float() @ w13[expert].float().t()
        if biases is not None:
            h = h + biases.w13[expert].float()
        h = activation.ref(h[:, :inter], h[:, inter:])
        y = h @ w2[expert].float().t()
        if biases is not None:
            y = y + biases.w2[expert].float()
        out.index_add_(0, token, y * topk_weights[token, slot, None].float())
    return out.to(x.dtype)


def fused_experts_w8a8_ref(
    x: torch.Tensor,
    w13: torch.Tensor,
    w2: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    group: int,
) -> torch.Tensor:
    """fused_experts_ref with the activations quantized as the W8A8 kernels quantize them: x per token and
    `group` channels (quantize_act_ref), and silu(gate) * up, rounded to x's dtype, per row likewise.
    w13 / w2: the dequantized expert weights."""
    from atom_kernels.fp8.ref import expand_scale, quantize_act_ref

    def fake_quant(t: torch.Tensor) -> torch.Tensor:
        q, s = quantize_act_ref(t, group)
        return q.float() * expand_scale(s, (1, group), tuple(t.shape))

    out = torch.zeros(x.shape, dtype=torch.float32, device=x.device)
    inter = w2.shape[2]
    xd = fake_quant(x)
    for expert in topk_ids.unique().tolist():
        token, slot = (topk_ids == expert).nonzero(as_tuple=True)
        h = xd[token] @ w13[expert].float().t()
        h = fake_quant((F.silu(h[:, :inter]) * h[:, inter:]).to(x.dtype))
        out.index_add_(0, token, (h @ w2[expert].float().t()) * topk_weights[token, slot, None].float())
    return out.to(x.dtype)
