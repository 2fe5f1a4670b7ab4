"""The `atom` command line in vLLM's shape: `atom serve MODEL`, `atom generate --model MODEL PROMPT...`,
checkpoint mistakes refused in one line before the engine (torch, transformers) is imported, and --help
that shows every flag's meaning and default."""

import json
import re
import subprocess
import sys

import pytest

from atom_core.cli import build_parser, main
from atom_core.cli.checks import looks_like_a_checkpoint


def _one_error(capsys) -> str:
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("[atom] error:")]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


@pytest.fixture
def checkpoint(tmp_path):
    """A directory that looks like a checkpoint (config.json) without weights: enough for the checks here."""
    path = tmp_path / "ckpt"
    path.mkdir()
    (path / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"]}))
    return path


def test_serve_takes_the_checkpoint_as_its_positional_model(tmp_path, capsys):
    missing = tmp_path / "missing"
    assert main(["serve", str(missing)]) == 2
    assert f"{missing}: no such checkpoint dir" in _one_error(capsys)
    assert main(["serve", str(tmp_path)]) == 2
    assert f"{tmp_path} is not a checkpoint dir (no config.json)" in _one_error(capsys)


def test_serve_refuses_two_different_models(checkpoint, tmp_path, capsys):
    assert main(["serve", str(checkpoint), "--model", str(tmp_path)]) == 2
    assert "two models given" in _one_error(capsys)


def test_a_checkpoint_where_a_prompt_goes_is_refused_not_completed(checkpoint, capsys):
    assert main(["generate", str(checkpoint)]) == 2
    line = _one_error(capsys)
    assert "looks like a checkpoint dir, not a prompt" in line and f"--model {checkpoint}" in line
    assert main(["generate", "./not-yet-there/"]) == 2
    assert "looks like a checkpoint dir" in _one_error(capsys)


@pytest.mark.parametrize(
    ("text", "path"),
    [
        ("./ckpt", True),
        ("~/models/llama", True),
        ("/models/x", True),
        ("llama/", True),
        ("The quick brown fox", False),
        ("either/or, whichever", False),
        ("a/b", False),
    ],
)
def test_what_counts_as_a_path_among_prompts(text, path):
    assert looks_like_a_checkpoint(text) is path


def test_a_file_given_as_the_model_is_named(checkpoint, capsys):
    assert main(["bench", "--model", str(checkpoint / "config.json")]) == 2
    assert "is a file, not a checkpoint dir" in _one_error(capsys)


@pytest.mark.parametrize(
    "args",
    [
        ["generate", "--model", "/nonexistent/ckpt"],
        ["serve", "/nonexistent/ckpt"],
        ["bench", "--model", "/nonexistent/ckpt"],
        ["generate", "./some/ckpt/"],
        ["serve", "--kernel-backend", "aiter"],  # (offered by no --help: no op implements it)
        ["generate", "--log-level", "loud"],
        ["bench", "--max-num-seqs", "many"],
        ["serve", "--served-model-name", "a", "a"],
        ["bench-serve"],  # (--max-token-id is required)
        ["bench-serve", "--max-token-id", "9", "--request-rate", "0"],
        ["bench-serve", "--max-token-id", "9", "--base-url", "localhost:8000"],
    ],
)
def test_argument_errors_come_before_the_engine_is_imported(args):
    code = (
        "import sys\nfrom atom_core.cli import main\n"
        "try:\n    rc = main(sys.argv[1:])\nexcept SystemExit as exit_:\n    rc = exit_.code\n"
        "print(rc, [m for m in ('torch', 'transformers') if m in sys.modules])"
    )
    done = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=120)
    assert done.stdout.split("\n")[0] == "2 []", done.stdout + done.stderr
    assert done.stderr.count("[atom] error:") == 1


def test_help_shows_every_flag_with_its_meaning_and_default():
    parser = build_parser()
    commands = parser._subparsers._group_actions[0].choices
    assert set(commands) == {"generate", "serve", "bench", "bench-serve"}
    for name, command in commands.items():
        for action in command._actions:
            assert action.help, f"atom {name} {'/'.join(action.option_strings) or action.dest} has no help"
        text = " ".join(command.format_help().split())  # (unwrapped)
        if name == "bench-serve":  # a client of a running server: no engine flags
            assert "(default: http://127.0.0.1:8000)" in text and "--max-num-seqs" not in text
        else:
            assert "(default: 256)" in text  # --max-num-seqs
        assert "(default: None)" not in text and "(default: False)" not in text
        for flag in text.split(" --"):  # a default the help text gives already is not repeated
            assert flag.count("default:") <= 1, flag
        assert "aiter" not in text
    assert "greedy unless --temperature" in " ".join(parser.format_help().split())


def test_a_busy_port_is_refused_before_the_model_loads():
    import socket

    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen()
    port = holder.getsockname()[1]
    code = (
        "import sys; from atom_core.cli import main; rc = main(sys.argv[1:]); "
        "print(rc, [m for m in ('torch', 'transformers') if m in sys.modules])"
    )
    try:
        done = subprocess.run(
            [sys.executable, "-c", code, "serve", "--port", str(port)],
            capture_output=True,
            text=True,
            timeout=120,
        )
    finally:
        holder.close()
    assert done.stdout.split("\n")[0] == "2 []", done.stdout + done.stderr
    lines = [line for line in done.stderr.splitlines() if line.startswith("[atom] error:")]
    assert len(lines) == 1 and f"cannot listen on 127.0.0.1:{port}" in lines[0], done.stderr
    assert "pick another --port" in lines[0]


def test_a_bad_command_line_is_one_error_line_naming_the_flag_and_the_help(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["serve", "--kernel-backend", "aiter"])
    err = capsys.readouterr().err
    assert exit_.value.code == 2
    [line] = err.splitlines()  # (argparse quotes the choices or not, by Python version)
    assert re.fullmatch(
        r"\[atom\] error: argument --kernel-backend: invalid choice: 'aiter' \(choose from '?triton'?, "
        r"'?torch'?\) \(see atom serve --help\)",
        line,
    ), line
