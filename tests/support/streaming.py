"""A scripted OpenAI-compatible streaming endpoint for the load generator's unit tests: the
server-sent event framing, and an aiohttp app served on a free loopback port."""

from __future__ import annotations

import json
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from aiohttp import web


def sse(payload: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(payload).encode() + b"\n\n"


@asynccontextmanager
async def serving(
    app: web.Application, *, handler_cancellation: bool = False
) -> AsyncIterator[str]:
    """The app on 127.0.0.1, its base URL; with `handler_cancellation`, a request the client
    hangs up on is dropped rather than served to the end."""
    runner = web.AppRunner(app, handler_cancellation=handler_cancellation)
    await runner.setup()
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    site = web.SockSite(runner, sock)
    await site.start()
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        await runner.cleanup()
