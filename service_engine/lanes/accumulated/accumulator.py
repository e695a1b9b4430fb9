"""The accumulated lane's declaration and its Postgres rows.

A service declares what a key's stream folds into::

    REPLY = Accumulator("reply", initial=lambda: "", fold=lambda text, chunk: text + chunk.decode())
    engine.register_accumulator(REPLY)

Chunks arrive through `Engine.push_chunk` or over NATS on
``stream.{service}.{key}``; each is durable in ``accumulator_chunk`` under
``(accumulator, key, seq)``. A key's state is the fold of its contiguous
prefix 0, 1, 2, ... (it stops at the first gap and resumes when it fills);
the seal (`seal_in`, ``cx.seal``) folds and deletes the chunks and writes
the key's marker in ``accumulator_seal``.

Writers and the seal meet on one advisory lock per key (`lane_lock_key`):
a chunk write takes it shared with a non-blocking try, the seal takes it
exclusively, so a chunk commits either before the seal (and is folded by
it, or refuses it) or after (and is refused by the marker): never lost.
"""

from __future__ import annotations

import hashlib
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar

from ...db.locks import advisory_key
from ...db.types import Conn
from .chunks import ChunkSeq, FoldCache, Gesture, check_key

__all__ = [
    "LANE_LOCK_DOMAIN",
    "Accumulator",
    "Cancelled",
    "Durable",
    "Folded",
    "SealPurger",
    "fold_key",
    "lane_lock_key",
    "read_seal",
]

S = TypeVar("S")

LANE_LOCK_DOMAIN = "service_engine.lane"


def lane_lock_key(accumulator: str, key: str) -> int:
    """The advisory lock a key's chunk writes (shared) and seal (exclusive) meet on."""
    return advisory_key(LANE_LOCK_DOMAIN, accumulator, key)


class SealPurger(Protocol):
    """The engine side of a seal: what runs once it committed (the purge of
    the key's NATS subject), and the count of a refusal."""

    def sealed(
        self, accumulator: str, key: str, gesture: Gesture
    ) -> Callable[[], Awaitable[None]]: ...

    def refused(self, gesture: Gesture, code: str) -> None: ...


@dataclass(eq=False)
class Accumulator(Generic[S]):
    """A streaming accumulator: ``fold(state, chunk)`` over a key's chunks
    in sequence order, from ``initial()``.

    ``fold`` must return a new state and leave its argument alone: folded
    prefixes are cached (bounded by ``fold_cache_capacity``) and shared.
    """

    name: str
    initial: Callable[[], S]
    fold: Callable[[S, bytes], S]
    _purgers: list[SealPurger] = field(default_factory=list, repr=False)

    def fold_all(self, chunks: Sequence[bytes], state: S | None = None) -> S:
        folded = self.initial() if state is None else state
        for chunk in chunks:
            folded = self.fold(folded, chunk)
        return folded

    def _attach(self, purger: SealPurger) -> None:
        """An engine serving this accumulator purges its sealed subjects."""
        if purger not in self._purgers:
            self._purgers.append(purger)

    def _detach(self, purger: SealPurger) -> None:
        if purger in self._purgers:
            self._purgers.remove(purger)

    @property
    def _purger(self) -> SealPurger | None:
        """The engine (of this process) that purges this accumulator's sealed keys."""
        return self._purgers[-1] if self._purgers else None


@dataclass(frozen=True, slots=True)
class Durable:
    """The receipt of one chunk: committed in Postgres (``duplicate`` when
    the identical chunk already was)."""

    accumulator: str
    key: str
    seq: ChunkSeq
    duplicate: bool = False


@dataclass(frozen=True, slots=True)
class Folded(Generic[S]):
    """A key's state: the fold of chunks ``0..next_seq-1`` (the fold
    stopped at ``next_seq``: a gap, or the end), the SHA-256 of those
    chunks, and the seal's high water when the key is sealed (its chunks
    are gone then and ``state`` is ``initial()``: the seal returned the
    folded state to whoever sealed it)."""

    state: S
    next_seq: int
    hash: str
    sealed_at: int | None = None


@dataclass(frozen=True, slots=True)
class Cancelled(Generic[S]):
    """What a cancel gesture (``cx.seal_partial``, ``cx.seal_current``)
    sealed: the fold of the contiguous prefix (``state``, chunks
    ``0..folded-1``), the marker's ``high_water``, and ``dropped``: the
    sequences of durable chunks past a gap in that prefix, which the fold
    cannot reach and the cancel discarded (empty when the prefix was
    whole). An acked chunk is never dropped silently: a caller that must
    not lose one checks ``dropped`` (or seals with ``cx.seal``, which
    refuses a gap)."""

    state: S
    folded: int
    high_water: int
    dropped: tuple[int, ...] = ()


async def read_seal(conn: Conn, accumulator: str, key: str) -> int | None:
    """The key's seal high water, or None while it is open."""
    value = await conn.fetchval(
        "SELECT high_water FROM service_engine.accumulator_seal "
        "WHERE accumulator = $1 AND key = $2",
        accumulator, key,
    )
    return None if value is None else int(value)


async def fold_key(
    conn: Conn, accumulator: Accumulator[S], key: str, cache: FoldCache[S] | None = None
) -> Folded[S]:
    """Fold ``key``'s contiguous durable prefix, resuming from the cached
    prefix when the table still holds its last chunk unchanged."""
    check_key(key)
    name = accumulator.name
    sealed = await read_seal(conn, name, key)
    if sealed is not None:
        if cache is not None:
            cache.invalidate(name, key)
        return Folded(accumulator.initial(), sealed, hashlib.sha256().hexdigest(), sealed)
    cached = cache.get(name, key) if cache is not None else None
    start = 0
    state = accumulator.initial()
    digest = hashlib.sha256()
    last_chunk: bytes | None = None
    if cached is not None and cached.next_seq > 0:
        rows = await conn.fetch(
            "SELECT seq, chunk FROM service_engine.accumulator_chunk "
            "WHERE accumulator = $1 AND key = $2 AND seq >= $3 ORDER BY seq",
            name, key, cached.next_seq - 1,
        )
        if rows and int(rows[0]["seq"]) == cached.next_seq - 1 and (
            bytes(rows[0]["chunk"]) == cached.last_chunk
        ):
            start, state, digest = cached.next_seq, cached.state, cached.digest
            last_chunk = cached.last_chunk
            rows = rows[1:]
        else:
            assert cache is not None
            cache.invalidate(name, key)
            rows = await _all_rows(conn, name, key)
    else:
        rows = await _all_rows(conn, name, key)
    expected = start
    for row in rows:
        seq = int(row["seq"])
        if seq != expected:
            break
        chunk = bytes(row["chunk"])
        state = accumulator.fold(state, chunk)
        digest.update(chunk)
        last_chunk = chunk
        expected += 1
    if cache is not None and expected > start:
        cache.put(name, key, expected, state, digest, last_chunk)
    return Folded(state, expected, digest.hexdigest())


async def _all_rows(conn: Conn, accumulator: str, key: str) -> list[Any]:
    return list(
        await conn.fetch(
            "SELECT seq, chunk FROM service_engine.accumulator_chunk "
            "WHERE accumulator = $1 AND key = $2 ORDER BY seq",
            accumulator, key,
        )
    )
