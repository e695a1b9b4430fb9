"""A session's identity: generated (`new_session_id`) or supplied by the
client (`parse_session_id`) to correlate a subscription with page requests."""

from __future__ import annotations

import re
import secrets
from typing import NewType

from ..failures import AttachError

__all__ = ["InvalidSessionId", "SessionId", "new_session_id", "parse_session_id"]

SessionId = NewType("SessionId", str)
"""A session's identity: generated, or supplied by the client
(`attach_with_session`) to correlate a subscription with page requests."""

_SESSION_ID = re.compile(r"[A-Za-z0-9_.:~-]{1,128}")


def new_session_id() -> SessionId:
    """A fresh random id (128 bits, URL-safe)."""
    return SessionId(secrets.token_urlsafe(16))


class InvalidSessionId(AttachError):
    """A client-supplied session id is not 1-128 characters of
    ``[A-Za-z0-9_.:~-]``."""


def parse_session_id(text: object) -> SessionId:
    """Validate a client-supplied session id; raises `InvalidSessionId`."""
    if not isinstance(text, str) or _SESSION_ID.fullmatch(text) is None:
        raise InvalidSessionId("a session id is 1-128 characters of [A-Za-z0-9_.:~-]")
    return SessionId(text)

