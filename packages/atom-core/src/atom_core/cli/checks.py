"""What is wrong with a command line that needs no engine to see: checked before torch or transformers
is imported, so a missing checkpoint dir, or a checkpoint given where a prompt goes, fails at once."""

from __future__ import annotations

import argparse
from pathlib import Path


def looks_like_a_checkpoint(text: str) -> bool:
    """Whether a positional prompt is a path instead: an existing directory, or one word written as a
    path (./x, ../x, /x, ~/x, x/)."""
    if Path(text).expanduser().is_dir():
        return True
    return not any(c.isspace() for c in text) and (
        text.startswith(("./", "../", "/", "~/")) or text.endswith("/")
    )


def model_error(model: Path | None) -> str | None:
    """Why `model` cannot be a checkpoint dir (checked before anything heavy is imported), or None."""
    if model is None:
        return None
    if not model.exists():
        return (
            f"{model}: no such checkpoint dir (ATOM loads a checkpoint from a local directory; "
            "it downloads nothing)"
        )
    if not model.is_dir():
        return f"{model} is a file, not a checkpoint dir (give the directory that holds config.json)"
    if not (model / "config.json").is_file():
        return f"{model} is not a checkpoint dir (no config.json)"
    return None


def check_arguments(args: argparse.Namespace) -> str | None:
    """What is wrong with the command line that needs no engine to see, or None. Sets args.model from
    serve's positional MODEL."""
    if args.command == "bench-serve":  # its --model names a served model, not a checkpoint dir
        return None
    if args.command == "serve" and args.model_tag is not None:
        if args.model is not None and args.model != args.model_tag:
            return f"two models given: MODEL {args.model_tag} and --model {args.model}; give one"
        args.model = args.model_tag
    names = getattr(args, "served_model_name", None) or []
    if len(set(names)) != len(names) or not all(n.strip() for n in names):
        return f"--served-model-name wants distinct, non-empty names, got {names}"
    if args.model is not None:
        args.model = args.model.expanduser()
    if args.command == "generate":
        for prompt in args.prompts:
            if looks_like_a_checkpoint(prompt):
                return (
                    f"{prompt!r} looks like a checkpoint dir, not a prompt: give it as --model {prompt} "
                    "(positional arguments are prompts)"
                )
    return model_error(args.model)
