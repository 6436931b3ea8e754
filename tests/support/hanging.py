"""A Prometheus that hangs: a TCP server that accepts connections and never answers."""

from __future__ import annotations

import socket
import threading


class HangingServer:
    """Accepts every connection on 127.0.0.1 and holds it open without a byte in reply."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0), backlog=1024)
        self.held: list[socket.socket] = []
        threading.Thread(target=self._serve, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.sock.getsockname()[1]}"

    @property
    def accepted(self) -> int:
        """Connections accepted so far."""
        return len(self.held)

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.held.append(conn)

    def close(self) -> None:
        for conn in self.held:
            conn.close()
        self.sock.close()
