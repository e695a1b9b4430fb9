"""The Impact model: what a committed write tells the render loop it touched.

An `Impact` names a noun and a key ("this row may have changed"), optionally
with a small `Cause` (the fact that changed it, delivered to PerImpact
projectors). Special kinds cover principal facts, bulk writes and mirrored
foreign rows; see `ImpactKind`.

Keys and cause payloads are JSON values. Their identity is their *canonical
JSON text* (compact separators, sorted object keys, UTF-8 kept as is): two
keys are the same key exactly when that text is equal, so ``{"a": 1, "b": 2}``
and ``{"b": 2, "a": 1}`` are one key, while ``1``, ``1.0`` and ``True`` are
three. Each value stores that text (``key_json``, ``data_json``) and compares
and hashes on it, and also exposes the decoded value (``key``, ``data``) with
lists turned into tuples. Treat a decoded dict as read-only: it is not
consulted for equality.

The wire form (`encode_impact` / `impact_json`) is a compact JSON object with
one-letter fields, written canonically so one impact always encodes to the
same bytes:

=====  ==========================================================  ==========
field  meaning                                                     omitted if
=====  ==========================================================  ==========
``t``  kind: ``p`` principal facts, ``r`` projector reset,         entity
       ``f`` foreign
``n``  noun                                                        never
``k``  key                                                         key is null
``c``  cause name                                                  no cause
``p``  cause payload                                               null
``d``  deps of a principal-facts impact (sorted, unique nouns)     empty
=====  ==========================================================  ==========

This module is pure: no I/O, no driver imports.
"""

from __future__ import annotations

import enum
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, TypeAlias

from service_engine.failures import ConfigError, DeclarationError, FrameError

JsonValue: TypeAlias = (
    bool | int | float | str | Sequence["JsonValue"] | Mapping[str, "JsonValue"] | None
)
"""A JSON-encodable value. Decoded values use tuples for arrays."""

PRINCIPAL_FACTS_NOUN = "principal_facts"
"""The fixed noun of every `ImpactKind.PRINCIPAL_FACTS` impact."""

# One encoder, built once: json.dumps with non-default arguments builds a new
# encoder on every call, and this runs for every impact of every commit.
_ENCODER = json.JSONEncoder(
    ensure_ascii=False, separators=(",", ":"), sort_keys=True, allow_nan=False
)
_encode = _ENCODER.encode

# Exact types whose canonical text needs no walk and whose value is already
# immutable; everything else goes through encode -> decode -> freeze.
_SCALARS: frozenset[type] = frozenset({str, int, bool, float, type(None)})
_FAST_KEYS: frozenset[type] = frozenset({str, int})
_set = object.__setattr__


class InvalidImpact(ConfigError):
    """An `Impact` or `Cause` was built from values it cannot carry (an empty
    noun, a key JSON cannot encode, a cause on a non-entity impact, ...)."""


class UnknownFactDependency(InvalidImpact):
    """A principal-facts impact names a dependency no registered projector
    reads: its deps are nouns (a projector's ``NOUN`` or a ``JOINS`` noun),
    not fact names; a dependency that names nothing would re-gate no window.
    Raised where the slice stages it (``cx.impact_principal_facts``)."""

    def __init__(self, unknown: Iterable[str], registered: Iterable[str]) -> None:
        self.unknown = tuple(sorted(unknown))
        known = ", ".join(sorted(registered)) or "none"
        super().__init__(
            f"impact_principal_facts names {', '.join(map(repr, self.unknown))}, which no "
            f"registered projector reads; name the nouns whose windows re-gate "
            f"(registered nouns: {known})"
        )


class UnencodableImpactValue(InvalidImpact, DeclarationError):
    """A key or cause payload of a type JSON cannot carry (also a `TypeError`,
    as ``json`` raises for one)."""


