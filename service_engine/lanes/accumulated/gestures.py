"""What a handler's context does for the accumulated lane (lane A): seal a
key's stream against its hash, or cancel it at a sequence or now
(`SealGestures`, a part of every pipeline context)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, TypeVar

from ...db.errors import Stage
from ...db.types import Conn
from ...failures import DeclarationError
from .accumulator import Accumulator, Cancelled
from .chunks import Gesture, SealPlan
from .errors import SealError
from .seal import seal_in

__all__ = ["SealGestures"]

T = TypeVar("T")


class SealGestures:
    """``cx.seal``, ``cx.seal_partial``, ``cx.seal_current``: a key's
    marker committed with the handler's transaction."""

    _conn: Conn
    _after_commit: list[Callable[[], Awaitable[None]]]

    if TYPE_CHECKING:

        async def _db(
            self, stage: Stage, call: Callable[[], Awaitable[T]], *, writes: bool = True
        ) -> T: ...

    async def seal(
        self, accumulator: Accumulator[T], key: str, last_seq: int, hash: str
    ) -> T:
        """Seal ``key``'s stream at ``last_seq`` against ``hash`` (the SHA-256
        of the concatenated chunks ``0..last_seq``, hex) and return the
        folded state; the marker (high water ``last_seq + 1``) commits with
        the transaction, and every later chunk of the key is refused.

        Takes the key's lane lock (waiting under ``lock_timeout``). Raises,
        with nothing written: `SealChunkBeyondLastSeq` (a chunk is durable
        past ``last_seq``), `SealTruncated` (the durable prefix stops before
        it: retry later or `seal_partial`), `SealHashMismatch`,
        `AlreadySealed`.
        """
        return await self._seal(accumulator, key, "seal", last_seq, hash)

    async def seal_partial(
        self, accumulator: Accumulator[T], key: str, last_seq: int
    ) -> Cancelled[T]:
        """Cancel at ``last_seq``: seal whatever contiguous prefix is durable
        (no hash) at ``last_seq + 1``; refuses a chunk durable beyond
        ``last_seq`` and a key already sealed. The result carries the
        prefix's fold and, in ``dropped``, every durable chunk past a gap
        in it (the fold cannot reach them; the cancel discards them)."""
        return await self._cancel(accumulator, key, "partial", last_seq)

    async def seal_current(self, accumulator: Accumulator[T], key: str) -> Cancelled[T]:
        """Cancel now: fold the chunks durable under the key's lane lock (a
        chunk that committed while this waited for the lock is folded too)
        and seal past the last of them; ``dropped`` names the durable
        chunks past a gap the fold could not reach. `AlreadySealed` when
        the key was sealed first (a deadline reads that as a lost race)."""
        return await self._cancel(accumulator, key, "current", None)

    async def _cancel(
        self, accumulator: Accumulator[T], key: str, gesture: Gesture, last_seq: int | None
    ) -> Cancelled[T]:
        state, plan = await self._seal_planned(accumulator, key, gesture, last_seq, None)
        return Cancelled(state, len(plan.chunks), plan.high_water, plan.dropped)

    async def _seal(
        self, accumulator: Accumulator[T], key: str, gesture: Gesture,
        last_seq: int | None, expected: str | None,
    ) -> T:
        state, _ = await self._seal_planned(accumulator, key, gesture, last_seq, expected)
        return state

    async def _seal_planned(
        self, accumulator: Accumulator[T], key: str, gesture: Gesture,
        last_seq: int | None, expected: str | None,
    ) -> tuple[T, SealPlan]:
        if not isinstance(accumulator, Accumulator):
            raise DeclarationError(f"seal names an Accumulator, got {accumulator!r}")
        purger = accumulator._purger
        try:
            state, plan = await self._db(
                Stage.SAVE,
                lambda: seal_in(self._conn, accumulator, key, gesture, last_seq, expected),
            )
        except SealError as exc:
            if purger is not None:
                purger.refused(gesture, exc.code)
            raise
        if purger is not None:
            self._after_commit.append(purger.sealed(accumulator.name, key, gesture))
        return state, plan
