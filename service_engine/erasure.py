"""Erase a person: one transaction across every slice, then a durable purge.

A slice that holds person data implements `Erasable` and registers it
(``Engine.register_erasable``). ``Engine.erase(person)`` (or a cloneable
`Eraser`, captured before ``run``) opens one write-pipeline transaction
that:

1. sets the transaction-local ``app.erasing = 'on'``, so a strict
   deny-when-unset RLS policy can whitelist the erasure
   (``current_setting('app.erasing', true) = 'on'``) under the app role;
2. records the durable fact in ``service_engine.person_erasure``;
3. runs every slice's ``erase(cx, person)`` over the `Erase` context (the
   pipeline's Ops — load / save / delete / dirty_offer / impacts — plus
   ``cx.person`` and ``cx.erased``, the `Erased` purge manifest a slice
   adds the person's lane-A stream keys, presence keys and blobs to);
4. persists the manifest on the row, and on the fresh erase only stages
   `PersonErased` on ``integration.evt.{service}.person.erased.v1``
   (`person_erased_subject`; envelope type ``person.erased``, version 1)
   through the outbox;
5. commits — a failing slice rolls the whole gesture back.

After the commit it purges: the person's lane-A chunks (the Postgres
chunks deleted, the seal marker kept — written when the key had none — so
the key stays sealed, and its NATS subject purged), their presence keys
and their blobs (object and row), then marks the row purged. A pod that
dies between commit and purge leaves the row unpurged; the beat drains it
from the persisted manifest (`Eraser.drain`). Erasing again is idempotent:
the slices run again (a retry after a partial purge is safe), no second
`PersonErased` is staged, and the purge runs again.

A slice retracts the person's offers by dirtying them: ``cx.delete`` for a
deleted row, ``cx.dirty_offer`` for a row anonymised outside the
aggregate API.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import timedelta
from typing import Any, ClassVar, Protocol

from pydantic import BaseModel, ConfigDict

from .beat.component import NO_TASKS, BeatStep
from .blobs.model import object_key
from .blobs.runtime import BlobRuntime
from .clock import Clock, SystemClock, Timestamp
from .config import EngineConfig
from .db.errors import Stage, translating
from .db.pool import Database
from .db.types import Conn
from .failures import ConfigError, DuplicateRegistration, EngineError
from .impacts.model import JsonValue
from .lanes.accumulated.runtime import Accumulators
from .messaging.envelope import DeclaredSequence, build_event, check_token
from .metrics import Metrics
from .persistence.full_eda import EventSourced, Redactor
from .pipeline.ops import Ops
from .pipeline.run import run_pipeline
from .supervisor import Worker

__all__ = [
    "PERSON_ERASED_SUBJECT",
    "Erasable",
    "Erase",
    "Erased",
    "Eraser",
    "ErasureResult",
    "PersonErased",
    "PresenceClear",
    "person_erased_subject",
]

PERSON_ERASED_SUBJECT = "integration.evt.{service}.person.erased.v1"
"""Where `PersonErased` is published (through the outbox): the subject the
specification fixes for it, its version the last token (the envelope says
``person.erased``, version 1, too). Format it with `person_erased_subject`."""


def person_erased_subject(service: str) -> str:
    """The subject ``service`` publishes `PersonErased` on; subscribe to it
    to react to an erasure (raises `EnvelopeError` for a service that is
    not a subject token)."""
    return PERSON_ERASED_SUBJECT.format(service=check_token(service, "service"))

_log = logging.getLogger(__name__)

PresenceClear = Callable[[str, str], Awaitable[bool]]
"""Clears one presence key: ``(projector, key) -> done``."""


class PersonErased(BaseModel):
    """The integration event of a fresh erasure."""

    model_config = ConfigDict(frozen=True)

    AGGREGATE: ClassVar[str] = "person"
    FACT: ClassVar[str] = "erased"
    VERSION: ClassVar[int] = 1

    person: str

    def sequence(self) -> DeclaredSequence | None:
        return None


@dataclass
class Erased:
    """The post-commit purge manifest a slice's erase adds to."""

    streams: dict[str, set[str]] = field(default_factory=dict)
    presence: dict[str, set[str]] = field(default_factory=dict)
    blobs: set[str] = field(default_factory=set)

    def stream(self, accumulator: str, key: str) -> None:
        """Purge ``key``'s lane-A chunks of ``accumulator`` (the key stays sealed)."""
        self.streams.setdefault(str(accumulator), set()).add(str(key))

    def presence_key(self, projector: str, key: str) -> None:
        """Clear ``key`` on ``projector``'s presence lane."""
        self.presence.setdefault(str(projector), set()).add(str(key))

    def blob(self, reference: str) -> None:
        """Delete the blob ``reference`` (object and row)."""
        self.blobs.add(str(reference))

    def to_json(self) -> dict[str, Any]:
        return {
            "streams": {name: sorted(keys) for name, keys in sorted(self.streams.items())},
            "presence": {name: sorted(keys) for name, keys in sorted(self.presence.items())},
            "blobs": sorted(self.blobs),
        }

    @classmethod
    def from_json(cls, value: Any) -> Erased:
        if isinstance(value, str):
            value = json.loads(value)
        value = value or {}
        return cls(
            {name: set(keys) for name, keys in value.get("streams", {}).items()},
            {name: set(keys) for name, keys in value.get("presence", {}).items()},
            set(value.get("blobs", ())),
        )

    def merge(self, other: Erased) -> None:
        for name, keys in other.streams.items():
            self.streams.setdefault(name, set()).update(keys)
        for name, keys in other.presence.items():
            self.presence.setdefault(name, set()).update(keys)
        self.blobs |= other.blobs


