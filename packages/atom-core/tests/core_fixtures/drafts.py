"""Oracle drafts: speculative configs, prompts of a learnable language, and drafts forced right or wrong from
the tokens a non-speculative run produced (speculative output must equal non-speculative output)."""

import torch

from atom_core.engine.execution.step_inputs import DraftInputs, StepInputs
from tools.testing_models import successor_language


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


def draft_logits_in_two_forwards(runner, tokens: list[int], state_slot: int) -> torch.Tensor:
    """The draft model's logits [len(tokens) - 1, V] for the tokens after each of tokens[:-1], one sequence:
    the target prefills all of them (state in state_slot; -1 without state layers), then the draft runs its
    rows in two forwards, so that its own KV cache carries from the first into the second."""
    n, table = len(tokens), list(range(5))
    target = runner.run(
        StepInputs(tokens, list(range(n)), [n], [n], [table], [0], [state_slot], [True], list(range(n)))
    )
    logits = []
    for rows in (range(0, 7), range(7, n - 1)):
        step = DraftInputs(
            [tokens[i + 1] for i in rows],
            list(rows),
            [len(rows)],
            [rows.stop],
            [table],
            list(rows),
            "target",
            list(range(len(rows))),
        )
        logits.append(runner.run_draft(step, target).logits)
    return torch.cat(logits)
