import torch

import atom_core
import atom_core.integration as api
from atom_kernels.activation.ref import silu_and_mul_ref


def test_every_name_of_the_adapter_surface_resolves():
    for name in api.__all__:
        assert getattr(api, name) is not None, name
    assert api.__version__ == atom_core.__version__
    assert {
        "build_model",
        "load_checkpoint",
        "BuildContext",
        "AttentionBackend",
        "ForwardContext",
        "bind_forward_context",
        "supported_architectures",
        "paged_prefill",
        "paged_decode",
    } <= set(api.__all__)


def test_the_offline_engine_is_importable_as_vllm_users_write_it():
    from atom_core import LLM, CompletionOutput, LLMEngine, RequestOutput, SamplingParams
    from atom_core.engine import llm, llm_engine, outputs, sampling_params

    assert (LLM, LLMEngine) == (llm.LLM, llm_engine.LLMEngine)
    assert (SamplingParams, RequestOutput, CompletionOutput) == (
        sampling_params.SamplingParams,
        outputs.RequestOutput,
        outputs.CompletionOutput,
    )
    assert set(atom_core.__all__) >= {
        "LLM",
        "SamplingParams",
        "RequestOutput",
        "CompletionOutput",
        "LLMEngine",
    }


def test_importing_the_package_does_not_import_torch():
    import subprocess
    import sys

    code = "import sys, atom_core; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


def test_stateful_layer_kinds_reach_adapters_as_core_steps_not_kernel_ops():
    """An adapter translates its engine's metadata into a view and calls core's step (the import contracts
    keep atom_core.ops and atom_kernels from it); the ops those steps compose are not on its surface."""
    assert {"gdn_step", "GDNStepView", "GDNBlockVerify", "GDNScratchVerify", "GDNStates", "mla_step"} <= set(
        api.__all__
    )
    composed = {
        "causal_conv1d",
        "gdn_gating",
        "gated_delta_rule_chunked",
        "gated_delta_rule_recurrent",
        "mla_attention",
        "write_latent",
    }
    assert not composed & set(api.__all__)


def test_kernel_ops_reach_adapters_through_core():
    x = torch.randn(5, 32)
    torch.testing.assert_close(api.silu_and_mul(x), silu_and_mul_ref(x), rtol=1e-5, atol=1e-5)


def test_importing_the_adapter_surface_does_not_import_torch():
    import subprocess
    import sys

    code = "import sys, atom_core.integration; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"
