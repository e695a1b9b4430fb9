"""The secure-by-default Postgres URL rules of `validate_database_tls`."""

from __future__ import annotations

import pytest

from service_engine.db.tls import trusted_hosts_from_env, validate_database_tls
from service_engine.errors import ConfigError, DatabaseUrlRefused

SECRET = "Zq9-s3cr3t-P4ss"

ACCEPTED = [
    # Remote hosts with a TLS sslmode.
    "postgresql://app:pw@db.example.com/app?sslmode=require",
    "postgresql://app:pw@db.example.com:6432/app?sslmode=verify-ca",
    "postgres://app:pw@db.example.com/app?sslmode=verify-full",
    "postgresql://app:pw@10.0.0.7/app?sslmode=verify-full&application_name=x",
    "postgresql://app:pw@[2001:db8::1]:5432/app?sslmode=require",
    "postgresql://app:pw@db1.example.com:5432,db2.example.com:5433/app?sslmode=require",
    "POSTGRESQL://app:pw@db.example.com/app?sslmode=require",
    # A repeated sslmode is fine while every value is a TLS mode.
    "postgresql://db.example.com/app?sslmode=require&sslmode=verify-full",
    # Percent-encoded names of parameters that are not host overrides.
    "postgresql://db.example.com/app?%73slmode=require",
    # Loopback needs no TLS.
    "postgresql://app:pw@localhost/app",
    "postgresql://app:pw@LocalHost:5433/app",
    "postgresql://app:pw@127.0.0.1/app?sslmode=disable",
    "postgresql://app:pw@127.8.9.10:5432/app",
    "postgresql://app:pw@[::1]/app",
    "postgresql://app:pw@[::1]:5432/app",
    "postgresql://app:pw@[::ffff:127.0.0.1]/app",
    "postgresql://app:pw@localhost,127.0.0.1:5433/app",
    # Unix sockets and the driver's local default need no TLS.
    "postgresql:///app",
    "postgresql://app@/app",
    "postgresql://%2Fvar%2Frun%2Fpostgresql/app",
    "postgresql://app:pw@%2Ftmp:5432/app",
    # Multi-host: remote hosts have TLS, local ones don't need it.
    "postgresql://localhost,db.example.com/app?sslmode=require",
    # A percent-encoded '@' in the password is not a second '@'.
    "postgresql://app:p%40ss@localhost/app",
]