def canonical_json(value: object) -> str:
    """Return the canonical JSON text of ``value``.

    Compact separators, sorted object keys, non-ASCII kept as is. Raises
    `TypeError` for a value JSON cannot carry and `ValueError` for NaN or an
    infinity.
    """
    return _encode(value)


class ImpactKind(enum.Enum):
    """What an impact means to the render loop."""

    ENTITY = "entity"
    """The row ``(noun, key)`` may have changed."""

    PRINCIPAL_FACTS = "principal_facts"
    """The facts of principal ``key`` changed; projectors over ``deps`` re-gate."""

    PROJECTOR_RESET = "projector_reset"
    """A bulk write: every key of ``noun`` may have changed."""

    FOREIGN = "foreign"
    """A mirror staged a change of a ``known_*`` row ``(noun, key)``."""


_KIND_CODE: dict[ImpactKind, str] = {
    ImpactKind.ENTITY: "e",
    ImpactKind.PRINCIPAL_FACTS: "p",
    ImpactKind.PROJECTOR_RESET: "r",
    ImpactKind.FOREIGN: "f",
}
_CODE_KIND: dict[str, ImpactKind] = {code: kind for kind, code in _KIND_CODE.items()}
_FIELDS = frozenset({"t", "n", "k", "c", "p", "d"})


def _freeze(value: Any) -> JsonValue:
    """Turn decoded JSON (lists, dicts) into the stored form (tuples, dicts)."""
    if isinstance(value, list | tuple):
        return tuple(_freeze(item) for item in value)
    if isinstance(value, dict):
        return {name: _freeze(item) for name, item in value.items()}
    return value  # type: ignore[no-any-return]


def _canonical(value: object, what: str) -> tuple[str, JsonValue]:
    """Return ``(canonical text, decoded value)`` for a caller-supplied value."""
    try:
        text = _encode(value)
    except (TypeError, ValueError) as exc:
        error = UnencodableImpactValue if isinstance(exc, TypeError) else InvalidImpact
        raise error(f"{what} must be a finite JSON value: {exc}") from exc
    except RecursionError as exc:
        raise InvalidImpact(f"{what} is nested too deeply to encode") from exc
    if type(value) in _SCALARS:
        return text, value  # type: ignore[return-value]
    if type(value) is dict and all(
        type(k) is str and type(v) in _SCALARS for k, v in value.items()
    ):
        # A flat object of exact scalars (a typical cause): decoding the text
        # would give these very values, keys in the text's sorted order.
        return text, {k: value[k] for k in sorted(value)}
    # Decoding our own text yields plain types (no subclasses, str dict keys),
    # so the exposed value always agrees with the identity text.
    return text, _freeze(json.loads(text))


@lru_cache(maxsize=4096)
def _name_json(name: str) -> str:
    # Nouns and cause names come from a small fixed vocabulary.
    return _encode(name)


def _check_name(value: object, what: str) -> str:
    if type(value) is not str or not value:
        raise InvalidImpact(f"{what} must be a non-empty str, got {value!r}")
    return value


@dataclass(frozen=True, slots=True, init=False)
class Cause:
    """The fact that caused an impact, delivered with PerImpact emission.

    ``name`` says what happened (``"card.moved"``); ``data`` is a small JSON
    payload. A cause rides the NOTIFY payload, so keep it small: a cause too
    large for one frame fails the write transaction with `CauseTooLarge`.
    Bulk data rides the view, not the cause.
    """

    name: str
    data: JsonValue = field(compare=False)
    data_json: str = field(repr=False)

    def __init__(self, name: str, data: JsonValue = None) -> None:
        object.__setattr__(self, "name", _check_name(name, "cause name"))
        text, value = _canonical(data, "cause data")
        object.__setattr__(self, "data", value)
        object.__setattr__(self, "data_json", text)


