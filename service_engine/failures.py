"""The engine's one exception hierarchy.

`EngineError` is the root of every typed failure the engine raises. Three
branches say whose fault a failure is:

* `ConfigError` (also a `ValueError`): the caller built a bad configuration;
* `AttachError`: a subscription attach was refused;
* everything else under `EngineError`: the engine met a state it refuses to
  run over (posture, schema version, a dead worker, an external failure).

Driver exceptions (asyncpg, nats) are translated at the adapter with
``raise ... from exc`` and never reach a slice author.

Every engine error carries a stable ``code``: what it is called when it
crosses a wire (a `MutationError` code, a reaction's dead-letter reason).
Which errors are answered by their code, and how, is the one table
`pipeline.outcomes.ANSWERED`.
"""

from __future__ import annotations


class EngineError(Exception):
    """Root of the engine's typed failures. ``code`` is its stable wire name."""

    code: str = "engine_error"


class ConfigError(EngineError, ValueError):
    """A configuration value or relation is out of bounds."""

    code = "configuration"


class DeclarationError(ConfigError, TypeError):
    """A declaration is ill-formed: a store, an aggregate class, an event, a
    row or a value handed to the engine is not of the shape it must have.
    (Also a `TypeError`, what a wrong shape was called before.)"""

    code = "declaration"


class DatabaseUrlRefused(ConfigError):
    """A database URL failed the secure-by-default connect rules.

    ``rule`` names the rule that refused it; the message never echoes the
    password.
    """

    def __init__(self, rule: str, detail: str) -> None:
        super().__init__(f"database URL refused ({rule}): {detail}")
        self.rule = rule


class DuplicateRegistration(EngineError):
    """A ``register_*`` seam was given a name that is already registered."""

    def __init__(self, kind: str, name: str) -> None:
        super().__init__(f"duplicate {kind} registration: {name!r}")
        self.kind = kind
        self.name = name


class PostureError(EngineError):
    """The engine's database role is more privileged than it may be.

    ``reason`` is the readiness reason code the refusal is reported under.
    """

    reason = "posture"


class PostureSuperuser(PostureError):
    """The engine connected as a superuser."""

    reason = "posture_superuser"


class PostureBypassRls(PostureError):
    """The engine's role has ``rolbypassrls``: RLS would not apply to it."""

    reason = "posture_bypassrls"


class PostureOwner(PostureError):
    """The engine's role owns, or is a member of the owner of, the engine
    schema or the database."""

    reason = "posture_owner"


class SchemaVersionConflict(EngineError):
    """A live pod of another version holds the schema-version singleton."""

    reason = "schema_version_conflict"

    def __init__(self, ours: str, theirs: str) -> None:
        super().__init__(
            f"schema version conflict: this pod runs {ours}, "
            f"a live pod holds the store at {theirs}"
        )
        self.ours = ours
        self.theirs = theirs


class ListenerProbeFailed(EngineError):
    """LISTEN/NOTIFY does not round-trip on the engine's connections.

    Typically the engine sits behind a transaction-mode pooler, where a
    LISTEN is released with the transaction and no notification arrives.
    """

    reason = "listener_probe"


class MigrationError(EngineError):
    """A migration could not be applied, or an applied one was altered."""


class MigrationAltered(MigrationError):
    """An applied migration's text changed since it was applied.

    ``applied`` and ``found`` are the SHA-256 digests (hex) of the text the
    database recorded and of the text found now; ``source`` is the file.
    An applied migration is never edited: restore it and write the change
    as a new migration (in development, dropping the database also works).
    """

    def __init__(
        self, version: int, name: str, source: str | None, applied: str, found: str
    ) -> None:
        where = f" ({source})" if source else ""
        super().__init__(
            f"migration {version}_{name}{where} was altered after it was applied: the "
            f"database applied sha256 {applied}, the file now has sha256 "
            f"{found}. An applied migration is never edited: restore its "
            f"applied text and write the change as a new migration numbered above "
            f"{version}; in development only, drop the database and migrate again"
        )
        self.version = version
        self.name = name
        self.source = source
        self.applied = applied
        self.found = found


class WorkerStopped(EngineError):
    """A supervised worker returned or raised before shutdown began."""

    def __init__(self, name: str, detail: str = "") -> None:
        message = f"worker stopped: {name}"
        if detail:
            message += f" ({detail})"
        super().__init__(message)
        self.name = name


class ShuttingDown(EngineError):
    """The engine is shutting down and accepts no new work."""

    code = "shutting_down"


class AttachError(EngineError):
    """A subscription attach was refused."""


class AttachShuttingDown(AttachError, ShuttingDown):
    """An attach arrived after shutdown began."""


class CauseTooLarge(EngineError):
    """A single impact's Cause cannot fit in one NOTIFY payload.

    Raised inside the write transaction, which then fails closed: a cause is
    a small fact, bulk data rides the view.
    """

    code = "cause_too_large"


class TornGroup(EngineError):
    """A framed impact group lost a frame: its impacts cannot be trusted."""


class FrameError(EngineError):
    """A NOTIFY payload is not a frame this engine wrote."""


class TooManyImpacts(EngineError):
    """An ordinary transaction dirtied more keys than ``impacts_per_commit``.

    Bulk writes go through the bulk path (``Bulk.impact_all``), which stages
    one projector-reset impact instead of one per key.
    """

    code = "too_many_impacts"


class NestedConnectionError(EngineError):
    """A task that holds a pooled connection asked the same pool for another.

    A handler, a store, a projector hook or an erasable runs while the
    engine holds a connection for it (a pipeline's transaction, a render
    read); reaching the pool again from there (`Engine.fetch`,
    ``load_principal_facts``, `Engine.fold`, `Engine.push_chunk`,
    `Database.fetch` ...) would wait for a second connection while holding
    the first, and with every connection so held the pod stops for good.
    Raised at once instead, before anything waits: nothing is committed.
    """

    code = "nested_connection"

    def __init__(self, entry: str) -> None:
        super().__init__(
            f"{entry}: this task already holds a connection of this pool; use the "
            "connection you were given (cx / conn): engine reads and facts cannot be "
            "awaited inside a pipeline, a render read or a store"
        )
        self.entry = entry
