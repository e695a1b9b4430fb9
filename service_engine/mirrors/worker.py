"""The mirror worker: boot read, watch, leader-gated projection, reconcile.

Per pod and mirror, a `MirrorRuntime`:

* reads every consumed prefix in full at boot into its `Shadow`s and holds
  readiness DOWN (``mirror:<name>``) until converged: shadows loaded and the
  per-bucket watermark (``service_engine.mirror_watermark``, advanced by the
  leader as it projects, and as it applies a change with nothing to project)
  reached the revision the boot read reached;
* watches each prefix from the revision its boot read reached plus one, so
  a put or retract between the boot read and the watch is not lost;
* projects through the direct lane only while it holds the mirror's lease
  (``mirror:<name>``): standbys keep their shadows current and re-project
  their whole shadow on takeover, so a change inside the failover window is
  never missed;
* re-reads and re-projects everything every ``mirror_reconcile``;
* never projects a consumed prefix to empty: a prefix that reads empty (at
  boot, at a reconcile, or a change that would empty it) holds readiness
  DOWN (``mirror:<name>:empty``, naming the prefix) and keeps ``known_*`` and
  the shadows as they are.

`MirrorSupervisor` restarts a runtime that raised, with backoff (a mirror
that had converged keeps readiness through a transient restart; it goes
DOWN once stuck or if it never converged); one stuck
past ``mirror_failure_threshold`` consecutive failures is recorded as one
`DeadLetterSource.MIRROR` dead letter, re-recorded on every beat while it
stays stuck (one row, counted once, s169). `Mirrors` (mirrors/component.py) keeps
``dependency_up{dependency="mirrors"}``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Hashable
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from ..beat.leader import LeaderLease
from ..db.errors import Stage, translating
from ..db.pool import Database
from ..impacts.transport import stage_in
from ..messaging.dead_letters import DeadLetter, DeadLetters, DeadLetterSource
from ..messaging.nats import KvBucket, KvChange, KvWatch, Nats
from ..offers.model import Published
from ..readiness import ReadinessHandle
from .declaration import Merged, Mirror, Shadow, ShadowEntry
from .projection import Projection

if TYPE_CHECKING:
    from ..config import EngineConfig

__all__ = ["MirrorBounds", "MirrorRuntime", "MirrorSupervisor"]

_log = logging.getLogger(__name__)

_WATERMARK = """
INSERT INTO service_engine.mirror_watermark AS w (mirror, bucket, revision)
VALUES ($1, $2, $3)
ON CONFLICT (mirror, bucket) DO UPDATE
   SET revision = GREATEST(w.revision, EXCLUDED.revision), updated_at = clock_timestamp()