@dataclass(frozen=True, slots=True, init=False)
class Impact:
    """One thing a committed write touched.

    Build impacts with the constructors: `Impact.entity`, `Impact.foreign`,
    `Impact.reset` and `Impact.principal_facts`. The plain constructor takes
    the same fields and validates the same rules: only an entity impact
    carries a cause; only a principal-facts impact carries deps and its noun
    is `PRINCIPAL_FACTS_NOUN`; a projector reset has no key.

    Equality and hashing use the canonical key text (``key_json``), not the
    decoded ``key``. ``deps`` are stored sorted and without duplicates.
    Invalid fields (a key JSON cannot carry included) raise `InvalidImpact`.
    """

    kind: ImpactKind
    noun: str
    key: JsonValue = field(compare=False)
    cause: Cause | None
    deps: tuple[str, ...]
    key_json: str = field(repr=False)

    def __init__(
        self,
        kind: ImpactKind,
        noun: str,
        key: JsonValue = None,
        cause: Cause | None = None,
        deps: Iterable[str] = (),
    ) -> None:
        if not isinstance(kind, ImpactKind):
            raise InvalidImpact(f"impact kind must be an ImpactKind, got {kind!r}")
        _check_name(noun, "impact noun")
        if cause is not None:
            if kind is not ImpactKind.ENTITY:
                raise InvalidImpact(f"only an entity impact carries a cause, not {kind.value}")
            if not isinstance(cause, Cause):
                raise InvalidImpact(f"cause must be a Cause, got {cause!r}")
        if isinstance(deps, str):
            raise InvalidImpact("deps must be an iterable of nouns, not a str")
        canonical_deps = tuple(sorted({_check_name(dep, "dep noun") for dep in deps}))
        if canonical_deps and kind is not ImpactKind.PRINCIPAL_FACTS:
            raise InvalidImpact(f"only a principal-facts impact carries deps, not {kind.value}")
        if kind is ImpactKind.PRINCIPAL_FACTS and noun != PRINCIPAL_FACTS_NOUN:
            raise InvalidImpact(f"a principal-facts impact has noun {PRINCIPAL_FACTS_NOUN!r}")
        if kind is ImpactKind.PROJECTOR_RESET and key is not None:
            raise InvalidImpact("a projector-reset impact has no key")
        text, value = _canonical(key, "impact key")
        object.__setattr__(self, "kind", kind)
        object.__setattr__(self, "noun", noun)
        object.__setattr__(self, "key", value)
        object.__setattr__(self, "cause", cause)
        object.__setattr__(self, "deps", canonical_deps)
        object.__setattr__(self, "key_json", text)

    @classmethod
    def entity(cls, noun: str, key: JsonValue, cause: Cause | None = None) -> Impact:
        """The row ``(noun, key)`` may have changed, optionally because of ``cause``."""
        return cls(ImpactKind.ENTITY, noun, key, cause)

    @classmethod
    def foreign(cls, noun: str, key: JsonValue) -> Impact:
        """A mirror changed the ``known_*`` row ``(noun, key)``. Never carries a cause."""
        return cls(ImpactKind.FOREIGN, noun, key)

    @classmethod
    def reset(cls, noun: str) -> Impact:
        """Every key of ``noun`` may have changed: the one impact a bulk write stages."""
        return cls(ImpactKind.PROJECTOR_RESET, noun)

    @classmethod
    def principal_facts(cls, principal_id: JsonValue, deps: Iterable[str]) -> Impact:
        """The facts of ``principal_id`` changed; ``deps`` are the nouns they gate."""
        return cls(ImpactKind.PRINCIPAL_FACTS, PRINCIPAL_FACTS_NOUN, principal_id, deps=deps)


