"""Secure-by-default rules for the engine's Postgres URL.

`validate_database_tls` is pure: it parses the URL the way asyncpg (the
engine's driver) does and refuses it, with `DatabaseUrlRefused`, before any
socket is opened. The rules:

* ``scheme``: only ``postgres://`` and ``postgresql://`` URLs are accepted.
* ``malformed``: the URL cannot be parsed the way the driver parses it, or is
  ambiguous (a raw ``@`` in the userinfo, an empty entry in a host list, a
  query that is not ``name=value`` pairs, a parameter name still holding a
  ``%`` after decoding, ``sslmode`` spelt other than exactly ``sslmode``).
* ``host_override``: a ``host``, ``hostaddr``, ``service`` or ``servicefile``
  query parameter is refused, whatever its spelling (see below). The hosts the
  engine connects to are exactly the hosts named in the URL's authority.
* ``tls_required``: every remote host of the URL needs ``sslmode`` set to
  ``require``, ``verify-ca`` or ``verify-full``. Loopback hosts, unix sockets
  and the hosts named in ``TRUSTED_NETWORK_HOSTS`` are exempt.

Query parameter names are compared after one level of percent-decoding, with
``+`` read as a space (what ``urllib.parse.parse_qs``, and so asyncpg, does;
libpq also decodes one level), then stripped of surrounding whitespace and
case-folded. libpq's names are case-sensitive and ``HOST`` is not ``host``, but
a near-miss spelling is refused rather than left for a driver to interpret
differently. ``service``/``servicefile`` are refused with ``host`` because a
service file can supply the host. A name that still contains ``%`` after decoding is refused as
malformed: no driver decodes twice, and nothing legitimate needs it.

A unix socket is addressed by a percent-encoded path in the authority
(``postgresql://%2Fvar%2Frun%2Fpostgresql/db``), never by ``?host=/path``.

No refusal echoes the password, a query value or the raw URL; refusals name
the offending host.
"""

from __future__ import annotations

import ipaddress
import os
import re
import urllib.parse
from collections.abc import Collection, Mapping

from service_engine.failures import DatabaseUrlRefused

__all__ = [
    "TLS_SSLMODES",
    "TRUSTED_NETWORK_HOSTS_ENV",
    "trusted_hosts_from_env",
    "validate_database_tls",
]

TLS_SSLMODES: frozenset[str] = frozenset({"require", "verify-ca", "verify-full"})
"""The ``sslmode`` values that make a remote connection acceptable."""

TRUSTED_NETWORK_HOSTS_ENV = "TRUSTED_NETWORK_HOSTS"
"""Environment variable naming hosts allowed to connect without TLS."""

_SCHEMES = frozenset({"postgres", "postgresql"})
_HOST_OVERRIDES = frozenset({"host", "hostaddr", "service", "servicefile"})
_KNOWN_SSLMODES = frozenset({"disable", "allow", "prefer"}) | TLS_SSLMODES
# asyncpg's own bracketed-host pattern, anchored at both ends so trailing
# junk after ``]`` is refused instead of silently dropped.
_BRACKETED = re.compile(r"\[([^\]]+)\](?::([0-9]*))?")


def validate_database_tls(url: str, trusted_hosts: Collection[str] = ()) -> None:
    """Refuse a Postgres URL that would connect insecurely.

    Call this before handing ``url`` to the driver; it returns ``None`` when
    the URL is acceptable and raises `DatabaseUrlRefused` (a `ConfigError`)
    naming the broken rule otherwise. Fix the URL rather than catching the
    error: add ``sslmode=verify-full`` (or ``require``/``verify-ca``) for a
    remote host, move a ``host=`` into the authority, or name a host on a
    network you trust in ``trusted_hosts`` (see `trusted_hosts_from_env`).

    A URL with no host at all (``postgresql:///db``) connects through the
    driver's defaults, local sockets and ``localhost``, and needs no TLS; the
    driver also reads ``PGHOST`` then, which this pure check cannot see, so
    the caller must not let ``PGHOST`` name a remote host.
    """
    try:
        parts = urllib.parse.urlsplit(url)
    except ValueError:
        # The parser's message may quote the URL: drop it and its chain.
        raise DatabaseUrlRefused("malformed", "the URL cannot be parsed") from None
    if parts.scheme not in _SCHEMES:
        raise DatabaseUrlRefused("scheme", "expected a postgres:// or postgresql:// URL")

    hosts = _authority_hosts(parts.netloc)
    sslmodes = _query_sslmodes(parts.query)

    trusted = {_normalise_trusted(host) for host in trusted_hosts}
    exposed = [host for host in hosts if not _is_local(host) and host.lower() not in trusted]
    if not exposed:
        return
    if sslmodes and all(mode in TLS_SSLMODES for mode in sslmodes):
        return
    if not sslmodes:
        found = "no sslmode"
    else:
        weak = [mode for mode in sslmodes if mode not in TLS_SSLMODES]
        found = f"sslmode={weak[-1]}" if weak[-1] in _KNOWN_SSLMODES else "an unknown sslmode"
    named = ", ".join(repr(host) for host in exposed)
    raise DatabaseUrlRefused(
        "tls_required",
        f"remote host {named} needs sslmode=require, verify-ca or verify-full "
        f"(found {found}); list the host in {TRUSTED_NETWORK_HOSTS_ENV} only if "
        "its network is trusted",
    )


