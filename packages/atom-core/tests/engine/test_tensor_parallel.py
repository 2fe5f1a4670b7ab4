"""Tensor parallel on the CPU: two gloo ranks, each loading only its shards, give the TP=1 logits.

The ranks run with a stand-in for the engine's peer all-reduce (gloo and the RMSNorm kernel, in place of
the fused kernel the GPUs run): every mixer and MLP that can hands its partial sum to the norm after it,
and each such norm reduces it, so the deferred reductions are exercised on every architecture here.
"""

import os

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from core_fixtures.architectures import QWEN2_MOE_SHARED, TINY
from transformers import LlamaConfig, Qwen2MoeConfig, Qwen3MoeConfig

from atom_core.attention import PagedAttentionBackend, PagedAttentionMetadata
from atom_core.build import BuildContext
from atom_core.cache import allocate_caches, collect_cache_specs
from atom_core.config import CacheConfig, ModelConfig, ParallelConfig
from atom_core.forward_context import ForwardContext, bind_forward_context
from atom_core.layers.linear import RowParallelLinear
from atom_core.layers.moe import SparseMoE
from atom_core.loader import build_model, load_checkpoint
from atom_core.ops import rms_norm
from tools.testing_models import free_port, random_checkpoint
from tools.testing_mxfp4 import mxfp4_checkpoint

PROMPTS = [[5, 9, 33, 71, 2, 64, 18], [101, 7, 7, 50]]


class GlooNormPeer:
    """The engine's PeerAllReduce interface over gloo: plain all-reduces stay with gloo (takes: never),
    and the norms after deferred reductions sum over gloo, then run the RMSNorm kernel; calls counted."""

    def __init__(self, group):
        self.group, self.norm_calls = group, 0

    def takes(self, x: torch.Tensor) -> bool:
        return False

    def takes_rows(self, x: torch.Tensor) -> bool:
        return True

    def rms_norm(self, x, weight, eps, residual, *, weight_offset=0.0):
        self.norm_calls += 1
        total = x.clone()
        dist.all_reduce(total, group=self.group)
        return rms_norm(total, weight, eps, residual, weight_offset=weight_offset)


def _deferring_blocks(model) -> int:
    """Mixers and MLPs of the model's decoder layers that leave their reduction to the norm after them
    (a MoE block's shared expert joins its block's partial sum: one reduction for both)."""

    def defers(block) -> bool:
        if isinstance(block, SparseMoE):
            return block.defer_reduce
        proj = next(getattr(block, n) for n in ("o_proj", "down_proj", "out_proj") if hasattr(block, n))
        return isinstance(proj, RowParallelLinear) and proj.defer_reduce and proj.bias is None

    return sum(defers(layer.self_attn) + defers(layer.mlp) for layer in model.model.layers)


def _logits(path, parallel: ParallelConfig) -> torch.Tensor:
    """Prefill both prompts in one batch through the paged cache; logits [T, V]."""
    config = ModelConfig.from_pretrained(path)
    model = build_model(
        config, BuildContext(PagedAttentionBackend(kernel_backend="torch"), parallel=parallel)
    )
    if parallel.peer_all_reduce is not None:  # each deferring block's norm fuses, once per forward
        parallel.peer_all_reduce.expected = _deferring_blocks(model)
        assert parallel.peer_all_reduce.expected >= config.num_hidden_layers
    load_checkpoint(model, path)
    caches = allocate_caches(
        collect_cache_specs(model), CacheConfig(block_size=4), dtype=config.dtype, num_blocks=8, device="cpu"
    )
    meta = PagedAttentionMetadata.build(
        query_lens=[7, 4], seq_lens=[7, 4], block_tables=[[5, 2], [7]], block_size=4
    )
    ids = torch.tensor(PROMPTS[0] + PROMPTS[1])
    positions = torch.tensor(list(range(7)) + list(range(4)))
    with bind_forward_context(ForwardContext({"paged": meta}, caches)), torch.no_grad():
        return model.compute_logits(model(ids, positions))