"""


@dataclass(frozen=True, slots=True)
class MirrorBounds:
    interval: timedelta = timedelta(seconds=1)
    lease: timedelta = timedelta(seconds=10)
    reconcile: timedelta = timedelta(seconds=60)
    failure_threshold: int = 3
    backoff: timedelta = timedelta(seconds=0.5)
    backoff_cap: timedelta = timedelta(seconds=30)

    @classmethod
    def of(cls, config: EngineConfig) -> MirrorBounds:
        return cls(
            interval=config.beat_interval, lease=config.lease,
            reconcile=config.mirror_reconcile,
            failure_threshold=config.mirror_failure_threshold,
            backoff=config.mirror_restart_backoff,
            backoff_cap=config.mirror_restart_backoff_cap,
        )


def reason_of(name: str) -> str:
    return f"mirror:{name}"


def empty_reason_of(name: str) -> str:
    return f"mirror:{name}:empty"


class MirrorRuntime:
    """One mirror on one pod (see the module docstring)."""

    def __init__(
        self,
        mirror: Mirror,
        db: Database,
        nats: Nats,
        holder: str,
        readiness: ReadinessHandle,
        bounds: MirrorBounds = MirrorBounds(),
    ) -> None:
        mirror.validate()
        self.mirror = mirror
        self.db = db
        self.nats = nats
        self.readiness = readiness
        self.bounds = bounds
        self.lease = LeaderLease(db, mirror.slot, holder, bounds.lease)
        self.shadows: dict[type[Published], Shadow[Any]] = {}
        self.converged = False
        self.projected = asyncio.Event()
        """Set after every committed projection (tests and benches wait on it)."""
        self.boot_hook: Callable[[], Awaitable[None]] | None = None
        """The test-support seam: awaited between the boot read and the watch."""
        self.converged_once = False
        """Converged at least once in this process (survives restarts)."""
        self._reset()

    def _reset(self) -> None:
        # A (re)start reads every prefix afresh: no index entry survives it.
        self.shadows = {c: Shadow(c) for c in self.mirror.consumed}
        self._buckets: dict[str, KvBucket] = {}
        self._boot: dict[str, int] = {}
        self._applied: dict[str, int] = {}
        self._marked: dict[str, int] = {}
        self._index: dict[Hashable, dict[type[Published], str]] = {}
        self._dirty: set[Hashable] = set()
        self._empty: set[type[Published]] = set()
        self._reread = False
        self._fence: int | None = None
        self.converged = False

    @property
    def name(self) -> str:
        return self.mirror.name

    def shadow(self, published: type[Published]) -> Shadow[Any]:
        return self.shadows[published]

    def merged(self, key: Hashable) -> Merged:
        found = self._index.get(key, {})
        values: dict[type[Published], Published] = {}
        for published, kv_key in found.items():
            value = self.shadows[published].get(kv_key)
            if value is not None:
                values[published] = value
        return Merged(values)

    # -- one run (raises on any failure; the supervisor restarts it) ----------

    async def run_once(self) -> None:
        self._reset()
        if not self.converged_once:
            # A restart after convergence keeps readiness: known_* is intact
            # and the supervisor holds DOWN once the mirror is stuck.
            self.readiness.set_down(reason_of(self.name), "mirror booting: reading its prefixes")
        for published in self.mirror.consumed:
            if published.BUCKET not in self._buckets:
                self._buckets[published.BUCKET] = await self.nats.bind_bucket(published.BUCKET)
        reached = await self._read_all()
        if self.boot_hook is not None:
            await self.boot_hook()
        queue: asyncio.Queue[tuple[type[Published], KvChange] | BaseException] = asyncio.Queue()
        watches: list[KvWatch] = []
        readers: list[asyncio.Task[None]] = []
        try:
            for published in self.mirror.consumed:
                bucket = self._buckets[published.BUCKET]
                watch = await bucket.watch_prefix(published.PREFIX, reached[published] + 1)
                watches.append(watch)
                readers.append(asyncio.create_task(self._read(published, watch, queue)))
            await self._loop(queue)
        finally:
            for task in readers:
                task.cancel()
            await asyncio.gather(*readers, return_exceptions=True)
            for watch in watches:
                await watch.aclose()

    async def _read(
        self,
        published: type[Published],
        watch: KvWatch,
        queue: asyncio.Queue[tuple[type[Published], KvChange] | BaseException],
    ) -> None:
        try:
            while True:
                change = await watch.next(5.0)
                if change is not None:
                    queue.put_nowait((published, change))
        except asyncio.CancelledError:
            raise
        except BaseException as exc:
            queue.put_nowait(exc)

    async def _loop(
        self, queue: asyncio.Queue[tuple[type[Published], KvChange] | BaseException]
    ) -> None:
        interval = self.bounds.interval.total_seconds()
        next_lease = 0.0
        next_reconcile = time.monotonic() + self.bounds.reconcile.total_seconds()
        leader = False
        while True:
            with contextlib.suppress(TimeoutError):
                item = await asyncio.wait_for(queue.get(), interval)
                while True:
                    if isinstance(item, BaseException):
                        raise item
                    self._apply(*item)
                    if queue.empty():
                        break
                    item = queue.get_nowait()
            now = time.monotonic()
            full = False
            ticked = now >= next_lease
            if ticked:
                next_lease = now + interval
                lease = await self.lease.acquire()
                leader = lease is not None
                if lease is None:
                    self._fence = None
                elif lease.fence != self._fence:
                    self._fence = lease.fence
                    full = True  # a takeover (or a restart) re-projects the whole shadow
            if now >= next_reconcile or self._reread:
                next_reconcile = now + self.bounds.reconcile.total_seconds()
                self._reread = False
                await self._read_all()
                full = True
            if leader and not self._empty and (full or self._dirty):
                await self._project(full)
            elif leader and not self._empty and self._behind():
                await self._advance()
            elif not leader and self._dirty and ticked:
                await self._forget_projected()
            await self._check_converged(leader)

    # -- the shadows ---------------------------------------------------------

    async def _read_all(self) -> dict[type[Published], int]:
        """Read every consumed prefix in full; a prefix that reads empty keeps
        its shadow and holds DOWN. Returns the revision each read reached."""
        reached: dict[type[Published], int] = {}
        empty: set[type[Published]] = set()
        for published in self.mirror.consumed:
            bucket = self._buckets[published.BUCKET]
            entries, revision = await bucket.read_prefix(published.PREFIX)
            reached[published] = revision
            self._boot[bucket.name] = max(self._boot.get(bucket.name, 0), revision)
            self._applied[bucket.name] = max(self._applied.get(bucket.name, 0), revision)
            if not entries:
                empty.add(published)
                continue
            shadow = self.shadows[published]
            fresh: dict[str, ShadowEntry[Any]] = {}
            for key, entry in entries.items():
                value = self._decode(published, key, entry.value)
                if value is not None:
                    fresh[key] = ShadowEntry(key, entry.revision, value)
            for old in shadow:
                if old.key not in fresh:
                    self._unindex(published, old)
            for fresh_entry in fresh.values():
                self._index_entry(published, shadow.entry(fresh_entry.key), fresh_entry)
            shadow._replace(fresh)
        for published in self.mirror.consumed:
            self.shadows[published].loaded = True
        self._set_empty(empty)
        return reached

    def _decode(self, published: type[Published], key: str, value: bytes) -> Any | None:
        try:
            return published.decode(value)
        except Exception as exc:
            _log.warning("mirror %s: %s holds no %s: %s", self.name, key, published.__name__, exc)
            return None

    def _apply(self, published: type[Published], change: KvChange) -> None:
        shadow = self.shadows[published]
        bucket = published.BUCKET
        old = shadow.entry(change.key)
        if old is not None and change.revision <= old.revision:
            return
        if change.value is None:
            if old is None:
                self._applied[bucket] = max(self._applied.get(bucket, 0), change.revision)
                return
            if len(shadow) == 1:
                # This retract would empty the prefix: hold, keep, re-read.
                self._set_empty(self._empty | {published})
                self._reread = True
                return
            shadow._pop(change.key)
            self._unindex(published, old)
        else:
            value = self._decode(published, change.key, change.value)
            if value is None:
                self._applied[bucket] = max(self._applied.get(bucket, 0), change.revision)
                return
            entry = ShadowEntry(change.key, change.revision, value)
            shadow._set(entry)
            self._index_entry(published, old, entry)
            if published in self._empty:
                self._set_empty(self._empty - {published})
        self._applied[bucket] = max(self._applied.get(bucket, 0), change.revision)

    def _key_of(self, value: Any) -> Hashable:
        assert self.mirror.key_fn is not None
        return self.mirror.key_fn(value)

    def _unindex(self, published: type[Published], old: ShadowEntry[Any]) -> None:
        key = self._key_of(old.value)
        found = self._index.get(key)
        if found is not None and found.get(published) == old.key:
            del found[published]
            if not found:
                del self._index[key]
        self._dirty.add(key)

    def _index_entry(
        self, published: type[Published], old: ShadowEntry[Any] | None, new: ShadowEntry[Any]
    ) -> None:
        if old is not None:
            if old.value == new.value:
                return
            self._unindex(published, old)
        key = self._key_of(new.value)
        self._index.setdefault(key, {})[published] = new.key
        self._dirty.add(key)

    def _set_empty(self, empty: set[type[Published]]) -> None:
        self._empty = set(empty)
        reason = empty_reason_of(self.name)
        if empty:
            prefixes = ", ".join(sorted(f"{p.BUCKET}/{p.PREFIX}" for p in empty))
            self.readiness.set_down(
                reason, f"consumed prefix reads empty: {prefixes} (known_* kept as it is)"
            )
        else:
            self.readiness.clear(reason)

    # -- projection (leader only) -------------------------------------------------

    async def _project(self, full: bool) -> None:
        assert self.mirror.project_fn is not None
        keys = set(self._dirty)
        if full:
            keys |= set(self._index)
        with translating(Stage.RELAY):
            async with self.db.pool.acquire() as conn, conn.transaction():
                await self.lease.assert_lease(conn)
                projection = Projection(conn)
                for key in keys:
                    await self.mirror.project_fn(projection, key, self.merged(key))
                for bucket, revision in self._applied.items():
                    await conn.execute(_WATERMARK, self.name, bucket, revision)
                await stage_in(conn, projection.impacts)
        self._marked = dict(self._applied)
        self._dirty -= keys
        self.projected.set()

    def _behind(self) -> bool:
        return any(self._marked.get(b, 0) < r for b, r in self._applied.items())

    async def _advance(self) -> None:
        """The leader with nothing to project (an equal re-put, a retract of
        an unknown key, an undecodable value) still advances its watermark to
        what it applied, so a standby whose boot read reached that revision
        converges now rather than at the next projection or reconcile."""
        applied = dict(self._applied)
        with translating(Stage.RELAY):
            async with self.db.pool.acquire() as conn, conn.transaction():
                await self.lease.assert_lease(conn)
                for bucket, revision in applied.items():
                    if self._marked.get(bucket, 0) < revision:
                        await conn.execute(_WATERMARK, self.name, bucket, revision)
        self._marked = applied

    async def _watermarks(self) -> dict[str, int]:
        with translating(Stage.RELAY):
            rows = await self.db.pool.fetch(
                "SELECT bucket, revision FROM service_engine.mirror_watermark WHERE mirror = $1",
                self.name,
            )
        return {r["bucket"]: int(r["revision"]) for r in rows}

    async def _forget_projected(self) -> None:
        """A standby drops the keys it saw change once the leader's
        watermark shows it projected them; until then a takeover re-projects
        them along with the whole shadow."""
        marks = await self._watermarks()
        if all(marks.get(b, 0) >= r for b, r in self._applied.items()):
            self._dirty.clear()

    async def _check_converged(self, leader: bool) -> None:
        if self.converged:
            return
        if self._empty:
            return
        marks = await self._watermarks()
        if all(marks.get(b, 0) >= r for b, r in self._boot.items()):
            self.converged = True
            self.converged_once = True
            self.readiness.clear(reason_of(self.name))


class MirrorSupervisor:
    """Runs one `MirrorRuntime` for the life of the engine, restarting it
    with backoff; past the failure threshold it is *stuck* and the beat
    re-records its one dead letter."""

    def __init__(
        self,
        runtime: MirrorRuntime,
        dead_letters: DeadLetters,
        bounds: MirrorBounds,
    ) -> None:
        self.runtime = runtime
        self.dead_letters = dead_letters
        self.bounds = bounds
        self.failures = 0
        self.restarts = 0
        self.last_error = ""
        self.episode = 1
        self._stuck = False

    @property
    def stuck(self) -> bool:
        return self._stuck

    @property
    def healthy(self) -> bool:
        return self.failures == 0 and self.runtime.converged

    async def run(self) -> None:
        reason = reason_of(self.runtime.name)
        readiness = self.runtime.readiness
        while True:
            try:
                await self.runtime.run_once()
                raise RuntimeError("the mirror loop returned")
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self.failures += 1
                self.restarts += 1
                self.last_error = f"{type(exc).__name__}: {exc}"
                self.runtime.converged = False
                stuck = self.failures >= self.bounds.failure_threshold
                if stuck or not self.runtime.converged_once:
                    # One transient failure of a converged mirror restarts it
                    # without flapping readiness; a stuck one holds DOWN.
                    readiness.set_down(
                        reason, f"mirror failed ({self.failures}x): {self.last_error}"
                    )
                _log.warning("mirror %s failed: %s", self.runtime.name, self.last_error)
                if self.failures >= self.bounds.failure_threshold:
                    self._stuck = True
            delay = min(
                self.bounds.backoff.total_seconds() * 2 ** max(0, self.failures - 1),
                self.bounds.backoff_cap.total_seconds(),
            )
            await asyncio.sleep(delay)
            if self.runtime.converged:
                self.recovered()

    def recovered(self) -> None:
        if self._stuck:
            self.episode += 1
        self._stuck = False
        self.failures = 0

    async def beat(self) -> None:
        """Re-record the dead letter of a stuck mirror (one row, counted once);
        a mirror that converged again is healthy."""
        if self.runtime.converged and self.failures:
            self.recovered()
        if not self._stuck:
            return
        await self.dead_letters.record_work(
            DeadLetter.for_work(
                DeadLetterSource.MIRROR, self.runtime.name,
                reason=f"stuck past {self.bounds.failure_threshold} restarts",
                detail=self.last_error, key=f"episode-{self.episode}",
                attempts=self.failures,
            )
        )