REFUSED = [
    # (url, rule)
    ("mysql://app:pw@db.example.com/app?sslmode=require", "scheme"),
    ("http://db.example.com/app", "scheme"),
    ("db.example.com/app", "scheme"),
    ("", "scheme"),
    # Remote without TLS.
    ("postgresql://app:pw@db.example.com/app", "tls_required"),
    ("postgresql://app:pw@db.example.com/app?sslmode=disable", "tls_required"),
    ("postgresql://app:pw@db.example.com/app?sslmode=allow", "tls_required"),
    ("postgresql://app:pw@db.example.com/app?sslmode=prefer", "tls_required"),
    ("postgresql://app:pw@db.example.com/app?sslmode=", "tls_required"),
    ("postgresql://app:pw@db.example.com/app?sslmode=REQUIRE", "tls_required"),
    ("postgresql://db.example.com/app?sslmode=require&sslmode=disable", "tls_required"),
    ("postgresql://db.example.com/app?sslmode=disable&sslmode=require", "tls_required"),
    ("postgresql://app:pw@10.0.0.7:5432/app", "tls_required"),
    ("postgresql://app:pw@[2001:db8::1]/app", "tls_required"),
    ("postgresql://app:pw@0.0.0.0/app", "tls_required"),
    # "localhost." is a DNS name, not the loopback alias.
    ("postgresql://app:pw@localhost./app", "tls_required"),
    ("postgresql://app:pw@localhost.evil.example/app", "tls_required"),
    # Multi-host: one remote host without TLS refuses the URL.
    ("postgresql://localhost:5432,db.example.com:5433/app", "tls_required"),
    ("postgresql://%2Ftmp,10.1.2.3/app", "tls_required"),
    # A percent-encoded remote host is still remote.
    ("postgresql://%64b.example.com/app", "tls_required"),
    # host= / hostaddr= overrides, however spelt.
    ("postgresql://localhost/app?host=evil.example", "host_override"),
    ("postgresql:///app?host=/var/run/postgresql", "host_override"),
    ("postgresql://localhost/app?hostaddr=203.0.113.9", "host_override"),
    ("postgresql://localhost/app?%68ost=evil.example", "host_override"),
    ("postgresql://localhost/app?%68%6F%73%74=evil.example", "host_override"),
    ("postgresql://localhost/app?h%6Fstaddr=203.0.113.9", "host_override"),
    ("postgresql://localhost/app?H%4FST=evil.example", "host_override"),
    ("postgresql://localhost/app?HOST=evil.example", "host_override"),
    ("postgresql://localhost/app?HostAddr=203.0.113.9", "host_override"),
    ("postgresql://localhost/app?host+=evil.example", "host_override"),
    ("postgresql://localhost/app?%20host=evil.example", "host_override"),
    ("postgresql://localhost/app?host=", "host_override"),
    (
        "postgresql://db.example.com/app?sslmode=require&host=evil.example",
        "host_override",
    ),
    # A service file can name the host: refused with host=.
    ("postgresql:///app?service=prod", "host_override"),
    ("postgresql://localhost/app?servicefile=/tmp/x", "host_override"),
    # Malformed or ambiguous.
    ("postgresql://localhost/app?%2568ost=evil.example", "malformed"),
    ("postgresql://db.example.com/app?SSLMODE=require", "malformed"),
    ("postgresql://db.example.com/app?%53slmode=require", "malformed"),
    ("postgresql://localhost/app?justaname", "malformed"),
    ("postgresql://app:p@ss@localhost/app", "malformed"),
    ("postgresql://localhost,,db.example.com/app?sslmode=require", "malformed"),
    ("postgresql://[::1/app", "malformed"),
    ("postgresql://[::1]junk/app", "malformed"),
]


@pytest.mark.parametrize("url", ACCEPTED)
def test_accepted(url: str) -> None:
    """Each URL in ACCEPTED (TLS to remote hosts, local sockets and loopback) passes the TLS rules."""
    validate_database_tls(url)


@pytest.mark.parametrize(("url", "rule"), REFUSED)
def test_refused(url: str, rule: str) -> None:
    """Each URL in REFUSED is refused under the rule it breaks."""
    with pytest.raises(DatabaseUrlRefused) as info:
        validate_database_tls(url)
    assert info.value.rule == rule


def test_refusal_is_a_config_error_and_a_value_error() -> None:
    """A refused database URL is a ConfigError and a ValueError."""
    with pytest.raises(ConfigError):
        validate_database_tls("postgresql://db.example.com/app")
    with pytest.raises(ValueError):
        validate_database_tls("postgresql://db.example.com/app")


def test_tls_refusal_names_every_exposed_host() -> None:
    """A TLS refusal names every non-local host exposed and the weak sslmode, and not the local one."""
    url = "postgresql://localhost,db1.example.com,db2.example.com:5433/app?sslmode=prefer"
    with pytest.raises(DatabaseUrlRefused) as info:
        validate_database_tls(url)
    message = str(info.value)
    assert "db1.example.com" in message
    assert "db2.example.com" in message
    assert "'localhost'" not in message
    assert "sslmode=prefer" in message


def test_trusted_host_opts_out_of_tls() -> None:
    """A host listed as trusted (case-insensitive, exact match only) may be reached without TLS."""
    url = "postgresql://app:pw@db.internal:5432/app"
    validate_database_tls(url, trusted_hosts={"db.internal"})
    validate_database_tls(url, trusted_hosts=["DB.Internal"])
    with pytest.raises(DatabaseUrlRefused):
        validate_database_tls(url, trusted_hosts={"other.internal"})
    # The match is exact: a suffix or prefix does not count.
    with pytest.raises(DatabaseUrlRefused):
        validate_database_tls(url, trusted_hosts={"internal"})


