"""The offer drain's revision cache alone (no I/O): least recently used out
first within its bound, valid for one fence, a bad bound refused."""

from __future__ import annotations

import pytest

from service_engine.errors import ConfigError
from service_engine.messaging.nats import KvEntry
from service_engine.offers.drain import REVISION_CACHE_KEYS, RevisionCache


def entry(key: str, revision: int) -> KvEntry:
    return KvEntry(key, b"v%d" % revision, revision)


def test_a_remembered_key_is_known_and_an_absent_one_is_known_absent() -> None:
    """A remembered entry comes back as it was, a key remembered absent
    comes back known-and-None, an unknown key is a miss; hits and misses
    are counted."""
    cache = RevisionCache()
    assert cache.bound == REVISION_CACHE_KEYS
    cache.under(1)
    cache.remember("a", entry("a", 3))
    cache.remember("b", None)
    assert cache.lookup("a") == (True, entry("a", 3))
    assert cache.lookup("b") == (True, None)
    assert cache.lookup("c") == (False, None)
    assert (cache.hits, cache.misses) == (2, 1)
    cache.forget("a")
    assert cache.lookup("a") == (False, None)


def test_the_least_recently_used_key_goes_first_beyond_the_bound() -> None:
    """At most ``bound`` keys are held; a lookup or a re-remember makes a
    key recent, so the oldest untouched key is the one dropped."""
    cache = RevisionCache(3)
    cache.under(1)
    for i, key in enumerate("abc"):
        cache.remember(key, entry(key, i + 1))
    cache.lookup("a")  # a is now the most recent
    cache.remember("d", entry("d", 4))
    assert len(cache) == 3
    assert "b" not in cache and all(k in cache for k in "acd")
    cache.remember("c", entry("c", 5))  # c refreshed
    cache.remember("e", entry("e", 6))
    assert "a" not in cache and all(k in cache for k in "cde")
    for i in range(100):
        cache.remember(f"x{i}", None)
    assert len(cache) == 3


def test_a_new_fence_forgets_and_the_same_fence_keeps() -> None:
    """Entries learned under one fence are served only under it: another
    fence (or a clear) starts empty."""
    cache = RevisionCache()
    cache.under(7)
    cache.remember("a", entry("a", 1))
    cache.under(7)
    assert "a" in cache
    cache.under(8)
    assert len(cache) == 0 and cache.fence == 8
    cache.remember("a", entry("a", 2))
    cache.clear()
    assert len(cache) == 0 and cache.fence is None


def test_a_zero_bound_remembers_nothing_and_a_bad_bound_is_refused() -> None:
    """Bound 0 turns the cache off (every key is read); a negative or
    non-integer bound is a `ConfigError`."""
    cache = RevisionCache(0)
    cache.under(1)
    cache.remember("a", entry("a", 1))
    assert len(cache) == 0
    for bad in (-1, 1.5, True, "4096"):
        with pytest.raises(ConfigError):
            RevisionCache(bad)  # type: ignore[arg-type]
