"""DeepSeek-V3's and GLM-4.5's MTP layers as SGLang's NextN drafts (DeepseekV3ForCausalLMNextN,
Glm4MoeForCausalLMNextN): built in one process from the target's checkpoint as SGLang's EAGLE worker builds
it, sharing the target's embedding and head, fed the target's captured hidden states through spec_info,
against transformers' own MTP model."""

import pytest
import torch
from sglang.srt.model_executor.forward_batch_info import ForwardMode
from sglang_harness import SglangHarness
from sglang_support import DEEPSEEK_V3_TINY, TINY, TINY_ARCHITECTURES
from transformers import AutoModelForCausalLM

from atom_core.integration import current_forward_context
from tools.testing_models import random_deepseek_mtp_checkpoint, transformers_mtp_logits

PROMPTS = ([7, 19, 33, 2, 250, 41, 90, 12, 5], [3, *range(100, 118), 4])
WINDOW = 3  # tokens each request's draft re-reads after a verify (SGLang's num_draft_tokens)


# the targets whose checkpoints carry DeepSeek's MTP layout: (tiny fields, transformers config class, the
# draft architecture SGLang names)
NEXTN = {
    "deepseek-v3": ({**TINY, **DEEPSEEK_V3_TINY}, "DeepseekV3Config", "DeepseekV3ForCausalLMNextN"),
    "glm-4.5": (
        {**TINY, **TINY_ARCHITECTURES["Glm4MoeForCausalLM"]},
        "Glm4MoeConfig",
        "Glm4MoeForCausalLMNextN",
    ),
}


@pytest.fixture(scope="module", params=list(NEXTN))
def checkpoint(request, tmp_path_factory):
    import transformers

    fields, config_class, draft_name = NEXTN[request.param]
    path = random_deepseek_mtp_checkpoint(
        fields, tmp_path_factory.mktemp(request.param), config_class=getattr(transformers, config_class)
    )
    return path, draft_name


def _sequences():
    g = torch.Generator().manual_seed(3)
    return [p + torch.randint(2, 300, (WINDOW + 1,), generator=g).tolist() for p in PROMPTS]


def _reference(checkpoint, sequence, chained=None):
    """transformers' MTP logits for every row of one sequence (row i predicts token i + 2 from token i + 1
    and the target's h_i); chained: the hidden state the last row reads instead (a draft step's own)."""
    main = AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.float32).eval()
    ids = torch.tensor([sequence])
    with torch.no_grad():
        hidden = _chain(main.model(ids).last_hidden_state, chained)
    return transformers_mtp_logits(checkpoint, ids, hidden)


def _chain(hidden: torch.Tensor, chained: torch.Tensor | None) -> torch.Tensor:
    """hidden [1, T, H] with row T - 2 (the last row an MTP reference reads) replaced by `chained`."""
    if chained is not None:
        hidden = hidden.clone()
        hidden[0, -2] = chained
    return hidden


def _draft_rows(target, draft, prompts, sequences):
    """SGLang's EAGLE flow for each sequence (a prompt, then WINDOW + 1 more tokens): the target prefills
    the prompts capturing every hidden state; the draft extends the prompts shifted by one (row i: token
    i + 1 with the target's h_i); the target runs the next window and the draft re-reads it as
    DRAFT_EXTEND_V2; then one draft DECODE step chains on the draft's own output. Returns each request's
    draft logits: its last prefill row, its WINDOW window rows, and (the proposed tokens, the hidden states
    they chained on, the decode rows)."""
    t_reqs = [target.add(s) for s in sequences]
    d_reqs = [draft.add(s) for s in sequences]
    out = target.extend_capturing([(r, p) for r, p in zip(t_reqs, prompts, strict=True)])
    d_out = draft.draft_extend(
        [(r, s[1 : len(p) + 1]) for r, s, p in zip(d_reqs, sequences, prompts, strict=True)],
        out.hidden_states,
    )
    prefill_rows = d_out.next_token_logits
    out = target.extend_capturing(
        [(r, s[len(p) : len(p) + WINDOW]) for r, s, p in zip(t_reqs, sequences, prompts, strict=True)]
    )
    d_out = draft.draft_extend(
        [
            (r, s[len(p) + 1 : len(p) + 1 + WINDOW])
            for r, s, p in zip(d_reqs, sequences, prompts, strict=True)
        ],
        out.hidden_states,
        mode=ForwardMode.DRAFT_EXTEND_V2,
    )
    window_rows = d_out.next_token_logits.split(WINDOW)
    # One multi-step DECODE: each request's drafted token, chained on the draft's own last hidden state.
    chained = torch.stack([rows[-1] for rows in d_out.hidden_states.split(WINDOW)])
    proposed = [int(rows[-1].argmax()) for rows in window_rows]
    decode_rows = draft.draft_decode(list(zip(d_reqs, proposed, strict=True)), chained).next_token_logits
    with pytest.raises(RuntimeError, match="no ForwardContext is bound"):
        current_forward_context()  # nothing leaked out of the forwards
    return prefill_rows, window_rows, (proposed, chained, decode_rows)


