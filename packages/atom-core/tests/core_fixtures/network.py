"""Server tests' socket helpers (free ports come from tools.testing_models), and the silent-flood client's
script, run in a subprocess."""

from pathlib import Path

SILENT_FLOOD = Path(__file__).with_name("silent_flood.py")


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
