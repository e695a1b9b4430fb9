"""Cohort keys: which sessions of one projector a render pass loads together.

Sessions of one projector that share a `CohortKey` see the same rows, so a
pass loads each dirty row once per cohort and only personalises
(visibility, projection) per session. Sharing a load between principals that
should *not* see the same rows would leak one principal's rows to another,
so a cohort key is **collision-free**: two keys are equal exactly when they
were built from the same input. Nothing is hashed into a fixed width;
Python's ``hash`` only buckets, equality compares every byte.

* `CohortKey.of_principal` (the default, and the only key an RLS projector
  may use): the exact principal id.
* `CohortKey.of_parts`: the exact bytes of the declared parts, each framed
  by a type tag and an 8-byte length, so ``("ab", "c")``, ``("a", "bc")``,
  ``("1",)`` and ``(1,)`` are four different cohorts.

This module is pure: no I/O, no driver imports.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable
from typing import Protocol, TypeAlias, TypeVar

from ..failures import DeclarationError, EngineError
from ..impacts.model import JsonValue, canonical_json

__all__ = [
    "CohortKey",
    "CohortMismatch",
    "CohortPart",
    "Grouped",
    "HasPrincipalId",
    "InvalidCohortPart",
    "InvalidPrincipalId",
    "check_cohort",
    "group_by_cohort",
    "principal_key",
]

CohortPart: TypeAlias = str | bytes | int | bool | uuid.UUID | None
"""What a declared cohort may be built from. Floats are refused: ``0.0`` and
``-0.0`` are equal but print differently, which would split a cohort."""

PrincipalIdLike: TypeAlias = JsonValue | uuid.UUID


class HasPrincipalId(Protocol):
    """A principal: anything with an ``id`` (a JSON value or a UUID).

    The id is the principal's identity everywhere in the render runtime: the
    default cohort, the principal-facts impact routed to its sessions
    (``Impact.principal_facts(id, deps)``), and page authorisation.
    """

    @property
    def id(self) -> PrincipalIdLike: ...


_TAG_PRINCIPAL = b"\x01"
_TAG_PARTS = b"\x02"
_LENGTH_BYTES = 8


class InvalidPrincipalId(DeclarationError):
    """A principal's ``id`` is neither a JSON value nor a UUID."""


def principal_key(principal_id: PrincipalIdLike) -> str:
    """Return the canonical JSON text of a principal id.

    A UUID is taken as its string form, so ``Impact.principal_facts(str(u),
    ...)`` reaches the sessions of the principal whose id is ``u``. Raises
    `InvalidPrincipalId` for an id JSON cannot carry.
    """
    if isinstance(principal_id, uuid.UUID):
        principal_id = str(principal_id)
    try:
        return canonical_json(principal_id)
    except (TypeError, ValueError) as exc:
        raise InvalidPrincipalId(
            f"a principal id is a JSON value or a UUID, not {type(principal_id).__name__}"
        ) from exc


def _frame(tag: bytes, raw: bytes) -> bytes:
    return tag + len(raw).to_bytes(_LENGTH_BYTES, "big") + raw


def _encode_part(part: CohortPart) -> bytes:
    # bool before int: True is an int, and must not be the cohort of 1.
    if part is None:
        return b"n"
    if isinstance(part, bool):
        return b"T" if part else b"F"
    if isinstance(part, str):
        return _frame(b"s", part.encode("utf-8", "surrogatepass"))
    if isinstance(part, bytes):
        return _frame(b"b", part)
    if isinstance(part, int):
        return _frame(b"i", str(part).encode("ascii"))
    if isinstance(part, uuid.UUID):
        return b"u" + part.bytes
    raise InvalidCohortPart(
        f"a cohort part is str, bytes, int, bool, UUID or None, not {type(part).__name__}"
    )


class CohortKey(bytes):
    """A collision-free cohort identity (an immutable byte string).

    Build it with `of_principal` or `of_parts`; it hashes and compares as
    the bytes it holds, which is as fast as a dict key gets.
    """

    __slots__ = ()

    @classmethod
    def of_principal(cls, principal_id: PrincipalIdLike) -> CohortKey:
        """The cohort of exactly one principal: its sessions load together."""
        return cls(_TAG_PRINCIPAL + principal_key(principal_id).encode("utf-8", "surrogatepass"))

    @classmethod
    def of_parts(cls, *parts: CohortPart) -> CohortKey:
        """A declared cohort, e.g. ``CohortKey.of_parts("org", org_id, role)``.

        Every principal whose `cohort` returns equal parts (same types, same
        values, same order) shares one load; ``of_parts()`` is the cohort of
        everyone. Raises `InvalidCohortPart` for a part of another type.
        """
        return cls(_TAG_PARTS + b"".join(_encode_part(part) for part in parts))

    @property
    def is_principal(self) -> bool:
        """Whether this is a per-principal cohort."""
        return self[:1] == _TAG_PRINCIPAL

    def __repr__(self) -> str:
        if self.is_principal:
            return f"CohortKey.of_principal({self[1:].decode('utf-8', 'surrogatepass')})"
        return f"CohortKey({bytes(self)!r})"


class InvalidCohortPart(DeclarationError):
    """A declared cohort was built from a part of a type it cannot hold
    (a float, a list, ...): declare it from str, bytes, int, bool, UUID, None."""


class CohortMismatch(EngineError):
    """A session's cohort recomputed from its principal is not the cohort it
    was grouped under: the projector's ``cohort()`` is not a pure function
    of the principal, so the session could land in two cohorts."""


class Grouped(Protocol):
    """What `group_by_cohort` needs of a session: the cohort it was filed under."""

    @property
    def cohort(self) -> CohortKey: ...


G = TypeVar("G", bound=Grouped)


def group_by_cohort(sessions: Iterable[G]) -> dict[CohortKey, list[G]]:
    """Group ``sessions`` by their stored cohort, keeping arrival order.

    Linear, one dict operation per session. The cohort is computed once per
    principal resolution and stored on the session, never per frame; in
    debug, follow with `check_cohort` for each grouped session.
    """
    groups: dict[CohortKey, list[G]] = {}
    for session in sessions:
        group = groups.get(session.cohort)
        if group is None:
            groups[session.cohort] = [session]
        else:
            group.append(session)
    return groups


def check_cohort(grouped_under: CohortKey, recompute: Callable[[], CohortKey]) -> None:
    """Raise `CohortMismatch` when ``recompute()`` differs from ``grouped_under``.

    The debug check of the render pass: for every session of a group, call
    it with the group's key and ``lambda: cohort_of(projector, session.principal)``.
    """
    again = recompute()
    if again != grouped_under:
        raise CohortMismatch(
            f"cohort() returned {again!r} for a session grouped under {grouped_under!r}: "
            "a cohort must be a pure function of the principal"
        )