class Erase(Ops):
    """The context of a slice's erase: the pipeline's Ops, the person, and
    the purge manifest."""

    def __init__(self, conn: Conn, config: EngineConfig, now: Timestamp, person: str) -> None:
        super().__init__(conn, config, now)
        self.person = person
        self.erased = Erased()

    async def execute(self, sql: str, *args: object) -> str:
        """Run one statement of the slice's own (an anonymising UPDATE) in
        the erasure's transaction."""
        return await self._db(Stage.SAVE, lambda: self._conn.execute(sql, *args))

    async def fetch(self, sql: str, *args: object) -> list[dict[str, Any]]:
        """Read rows of the slice's own (the person's ids) in the erasure's
        transaction."""
        rows = await self._db(Stage.LOAD, lambda: self._conn.fetch(sql, *args))
        return [dict(row) for row in rows]

    async def erase_events(
        self, aggregate: type[EventSourced], redactor: Redactor[str]
    ) -> list[JsonValue]:
        """A full-EDA slice's erase: rewrite the person's events of
        ``aggregate`` in place through ``redactor`` and re-snapshot each
        touched aggregate from genesis (`persistence.erase`), in the
        erasure's transaction; answers the touched keys."""
        return await self.redact_events(aggregate, redactor, self.person)


def _stage_person_erased(cx: Erase, service: str, person: str) -> None:
    """`PersonErased` through the outbox, on its versioned subject (the
    engine's ``emit`` would name ``...person.erased``)."""
    message = build_event(
        PersonErased(person=person), service=service, metadata=cx._outbound_metadata(),
        occurred_at=cx.now().value,
    )
    cx._stage_message(replace(message, subject=person_erased_subject(service)))


class Erasable(Protocol):
    """A slice that holds person data."""

    async def erase(self, cx: Erase, person: str) -> None: ...


@dataclass(frozen=True, slots=True)
class ErasureResult:
    person: str
    fresh: bool
    """False when the person was already erased (no second `PersonErased`)."""
    purged: bool
    manifest: Erased


