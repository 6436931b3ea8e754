"""Small helpers shared by the test servers (control plane, Prometheus): free ports and the
tail of a process's log for error messages."""

from __future__ import annotations

import socket
import subprocess
from pathlib import Path


def free_ports(count: int) -> list[int]:
    """Ports free on 127.0.0.1, held open together so that none is handed out twice."""
    sockets = []
    try:
        for _ in range(count):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.bind(("127.0.0.1", 0))
            sockets.append(sock)
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def log_tail(path: Path, lines: int = 40) -> str:
    try:
        data = path.read_text(errors="replace").splitlines()
    except OSError:
        return "(no log)"
    return "\n".join(data[-lines:])


def script_path(script: Path, *args: str) -> Path:
    """The path a setup script prints as its last line (our scripts' convention: progress
    on stderr, the thing they made or found on the last line of stdout)."""
    out = subprocess.run(
        ["bash", str(script), *args], check=True, stdout=subprocess.PIPE, text=True
    ).stdout
    return Path(out.strip().splitlines()[-1])
