"""Drive ATOM inside SGLang's real runtime pieces on the CPU, the way SGLang's scheduler and ModelRunner do.

Real: SGLang's ModelRunner subclasses from its attention test kits (server args installed through SGLang's
runtime context), ReqToTokenPool, MHATokenToKVPool / MLATokenToKVPool, ForwardBatch/ForwardMode, the per-forward
ForwardContext that publishes the attention backend, LogitsProcessor, its safetensors weight iterator,
and a world-size-1 gloo process group (SGLang's own helper for CPU layer tests). What this stands in for
is SGLang's scheduler: it allocates page-aligned slots as SGLang's paged allocator does (a token at
position p sits at offset p % page_size of its page) and builds the batches.
"""

from __future__ import annotations

import dataclasses
import random
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

import torch
from sglang.srt.configs.model_config import ModelConfig, is_multimodal_model
from sglang.srt.layers.attention.attention_registry import ATTENTION_BACKENDS
from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, MLATokenToKVPool
from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode, ForwardBatch, ForwardMode
from sglang.srt.model_executor.forward_context import ForwardContext, forward_context
from sglang.srt.model_loader.weight_utils import safetensors_weights_iterator
from sglang.test.kits.attention_unittest.attention_methods.dense_attention import (
    DenseAttentionCase,
    MockModelRunner,
    TinyModelConfig,
)
from sglang.test.kits.attention_unittest.attention_methods.mla_attention import (
    MLAAttentionCase,
    MockMLAModelRunner,
    TinyMLAModelConfig,
)
from sglang.test.layer_ut_utils import init_single_process_dist
from transformers import AutoConfig


def sglang_quant_config(hf_config):
    """SGLang's QuantizationConfig for a checkpoint that declares one, made as its model loader makes it
    (its own class for the method, from config.json's dict, with the packed-modules key SGLang adds)."""
    declared = getattr(hf_config, "quantization_config", None)
    if not declared:
        return None
    from sglang.srt.layers.quantization import get_quantization_config

    return get_quantization_config(declared["quant_method"]).from_config(
        {**declared, "packed_modules_mapping": {"qkv_proj": ["q_proj", "k_proj", "v_proj"]}}
    )


@dataclass
class Request:
    prompt: list[int]
    index: int  # its row in req_to_token
    tokens: list[int] = field(default_factory=list)  # everything in the KV cache or about to be
    pages: dict[int, int] = field(default_factory=dict)  # logical page -> physical page


# SGLang's ModelConfig renames a target's architecture for its draft runner.
DRAFT_NAMES = {
    "DeepseekV3ForCausalLM": "DeepseekV3ForCausalLMNextN",
    "Glm4MoeForCausalLM": "Glm4MoeForCausalLMNextN",
    "Qwen3NextForCausalLM": "Qwen3NextForCausalLMMTP",
    **dict.fromkeys(
        [
            "Qwen3_5ForCausalLM",
            "Qwen3_5MoeForCausalLM",
            "Qwen3_5ForConditionalGeneration",
            "Qwen3_5MoeForConditionalGeneration",
        ],
        "Qwen3_5ForCausalLMMTP",
    ),
}


def _mha_runner(c, head_dim, backend, page_size, max_reqs, max_context_len):
    """The attention kit's MHA ModelRunner (its pool is replaced by the caller's, sized for the model)."""
    case = DenseAttentionCase(
        name="atom-model",
        backend=backend,
        forward_mode=ForwardMode.EXTEND,
        num_heads=c.num_attention_heads,
        num_kv_heads=c.num_key_value_heads,
        page_size=page_size,
        prefix_lens=(0,) * max_reqs,
        extend_lens=(1,) * max_reqs,
    )
    tiny = TinyModelConfig(
        num_heads=c.num_attention_heads,
        num_kv_heads=c.num_key_value_heads,
        head_dim=head_dim,
        hidden_size=c.hidden_size,
        context_len=max_context_len,
    )
    return MockModelRunner(
        case=case,
        model_config=tiny,
        dtype=torch.float32,
        device="cpu",
        max_context_len=max_context_len,
        head_dim=head_dim,
    )


