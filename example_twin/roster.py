"""The twin's published language out (its roster) and the service's in
(the board offer), over the gitops-declared KV buckets.

`publish_roster` puts each person under ``twin.person.<id>`` and retracts
the people no longer listed; `read_boards` reads every board the service
offers. The twin writes its own bucket with plain puts: it is the only
writer of its roster.
"""

from __future__ import annotations

from collections.abc import Iterable

from pydantic import ValidationError

from service_engine import Nats

from .contract import (
    BOARD_BUCKET,
    BOARD_PREFIX,
    ROSTER_BUCKET,
    ROSTER_PREFIX,
    OfferedBoard,
    Person,
)

__all__ = ["DEFAULT_ROSTER", "publish_roster", "read_boards", "retract_person"]

DEFAULT_ROSTER = (
    Person(id="alice", name="Alice", org="acme"),
    Person(id="carol", name="Carol", org="acme"),
    Person(id="bob", name="Bob", org="globex"),
)
"""The people the twin publishes unless told otherwise (the passports of the
black-box battery)."""


def _key(person_id: str) -> str:
    return f"{ROSTER_PREFIX}.{person_id}"


async def publish_roster(nats: Nats, people: Iterable[Person], *, replace: bool = False) -> int:
    """Put every person whose value changed; with ``replace``, retract those
    not in ``people``. Returns how many keys were written or retracted."""
    bucket = await nats.bind_bucket(ROSTER_BUCKET)
    current, _ = await bucket.read_prefix(ROSTER_PREFIX)
    wanted = {_key(p.id): p.model_dump_json().encode() for p in people}
    written = 0
    for key, value in wanted.items():
        entry = current.get(key)
        if entry is None or Person.model_validate_json(entry.value) != Person.model_validate_json(
            value
        ):
            await bucket.put(key, value)
            written += 1
    if replace:
        for key in current.keys() - wanted.keys():
            await bucket.delete(key)
            written += 1
    return written


async def retract_person(nats: Nats, person_id: str) -> None:
    bucket = await nats.bind_bucket(ROSTER_BUCKET)
    await bucket.delete(_key(person_id))


async def read_boards(nats: Nats) -> dict[str, OfferedBoard]:
    """Every board the service offers, by id (a value that is not a board is skipped)."""
    bucket = await nats.bind_bucket(BOARD_BUCKET)
    entries, _ = await bucket.read_prefix(BOARD_PREFIX)
    boards: dict[str, OfferedBoard] = {}
    for entry in entries.values():
        try:
            board = OfferedBoard.model_validate_json(entry.value)
        except ValidationError:
            continue
        boards[board.id] = board
    return boards