def _assert_rows(prompts, sequences, prefill_rows, window_rows, decode, reference):
    """reference(sequence, chained) -> the independent MTP logits of every row (row i predicts token i + 2;
    chained: the hidden state the last row reads instead of the target's)."""
    proposed, chained, decode_rows = decode
    for i, (sequence, prompt) in enumerate(zip(sequences, prompts, strict=True)):
        ref = reference(sequence, None)
        scale = float(ref.abs().max())
        torch.testing.assert_close(prefill_rows[i], ref[len(prompt) - 1], atol=1e-4 * scale, rtol=1e-4)
        rows = ref[len(prompt) : len(prompt) + WINDOW]
        torch.testing.assert_close(window_rows[i], rows, atol=1e-4 * scale, rtol=1e-4)
        m = len(prompt) + WINDOW  # the decode row: the proposed token, chained on the draft's row m - 1
        ref = reference([*sequence[: m + 1], proposed[i]], chained[i])[m]
        torch.testing.assert_close(decode_rows[i], ref, atol=1e-4 * scale, rtol=1e-4)


def _share_vocab(target, draft):
    """SGLang's EAGLE worker: embed, head = target.get_embed_and_head(); draft.set_embed_and_head(...)."""
    embed, head = target.model.get_embed_and_head()
    draft.model.set_embed_and_head(embed, head)
    shared_embed, shared_head = draft.model.get_embed_and_head()
    assert shared_embed is embed and shared_head is head  # the same storage, not copies


@pytest.mark.parametrize("draft_backend", ["atom", "torch_native"])
def test_the_draft_shares_the_targets_vocab_and_equals_transformers_mtp(checkpoint, draft_backend):
    checkpoint, draft_name = checkpoint
    target = SglangHarness(checkpoint, page_size=16, seed=1)
    draft = SglangHarness(checkpoint, page_size=16, seed=2, draft=True, backend=draft_backend)
    assert type(draft.model).__name__ == draft_name
    assert draft.runner.token_to_kv_pool.layer_num == 1  # the draft runner's own pool: its MTP layer, id 0
    # load_weights names what it filled: the MTP layer's tensors, nothing of the target's
    assert draft.loaded and all(".layers.2." in name for name in draft.loaded)
    _share_vocab(target, draft)
    sequences = _sequences()
    rows = _draft_rows(target, draft, PROMPTS, sequences)
    _assert_rows(PROMPTS, sequences, *rows, lambda s, chained: _reference(checkpoint, s, chained))


QWEN_DRAFTS = {
    "qwen3-next": "Qwen3NextForCausalLMMTP",
    "qwen3.5": "Qwen3_5ForCausalLMMTP",
    "qwen3.5-moe": "Qwen3_5ForCausalLMMTP",
    "qwen3.5-conditional-generation": "Qwen3_5ForCausalLMMTP",
}


@pytest.mark.parametrize("case", list(QWEN_DRAFTS))
def test_qwen_mtp_drafts_beside_their_hybrid_target_equal_the_mtp_reference(case, tmp_path):
    # SGLang names every Qwen3.5 draft Qwen3_5ForCausalLMMTP; the checkpoint's config.json says which
    # target's MTP layer (dense or MoE, text or multimodal layout) ATOM builds.
    from tools.testing_qwen import qwen_mtp_checkpoint

    main, mtp = qwen_mtp_checkpoint(tmp_path, case, full_attention_interval=2)
    target = SglangHarness(tmp_path, page_size=16, seed=1)
    draft = SglangHarness(tmp_path, page_size=16, seed=2, draft=True)
    assert type(draft.model).__name__ == QWEN_DRAFTS[case]
    assert draft.loaded and all(".mtp." in f".{name}" for name in draft.loaded)
    _share_vocab(target, draft)
    prompts = ([7, 19, 33, 2, 150, 41, 90, 12, 5], [3, *range(100, 118), 4])
    g = torch.Generator().manual_seed(4)
    sequences = [p + torch.randint(2, 200, (WINDOW + 1,), generator=g).tolist() for p in prompts]
    rows = _draft_rows(target, draft, prompts, sequences)

    def reference(sequence, chained):
        ids = torch.tensor([sequence])
        with torch.no_grad():
            return mtp(ids, _chain(main.model(ids).last_hidden_state, chained))[0]

    _assert_rows(prompts, sequences, *rows, reference)


def test_a_draft_without_the_targets_vocab_says_so(checkpoint):
    draft = SglangHarness(checkpoint[0], page_size=16, draft=True)
    req = draft.add([5, 6, 7])
    with pytest.raises(RuntimeError, match="set_embed_and_head before the first forward"):
        draft.draft_extend([(req, [5, 6, 7])], torch.zeros(3, TINY["hidden_size"]))
    embed = torch.zeros(TINY["vocab_size"], TINY["hidden_size"])
    with pytest.raises(NotImplementedError, match="--speculative-token-map"):
        draft.model.set_embed_and_head(embed, embed[:100])


def test_sglangs_draft_backend_factory_builds_the_documented_draft_backends(checkpoint):
    # The supported launch: target on `--attention-backend atom`, draft on a built-in backend through
    # `--speculative-draft-attention-backend` (SGLang builds draft backends from a fixed table: `atom` is
    # not in it). SGLang's own factory, unpatched, builds them for an MLA or MHA draft runner.
    from sglang.srt.speculative.draft_utils import DraftBackendFactory

    draft = SglangHarness(checkpoint[0], page_size=16, draft=True)
    draft.runner.draft_attention_backend = "triton"
    factory = DraftBackendFactory(draft.runner, topk=1, speculative_num_steps=3)
    assert type(factory.create_decode_backend()).__name__ == "TritonMultiStepDraftBackend"
    assert type(factory.create_draft_extend_backend()).__name__ == "TritonAttnBackend"
    draft.runner.draft_attention_backend = None  # the target's `atom`: SGLang refuses it by name
    with pytest.raises(ValueError, match="EAGLE is not supported in decode attention backend atom"):
        DraftBackendFactory(draft.runner, topk=1, speculative_num_steps=3).create_decode_backend()