def _mla_runner(c, backend, page_size, max_reqs, max_context_len, kv_dtype):
    """The MLA kit's ModelRunner (use_mla_backend, as SGLang sets it for DeepSeek's architectures)."""
    case = MLAAttentionCase(
        name="atom-model",
        backend=backend,
        forward_mode=ForwardMode.EXTEND,
        num_heads=c.num_attention_heads,
        page_size=page_size,
        prefix_lens=(0,) * max_reqs,
        extend_lens=(1,) * max_reqs,
    )
    tiny = TinyMLAModelConfig(
        num_heads=c.num_attention_heads,
        kv_lora_rank=c.kv_lora_rank,
        qk_rope_head_dim=c.qk_rope_head_dim,
        hidden_size=c.hidden_size,
        context_len=max_context_len,
    )
    return MockMLAModelRunner(
        case=case,
        model_config=tiny,
        dtype=torch.float32,
        device="cpu",
        max_context_len=max_context_len,
        kv_lora_rank=c.kv_lora_rank,
        qk_rope_head_dim=c.qk_rope_head_dim,
        fp8_kv_cache=kv_dtype == torch.float8_e4m3fn,
    )


def is_gdn_hybrid(config) -> bool:
    return getattr(config.get_text_config(), "linear_num_value_heads", None) is not None


def _hybrid_runner(c, backend, page_size, max_reqs, max_context_len, size, kv_dtype, verify_tokens):
    """A GDN hybrid's pools as SGLang's kv-cache configurator builds them: a HybridReqToTokenPool owning the
    MambaPool (conv and recurrent state per linear layer; fp32 here, as the CPU tests run) and a
    HybridLinearKVPool over the full-attention layers. The radix cache is off (ATOM's GDN layers require
    it: they keep no prefix snapshots)."""
    from sglang.srt.configs.mamba_utils import Mamba2StateDType
    from sglang.srt.mem_cache.memory_pool import HybridLinearKVPool, HybridReqToTokenPool
    from sglang.srt.runtime_context import get_context

    text = c.get_text_config()
    head_dim = text.head_dim
    runner = _mha_runner(text, head_dim, backend, page_size, max_reqs, max_context_len)
    kit_args = runner._server_args_override  # the kit's server args, with the radix cache off
    kit_args.restore()
    fields = {**kit_args._fields, "disable_radix_cache": True}
    if verify_tokens:  # chain speculation: SGLang sizes the verify scratch from these
        fields.update(
            speculative_eagle_topk=1,
            speculative_num_draft_tokens=verify_tokens,
            speculative_num_steps=verify_tokens - 1,
        )
    runner._server_args_override = get_context().override_server_args(**fields)
    runner.server_args = runner._server_args_override.install()
    params = dataclasses.replace(
        text.mamba2_cache_params, dtype=Mamba2StateDType(conv=torch.float32, temporal=torch.float32)
    )
    runner.req_to_token_pool = HybridReqToTokenPool(
        size=max_reqs,
        mamba_size=max_reqs,
        mamba_spec_state_size=max_reqs,
        max_context_len=max_context_len,
        device="cpu",
        enable_memory_saver=False,
        cache_params=params,
        mamba_layer_ids=text.linear_layer_ids,
        enable_mamba_extra_buffer=False,
        speculative_num_draft_tokens=verify_tokens,
        speculative_eagle_topk=1 if verify_tokens else None,
        enable_overlap_schedule=False,
    )
    runner.token_to_kv_pool = HybridLinearKVPool(
        size=size,
        dtype=kv_dtype,
        page_size=page_size,
        head_num=text.num_key_value_heads,
        head_dim=head_dim,
        full_attention_layer_ids=text.full_attention_layer_ids,
        device="cpu",
        mamba_pool=runner.req_to_token_pool.mamba_pool,
    )
    runner.init_kv_index_translator()
    from sglang.srt.layers.attention.linear.utils import resolve_linear_attn_backends

    runner.linear_attn_backends = resolve_linear_attn_backends()  # ModelRunner.initialize stamps these
    return runner


