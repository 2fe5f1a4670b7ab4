"""Gated DeltaNet (the linear-attention layers of Qwen3-Next and Qwen3.5), over per-sequence state slots.

Per token: q, k, v and the output gate z come from the input projections; q, k, v pass a depthwise causal
conv (then SiLU) that continues from the sequence's conv state; the gated delta rule updates the
sequence's recurrent state S (decay g = -exp(A_log) * softplus(a + dt_bias), write strength
beta = sigmoid(b), q and k L2-normed) and reads o = S q; o is RMS-normed per value head and gated by
silu(z), then projected out. Qwen3-Next projects q|k|v|z and b|a grouped per key head (in_proj_qkvz,
in_proj_ba); Qwen3.5 has one projection per part (in_proj_qkv, in_proj_z, in_proj_b, in_proj_a).

The stateful part (conv, gating, delta rule) is the attention backend's GDN layer (attention/gdn.py): the
native engine keeps the states in the slots it assigns, where a sequence that starts in this forward
starts from zeros and later forwards, chunked prefills included, continue its state; an adapter keeps
them in its engine's state cache.
Tensor parallel splits the key heads (each with its value heads) over ranks: every projection, the conv
channels of q, k and v, A_log and dt_bias are cut to the rank's heads, out_proj sums over ranks.
"""

from __future__ import annotations

import torch
from torch import nn

from atom_core.attention.gdn import GDNLayerSpec
from atom_core.build import BuildContext
from atom_core.config import ConfigError, ModelConfig
from atom_core.layers.joint_linear import JointLinears
from atom_core.layers.linear import (
    ColumnParallelLinear,
    PartsColumnParallelLinear,
    RowParallelLinear,
    narrow_parts,
)
from atom_core.layers.parallel import RankPartial
from atom_core.ops import check_gdn_head_sizes, max_key_head_size, rms_norm_gated

STATE_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


