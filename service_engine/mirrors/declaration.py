"""`Mirror`: which published languages a pod mirrors, keyed and projected how.

::

    ROSTER = (
        Mirror("roster")
        .consume(PersonPublished)          # a Published: BUCKET, PREFIX, fields
        .keyed_by(lambda person: person.id)
        .project(project_roster)
    )

    async def project_roster(projection: Projection, key: str, merged: Merged) -> None:
        person = merged.get(PersonPublished)
        if person is None:
            await projection.remove(KnownScope.of(KnownPerson, id=key))
        else:
            await projection.replace_one(KnownPerson(id=key, name=person.name))

Every pod keeps a typed `Shadow` of each consumed prefix (``PREFIX.>`` in
``BUCKET``); ``keyed_by`` maps a consumed value to the key the shadows are
merged under, and the projection function is called with the `Merged`
values of each changed key (absent types: that value is gone).
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, Hashable, Iterator
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from ..failures import DeclarationError
from ..offers.model import Published, validate_bucket, validate_prefix
from .projection import Projection

__all__ = ["Merged", "Mirror", "ProjectFn", "Shadow", "ShadowEntry"]

C = TypeVar("C", bound=Published)

ProjectFn = Callable[[Projection, Any, "Merged"], Awaitable[None]]
"""``project(projection, key, merged)``: write the derived rows of ``key``."""

_NAME = re.compile(r"^[-_A-Za-z0-9]+$")


@dataclass(frozen=True, slots=True)
class ShadowEntry(Generic[C]):
    key: str
    revision: int
    value: C


class Shadow(Generic[C]):
    """A pod's typed copy of one consumed prefix: KV key -> (revision, value)."""

    def __init__(self, published: type[C]) -> None:
        self.published = published
        self._entries: dict[str, ShadowEntry[C]] = {}
        self.loaded = False

    def __len__(self) -> int:
        return len(self._entries)

    def __iter__(self) -> Iterator[ShadowEntry[C]]:
        return iter(list(self._entries.values()))

    def get(self, kv_key: str) -> C | None:
        entry = self._entries.get(kv_key)
        return None if entry is None else entry.value

    def entry(self, kv_key: str) -> ShadowEntry[C] | None:
        return self._entries.get(kv_key)

    def values(self) -> list[C]:
        return [e.value for e in self._entries.values()]

    def _set(self, entry: ShadowEntry[C]) -> None:
        self._entries[entry.key] = entry

    def _pop(self, kv_key: str) -> ShadowEntry[C] | None:
        return self._entries.pop(kv_key, None)

    def _replace(self, entries: dict[str, ShadowEntry[C]]) -> None:
        self._entries = dict(entries)
        self.loaded = True


class Merged:
    """The consumed values merged under one key, by published type."""

    def __init__(self, values: dict[type[Published], Published]) -> None:
        self._values = values

    def get(self, published: type[C]) -> C | None:
        value = self._values.get(published)
        return value if value is None or isinstance(value, published) else None

    def __bool__(self) -> bool:
        return bool(self._values)

    def types(self) -> list[type[Published]]:
        return list(self._values)


class Mirror:
    """A mirror declaration (see the module docstring); register it with
    `Engine.register_mirror`."""

    def __init__(self, name: str) -> None:
        if not isinstance(name, str) or not _NAME.match(name):
            raise DeclarationError(f"a mirror name is [-_A-Za-z0-9]+, got {name!r}")
        self.name = name
        self.consumed: list[type[Published]] = []
        self.key_fn: Callable[[Any], Hashable] | None = None
        self.project_fn: ProjectFn | None = None

    def consume(self, published: type[Published]) -> Mirror:
        """Mirror the published language ``published`` (its ``BUCKET`` and
        ``PREFIX``)."""
        if not (isinstance(published, type) and issubclass(published, Published)):
            raise DeclarationError(f"mirror {self.name}: consume a Published subclass")
        owner = f"mirror {self.name}: {published.__qualname__}"
        validate_bucket(getattr(published, "BUCKET", None), owner)
        validate_prefix(getattr(published, "PREFIX", None), owner)
        if published in self.consumed:
            raise DeclarationError(f"{owner} is consumed twice")
        self.consumed.append(published)
        return self

    def keyed_by(self, key_fn: Callable[[Any], Hashable]) -> Mirror:
        """How a consumed value maps to the key its shadows merge under."""
        if not callable(key_fn):
            raise DeclarationError(f"mirror {self.name}: keyed_by takes a function")
        self.key_fn = key_fn
        return self

    def project(self, project_fn: ProjectFn) -> Mirror:
        """The projection function (``async``), called per changed key."""
        if not callable(project_fn):
            raise DeclarationError(f"mirror {self.name}: project takes an async function")
        self.project_fn = project_fn
        return self

    @property
    def slot(self) -> str:
        return f"mirror:{self.name}"

    def validate(self) -> None:
        if not self.consumed:
            raise DeclarationError(f"mirror {self.name}: consume at least one published language")
        if self.key_fn is None:
            raise DeclarationError(f"mirror {self.name}: declare keyed_by(f)")
        if self.project_fn is None:
            raise DeclarationError(f"mirror {self.name}: declare project(p)")