class Eraser:
    """Erases persons for one engine (cloneable: copy it freely)."""

    def __init__(
        self,
        db: Database,
        config: EngineConfig,
        *,
        lanes: Accumulators,
        blobs: BlobRuntime,
        presence: PresenceClear | None,
        metrics: Metrics | None = None,
        clock: Clock | None = None,
        purge_grace: timedelta = timedelta(seconds=5),
        nouns: Collection[str] | None = None,
    ) -> None:
        self._db = db
        self._config = config
        self._lanes = lanes
        self._blobs = blobs
        self._presence = presence
        self._metrics = metrics
        self._clock = clock or SystemClock()
        self._purge_grace = purge_grace
        self._nouns = nouns
        self._erasables: dict[str, Erasable] = {}

    def register(self, name: str, erasable: Erasable) -> None:
        """A slice that holds person data: ``erasable.erase(cx, person)`` runs
        in every erasure's one transaction. The beat drains unfinished purges."""
        if name in self._erasables:
            raise DuplicateRegistration("erasable", name)
        if not callable(getattr(erasable, "erase", None)):
            raise ConfigError(f"an erasable implements erase(cx, person), got {erasable!r}")
        self._erasables[name] = erasable

    @property
    def registered(self) -> Sequence[str]:
        return tuple(self._erasables)

    # The erasure component: the beat drains unfinished purges once a slice
    # registered an erasable.
    async def start(self) -> None:
        return None

    def tasks(self) -> Mapping[str, Worker]:
        return NO_TASKS

    def beat_steps(self) -> Mapping[str, BeatStep]:
        return {"erasure_purge": self._purge} if self._erasables else {}

    async def aclose(self) -> None:
        return None

    async def _purge(self) -> None:
        await self.drain()

    async def erase(self, person: str, *, purge: bool = True) -> ErasureResult:
        """Erase ``person`` across every registered slice; purge after the
        commit (``purge=False``: leave the purge to the beat, as a pod that
        died after the commit would)."""
        if not isinstance(person, str) or not person:
            raise ConfigError(f"a person is a non-empty str, got {person!r}")
        erasables = list(self._erasables.values())

        def open_context(conn: Conn, now: Timestamp) -> Erase:
            return Erase(conn, self._config, now, person)

        async def handler(cx: Erase) -> tuple[bool, Erased]:
            await cx._execute_first(Stage.SAVE, "SET LOCAL app.erasing = 'on'")
            fresh = await cx._db(Stage.SAVE, lambda: cx._conn.fetchval(
                "INSERT INTO service_engine.person_erasure (person) VALUES ($1)"
                " ON CONFLICT (person) DO NOTHING RETURNING true", person,
            ))
            if not fresh:  # erased before: run again, purge again
                await cx.execute(
                    "UPDATE service_engine.person_erasure SET purged_at = NULL WHERE person = $1",
                    person,
                )
            for erasable in erasables:
                await erasable.erase(cx, person)
            previous = await cx._db(Stage.LOAD, lambda: cx._conn.fetchval(
                "SELECT manifest FROM service_engine.person_erasure WHERE person = $1", person
            ))
            manifest = Erased.from_json(previous)
            manifest.merge(cx.erased)
            for reference in manifest.blobs:
                cx.release_blob(reference)
            await cx.execute(
                "UPDATE service_engine.person_erasure SET manifest = $2::jsonb WHERE person = $1",
                person, json.dumps(manifest.to_json()),
            )
            if fresh and self._config.service:
                _stage_person_erased(cx, self._config.service, person)
            return bool(fresh), manifest

        fresh, manifest = await run_pipeline(
            self._db, self._config, open_context, handler, clock=self._clock,
            metrics=self._metrics, nouns=self._nouns,
        )
        purged = False
        if purge:
            try:
                await self.purge(person, manifest)
                purged = True
            except Exception as exc:  # the beat drains it from the persisted manifest
                _log.warning("purge of erased person %s failed: %s", person, exc, exc_info=exc)
        return ErasureResult(person, fresh, purged, manifest)

    async def purge(self, person: str, manifest: Erased) -> None:
        """Remove what the manifest names, then mark the row purged."""
        for accumulator, keys in manifest.streams.items():
            for key in sorted(keys):
                await self._purge_stream(accumulator, key)
        if manifest.presence:
            if self._presence is None:
                raise EngineError("the erasure names presence keys but no presence lane runs")
            for projector, keys in manifest.presence.items():
                for key in sorted(keys):
                    if not await self._presence(projector, key):
                        raise EngineError(f"presence key {projector}/{key} was not cleared")
        for reference in sorted(manifest.blobs):
            await self._purge_blob(reference)
        with translating(Stage.SAVE):
            await self._db.pool.execute(
                "UPDATE service_engine.person_erasure SET purged_at = clock_timestamp(),"
                " purge_attempts = purge_attempts + 1 WHERE person = $1", person,
            )

    async def _purge_stream(self, accumulator: str, key: str) -> None:
        with translating(Stage.SAVE):
            async with self._db.pool.acquire() as conn, conn.transaction():
                # Keep the key sealed: a marker past the last chunk when none exists.
                await conn.execute(
                    "INSERT INTO service_engine.accumulator_seal"
                    " (accumulator, key, high_water, gesture)"
                    " SELECT $1, $2, coalesce(max(seq) + 1, 0), 'current'"
                    " FROM service_engine.accumulator_chunk WHERE accumulator = $1 AND key = $2"
                    " ON CONFLICT (accumulator, key) DO NOTHING", accumulator, key,
                )
                await conn.execute(
                    "DELETE FROM service_engine.accumulator_chunk"
                    " WHERE accumulator = $1 AND key = $2", accumulator, key,
                )
        if self._lanes.nats is not None:
            await self._lanes.purge(accumulator, key)

    async def _purge_blob(self, reference: str) -> None:
        with translating(Stage.READ):
            row = await self._db.pool.fetchrow(
                "SELECT kind FROM service_engine.blob WHERE id = $1::uuid", reference
            )
        if row is None:
            return
        store = self._blobs.store
        if store is None:
            raise EngineError("the erasure names blobs but no blob store is bound")
        await store.delete(object_key(row["kind"], reference))
        with translating(Stage.SAVE):
            await self._db.pool.execute(
                "DELETE FROM service_engine.blob WHERE id = $1::uuid", reference
            )

    async def drain(self, *, older_than: timedelta | None = None, batch: int = 20) -> int:
        """The beat's backstop: purge the rows a pod committed and never
        purged (older than ``older_than``, by default the purge grace: the
        erasing pod's own purge is not raced), from their persisted manifests."""
        if older_than is None:
            older_than = self._purge_grace
        with translating(Stage.READ):
            rows = await self._db.pool.fetch(
                "SELECT person, manifest FROM service_engine.person_erasure"
                " WHERE purged_at IS NULL"
                " AND erased_at < clock_timestamp() - make_interval(secs => $1)"
                " ORDER BY erased_at LIMIT $2", older_than.total_seconds(), batch,
            )
        done = 0
        for row in rows:
            try:
                await self.purge(row["person"], Erased.from_json(row["manifest"]))
                done += 1
            except Exception as exc:
                _log.warning("beat purge of erased person %s failed: %s", row["person"], exc)
                with translating(Stage.SAVE):
                    await self._db.pool.execute(
                        "UPDATE service_engine.person_erasure"
                        " SET purge_attempts = purge_attempts + 1 WHERE person = $1",
                        row["person"],
                    )
        return done
