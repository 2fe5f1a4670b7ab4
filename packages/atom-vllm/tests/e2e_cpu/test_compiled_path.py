"""ATOM's models on vLLM's compiled path (enforce_eager=False) inside a real vLLM engine on the CPU.

vLLM's CPU platform compiles a model in "trace once" mode: Dynamo traces the decorated model's forward a
single time with a dynamic token count and drops the guards; its default backend there is Inductor
(VLLM_CPU_CI_ENV=1 swaps in the eager backend, the trace being the same). Each test reads torch's log
of the traced graph's code and checks that the kernel entry points and ATOM's attention
layers are in it as opaque ops (atom_kernels::*, atom_vllm::*) beside vLLM's own attention op; then the
compiled model must give transformers' greedy tokens.
"""

import logging

import pytest
from vllm_support import (
    PROMPTS,
    STEPS,
    greedy_by_recompute,
    recorded_lines,
    run_vllm,
    save_hybrid_checkpoint,
)

from atom_vllm.diagnostics import describe


@pytest.fixture(autouse=True)
def _traced_fresh(monkeypatch):
    monkeypatch.setenv("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")  # apply_model pickles describe()
    monkeypatch.setenv("VLLM_DISABLE_COMPILE_CACHE", "1")  # trace here, not a graph from an earlier run


@pytest.fixture
def graph_code():
    """The code of the graphs Dynamo traces during the test (torch's "graph_code" log, read from its
    logger: the engine runs in this process, which imported torch before TORCH_LOGS could be set)."""
    import torch._logging

    logger = torch._logging.getArtifactLogger("torch._dynamo.output_graph", "graph_code")
    torch._logging.set_logs(graph_code=True)
    try:
        with recorded_lines(logger, logging.DEBUG) as traced:
            yield traced
    finally:
        torch._logging.set_logs()


def _graph_ops(traced: list[str], namespaces=("atom_kernels", "atom_vllm", "vllm")) -> set[str]:
    """The custom ops the traced graphs call ("torch.ops.<ns>.<op>.default" in their code)."""
    found = set()
    for line in "\n".join(traced).splitlines():
        for ns in namespaces:
            marker = f"torch.ops.{ns}."
            start = line.find(marker)
            while start >= 0:
                name = line[start + len("torch.ops.") :].split("(")[0]
                found.add(name.removesuffix(".default").replace(".", "::", 1))
                start = line.find(marker, start + 1)
    return found


def test_qwen3_5_hybrid_under_vllms_default_compilation_equals_transformers(tmp_path, graph_code):
    """Qwen3.5's multimodal layout (M-RoPE positions [3, T], gated full attention, GDN layers) under
    vLLM's CPU default (Inductor); a ragged batch with the 40-token prompt prefilled in chunks."""
    ckpt, model = save_hybrid_checkpoint("qwen3.5-conditional-generation", tmp_path / "ckpt")
    expected = [greedy_by_recompute(model, p, STEPS) for p in PROMPTS]
    mode = {}

    def probe(llm):
        config = llm.llm_engine.vllm_config.compilation_config
        mode.update(mode=config.mode.name, backend=config.backend)

    runs, what, _ = run_vllm(
        ckpt.path, PROMPTS, block_size=None, enable_prefix_caching=False, enforce_eager=False, probe=probe
    )
    assert mode == {"mode": "DYNAMO_TRACE_ONCE", "backend": "inductor"}
    assert what["model_class"] == "atom_vllm.hybrid.AtomHybridForCausalLM"
    assert runs[0] == expected
    ops = _graph_ops(graph_code)
    assert {
        "atom_kernels::linear",
        "atom_kernels::rms_norm_residual",
        "atom_kernels::rms_norm_gated",
        "atom_kernels::apply_mrope",
        "atom_vllm::gdn_attention",
        "vllm::unified_attention_with_output",
    } <= ops


def test_deepseek_v3_compiled_target_with_atoms_mtp_draft_equals_plain_greedy(
    tmp_path, graph_code, monkeypatch
):
    """DeepSeek-V3 (ATOM's MLA layer, grouped routing, fused experts) compiled as the target of an MTP
    speculation (the draft stays eager: vLLM compiles only the decorated target class). Traced by Dynamo
    with the eager backend (VLLM_CPU_CI_ENV=1) to keep CI's time: Inductor's CPU code generation for this
    graph takes minutes here, and the graph's opaque ops are the same."""
    from vllm_support import save_mtp_checkpoint, speculate, transformers_greedy

    monkeypatch.setenv("VLLM_CPU_CI_ENV", "1")
    ckpt = save_mtp_checkpoint(tmp_path / "ckpt")
    prompts, steps = [*PROMPTS, [100] * 5], 16
    expected = [transformers_greedy(ckpt.path, p, steps) for p in prompts]
    tokens, drafted, accepted, llm = speculate(ckpt.path, prompts, steps, block_size=16, enforce_eager=False)
    assert llm.llm_engine.vllm_config.compilation_config.mode.name == "DYNAMO_TRACE_ONCE"
    assert tokens == expected
    assert 0 < accepted < drafted
    (what,) = llm.apply_model(describe)
    assert what["attention"] == ["VllmMLALayer:ATOM_MLA"]
    ops = _graph_ops(graph_code)
    assert {
        "atom_kernels::linear",
        "atom_kernels::rms_norm_residual",
        "atom_kernels::apply_rotary",
        "atom_kernels::grouped_topk",
        "atom_kernels::fused_experts",
        "atom_vllm::mla_attention",
    } <= ops