def trusted_hosts_from_env(environ: Mapping[str, str] | None = None) -> frozenset[str]:
    """Read the ``TRUSTED_NETWORK_HOSTS`` opt-out.

    The value is a comma-separated list of hostnames (or IP literals) allowed
    to connect without TLS; entries are trimmed and empty ones ignored. Pass
    the result to `validate_database_tls`. ``environ`` defaults to
    ``os.environ``; pass a mapping in tests.
    """
    source = os.environ if environ is None else environ
    raw = source.get(TRUSTED_NETWORK_HOSTS_ENV, "")
    return frozenset(entry.strip() for entry in raw.split(",") if entry.strip())


def _authority_hosts(netloc: str) -> list[str]:
    """The decoded hosts of the URL's authority, split as asyncpg splits them."""
    if netloc.count("@") > 1:
        raise DatabaseUrlRefused(
            "malformed", "the userinfo contains a raw '@'; percent-encode it as %40"
        )
    # asyncpg takes everything after the first '@' as the host list.
    _, _, hostlist = netloc.rpartition("@")
    if not hostlist:
        return []
    specs = hostlist.split(",")
    if len(specs) > 1 and not all(specs):
        raise DatabaseUrlRefused("malformed", "the host list has an empty entry")
    return [_decode_hostspec(spec) for spec in specs]


def _decode_hostspec(spec: str) -> str:
    if spec.startswith("["):
        match = _BRACKETED.fullmatch(spec)
        if match is None:
            raise DatabaseUrlRefused("malformed", "a bracketed IPv6 host is not closed")
        address = match.group(1)
    else:
        address, _, _ = spec.partition(":")
    return urllib.parse.unquote(address)


def _query_sslmodes(query: str) -> list[str]:
    """Every ``sslmode`` value of the query, refusing host overrides on the way."""
    if not query:
        return []
    try:
        pairs = urllib.parse.parse_qsl(query, keep_blank_values=True, strict_parsing=True)
    except ValueError:
        # parse_qsl quotes the offending field, which may hold a password.
        raise DatabaseUrlRefused("malformed", "the query string is not name=value pairs") from None
    sslmodes: list[str] = []
    for decoded, value in pairs:
        name = decoded.strip().casefold()
        if "%" in name:
            raise DatabaseUrlRefused(
                "malformed", "a query parameter name still contains '%' after decoding"
            )
        if name in _HOST_OVERRIDES:
            raise DatabaseUrlRefused(
                "host_override",
                f"a {name}= query parameter is refused; name the host in the URL's "
                "authority (a unix socket as a percent-encoded path, "
                "postgresql://%2Fvar%2Frun%2Fpostgresql/db)",
            )
        if name == "sslmode":
            # The driver matches the decoded name exactly: a near miss such as
            # SSLMODE would pass here yet leave the driver at its default.
            if decoded != "sslmode":
                raise DatabaseUrlRefused("malformed", "spell the TLS parameter exactly 'sslmode'")
            sslmodes.append(value)
    return sslmodes


def _is_local(host: str) -> bool:
    """Whether ``host`` is a unix socket, the driver's default, or loopback."""
    if not host or host.startswith("/"):
        return True
    if host.lower() == "localhost":
        return True
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return False
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped.is_loopback
    return address.is_loopback


def _normalise_trusted(host: str) -> str:
    host = host.strip().lower()
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return host
