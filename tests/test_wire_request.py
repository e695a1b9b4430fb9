"""The upgrade's headers as the socket keeps them (`WireRequest`): one
header found by name in the one bytes object answers what Starlette's
``Headers.get`` answers over the same headers."""

from __future__ import annotations

import pytest

from service_engine.server.wire_admission import WireRequest

HEADERS = [
    ("Host", "example.test"),
    ("X-Passport", '{"sub": "alice", "org": "acme"}'),
    ("Origin", "http://example.test"),
    ("X-Forwarded-For", "10.0.0.1"),
    ("x-forwarded-for", "10.0.0.2"),
    ("Sec-Fetch-Site", "same-origin"),
    ("X-Empty", ""),
    ("X-Colon", "a: b: c"),
]


@pytest.mark.parametrize("name", [
    "host", "HOST", "x-passport", "X-Passport", "origin", "x-forwarded-for",
    "sec-fetch-site", "x-empty", "x-colon", "forwarded", "x-pass", "passport", "st",
])
def test_a_header_by_name_is_what_starlette_answers(name: str) -> None:
    """Any case; the first of a repeated header; an empty value; a value
    holding ``": "``; a name that is only a prefix or suffix of another's
    is not found."""
    request = WireRequest(HEADERS, "/graphql/ws", ("127.0.0.1", 5000))
    assert request.get(name) == request.headers.get(name)


def test_no_headers_finds_nothing() -> None:
    """An upgrade without headers finds none."""
    request = WireRequest([], "/graphql/ws", None)
    assert request.get("host") is None
    assert list(request.headers.items()) == []