class GatedDeltaNet(nn.Module):
    """grouped_projections: Qwen3-Next's in_proj_qkvz / in_proj_ba (else Qwen3.5's four projections).
    The recurrent state's dtype is ctx.state_dtype."""

    def __init__(
        self,
        config: ModelConfig,
        ctx: BuildContext,
        *,
        layer_index: int,
        prefix: str,
        grouped_projections: bool,
    ):
        super().__init__()
        hf, parallel = config.hf, ctx.parallel
        if hf.get("hidden_act", "silu") != "silu":
            raise ConfigError(f"Gated DeltaNet supports hidden_act 'silu', got {hf['hidden_act']!r}")
        state_dtype = ctx.state_dtype
        if state_dtype not in STATE_DTYPES:
            raise ConfigError(f"GDN state dtype must be one of {sorted(STATE_DTYPES)}, got {state_dtype!r}")
        num_k_heads, num_v_heads = hf["linear_num_key_heads"], hf["linear_num_value_heads"]
        self.head_k_dim, self.head_v_dim = hf["linear_key_head_dim"], hf["linear_value_head_dim"]
        try:  # any size transformers takes, within the kernels' shared memory: refused here, not per request
            check_gdn_head_sizes(self.head_k_dim, self.head_v_dim, config.dtype)
        except ValueError as err:
            raise ConfigError(
                f"linear_key_head_dim {self.head_k_dim}, linear_value_head_dim {self.head_v_dim} "
                f"({config.dtype}): {err}; supported: key heads up to {max_key_head_size(config.dtype)}"
            ) from None
        if num_v_heads % num_k_heads:
            raise ConfigError(
                f"linear_num_value_heads ({num_v_heads}) must be a multiple of linear_num_key_heads "
                f"({num_k_heads})"
            )
        if num_k_heads % parallel.tp_size:  # each rank keeps whole key heads and their value heads
            raise ConfigError(
                f"{config.architecture}: linear_num_key_heads ({num_k_heads}) must be divisible by "
                f"tensor_parallel_size ({parallel.tp_size})"
            )
        # this rank's heads: key heads split over ranks, each with its group of value heads
        self.num_k_heads, self.num_v_heads = num_k_heads // parallel.tp_size, num_v_heads // parallel.tp_size
        self.key_dim = self.num_k_heads * self.head_k_dim
        self.value_dim = self.num_v_heads * self.head_v_dim
        self.conv_dim = 2 * self.key_dim + self.value_dim
        key_dim, value_dim = num_k_heads * self.head_k_dim, num_v_heads * self.head_v_dim  # all ranks'
        conv_parts = [key_dim, key_dim, value_dim]
        width = hf["linear_conv_kernel_dim"]
        self.eps = config.rms_norm_eps
        self.grouped = grouped_projections
        hidden = config.hidden_size
        common = dict(bias=False, dtype=config.dtype, parallel=parallel, quant_config=ctx.quant_config)
        if grouped_projections:  # grouped per key head: a rank's key heads are contiguous rows
            self.in_proj_qkvz = ColumnParallelLinear(
                hidden, 2 * key_dim + 2 * value_dim, prefix=f"{prefix}.in_proj_qkvz", **common
            )
            self.in_proj_ba = ColumnParallelLinear(
                hidden, 2 * num_v_heads, prefix=f"{prefix}.in_proj_ba", **common
            )
        else:
            self.in_proj_qkv = PartsColumnParallelLinear(
                hidden, conv_parts, prefix=f"{prefix}.in_proj_qkv", **common
            )
            self.in_proj_z = ColumnParallelLinear(hidden, value_dim, prefix=f"{prefix}.in_proj_z", **common)
            self.in_proj_b = ColumnParallelLinear(hidden, num_v_heads, prefix=f"{prefix}.in_proj_b", **common)
            self.in_proj_a = ColumnParallelLinear(hidden, num_v_heads, prefix=f"{prefix}.in_proj_a", **common)
        # the input projections as one matmul once loaded (one launch, not two or four, a decode layer)
        self.in_projs = JointLinears(
            *(
                (self.in_proj_qkvz, self.in_proj_ba)
                if grouped_projections
                else (self.in_proj_qkv, self.in_proj_z, self.in_proj_b, self.in_proj_a)
            )
        )
        # as checkpoints store them: conv1d.weight [conv_dim, 1, width] (depthwise, no bias), channels q | k | v
        self.conv1d = nn.Module()
        self.conv1d.weight = _sharded(
            torch.empty(self.conv_dim, 1, width, dtype=config.dtype),
            lambda loaded: narrow_parts(loaded, conv_parts, parallel),
        )

        def heads(loaded: torch.Tensor) -> torch.Tensor:
            return narrow_parts(loaded, [num_v_heads], parallel)

        self.dt_bias = _sharded(torch.ones(self.num_v_heads, dtype=config.dtype), heads)
        self.A_log = _sharded(torch.zeros(self.num_v_heads, dtype=config.dtype), heads)
        self.norm = nn.Module()  # the gated RMSNorm over each value head (weight * x, not 1 + weight)
        self.norm.weight = nn.Parameter(torch.ones(self.head_v_dim, dtype=config.dtype), requires_grad=False)
        self.out_proj = RowParallelLinear(value_dim, hidden, prefix=f"{prefix}.out_proj", **common)
        self.cache_index = layer_index
        spec = GDNLayerSpec(
            layer_index=layer_index,
            num_k_heads=self.num_k_heads,
            num_v_heads=self.num_v_heads,
            head_k_dim=self.head_k_dim,
            head_v_dim=self.head_v_dim,
            conv_width=width,
            state_dtype=STATE_DTYPES[state_dtype],
            prefix=f"{prefix}.core",
            conv_activation=hf.get("hidden_act", "silu"),  # transformers applies hidden_act after the conv
        )
        self.cache_spec = spec.cache_spec()
        self.core = ctx.attention_backend.make_gdn_layer(spec)

    def _project(self, hidden: torch.Tensor):
        """-> mixed q|k|v [T, conv_dim], z [T, HV, Dv], b, a [T, HV]."""
        tokens = hidden.shape[0]
        if not self.grouped:
            mixed, z, b, a = self.in_projs(hidden)
            return mixed, z.view(tokens, self.num_v_heads, self.head_v_dim), b, a
        ratio = self.num_v_heads // self.num_k_heads
        dk, group_v = self.head_k_dim, ratio * self.head_v_dim
        qkvz, ba = self.in_projs(hidden)
        qkvz = qkvz.view(tokens, self.num_k_heads, 2 * dk + 2 * group_v)
        q, k, v, z = qkvz.split([dk, dk, group_v, group_v], dim=-1)
        ba = ba.view(tokens, self.num_k_heads, 2 * ratio)
        b, a = (x.reshape(tokens, self.num_v_heads) for x in ba.split([ratio, ratio], dim=-1))
        mixed = torch.cat([q.reshape(tokens, -1), k.reshape(tokens, -1), v.reshape(tokens, -1)], dim=-1)
        return mixed, z.reshape(tokens, self.num_v_heads, self.head_v_dim), b, a

    def defer_output_reduce(self) -> None:
        """forward returns out_proj's partial sum for the next RMSNorm to reduce (tensor parallel)."""
        self.out_proj.defer_reduce = True

    def forward(self, hidden: torch.Tensor) -> torch.Tensor | RankPartial:
        """hidden: [T, hidden] (sequences back to back, as the backend's metadata says) -> [T, hidden]."""
        tokens = hidden.shape[0]
        mixed, z, b, a = self._project(hidden)
        o = self.core(mixed, b, a, self.conv1d.weight.squeeze(1), self.A_log, self.dt_bias)
        o = rms_norm_gated(
            o.reshape(-1, self.head_v_dim), z.reshape(-1, self.head_v_dim), self.norm.weight, self.eps
        )
        return self.out_proj(o.view(tokens, self.value_dim))


def _sharded(value: torch.Tensor, local_rows) -> nn.Parameter:
    """A parameter whose checkpoint tensor is cut to this rank's rows by local_rows(loaded)."""
    param = nn.Parameter(value, requires_grad=False)

    def load(param: nn.Parameter, loaded: torch.Tensor, shard_id=None) -> None:
        local = local_rows(loaded)
        if tuple(local.shape) != tuple(param.shape):
            raise ValueError(f"expected shape {tuple(param.shape)} on this rank, got {tuple(local.shape)}")
        param.data.copy_(local)

    param.weight_loader = load
    return param
