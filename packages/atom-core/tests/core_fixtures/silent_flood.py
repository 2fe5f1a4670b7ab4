"""A flood of silent connections, run as its own process by test_server_connections.py:
`python silent_flood.py PORT COUNT SECONDS PER_SECOND` prints how many connections it reopened. It imports
nothing of the tests (their helpers load torch), so it starts at once."""

import selectors
import socket
import sys
import time


def silent_flood(port: int, count: int, seconds: float, per_second: float) -> int:
    """Keep `count` connections open that never send a byte, reopening each one the server closes (at most
    `per_second` a second), for `seconds`; returns how many it reopened."""
    sel = selectors.DefaultSelector()
    start = time.monotonic()
    deadline, opened, reopened = start + seconds, 0, 0
    try:
        while time.monotonic() < deadline:
            while len(sel.get_map()) < count and opened < count + per_second * (time.monotonic() - start):
                try:
                    sock = socket.create_connection(("127.0.0.1", port), timeout=1)
                except OSError:
                    break
                opened += 1
                sock.setblocking(False)
                sel.register(sock, selectors.EVENT_READ)
            for key, _ in sel.select(timeout=0.01):  # readable: the server closed it (it sends nothing)
                sel.unregister(key.fileobj)
                key.fileobj.close()
                reopened += 1
    finally:
        for key in list(sel.get_map().values()):
            key.fileobj.close()
        sel.close()
    return reopened


if __name__ == "__main__":
    port, count, seconds, per_second = sys.argv[1:5]
    print(silent_flood(int(port), int(count), float(seconds), float(per_second)))