def _rank(rank: int, world: int, port: int, path: str, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        peer = GlooNormPeer(dist.group.WORLD)
        parallel = ParallelConfig(tp_size=world, tp_rank=rank, group=dist.group.WORLD, peer_all_reduce=peer)
        logits = _logits(path, parallel)
        assert peer.norm_calls == peer.expected, (peer.norm_calls, peer.expected)
        torch.save(logits, f"{out}.{rank}")
        dist.barrier()  # no rank tears gloo down while a peer still talks to it
    finally:
        dist.destroy_process_group()


def _assert_tp2_equals_tp1(path, out) -> None:
    """Two gloo ranks' logits (each saved to out.<rank>) equal one process's."""
    single = _logits(path, ParallelConfig())
    mp.start_processes(
        _rank, args=(2, free_port(), str(path), str(out)), nprocs=2, join=True, start_method="spawn"
    )
    for rank in range(2):
        torch.testing.assert_close(torch.load(f"{out}.{rank}"), single, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    ("cls", "overrides"),
    [
        (LlamaConfig, dict(num_key_value_heads=4, attention_bias=True)),
        (LlamaConfig, dict(num_key_value_heads=1)),  # fewer KV heads than ranks: replicated
        (Qwen3MoeConfig, dict(head_dim=16, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32)),
        (  # a gated shared expert beside the routed ones: their partial sums reduce once
            Qwen2MoeConfig,
            QWEN2_MOE_SHARED,
        ),
    ],
)
def test_tp2_equals_tp1(tmp_path, cls, overrides):
    _, path = random_checkpoint(cls(**{**TINY, "num_attention_heads": 8, **overrides}), tmp_path / "ckpt")
    _assert_tp2_equals_tp1(path, tmp_path / "logits")


@pytest.mark.parametrize("mxfp4", [False, True], ids=["bf16-layout", "mxfp4"])
def test_gpt_oss_tp2_equals_tp1(tmp_path, mxfp4):
    """Sinks split with their heads, q/k/v biases split and o_proj's added once; the experts' gate/up
    biases split with their columns and the down bias added once (rank 0's partial sum holds it); MXFP4
    experts split on whole 32-value groups (bytes and scales)."""
    from core_fixtures.architectures import GPT_OSS_TINY
    from core_fixtures.checkpoints import gpt_oss_extras
    from transformers import GptOssConfig

    config = GptOssConfig(
        **{**GPT_OSS_TINY, "num_attention_heads": 8, "num_key_value_heads": 4, "intermediate_size": 64}
    )
    _, path = random_checkpoint(config, tmp_path / "ckpt", edit=gpt_oss_extras)
    if mxfp4:
        path = mxfp4_checkpoint(path, tmp_path / "mxfp4")
    _assert_tp2_equals_tp1(path, tmp_path / "logits")


def test_deepseek_tp2_equals_tp1(tmp_path):
    """MLA heads split over ranks (the latent replicated), routed experts split, shared experts split (their
    partial sums join the routed experts' for one reduction)."""
    from core_fixtures.architectures import DSV3
    from core_fixtures.checkpoints import deepseek_checkpoint
    from transformers import DeepseekV3Config

    deepseek_checkpoint(tmp_path / "ckpt", DeepseekV3Config, DSV3, dict(num_hidden_layers=2))
    single = _logits(tmp_path / "ckpt", ParallelConfig())
    out = str(tmp_path / "logits")
    mp.start_processes(
        _rank, args=(2, free_port(), str(tmp_path / "ckpt"), out), nprocs=2, join=True, start_method="spawn"
    )
    for rank in range(2):
        torch.testing.assert_close(torch.load(f"{out}.{rank}"), single, rtol=1e-5, atol=1e-5)


def _shared_vocab_rank(rank: int, world: int, port: int, path: str, out: str) -> None:
    """A draft's view of the target's vocabulary on each rank: SharedVocab over the target's own shards."""
    from atom_core.integration import SharedVocab

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        parallel = ParallelConfig(tp_size=world, tp_rank=rank, group=dist.group.WORLD)
        config = ModelConfig.from_pretrained(path)
        target = build_model(
            config, BuildContext(PagedAttentionBackend(kernel_backend="torch"), parallel=parallel)
        )
        load_checkpoint(target, path)
        embed, head = target.model.embed_tokens.weight, target.lm_head.weight
        shared = SharedVocab(embed, head, config.vocab_size, parallel)
        assert shared.embed_tokens.weight is embed and shared.lm_head.weight is head  # nothing copied
        ids = torch.tensor([0, 1, 150, 151, config.vocab_size - 1])  # both ranks' rows, the padded edge
        hidden = torch.randn(5, config.hidden_size, generator=torch.Generator().manual_seed(0))
        with torch.no_grad():
            torch.testing.assert_close(
                shared.embed_input_ids(ids), target.embed_input_ids(ids), rtol=0, atol=0
            )
            torch.testing.assert_close(
                shared.compute_logits(hidden), target.compute_logits(hidden), rtol=0, atol=0
            )
        with pytest.raises(ValueError, match="this rank's"):
            SharedVocab(embed[:-1], head, config.vocab_size, parallel)
        torch.save(True, f"{out}.{rank}")
        dist.barrier()
    finally:
        dist.destroy_process_group()


def test_a_draft_sees_the_targets_vocabulary_split_as_the_target_does(tmp_path):
    _, path = random_checkpoint(
        LlamaConfig(**{**TINY, "vocab_size": 301, "num_attention_heads": 8}), tmp_path / "ckpt"
    )
    out = str(tmp_path / "ok")
    mp.start_processes(
        _shared_vocab_rank, args=(2, free_port(), str(path), out), nprocs=2, join=True, start_method="spawn"
    )
    assert all(torch.load(f"{out}.{rank}") for rank in range(2))
