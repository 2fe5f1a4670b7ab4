"""Linears of one input run as one matmul once loaded (layers/joint_linear.py): the same outputs as each
member alone, no second copy of the weights, members that cannot join left to run alone, and the layers
that hold them (GDN, MoE with a shared expert, MLA) joined by the loader."""

import pytest
import torch
from core_fixtures.architectures import DSV3
from core_fixtures.checkpoints import deepseek_checkpoint
from transformers import DeepseekV3Config

from atom_core.attention import PagedAttentionBackend
from atom_core.build import BuildContext
from atom_core.config import ModelConfig, ParallelConfig
from atom_core.layers.joint_linear import JointLinears
from atom_core.layers.linear import ColumnParallelLinear, ReplicatedLinear, RowParallelLinear
from atom_core.loader import build_model, load_checkpoint
from atom_core.quantization.fp8 import Fp8BlockConfig
from tools.testing_qwen import qwen3_next_checkpoint

PARALLEL = ParallelConfig()
COMMON = dict(dtype=torch.float32, parallel=PARALLEL)


def _filled(layer, seed: int):
    gen = torch.Generator().manual_seed(seed)
    for param in layer.parameters():  # fp8 weights as e4m3 values, their block scales positive
        value = torch.randn(param.shape, generator=gen)
        param.data.copy_(
            (value.abs() + 0.1 if getattr(param, "block_scale", False) else value).to(param.dtype)
        )
    return layer


def _members():
    return (
        _filled(ReplicatedLinear(32, 8, bias=False, prefix="m.router", **COMMON), 1),
        _filled(ColumnParallelLinear(32, 16, bias=False, prefix="m.gate_up", **COMMON), 2),
        _filled(ReplicatedLinear(32, 1, bias=False, prefix="m.gate", **COMMON), 3),
    )


def test_joint_outputs_equal_each_member_alone_and_share_its_weights():
    members = _members()
    x = torch.randn(5, 32)
    want = [torch.nn.functional.linear(x, m.weight.detach().clone()) for m in members]
    joint = JointLinears(*members)
    joint.join()
    assert joint.joined == (0, 1, 2)
    got = joint(x)
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w)
    # the members' weights are the joint matrix's rows: no second copy, and a later write reaches it
    ptr, end = joint.weight.data_ptr(), joint.weight.data_ptr() + joint.weight.numel() * 4
    assert all(ptr <= m.weight.data_ptr() < end for m in members)
    members[1].weight_loader(members[1].weight, torch.zeros(16, 32))
    assert joint(x)[1].abs().max() == 0
    torch.testing.assert_close(joint(x)[0], want[0])


def test_members_that_cannot_join_run_alone_in_their_place():
    router, gate_up, gate = _members()
    fp8 = Fp8BlockConfig(block=(16, 16))
    quantized = _filled(ColumnParallelLinear(32, 16, bias=False, prefix="m.q", quant_config=fp8, **COMMON), 4)
    biased = _filled(ReplicatedLinear(32, 4, bias=True, prefix="m.b", **COMMON), 5)
    rows = _filled(RowParallelLinear(32, 4, bias=False, prefix="m.o", **COMMON), 6)
    narrower = _filled(ReplicatedLinear(16, 4, bias=False, prefix="m.n", **COMMON), 7)
    x = torch.randn(3, 32)
    alone = [quantized(x), biased(x), rows(x)]
    joint = JointLinears(router, quantized, gate_up, biased, rows, gate)
    joint.join()
    assert joint.joined == (0, 2, 5)  # the fp8, biased and row-parallel members run alone
    got = joint(x)
    torch.testing.assert_close(got[1], alone[0])
    torch.testing.assert_close(got[3], alone[1])
    torch.testing.assert_close(got[4], alone[2])
    torch.testing.assert_close(got[2], torch.nn.functional.linear(x, gate_up.weight))
    lonely = JointLinears(narrower, quantized)
    lonely.join()
    assert lonely.joined == ()  # one joinable member: nothing to join


def _engine_model(path):
    model = build_model(
        ModelConfig.from_pretrained(path), BuildContext(PagedAttentionBackend(kernel_backend="torch"))
    )
    load_checkpoint(model, path)
    return model


@pytest.mark.parametrize(
    ("case", "joined"),
    [
        ("qwen3.5-moe", {"linear_attn": (0, 1, 2, 3), "mlp": (0, 1, 2)}),
        ("qwen3-next", {"linear_attn": (0, 1)}),
    ],
)
def test_the_loader_joins_gdn_and_shared_expert_projections(tmp_path, case, joined):
    qwen3_next_checkpoint(tmp_path, case)
    model = _engine_model(tmp_path)
    layers = model.model.layers
    assert layers[0].linear_attn.in_projs.joined == joined["linear_attn"]
    if "mlp" in joined:
        assert layers[0].mlp.in_projs.joined == joined["mlp"]


@pytest.mark.parametrize("q_lora_rank", [None, 16])
def test_the_loader_joins_mla_query_and_latent_projections(tmp_path, q_lora_rank):
    deepseek_checkpoint(tmp_path, DeepseekV3Config, DSV3, {"q_lora_rank": q_lora_rank})
    attention = _engine_model(tmp_path).model.layers[1].self_attn
    assert attention.in_projs.joined == (0, 1)  # q_proj or q_a_proj, and kv_a_proj_with_mqa