class SglangHarness:
    """One model on one backend with its own pools: a target, or (draft=True) the NextN draft SGLang builds
    from the same checkpoint, whose forwards read the target's hidden states (draft_extend)."""

    def __init__(
        self,
        checkpoint: Path,
        *,
        page_size: int,
        backend: str = "atom",
        max_reqs: int = 4,
        max_context_len: int = 128,
        seed: int = 0,
        draft: bool = False,
        kv_dtype: torch.dtype = torch.float32,
        verify_tokens: int | None = None,
    ):
        from atom_sglang.models.atom import EntryClass

        init_single_process_dist()
        self.hf_config = AutoConfig.from_pretrained(checkpoint)
        if is_gdn_hybrid(self.hf_config):  # SGLang loads these with its own config classes
            # a multimodal layout (Qwen3.5's ConditionalGeneration) is served as the README says: text only
            lm_only = is_multimodal_model(self.hf_config.architectures)
            self.hf_config = ModelConfig(str(checkpoint), language_model_only=lm_only).hf_config
        c = self.hf_config
        if draft:  # what SGLang's ModelConfig does for a draft runner: rename, one pool layer per MTP layer
            c.architectures = [DRAFT_NAMES[c.architectures[0]]]
        layers = 1 if draft else c.get_text_config().num_hidden_layers  # a draft: its one MTP layer
        self.num_pages = max_reqs * max_context_len // page_size + 1
        size = (self.num_pages - 1) * page_size
        # a hybrid's draft (its MTP layer) is full attention only: a plain pool serves it here
        self.gdn_hybrid = is_gdn_hybrid(c) and not draft
        if self.gdn_hybrid:
            self.runner = _hybrid_runner(
                c, backend, page_size, max_reqs, max_context_len, size, kv_dtype, verify_tokens
            )
        elif getattr(c, "kv_lora_rank", None):
            self.runner = _mla_runner(c, backend, page_size, max_reqs, max_context_len, kv_dtype)
            self.runner.token_to_kv_pool = MLATokenToKVPool(
                size=size,
                page_size=page_size,
                dtype=kv_dtype,
                kv_lora_rank=c.kv_lora_rank,
                qk_rope_head_dim=c.qk_rope_head_dim,
                layer_num=layers,
                device="cpu",
                enable_memory_saver=False,
            )
        else:
            text = c.get_text_config()
            head_dim = getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads
            self.runner = _mha_runner(text, head_dim, backend, page_size, max_reqs, max_context_len)
            self.runner.token_to_kv_pool = MHATokenToKVPool(
                size=size,
                page_size=page_size,
                dtype=kv_dtype,
                head_num=text.num_key_value_heads,
                head_dim=head_dim,
                layer_num=layers,
                device="cpu",
                enable_memory_saver=False,
                enable_alt_stream=False,
            )
        self.backend = ATTENTION_BACKENDS[backend](self.runner)
        if self.gdn_hybrid:  # what SGLang's attn_backend_wrapper builds for hybrid GDN configs
            from sglang.srt.layers.attention.hybrid_linear_attn_backend import HybridLinearAttnBackend
            from sglang.srt.layers.attention.linear.gdn_backend import GDNAttnBackend

            full_ids = c.get_text_config().full_attention_layer_ids
            self.backend = HybridLinearAttnBackend(self.backend, GDNAttnBackend(self.runner), full_ids)
        [cls] = [entry for entry in EntryClass if entry.__name__ == c.architectures[0]]
        with torch.device("cpu"):
            self.model = cls(self.hf_config, quant_config=sglang_quant_config(self.hf_config))
        files = sorted(str(p) for p in Path(checkpoint).glob("*.safetensors"))
        self.loaded = self.model.load_weights(safetensors_weights_iterator(files))
        self.page_size = page_size
        self.free_pages = list(range(1, self.num_pages))  # page 0 holds SGLang's padding slot
        random.Random(seed).shuffle(self.free_pages)  # a request's pages are scattered, as after churn
        self.requests: list[Request] = []

    def add(self, prompt: list[int]) -> Request:
        req = Request(list(prompt), index=len(self.requests))
        self.requests.append(req)
        if self.gdn_hybrid:  # HybridReqToTokenPool.alloc: a mamba state slot per request row
            pool = self.runner.req_to_token_pool
            [slot] = pool.mamba_allocator.alloc(1)
            pool.req_index_to_mamba_index_mapping[req.index] = slot
        return req

    def _slot(self, req: Request, pos: int) -> int:
        page = req.pages.get(pos // self.page_size)
        if page is None:
            page = req.pages[pos // self.page_size] = self.free_pages.pop()
        slot = page * self.page_size + pos % self.page_size
        self.runner.req_to_token_pool.req_to_token[req.index, pos] = slot
        return slot

    def extend(self, chunks: list[tuple[Request, list[int]]]) -> torch.Tensor:
        """Each request's new tokens after what it has cached (a prompt, a chunk of one, a prefix hit)."""
        return self.run(self._extend_batch(chunks, ForwardMode.EXTEND))

    def extend_capturing(self, chunks: list[tuple[Request, list[int]]]):
        """extend, keeping every token's hidden state (SGLang's CaptureHiddenMode.FULL, as its speculative
        worker asks of a target): returns the LogitsProcessorOutput (hidden_states [tokens, H])."""
        batch = self._extend_batch(chunks, ForwardMode.EXTEND)
        batch.capture_hidden_mode = CaptureHiddenMode.FULL
        return self.run_output(batch)

    def draft_extend(
        self, chunks: list[tuple[Request, list[int]]], hidden: torch.Tensor, mode=ForwardMode.EXTEND
    ):
        """A draft forward as SGLang's EAGLE worker runs one: the tokens with the target's hidden states
        (hidden [tokens, H]) in spec_info; EXTEND after a target prefill, DRAFT_EXTEND_V2 after a verify
        (every request the same number of tokens; all rows' logits come back). Returns the
        LogitsProcessorOutput."""
        batch = self._extend_batch(chunks, mode)
        batch.spec_info = SimpleNamespace(hidden_states=hidden, select_index=None)
        batch.capture_hidden_mode = CaptureHiddenMode.FULL
        return self.run_output(batch)

    def verify(self, drafts: list[tuple[Request, list[int]]]):
        """A chain TARGET_VERIFY step as SGLang's EAGLE worker runs it: every request's drafted tokens (the
        same number each) after what it has cached; seq_lens exclude them. Returns the logits of every
        drafted position, [requests * n, vocab]."""
        n = len(drafts[0][1])
        reqs = [r for r, _ in drafts]
        prefix = [len(r.tokens) for r in reqs]
        positions, slots, ids = [], [], []
        for (req, tokens), start in zip(drafts, prefix, strict=True):
            for offset, token in enumerate(tokens):
                positions.append(start + offset)
                slots.append(self._slot(req, start + offset))
                ids.append(token)
            req.tokens += tokens
        batch = self._batch(ForwardMode.TARGET_VERIFY, reqs, ids, positions, slots, prefix)
        batch.spec_info = SimpleNamespace(
            draft_token_num=n, topk=1, num_tokens_per_req=n, ragged_verify_layout=None, custom_mask=None
        )
        return self.run_output(batch).next_token_logits

    def _extend_batch(self, chunks, mode) -> ForwardBatch:
        prefix = [len(r.tokens) for r, _ in chunks]
        new = [len(t) for _, t in chunks]
        positions, slots, ids = [], [], []
        for (req, tokens), start in zip(chunks, prefix, strict=True):
            for offset, token in enumerate(tokens):
                positions.append(start + offset)
                slots.append(self._slot(req, start + offset))
                ids.append(token)
            req.tokens += tokens
        seq_lens = [p + n for p, n in zip(prefix, new, strict=True)]
        batch = self._batch(mode, [r for r, _ in chunks], ids, positions, slots, seq_lens)
        batch.extend_prefix_lens = torch.tensor(prefix, dtype=torch.int32)
        batch.extend_prefix_lens_cpu = prefix
        batch.extend_seq_lens = torch.tensor(new, dtype=torch.int32)
        batch.extend_seq_lens_cpu = new
        batch.extend_start_loc = torch.tensor([0, *new[:-1]], dtype=torch.int32).cumsum(0).to(torch.int32)
        batch.extend_num_tokens = sum(new)
        batch.extend_logprob_start_lens_cpu = list(new)
        return batch

    def decode(self, steps: list[tuple[Request, int]]) -> torch.Tensor:
        return self.run(self._decode_batch(steps))

    def draft_decode(self, steps: list[tuple[Request, int]], hidden: torch.Tensor):
        """One of the draft's multi-step DECODE forwards (topk 1): each request's drafted token with the
        hidden state it chains on (hidden [requests, H], the draft's own previous output) in spec_info.
        Returns the LogitsProcessorOutput."""
        batch = self._decode_batch(steps)
        batch.spec_info = SimpleNamespace(hidden_states=hidden, select_index=None)
        batch.capture_hidden_mode = CaptureHiddenMode.LAST
        return self.run_output(batch)

    def _decode_batch(self, steps: list[tuple[Request, int]]) -> ForwardBatch:
        reqs = [r for r, _ in steps]
        positions = [len(r.tokens) for r in reqs]
        slots = [self._slot(r, p) for r, p in zip(reqs, positions, strict=True)]
        for req, token in steps:
            req.tokens.append(token)
        return self._batch(
            ForwardMode.DECODE, reqs, [t for _, t in steps], positions, slots, [p + 1 for p in positions]
        )

    def _batch(self, mode, reqs, ids, positions, slots, seq_lens) -> ForwardBatch:
        batch = ForwardBatch(
            forward_mode=mode,
            batch_size=len(reqs),
            input_ids=torch.tensor(ids, dtype=torch.int64),
            req_pool_indices=torch.tensor([r.index for r in reqs], dtype=torch.int32),
            seq_lens=torch.tensor(seq_lens, dtype=torch.int32),
            seq_lens_cpu=torch.tensor(seq_lens, dtype=torch.int32),
            out_cache_loc=torch.tensor(slots, dtype=torch.int64),
            seq_lens_sum=sum(seq_lens),
            positions=torch.tensor(positions, dtype=torch.int64),
            capture_hidden_mode=CaptureHiddenMode.NULL,
        )
        self.runner.kv_index_translator.bind_own_plan(batch)
        return batch

    def run(self, batch: ForwardBatch) -> torch.Tensor:
        """What ModelRunner does per forward: publish the backend, prepare its metadata, call the model.
        Returns the next-token logits, [batch, vocab]."""
        return self.run_output(batch).next_token_logits

    def run_output(self, batch: ForwardBatch):
        """One forward -> the model's LogitsProcessorOutput."""
        with torch.no_grad(), forward_context(ForwardContext(attn_backend=self.backend)):
            self.backend.init_forward_metadata(batch)
            return self.model(batch.input_ids, batch.positions, batch)


def generate(h: SglangHarness, prompts: list[list[int]], steps: int = 6):
    """Ragged batch; the longest prompt is prefilled in two chunks (the second rides with nothing else),
    then greedy decode. Returns per request (generated tokens, next-token logits at each step)."""
    reqs = [h.add(p) for p in prompts]
    first = h.extend([(reqs[0], prompts[0]), (reqs[1], prompts[1]), (reqs[2], prompts[2][:20])])
    last = [first[0], first[1], h.extend([(reqs[2], prompts[2][20:])])[0]]
    tokens, logits = [[] for _ in reqs], [[row] for row in last]
    for _ in range(steps):
        step = [int(row.argmax()) for row in last]
        for i, token in enumerate(step):
            tokens[i].append(token)
        last = list(h.decode(list(zip(reqs, step, strict=True))))
        for i, row in enumerate(last):
            logits[i].append(row)
    return tokens, [torch.stack(rows[:-1]) for rows in logits]


def assert_generation_matches(reference_logits, prompts, tokens, logits) -> None:
    """generate()'s output against a reference: reference_logits(token list) -> [len, vocab] logits of one
    sequence. Every step's logits to 1e-4 of their range, and the greedy tokens exactly."""
    for prompt, generated, mine in zip(prompts, tokens, logits, strict=True):
        ref = reference_logits(prompt + generated)[len(prompt) - 1 : len(prompt) - 1 + len(generated)]
        torch.testing.assert_close(mine, ref, atol=1e-4 * float(ref.abs().max()), rtol=1e-4)
        assert ref.argmax(-1).tolist() == generated


def padded_decode(fx, pad: int):
    """An attention-kit fixture's decode batch as SGLang's decode graph runner replays it: the real rows,
    then padding rows on request 0 with seq_len = the backend's fill value and slot 0 (the pool's padding
    slot). Returns (batch, hidden inputs with random padding rows)."""
    fb, fill = fx.forward_batch, fx.backend.get_cuda_graph_seq_len_fill_value()
    cat = torch.cat
    batch = dataclasses.replace(
        fb,
        batch_size=fb.batch_size + pad,
        req_pool_indices=cat([fb.req_pool_indices, torch.zeros(pad, dtype=fb.req_pool_indices.dtype)]),
        seq_lens=cat([fb.seq_lens, torch.full((pad,), fill, dtype=fb.seq_lens.dtype)]),
        out_cache_loc=cat([fb.out_cache_loc, torch.zeros(pad, dtype=fb.out_cache_loc.dtype)]),
        positions=cat([fb.positions, torch.zeros(pad, dtype=fb.positions.dtype)]),
    )
    return batch, cat([fx.input_hidden, torch.randn(pad, fx.input_hidden.shape[1])])
