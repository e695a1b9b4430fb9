"""`Offer` and `Published`: what a service publishes, and which nouns carry it.

A published language is a pydantic model naming its bucket and key prefix::

    class BoardPublished(Published):
        BUCKET: ClassVar[str] = "example_published"
        PREFIX: ClassVar[str] = "example.board"
        id: str
        title: str

An offer maps a noun of the service onto it::

    class BoardOffer(Offer[Board, str, BoardPublished]):
        NAME = "boards"
        ROW = Board
        PUBLISHED = BoardPublished

        def publish(self, row: Board) -> BoardPublished | None: ...
        async def keys(self, conn: Conn) -> Iterable[str]: ...   # for the reconcile

A saved, created or ``cx.delete``'d aggregate of ``ROW`` stages its dirty key
in the write's own transaction once the offer is registered
(`Engine.register_offer`); the leader drains it to ``BUCKET`` under
``PREFIX.<key>``. ``publish`` answering None retracts the key (a row that is
no longer offered).
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterable
from typing import Any, ClassVar, Generic, TypeVar

from pydantic import BaseModel, ConfigDict

from ..db.types import Conn
from ..failures import DeclarationError, DuplicateRegistration
from ..impacts.model import JsonValue, canonical_json

__all__ = [
    "Offer",
    "Published",
    "kv_key_of",
    "offers_of",
    "register_offer_type",
    "validate_bucket",
    "validate_prefix",
]

A = TypeVar("A")
K = TypeVar("K")
P = TypeVar("P", bound="Published")

_TOKEN = re.compile(r"^[-/_=.A-Za-z0-9]+$")
_PREFIX = re.compile(r"^[-_A-Za-z0-9]+(\.[-_A-Za-z0-9]+)*$")
_BUCKET = re.compile(r"^[-_A-Za-z0-9]+$")


def validate_prefix(prefix: object, owner: str) -> str:
    if not isinstance(prefix, str) or not _PREFIX.match(prefix):
        raise DeclarationError(
            f"{owner}: PREFIX must be dot-separated [-_A-Za-z0-9] tokens, got {prefix!r}"
        )
    return prefix


def validate_bucket(bucket: object, owner: str) -> str:
    if not isinstance(bucket, str) or not _BUCKET.match(bucket):
        raise DeclarationError(f"{owner}: BUCKET must be [-_A-Za-z0-9]+, got {bucket!r}")
    return bucket


class Published(BaseModel):
    """A published language: one key's value in a KV bucket, as JSON.

    Subclasses name ``BUCKET`` and ``PREFIX``; a producer's `Offer` and a
    consumer's `Mirror` share the one class (the contract).
    """

    model_config = ConfigDict(frozen=True, extra="ignore")

    BUCKET: ClassVar[str]
    PREFIX: ClassVar[str]

    def encode(self) -> bytes:
        """The value as stored: canonical JSON (equal values, equal bytes)."""
        return canonical_json(self.model_dump(mode="json")).encode()

    @classmethod
    def decode(cls, value: bytes) -> Any:
        """Parse a stored value (raises pydantic's ValidationError on a bad one)."""
        return cls.model_validate_json(value)


def _json_key(key: object) -> JsonValue:
    if isinstance(key, uuid.UUID):
        return str(key)
    if isinstance(key, list | tuple):
        return [_json_key(k) for k in key]
    return key  # type: ignore[return-value]


class Offer(Generic[A, K, P]):
    """The offer of one noun (see the module docstring).

    ``NAME`` names the offer (its leader slot is ``offer:<NAME>``); ``ROW``
    is the aggregate class; ``PUBLISHED`` the published language.
    ``PREFIX`` and ``BUCKET`` default to the published language's.
    """

    NAME: ClassVar[str]
    ROW: ClassVar[type[Any]]
    PUBLISHED: ClassVar[type[Published]]
    PREFIX: ClassVar[str] = ""
    BUCKET: ClassVar[str] = ""

    def publish(self, row: A) -> P | None:
        """The published image of ``row``; None retracts its key."""
        raise NotImplementedError

    async def keys(self, conn: Conn) -> Iterable[K]:
        """Every aggregate key the store holds (the reconcile's source side)."""
        raise NotImplementedError

    def key(self, key: K) -> str:
        """The KV key token of an aggregate key (``PREFIX.<token>``)."""
        return str(_json_key(key))

    # -- derived --------------------------------------------------------

    @property
    def prefix(self) -> str:
        return self.PREFIX or getattr(self.PUBLISHED, "PREFIX", "")

    @property
    def bucket(self) -> str:
        return self.BUCKET or getattr(self.PUBLISHED, "BUCKET", "")

    @property
    def slot(self) -> str:
        return f"offer:{self.NAME}"

    def kv_key(self, key: K) -> str:
        token = self.key(key)
        if not isinstance(token, str) or not _TOKEN.match(token):
            raise DeclarationError(
                f"offer {self.NAME}: key {key!r} maps to {token!r}, not a KV key token"
            )
        return f"{self.prefix}.{token}"

    def agg_key_json(self, key: K) -> str:
        return canonical_json(_json_key(key))

    def validate(self) -> None:
        """Raise `DeclarationError` for a malformed declaration."""
        owner = f"offer {type(self).__qualname__}"
        name = getattr(self, "NAME", None)
        if not isinstance(name, str) or not _BUCKET.match(name):
            raise DeclarationError(f"{owner}: NAME must be [-_A-Za-z0-9]+, got {name!r}")
        row = getattr(self, "ROW", None)
        if not isinstance(row, type) or getattr(row, "Store", None) is None:
            raise DeclarationError(f"{owner}: ROW must be an aggregate class with a Store")
        published = getattr(self, "PUBLISHED", None)
        if not (isinstance(published, type) and issubclass(published, Published)):
            raise DeclarationError(f"{owner}: PUBLISHED must be a Published subclass")
        validate_prefix(self.prefix, owner)
        validate_bucket(self.bucket, owner)
        if type(self).publish is Offer.publish:
            raise DeclarationError(f"{owner}: implement publish(row)")
        if type(self).keys is Offer.keys:
            raise DeclarationError(f"{owner}: implement keys(conn) (the reconcile reads it)")


def kv_key_of(offer: Offer[Any, Any, Any], key: Any) -> str:
    return offer.kv_key(key)


_BY_TYPE: dict[type[Any], dict[str, Offer[Any, Any, Any]]] = {}
_BY_NAME: dict[str, Offer[Any, Any, Any]] = {}


def register_offer_type(offer: Offer[Any, Any, Any]) -> None:
    """Mark ``offer.ROW`` as carrying ``offer``: from now on every write of
    it in this process stages its dirty key. Registering the same offer class
    again (a second pod in one process) is a no-op; another class under the
    same NAME raises `DuplicateRegistration`."""
    offer.validate()
    known = _BY_NAME.get(offer.NAME)
    if known is not None:
        if type(known) is not type(offer):
            raise DuplicateRegistration("offer", offer.NAME)
        return
    _BY_NAME[offer.NAME] = offer
    _BY_TYPE.setdefault(offer.ROW, {})[offer.NAME] = offer


def offers_of(aggregate_type: type[Any]) -> Iterable[Offer[Any, Any, Any]]:
    """The offers the aggregate class carries (none: not offered)."""
    found = _BY_TYPE.get(aggregate_type)
    return () if found is None else found.values()
