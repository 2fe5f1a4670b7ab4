"""What `atom serve` says before it serves, and the socket it serves on.

The socket is bound before the model loads, so a busy port or an address this machine does not have fails
at once, in one line, instead of after a load that may take minutes. Once loaded, one block of lines names
the model, where it runs and what memory it holds; `ready` follows when requests are accepted.
"""

from __future__ import annotations

import errno
import socket
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from atom_core.engine.llm_engine import LLMEngine

GIB = 1 << 30


def bind_socket(host: str, port: int) -> socket.socket:
    """A TCP socket bound to host:port (port 0: any free one), not listening yet: the server listens on it
    once the model is loaded (connections before that are refused, not queued)."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
    except socket.gaierror as err:
        raise OSError(f"--host {host}: not an address to listen on ({err.strerror})") from None
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(address)
    except OSError as err:
        sock.close()
        hint = (
            "another process listens there: stop it, or pick another --port"
            if err.errno == errno.EADDRINUSE
            else "check --host and --port"
        )
        raise OSError(f"cannot listen on {host}:{port}: {err.strerror} ({hint})") from None
    return sock


def address_of(sock: socket.socket) -> str:
    """The URL root a bound socket serves at (the port the system picked, for port 0)."""
    host, port = sock.getsockname()[:2]
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def startup_lines(
    engine: LLMEngine, served_name: str, reasoning_parser: str | None = None, tool_parser: str | None = None
) -> list[str]:
    """The startup block: the model, where it runs, its memory and cache, its step modes."""
    config, plan, model = engine.config, engine.plan, engine.model_config
    tp = config.tensor_parallel_size
    devices = f"{engine.device}" + (f" x {tp} (tensor parallel)" if tp > 1 else "")
    weights = memory_size(engine.runner.weight_bytes)
    tokens = plan.num_blocks * plan.block_size
    lines = [
        f"model {served_name}: {model.architecture} from {config.model or 'the built-in demo checkpoint'}",
        f"dtype {str(model.dtype).removeprefix('torch.')}, device {devices}, weights {weights} a device",
        f"KV cache: {plan.num_blocks} blocks of {plan.block_size} tokens ({tokens} tokens), "
        f"max_model_len {plan.max_model_len}, max_num_seqs {plan.max_num_seqs}",
    ]
    # (the modes the plan turned off, CUDA graphs among them, the engine has logged with their reasons)
    if plan.graph_sizes:
        lines.append("CUDA graphs: batch sizes " + ", ".join(map(str, plan.graph_sizes)))
    if plan.num_speculative_tokens:
        lines.append(f"speculative decoding: {plan.num_speculative_tokens} draft tokens a step")
    if reasoning_parser is not None:
        lines.append(f"reasoning parser: {reasoning_parser} (chat answers' reasoning_content)")
    if tool_parser is not None:
        lines.append(f'tool-call parser: {tool_parser} (tool_choice "auto")')
    return lines


def memory_size(size: int) -> str:
    """Bytes in the largest binary unit that leaves at least one: 1.50 GiB, 297.2 KiB."""
    for unit, scale, digits in (("GiB", GIB, 2), ("MiB", 1 << 20, 1), ("KiB", 1 << 10, 1)):
        if size >= scale:
            return f"{size / scale:.{digits}f} {unit}"
    return f"{size} B"
