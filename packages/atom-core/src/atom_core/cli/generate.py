"""`atom generate --model MODEL [PROMPT ...]`: complete prompts, as vLLM's LLM.generate, and print them."""

from __future__ import annotations

import argparse
import json

from atom_core.cli.common import Help, configure_logging, parse_token_ids, say, with_engine_args

# what `atom generate` samples with where neither a flag nor the checkpoint's generation config says
GENERATE_FALLBACKS = {"temperature": 0.0, "max_tokens": 32}


def add_parser(sub) -> None:
    gen = with_engine_args(
        sub.add_parser(
            "generate",
            help="complete prompts on a checkpoint (greedy unless --temperature or the checkpoint's "
            "generation_config.json says otherwise; default: the built-in demo)",
            formatter_class=Help,
        )
    )
    gen.add_argument(
        "prompts",
        nargs="*",
        metavar="PROMPT",
        help="prompts to complete (as vLLM's LLM.generate); the checkpoint goes in --model",
    )
    gen.add_argument("--prompt", action="append", help="a prompt; repeat for several")
    gen.add_argument(
        "--prompt-token-ids", action="append", type=parse_token_ids, help="a prompt as token ids: '1,2,3'"
    )
    # unset sampling flags take the checkpoint's generation_config.json values (--generation-config auto),
    # else the fallbacks below: greedy, 32 tokens
    gen.add_argument(
        "--max-tokens",
        type=int,
        help="tokens generated per prompt, at most (default: the checkpoint's, else 32)",
    )
    gen.add_argument(
        "--temperature",
        type=float,
        help="sampling temperature, 0: greedy (default: the checkpoint's, else 0)",
    )
    gen.add_argument("--top-p", type=float, help="nucleus sampling: the top tokens' mass kept (default: all)")
    gen.add_argument("--top-k", type=int, help="the k most likely tokens kept, -1: all (default: all)")
    gen.add_argument("--ignore-eos", action="store_true", help="keep generating past end-of-sequence")
    gen.add_argument("--json", action="store_true", help="print one JSON object per prompt")


def run(args: argparse.Namespace) -> int:
    from atom_core.demo import ensure_demo_checkpoint
    from atom_core.engine import LLM, EngineConfig, SamplingParams

    configure_logging(args.log_level)

    # (--seed is the engine's: it seeds every prompt, as vLLM's)
    flags = dict(temperature=args.temperature, top_p=args.top_p, top_k=args.top_k, max_tokens=args.max_tokens)
    given = {k: v for k, v in flags.items() if v is not None} | {"ignore_eos": args.ignore_eos}
    try:
        SamplingParams(**{**GENERATE_FALLBACKS, **given})  # the flags checked before the model loads
    except ValueError as err:
        say(f"error: {err}")
        return 2
    model_dir = args.model or ensure_demo_checkpoint(log=say)
    if args.model is None:
        say("using the built-in demo checkpoint: RANDOM weights, so the text below is meaningless")
    llm = LLM.from_engine_config(EngineConfig.from_cli_args(args, model=model_dir))
    params = SamplingParams(**{**GENERATE_FALLBACKS, **llm.engine.generation_defaults, **given})
    prompts: list = [*args.prompts, *(args.prompt or [])] + [
        {"prompt_token_ids": ids} for ids in args.prompt_token_ids or []
    ]
    if not prompts:
        prompts = ["Paged attention keeps", "The quick brown fox"]
    try:
        outputs = llm.generate(prompts, params)
    except ValueError as err:
        say(f"error: {err}")
        return 2
    finally:
        llm.shutdown()
    failed = 0
    for out in outputs:
        completion = out.outputs[0]
        if out.error is not None:  # the engine failed this request: said, and the exit status says so
            shown = out.prompt if out.prompt is not None else out.prompt_token_ids
            say(f"error: the request for {shown!r} failed: {out.error}")
            failed += 1
            continue
        if args.json:
            print(
                json.dumps(
                    {
                        "prompt": out.prompt,
                        "prompt_token_ids": out.prompt_token_ids,
                        "token_ids": completion.token_ids,
                        "text": completion.text,
                        "finish_reason": completion.finish_reason,
                    }
                )
            )
        else:
            shown = out.prompt if out.prompt is not None else out.prompt_token_ids
            print(f"{shown!r} -> {completion.text!r}")
    return 1 if failed else 0
