"""What atom-core's tests share: tiny configs, random checkpoints, transformers' greedy reference, free ports.

pytest imports test files with --import-mode=importlib, so conftest.py puts this directory on sys.path and
tests import this module as `core_support`; worker processes a test spawns inherit that sys.path.
The fixtures built on these (tiny_llama, hf_greedy_tokens, a_free_port) are in conftest.py.
"""

import contextlib
import json

import pytest
import torch
from torch import nn

from atom_core.cache import StateCacheSpec
from tools.testing_models import (  # noqa: F401 (re-exported)
    DEEPSEEK_V2_TINY,
    DEEPSEEK_V3_TINY,
    TINY_ARCHITECTURES,
    TINY_DIMS,
    decisive_routing,
    free_port,
    random_checkpoint,
    successor_language,
)

# A tiny Llama-shaped config (tools/testing_models.py's), the base the tests' own configs override (fp32 on
# the CPU in seconds).
TINY = dict(TINY_DIMS, **TINY_ARCHITECTURES["LlamaForCausalLM"], vocab_size=211)
# The model behind the tiny_llama fixture (engine, server and CLI tests).
TINY_LLAMA = dict(TINY, vocab_size=151)
# Qwen2-MoE's tiny MoE block: routed experts beside a sigmoid-gated shared expert
QWEN2_MOE_SHARED = dict(
    num_experts=4,
    num_experts_per_tok=2,
    moe_intermediate_size=24,
    shared_expert_intermediate_size=40,
)

# Tiny DeepSeek-V3 and V2 (MLA + DeepSeek MoE): every path transformers implements is a variant of these.
YARN = dict(rope_type="yarn", rope_theta=10000.0, factor=4.0, original_max_position_embeddings=64)
DSV3 = dict(
    DEEPSEEK_V3_TINY,
    vocab_size=211,
    hidden_size=64,
    num_hidden_layers=3,
    max_position_embeddings=256,
    rope_interleave=True,
    rope_parameters=dict(YARN, beta_fast=32, beta_slow=1, mscale=0.9, mscale_all_dim=0.7),
    bos_token_id=0,
    eos_token_id=1,
)
DSV2 = dict(
    DEEPSEEK_V2_TINY,
    vocab_size=211,
    hidden_size=64,
    num_hidden_layers=3,
    max_position_embeddings=256,
    rope_parameters=dict(YARN, mscale=0.707, mscale_all_dim=0.707),
)


def drain_finished(engine) -> dict:
    """Step an engine until it has nothing left; its finished outputs by request id."""
    finished = {}
    while engine.has_unfinished_requests():
        finished.update({out.request_id: out for out in engine.step() if out.finished})
    return finished


def deepseek_checkpoint(path, config_cls, base: dict, overrides: dict):
    """A random tiny model whose routing is decisive (no near-ties between implementations) and whose
    e_score_correction_bias is not zero, saved as transformers saves it."""
    model, _ = random_checkpoint(config_cls(**{**base, **overrides}), path, edit=decisive_routing)
    return model


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


class TokenCounter(nn.Module):
    """A state layer, as a GDN layer is one: per sequence, the count and sum of the tokens it has seen, kept in
    its state slot. Each forward counts rows whose resumed state does not cover exactly the positions before
    their chunk, or whose `fresh` flag disagrees with starting at position 0 (`problems`). Tensor ops only, so
    decode steps replay it in CUDA graphs."""

    SPEC = StateCacheSpec((("seen", (2,), torch.float64),))

    def __init__(self, cache_index: int):
        super().__init__()
        self.cache_index = cache_index
        self.cache_spec = self.SPEC
        self.problems = self.fresh_starts = self.resumed = None  # [] int64 on the model's device

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> None:
        from atom_core.forward_context import current_forward_context

        ctx = current_forward_context()
        meta, state = ctx.metadata_for("state"), ctx.caches[self.cache_index].states["seen"]
        if self.problems is None:
            self.problems, self.fresh_starts, self.resumed = torch.zeros(
                3, dtype=torch.int64, device=state.device
            )
        cu = meta.cu_seqlens_q.long()
        start = positions[cu[:-1]]
        sums = torch.cat([input_ids.new_zeros(1), input_ids.cumsum(0)]).to(torch.float64)
        seen = torch.stack([(cu[1:] - cu[:-1]).to(torch.float64), sums[cu[1:]] - sums[cu[:-1]]], dim=1)
        valid, fresh = meta.slots >= 0, meta.fresh
        rows = meta.slots.long().clamp(min=0)  # padding rows (-1) change nothing below
        before = state[rows] * (~fresh)[:, None]
        wrong = (before[:, 0] != start) | (fresh != (start == 0))
        self.problems.add_((wrong & valid).sum())
        self.fresh_starts.add_((fresh & valid).sum())
        self.resumed.add_((~fresh & valid).sum())
        state.index_add_(0, rows, torch.where(valid[:, None], before + seen - state[rows], 0))


def install_token_counter(monkeypatch) -> list[TokenCounter]:
    """Every Llama-family model built from now on gets a TokenCounter after its decoder layers (the last cache
    index) that sees every forward's tokens; returns the list the built counters are appended to."""
    from atom_core.models.llama import LlamaForCausalLM

    init, forward, counters = LlamaForCausalLM.__init__, LlamaForCausalLM.forward, []

    def counted_init(self, config, ctx, prefix=""):
        init(self, config, ctx, prefix)
        self.counter = TokenCounter(cache_index=len(self.model.layers))
        counters.append(self.counter)

    def counted_forward(self, input_ids, positions, inputs_embeds=None):
        self.counter(input_ids, positions)
        return forward(self, input_ids, positions, inputs_embeds)

    monkeypatch.setattr(LlamaForCausalLM, "__init__", counted_init)
    monkeypatch.setattr(LlamaForCausalLM, "forward", counted_forward)
    return counters


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
        from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3DecoderLayer

        cfg, h = main.config, main.config.hidden_size
        self.main_ref = [main]  # not a submodule: its parameters are the target's
        self.block = DeepseekV3DecoderLayer(cfg, layer_index)
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


