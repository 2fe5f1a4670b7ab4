"""What the tests compare against: transformers' greedy continuation and logits, a transformers-style MTP
layer, and the torch reference ops in place of the Triton kernels."""

import contextlib

import pytest
import torch
from torch import nn


def hf_greedy(model, prompt, steps):
    """Plain argmax decoding with transformers' own KV cache (no logits processors: generate() would, e.g.,
    suppress EOS under min_new_tokens)."""
    tokens, past = list(prompt), None
    with torch.no_grad():
        step_input = torch.tensor([prompt])
        for _ in range(steps):
            out = model(step_input, past_key_values=past, use_cache=True)
            past = out.past_key_values
            tokens.append(int(out.logits[0, -1].argmax()))
            step_input = torch.tensor([[tokens[-1]]])
    return tokens[len(prompt) :]


def swiglu_as_configured(model):
    """transformers' GPT-OSS model, its experts' SwiGLU alpha and limit set from its config. transformers
    before 5.19 fixes them at 1.702 and 7.0 whatever the config says (5.19 reads swiglu_alpha and
    swiglu_limit, as ATOM does): the tests' low limits would otherwise meet a reference that never clamps
    there. A no-op on transformers 5.19 and later. Returns the model."""
    for module in model.modules():
        if type(module).__name__ == "GptOssExperts":
            module.alpha = getattr(model.config, "swiglu_alpha", 1.702)
            module.limit = getattr(model.config, "swiglu_limit", 7.0)
    return model


def causal_mask(n: int) -> torch.Tensor:
    return torch.full((n, n), torch.finfo(torch.float32).min).triu(1)[None, None]


def rms(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


class HFMtp(nn.Module):
    """DeepSeek-V3's MTP layer written from its published description, on transformers' decoder layer (the
    independent reference for ATOM's draft): row i of tokens [B, T] and the target's final hidden states
    h [B, T, H] -> logits predicting token i + 2, from head(shared_head.norm(layer(eh_proj([enorm(Emb(t_{i+1})),
    hnorm(h_i)])))) with row i at position i."""

    def __init__(self, main, layer_index: int):
        super().__init__()
        cfg, h = main.config, main.config.hidden_size
        self.main_ref = [main]  # not a submodule: its parameters are the target's
        # the target's own decoder layer class (DeepSeek-V3's, or GLM-4.5's: the same MTP structure)
        self.block = type(main.model.layers[-1])(cfg, layer_index)
        for module in self.block.modules():  # built outside a PreTrainedModel: initialized as its layers are
            main._init_weights(module)
        self.enorm, self.hnorm, self.head_norm = (nn.Parameter(torch.ones(h)) for _ in range(3))
        self.eh_proj = nn.Linear(2 * h, h, bias=False)

    def forward(self, tokens: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
        main = self.main_ref[0]
        eps, n = main.config.rms_norm_eps, tokens.shape[1] - 1
        emb = main.model.embed_tokens(tokens[:, 1:])
        x = self.eh_proj(torch.cat([rms(emb, self.enorm, eps), rms(hidden[:, :-1], self.hnorm, eps)], -1))
        pos = torch.arange(n)[None]
        x = self.block(
            x,
            attention_mask=causal_mask(n),
            position_ids=pos,
            position_embeddings=main.model.rotary_emb(x, pos),
        )
        return main.lm_head(rms(x, self.head_norm, eps))

    def checkpoint_tensors(self, layer_index: int) -> dict[str, torch.Tensor]:
        """Its weights under DeepSeek-V3's published names (with the copies of embedding and head)."""
        main, p = self.main_ref[0], f"model.layers.{layer_index}."
        found = {p + k: v for k, v in self.block.state_dict().items() if ".experts." not in k}
        experts = self.block.mlp.experts  # fused in transformers' module, per expert in published checkpoints
        for e in range(experts.num_experts):
            gate, up = experts.gate_up_proj[e].chunk(2, dim=0)
            names = {"gate_proj": gate, "up_proj": up, "down_proj": experts.down_proj[e]}
            found.update({f"{p}mlp.experts.{e}.{name}.weight": w for name, w in names.items()})
        found.update(
            {
                p + "enorm.weight": self.enorm.data,
                p + "hnorm.weight": self.hnorm.data,
                p + "eh_proj.weight": self.eh_proj.weight.data,
                p + "shared_head.norm.weight": self.head_norm.data,
                p + "embed_tokens.weight": main.model.embed_tokens.weight.data,
                p + "shared_head.head.weight": main.lm_head.weight.data,
            }
        )
        return {k: v.detach().clone().contiguous() for k, v in found.items()}


def hf_main_hidden(main, tokens: torch.Tensor) -> torch.Tensor:
    """transformers' final hidden states (after model.norm) for tokens [B, T]."""
    return main.model(tokens).last_hidden_state


def ragged_prefill_logits(
    path,
    prompts: list[list[int]],
    *,
    state_slots: list[int] | None = None,
    parallel=None,
    device="cpu",
    dtype="float32",
    block_size: int = 4,
) -> list[torch.Tensor]:
    """Every prompt's logits [len, V] from one ragged prefill batch through the engine's ModelRunner
    (torch attention on the CPU; each prompt on its own pages, state slot state_slots[i] if the model has
    state layers)."""
    from atom_core.config import ModelConfig, ParallelConfig
    from atom_core.engine import EngineConfig
    from atom_core.engine.execution.model_runner import ModelRunner
    from atom_core.engine.execution.step_inputs import StepInputs

    config = ModelConfig.from_pretrained(path)
    engine = EngineConfig(
        model=path,
        num_kv_blocks=32,
        block_size=block_size,
        dtype=dtype,
        **({"kernel_backend": "torch"} if device == "cpu" else {}),
    )
    runner = ModelRunner(config, engine, parallel=parallel or ParallelConfig(), device=torch.device(device))
    ids, positions, tables, start = [], [], [], 1
    for p in prompts:
        ids += p
        positions += list(range(len(p)))
        pages = -(-len(p) // block_size)
        tables.append(list(range(start, start + pages)))
        start += pages
    lens = [len(p) for p in prompts]
    rows = list(range(len(ids)))
    slots = state_slots or list(range(len(prompts)))
    ends = list(range(len(prompts)))  # every sequence reaches its last token (every row gets logits)
    logits = runner.run(
        StepInputs(ids, positions, lens, lens, tables, ends, slots, [True] * len(prompts), rows)
    ).logits
    return list(logits.split(lens))


@contextlib.contextmanager
def torch_reference_ops():
    """On the CPU, every atom-kernels op of the engines built inside runs its torch reference: the engine's
    kernel_backend reaches attention only, and norms, rotary, DeltaNet and MoE routing would otherwise run
    in Triton's interpreter over hundreds of rows (minutes). The kernels meet their references in their own
    tests and on the GPU. Tensor-parallel workers read the environment when they start. On a GPU: nothing."""
    if torch.cuda.is_available():
        yield
        return
    from atom_kernels import settings
    from atom_kernels.settings import Backend, Settings

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(settings, "SETTINGS", Settings(Backend.TORCH, settings.SETTINGS.triton_interpret))
        patch.setenv("ATOM_KERNELS_BACKEND", "torch")
        yield