def impact_json(impact: Impact) -> str:
    """Return the canonical wire text of ``impact``.

    Equal to ``canonical_json(encode_impact(impact))`` but assembled from the
    texts the impact already holds, so nothing is encoded twice.
    """
    # Fields are appended in sorted order (c, d, k, n, p, t): that is what
    # makes the text canonical without a sort.
    cause = impact.cause
    kind = impact.kind
    if cause is None and kind is ImpactKind.ENTITY and impact.key_json != "null":
        return '{"k":' + impact.key_json + ',"n":' + _name_json(impact.noun) + "}"
    parts: list[str] = []
    if cause is not None:
        parts.append('"c":' + _name_json(cause.name))
    if impact.deps:
        parts.append('"d":' + _encode(impact.deps))
    if impact.key_json != "null":
        parts.append('"k":' + impact.key_json)
    parts.append('"n":' + _name_json(impact.noun))
    if cause is not None and cause.data_json != "null":
        parts.append('"p":' + cause.data_json)
    if kind is not ImpactKind.ENTITY:
        parts.append('"t":"' + _KIND_CODE[kind] + '"')
    return "{" + ",".join(parts) + "}"


def encode_impact(impact: Impact) -> dict[str, JsonValue]:
    """Return the wire object of ``impact`` (see the module docstring).

    `canonical_json` of the result is the impact's canonical text; prefer
    `impact_json` when the text is what you need.
    """
    obj: dict[str, JsonValue] = {"n": impact.noun}
    if impact.kind is not ImpactKind.ENTITY:
        obj["t"] = _KIND_CODE[impact.kind]
    if impact.key_json != "null":
        obj["k"] = impact.key
    if impact.cause is not None:
        obj["c"] = impact.cause.name
        if impact.cause.data_json != "null":
            obj["p"] = impact.cause.data
    if impact.deps:
        obj["d"] = impact.deps
    return obj


def decode_impact(obj: object) -> Impact:
    """Rebuild an `Impact` from its wire object (as parsed from JSON).

    Raises `FrameError` naming the fault when ``obj`` is not an impact this
    engine encoded.
    """
    if not isinstance(obj, dict):
        raise FrameError(f"an impact is a JSON object, got {type(obj).__name__}")
    if len(obj) == 2:
        # The hot path on the listener: an entity impact with a str or int key
        # (every commit's common case) needs none of the general checks.
        noun, key = obj.get("n"), obj.get("k")
        if type(noun) is str and noun and type(key) in _FAST_KEYS:
            impact = object.__new__(Impact)
            _set(impact, "kind", ImpactKind.ENTITY)
            _set(impact, "noun", noun)
            _set(impact, "key", key)
            _set(impact, "cause", None)
            _set(impact, "deps", ())
            _set(impact, "key_json", _encode(key))
            return impact
    unknown = obj.keys() - _FIELDS
    if unknown:
        raise FrameError(f"impact has unknown fields {sorted(map(str, unknown))}")
    code = obj.get("t", "e")
    kind = _CODE_KIND.get(code) if isinstance(code, str) else None
    if kind is None:
        raise FrameError(f"impact has unknown kind {code!r}")
    noun = obj.get("n")
    if not isinstance(noun, str) or not noun:
        raise FrameError(f"impact noun must be a non-empty string, got {noun!r}")
    if "p" in obj and "c" not in obj:
        raise FrameError("impact has a cause payload but no cause name")
    deps = obj.get("d", [])
    if not isinstance(deps, list | tuple):
        raise FrameError(f"impact deps must be a list of strings, got {deps!r}")
    try:
        cause = Cause(obj["c"], obj.get("p")) if "c" in obj else None
        return Impact(kind, noun, obj.get("k"), cause, deps)
    except (TypeError, ValueError) as exc:
        raise FrameError(f"invalid impact: {exc}") from exc


# -- what the listener delivers -------------------------------------------------


@dataclass(frozen=True, slots=True)
class Reconnected:
    """Continuity was lost: impacts may have been missed.

    Arrives after LISTEN is live again; the consumer re-snapshots every
    session from committed state.
    """

    reason: str


Delivery: TypeAlias = list[Impact] | Reconnected
"""What the listener yields: one commit's impacts, or a loss of continuity."""
