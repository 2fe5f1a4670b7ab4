"""The `atom` command line.

`atom generate` runs greedy generation on a checkpoint dir, or on the built-in demo checkpoint when no
--model is given. ATOM's own engine is not built yet: until it is, generation runs the checkpoint through
HF transformers (the ground-truth implementation ATOM's models are tested against) and says so.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from atom_core import __version__


def _log(message: str) -> None:
    print(f"[atom] {message}", file=sys.stderr, flush=True)


def _parse_token_ids(raw: str) -> list[int]:
    try:
        ids = [int(t) for t in raw.replace(",", " ").split()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--prompt-token-ids wants integers, got {raw!r}") from None
    if not ids:
        raise argparse.ArgumentTypeError("--prompt-token-ids is empty")
    return ids


def _build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="atom", description="ATOM: LLM inference")
    parser.add_argument("--version", action="store_true", help="print package versions and exit")
    sub = parser.add_subparsers(dest="command")
    gen = sub.add_parser("generate", help="greedy generation on a checkpoint (default: the built-in demo)")
    gen.add_argument("--model", type=Path, help="HF checkpoint dir (safetensors); default: built-in demo")
    gen.add_argument("--prompt", action="append", help="a prompt; repeat for several")
    gen.add_argument(
        "--prompt-token-ids", action="append", type=_parse_token_ids, help="a prompt as token ids: '1,2,3'"
    )
    gen.add_argument("--max-tokens", type=int, default=32)
    gen.add_argument("--device", default=None, help="cpu or cuda (default: cuda if available)")
    gen.add_argument("--json", action="store_true", help="print one JSON object per prompt")
    return parser


def _generate(args: argparse.Namespace) -> int:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from atom_core.demo import ensure_demo_checkpoint

    if args.max_tokens < 1:
        _log("--max-tokens must be at least 1")
        return 2
    model_dir = args.model or ensure_demo_checkpoint(log=_log)
    if not (model_dir / "config.json").is_file():
        _log(f"{model_dir} is not a checkpoint dir (no config.json)")
        return 2
    if args.model is None:
        _log("using the built-in demo checkpoint: RANDOM weights, so the text below is meaningless")
    _log(
        "ATOM's engine is not built yet: this run generates with HF transformers, the reference "
        "implementation ATOM's models are tested against"
    )
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, use_safetensors=True).to(device).eval()

    prompts: list[tuple[str | None, list[int]]] = [(p, tokenizer(p).input_ids) for p in args.prompt or []]
    prompts += [(None, ids) for ids in args.prompt_token_ids or []]
    if not prompts:
        prompts = [(p, tokenizer(p).input_ids) for p in ("Paged attention keeps", "The quick brown fox")]
    for text, ids in prompts:
        with torch.inference_mode():
            out = model.generate(
                torch.tensor([ids], device=device),
                attention_mask=torch.ones(1, len(ids), dtype=torch.long, device=device),
                max_new_tokens=args.max_tokens,
                do_sample=False,
                pad_token_id=tokenizer.eos_token_id,
            )
        new_ids = out[0, len(ids) :].tolist()
        completion = tokenizer.decode(new_ids, skip_special_tokens=True)
        if args.json:
            record = {"prompt": text, "prompt_token_ids": ids, "token_ids": new_ids, "text": completion}
            print(json.dumps(record))
        else:
            print(f"{text if text is not None else ids!r} -> {completion!r}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = _build_parser()
    args = parser.parse_args(argv)
    if args.version:
        import atom_kernels

        print(f"atom-core {__version__}, atom-kernels {atom_kernels.__version__}")
        return 0
    if args.command == "generate":
        return _generate(args)
    parser.print_help()
    return 2


if __name__ == "__main__":
    raise SystemExit(main())
