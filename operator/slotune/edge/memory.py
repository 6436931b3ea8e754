"""Giving the C heap's free pages back to the system after a burst of work."""

from __future__ import annotations

import ctypes
from typing import Any

try:  # glibc's
    _LIBC: Any = ctypes.CDLL("libc.so.6")
    _LIBC.malloc_trim  # noqa: B018 - present on glibc only
except (OSError, AttributeError):
    _LIBC = None


def trim_heap() -> None:
    """Hands the C heap's free pages back to the system (glibc's malloc_trim). Python frees
    the objects of a deleted LLMDeployment, its watch events and its reconciles, but glibc
    keeps the freed pages: without this, the operator's memory never went down after a burst
    of work or a bulk delete. Elsewhere (musl) there is no such call, and nothing to do."""
    if _LIBC is not None:
        _LIBC.malloc_trim(0)
