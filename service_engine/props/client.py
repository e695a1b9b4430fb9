"""A small caller of the props verbs over NATS (tests, tools, the README)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import nats.errors
from nats.aio.client import Client

from .addressing import subject
from .errors import ERROR_RC, PropsError


class PropsUnanswered(PropsError):
    """Nobody answered the verb (no responders or a timeout)."""


def decode_reply(headers: Mapping[str, str], data: bytes) -> dict[str, Any]:
    """The success body, or the refusal raised as `PropsError`."""
    body = json.loads(data or b"{}")
    if not isinstance(body, dict):
        raise PropsError("unavailable", "a props reply body is not a JSON object")
    if headers.get("rc") == "0":
        return body
    code = body.pop("error_code", "unavailable")
    message = body.pop("message", headers.get("error", ""))
    if code not in ERROR_RC:
        code = "unavailable"
    raise PropsError(code, str(message), **body)


class PropsClient:
    """Calls ``<service>.props.<verb>`` on a connected nats-py ``client``."""

    def __init__(self, client: Client, service: str, *, timeout: float = 5.0) -> None:
        self._client = client
        self.service = service
        self._timeout = timeout

    async def request(
        self, verb: str, namespace: str, *, body: Any = None, **headers: str
    ) -> dict[str, Any]:
        """Send one verb; ``headers`` are its wire headers (``key``, ``if_version``, ...)."""
        data = b"" if body is None else json.dumps(body).encode()
        try:
            msg = await self._client.request(
                subject(self.service, verb),
                data,
                timeout=self._timeout,
                headers={"namespace": namespace, **headers},
            )
        except (nats.errors.NoRespondersError, nats.errors.TimeoutError) as exc:
            raise PropsUnanswered("unavailable", f"{verb}: {type(exc).__name__}") from exc
        return decode_reply(msg.headers or {}, msg.data or b"")

    async def set(
        self, namespace: str, fields: Mapping[str, Any], **headers: str
    ) -> dict[str, Any]:
        return await self.request("set", namespace, body=dict(fields), **headers)

    async def get(self, namespace: str, **headers: str) -> dict[str, Any]:
        return await self.request("get", namespace, **headers)