def deepseek_mtp_checkpoint(path, overrides: dict | None = None, *, train_steps: int = 0, seed: int = 0):
    """A tiny DeepSeek-V3 with its MTP layer (model.layers.{L}.*, num_nextn_predict_layers 1), saved as the
    published checkpoints are. train_steps > 0 trains target and MTP layer together on successor_language
    first, so the draft predicts well. Returns (transformers' target model, the HFMtp reference)."""
    from safetensors.torch import load_file, save_file
    from transformers import AutoModelForCausalLM, DeepseekV3Config

    torch.manual_seed(seed)
    cfg = DeepseekV3Config(**{**DSV3, **(overrides or {})})
    layers = cfg.num_hidden_layers
    main = AutoModelForCausalLM.from_config(cfg, attn_implementation="eager")
    mtp = HFMtp(main, layers)
    with torch.no_grad():
        for mlp in [layer.mlp for layer in main.model.layers] + [mtp.block.mlp]:
            if hasattr(mlp, "gate"):
                mlp.gate.weight.normal_(0, 0.5)
                mlp.gate.e_score_correction_bias.uniform_(-0.3, 0.3)
        mtp.eh_proj.weight.normal_(0, 0.05)
    if train_steps:
        _train(main, mtp, train_steps, seed)
    main.eval(), mtp.eval()
    main.save_pretrained(path)
    tensors = load_file(path / "model.safetensors")
    tensors.update(mtp.checkpoint_tensors(layers))
    save_file(tensors, path / "model.safetensors", metadata={"format": "pt"})
    config = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**config, "num_nextn_predict_layers": 1}, indent=1))
    return main, mtp


def _train(main, mtp, steps: int, seed: int) -> None:
    _, sample = successor_language(main.config.vocab_size, seed)
    gen = torch.Generator().manual_seed(seed + 1)
    params = list(main.parameters()) + [p for n, p in mtp.named_parameters() if not n.startswith("main_ref")]
    opt = torch.optim.AdamW(params, lr=3e-3, weight_decay=0.0)
    main.train(), mtp.train()
    ce = nn.functional.cross_entropy
    for _ in range(steps):
        tokens = sample(32, 24, gen)
        out = main(tokens, output_hidden_states=True)
        logits = out.logits[:, :-1]
        draft = mtp(tokens, out.hidden_states[-1])[:, :-1]  # row i predicts token i + 2
        v = logits.shape[-1]
        loss = ce(logits.reshape(-1, v), tokens[:, 1:].reshape(-1)) + ce(
            draft.reshape(-1, v), tokens[:, 2:].reshape(-1)
        )
        opt.zero_grad()
        loss.backward()
        opt.step()


def save_word_tokenizer(path, vocab_size: int) -> None:
    """A word-level tokenizer for a synthetic vocabulary: id i is the word "w{i}" (0 and 1: <s> and </s>), words
    joined by spaces, so stop strings can name token sequences."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = {"<s>": 0, "</s>": 1, **{f"w{i}": i for i in range(2, vocab_size)}}
    tok = Tokenizer(models.WordLevel(words, unk_token="<s>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##")  # joins words with spaces
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>")
    fast.save_pretrained(path)


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


def closed_within(sock, seconds: float) -> bool:
    """Whether the server closes sock within `seconds` (reading and dropping what it still sends); sock
    stays open on our side, for the caller to use or close."""
    sock.settimeout(seconds)
    try:
        while sock.recv(65536):
            pass
        return True
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False


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


def mtp(k: int) -> dict:
    """The speculative config of k MTP drafts."""
    return {"method": "mtp", "num_speculative_tokens": k}


def language_prompts(vocab: int, lengths, seed: int = 3) -> list[list[int]]:
    """Prompts of the given lengths from successor_language(vocab): text a draft can learn to predict."""
    _, sample = successor_language(vocab)
    gen = torch.Generator().manual_seed(seed)
    return [sample(1, n, gen)[0].tolist() for n in lengths]


def plain_tokens(prompts, outs) -> dict[tuple[tuple[int, ...], int], list[int]]:
    """Each sample's plain output tokens by (prompt, sample index)."""
    return {(tuple(p), o.index): o.token_ids for p, r in zip(prompts, outs, strict=True) for o in r.outputs}


def forced(plain: dict[tuple[tuple[int, ...], int], list[int]], right_for: int | None, vocab: int):
    """A Drafter.oracle proposing from the plain outputs (plain_tokens): a sequence's draft j, the guess for
    output position p = len(output_token_ids) + j, is the plain token at p if j < right_for (None: every
    draft), else that token + 1, a wrong one. A step verifying d such drafts then accepts exactly
    min(right_for, len(d)): with right_for 1, one a step that verifies any (num_verifications)."""

    def oracle(seq, j: int, token: int) -> int:
        want = plain[(tuple(seq.prompt_token_ids), seq.index)]
        p = len(seq.output_token_ids) + j
        if p >= len(want):  # never, for requests that ignore EOS: drafts stop at max_tokens
            return token
        return want[p] if right_for is None or j < right_for else (want[p] + 1) % vocab

    return oracle