def test_trusted_host_covers_only_itself_in_a_multi_host_url() -> None:
    """In a multi-host URL a trusted host covers only itself; the refusal names the untrusted one."""
    url = "postgresql://db.internal,db.example.com/app"
    with pytest.raises(DatabaseUrlRefused) as info:
        validate_database_tls(url, trusted_hosts={"db.internal"})
    assert "db.example.com" in str(info.value)
    assert "db.internal" not in str(info.value).split("needs")[0]
    validate_database_tls(url, trusted_hosts={"db.internal", "db.example.com"})


def test_trusted_ipv6_literal_with_or_without_brackets() -> None:
    """A trusted IPv6 literal matches with or without brackets."""
    url = "postgresql://[fd00::7]:5432/app"
    validate_database_tls(url, trusted_hosts={"fd00::7"})
    validate_database_tls(url, trusted_hosts={"[fd00::7]"})


def test_trusted_host_does_not_excuse_a_host_override() -> None:
    """A trusted host does not excuse a host override in the query string."""
    with pytest.raises(DatabaseUrlRefused) as info:
        validate_database_tls(
            "postgresql://db.internal/app?host=db.internal", trusted_hosts={"db.internal"}
        )
    assert info.value.rule == "host_override"


@pytest.mark.parametrize(
    "url",
    [
        f"postgresql://app:{SECRET}@db.example.com/app",
        f"postgresql://app:{SECRET}@db.example.com/app?sslmode=disable",
        f"postgresql://app:{SECRET}@localhost/app?host=evil",
        f"postgresql://app:{SECRET}@localhost/app?%68ost=evil",
        f"mysql://app:{SECRET}@db.example.com/app",
        f"postgresql://app:{SECRET}@@db.example.com/app",
        f"postgresql://app:{SECRET}@[::1/app",
        f"postgresql://app:{SECRET}@[::1]x/app",
        f"postgresql://app:{SECRET}@a,,b/app",
        f"postgresql://app@db.example.com/app?password={SECRET}",
        f"postgresql://app@db.example.com/app?{SECRET}",
        f"postgresql://app@db.example.com/app?sslmode={SECRET}",
        f"postgresql://app@db.example.com/app?%25{SECRET}=x",
    ],
)
def test_refusals_never_echo_the_password(url: str) -> None:
    """No refusal, however malformed the URL, echoes the password, in its text, repr, args or
    chained cause."""
    with pytest.raises(DatabaseUrlRefused) as info:
        validate_database_tls(url)
    rendered = f"{info.value}\n{info.value!r}\n{info.value.args}"
    assert SECRET not in rendered
    assert info.value.__cause__ is None
    assert info.value.__suppress_context__ or info.value.__context__ is None


def test_trusted_hosts_from_env() -> None:
    """TRUSTED_NETWORK_HOSTS parses as a comma list, spaces and empty entries ignored."""
    env = {"TRUSTED_NETWORK_HOSTS": " db.internal , ,10.0.0.7,,[fd00::7] "}
    assert trusted_hosts_from_env(env) == frozenset({"db.internal", "10.0.0.7", "[fd00::7]"})
    assert trusted_hosts_from_env({}) == frozenset()
    assert trusted_hosts_from_env({"TRUSTED_NETWORK_HOSTS": ""}) == frozenset()
    assert trusted_hosts_from_env({"TRUSTED_NETWORK_HOSTS": " , "}) == frozenset()


def test_trusted_hosts_from_env_defaults_to_os_environ(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Without an argument the trusted hosts are read from the process environment."""
    monkeypatch.setenv("TRUSTED_NETWORK_HOSTS", "db.internal")
    assert trusted_hosts_from_env() == frozenset({"db.internal"})
    monkeypatch.delenv("TRUSTED_NETWORK_HOSTS")
    assert trusted_hosts_from_env() == frozenset()


async def test_connect_pool_refuses_keyword_host_overrides() -> None:
    """connect_pool refuses a host keyword that would override the URL's host."""
    from service_engine.db import connect_pool

    with pytest.raises(DatabaseUrlRefused) as refused:
        await connect_pool("postgresql://app:pw@127.0.0.1:5432/db", host="db.evil.example")
    assert refused.value.rule == "host_override"
