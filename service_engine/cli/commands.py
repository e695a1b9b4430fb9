"""The operator CLI's commands (click), each a thin shell over the engine's
own functions: it parses, calls, and renders one result as text or JSON."""

from __future__ import annotations

import base64
import enum
import functools
import importlib
import json
import os
import sys
import uuid
from collections.abc import Callable, Coroutine, Iterable, Mapping
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

import click

from ..failures import ConfigError, EngineError, MigrationError

if TYPE_CHECKING:
    from ..commands import CheckedCommand
    from ..db import Database
    from ..messaging.dead_letters import DeadLetter, DeadLetters, DeadLetterSource

# Each command imports what it runs on in its body (asyncio and urllib too):
# ``--help`` loads click and nothing of the engine; ``check-config`` no
# database driver (unless it checks DATABASE_URL), ``migrate`` no pipeline
# (unless it installs --commands), the ops commands no integration loop.


class ExitCode(enum.IntEnum):
    """What a command's exit status means."""

    OK = 0
    """Done; the pod is UP; the configuration is valid."""
    NO = 1
    """The answer is no: DOWN, invalid, refused, not acknowledged."""
    USAGE = 2
    """Bad arguments (click's own usage errors)."""
    NOT_FOUND = 3
    """No such dead letter."""
    UNAVAILABLE = 4
    """The database, the pod or NATS could not be reached."""


class Failed(Exception):
    """Ends a command with ``exit_code``; ``code`` names the failure."""

    def __init__(
        self, exit_code: ExitCode, code: str, message: str, **data: Any
    ) -> None:
        super().__init__(message)
        self.exit_code = exit_code
        self.code = code
        self.data = data


def _emit(as_json: bool, data: Mapping[str, Any], text: str) -> None:
    if as_json:
        click.echo(json.dumps(data, default=_jsonable, sort_keys=False))
    else:
        click.echo(text)


def _jsonable(value: object) -> object:
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, uuid.UUID | Path):
        return str(value)
    if isinstance(value, enum.Enum):
        return value.value
    raise TypeError(f"{type(value).__name__} is not JSON serialisable")


def _fail(as_json: bool, failed: Failed) -> NoReturn:
    if as_json:
        error = {"code": failed.code, "message": str(failed)}
        click.echo(json.dumps({"ok": False, "error": error, **failed.data}, default=_jsonable))
    else:
        click.echo(f"error ({failed.code}): {failed}", err=True)
    sys.exit(int(failed.exit_code))


json_option = click.option(
    "--json", "as_json", is_flag=True, help="Print one JSON object on stdout instead of text."
)
database_option = click.option(
    "--database-url", envvar="DATABASE_URL", required=True, show_envvar=True,
    help="Postgres URL (the engine's app role; TLS rules as connect_pool).",
)


Outcome = tuple[dict[str, Any], str, ExitCode]


def _runs(body: Callable[..., Coroutine[Any, Any, Outcome]]) -> Callable[..., None]:
    """Run an async command body: render its (data, text, exit code), or its `Failed`."""

    @functools.wraps(body)
    def command(*args: Any, as_json: bool, **kwargs: Any) -> None:
        import asyncio

        try:
            data, text, exit_code = asyncio.run(body(*args, **kwargs))
        except Failed as failed:
            _fail(as_json, failed)
        _emit(as_json, {"ok": exit_code is ExitCode.OK, **data}, text)
        sys.exit(int(exit_code))

    return command


def _declared_commands(ref: str) -> list[CheckedCommand]:
    """The checked commands ``MODULE:ATTR`` names (an iterable of them, or a
    function returning one); `ConfigError` for a reference that names none."""
    from ..commands import CheckedCommand

    module_name, sep, attr = ref.partition(":")
    if not sep or not module_name or not attr:
        raise ConfigError(f"--commands {ref!r}: expected MODULE:ATTR")
    try:
        found: Any = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise ConfigError(f"--commands {ref!r}: {exc}") from exc
    if callable(found):
        found = found()
    commands = list(found) if isinstance(found, Iterable) else []
    if not commands or not all(isinstance(c, CheckedCommand) for c in commands):
        raise ConfigError(f"--commands {ref!r}: not an iterable of checked commands "
                          "(Catalog.command's answers)")
    return commands


async def _open_database(url: str) -> Database:
    from ..db import connect_pool

    try:
        return await connect_pool(url, min_size=1, max_size=2)
    except ConfigError as exc:
        raise Failed(ExitCode.NO, "database_url_refused", str(exc)) from exc
    except Exception as exc:
        raise Failed(
            ExitCode.UNAVAILABLE, "database_unreachable",
            f"cannot connect to the database: {type(exc).__name__}: {exc}",
        ) from exc


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def cli() -> None:
    """Operate a service-engine deployment.

    Exit codes: 0 done / UP / valid, 1 the answer is no (DOWN, invalid,
    refused), 2 usage, 3 not found, 4 unreachable. Every command takes
    --json.
    """


def main(args: list[str] | None = None) -> NoReturn:
    """The console entry point (``python -m service_engine``).

    Usage errors exit 2; with ``--json`` they too are one JSON object.
    """
    argv = sys.argv[1:] if args is None else args
    try:
        cli.main(argv, prog_name="python -m service_engine", standalone_mode=False)
    except click.UsageError as exc:
        if "--json" in argv:
            _fail(True, Failed(ExitCode.USAGE, "usage", exc.format_message()))
        exc.show()
        sys.exit(int(ExitCode.USAGE))
    except click.ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code)
    except click.exceptions.Abort:
        click.echo("aborted", err=True)
        sys.exit(int(ExitCode.NO))
    sys.exit(int(ExitCode.OK))


# -- migrate -------------------------------------------------------------------


_OWNERSHIP = """
SELECT current_user AS role,
       pg_has_role(current_user, d.datdba, 'MEMBER') AS owns_database,
       r.rolsuper AS superuser
  FROM pg_database d JOIN pg_roles r ON r.rolname = current_user
 WHERE d.datname = current_database()
"""


@cli.command("migrate")
@click.option(
    "--owner-url", envvar="OWNER_DATABASE_URL", required=True, show_envvar=True,
    help="Postgres URL of the owner role (owns the database and the engine schema).",
)
@click.option(
    "--service-migrations", "service_dirs", multiple=True,
    type=click.Path(exists=True, file_okay=False, path_type=Path),
    help="A folder of the service's NNNN_name.sql migrations (numbered from 1000); repeatable.",
)
@click.option(
    "--grant", "app_role", default=None,
    help="After migrating, grant this app role what the engine needs (grant_engine_access).",
)
@click.option(
    "--commands", "command_refs", multiple=True, metavar="MODULE:ATTR",
    help="After migrating, install the database functions of the service's declared commands "
         "(ATTR: an iterable of checked commands, or a function returning one); repeatable.",
)
@json_option
@_runs
async def migrate_command(
    owner_url: str, service_dirs: tuple[Path, ...], app_role: str | None,
    command_refs: tuple[str, ...] = (),
) -> tuple[dict[str, Any], str, ExitCode]:
    """Apply the engine's migrations (and the service's) as the owner role,
    then install the declared commands' functions."""
    from ..commands import install_commands
    from ..db import engine_migrations, grant_engine_access, migrate, service_migrations

    try:
        migrations = [*engine_migrations()]
        for directory in service_dirs:
            migrations.extend(service_migrations(directory))
        declared = [c for ref in command_refs for c in _declared_commands(ref)]
    except (MigrationError, ConfigError) as exc:
        raise Failed(ExitCode.NO, "migration_refused", str(exc)) from exc
    db = await _open_database(owner_url)
    async with db, db.pool.acquire() as conn:
        who = await conn.fetchrow(_OWNERSHIP)
        assert who is not None
        if not who["owns_database"]:
            raise Failed(
                ExitCode.NO, "not_owner",
                f"role {who['role']!r} does not own this database: migrations run as the "
                "owner role (never as the engine's app role)",
                role=who["role"],
            )
        try:
            applied = await migrate(conn, migrations)
            installed = await install_commands(conn, declared) if declared else []
            if app_role is not None:
                await grant_engine_access(conn, app_role)
        except MigrationError as exc:
            raise Failed(ExitCode.NO, "migration_refused", str(exc), role=who["role"]) from exc
        except EngineError as exc:
            raise Failed(ExitCode.NO, "migration_refused", str(exc), role=who["role"]) from exc
    known = [m.version for m in migrations]
    data = {"role": who["role"], "applied": applied, "known": known, "granted": app_role,
            "commands": installed}
    text = (
        f"migrated as {who['role']}: applied {applied or 'nothing (up to date)'}"
        f"; {len(known)} migrations known"
        + (f"; installed {len(installed)} command functions" if installed else "")
        + (f"; granted engine access to {app_role}" if app_role else "")
    )
    return data, text, ExitCode.OK


# -- check-config --------------------------------------------------------------


def _read_env_file(path: Path) -> dict[str, str]:
    values: dict[str, str] = {}
    for number, raw in enumerate(path.read_text().splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        key, sep, value = line.removeprefix("export ").partition("=")
        if not sep or not key.strip():
            raise click.UsageError(f"{path}:{number}: expected NAME=VALUE, got {raw!r}")
        values[key.strip()] = value.strip().strip("'\"")
    return values


@cli.command("check-config")
@click.option(
    "--env-file", type=click.Path(exists=True, dir_okay=False, path_type=Path), default=None,
    help="Read SERVICE_ENGINE_* (and DATABASE_URL) from this NAME=VALUE file instead of "
         "the environment.",
)
@json_option
@_runs
async def check_config(env_file: Path | None) -> tuple[dict[str, Any], str, ExitCode]:
    """Validate a configuration without booting: every EngineConfig bound and
    relation, misspelt SERVICE_ENGINE_* names, and DATABASE_URL's TLS rules."""
    from ..config import check_environment, describe_config

    environ = _read_env_file(env_file) if env_file is not None else dict(os.environ)
    check = check_environment(environ)
    problems = list(check.problems)
    url = environ.get("DATABASE_URL")
    if url:
        from ..db import trusted_hosts_from_env, validate_database_tls

        try:
            validate_database_tls(url, trusted_hosts_from_env(environ))
        except ConfigError as exc:
            problems.append(f"DATABASE_URL: {exc}")
    source = str(env_file) if env_file is not None else "the environment"
    if problems or check.config is None:
        text = f"invalid configuration ({source}):\n" + "\n".join(f"  {p}" for p in problems)
        return {"source": source, "problems": problems}, text, ExitCode.NO
    values = describe_config(check.config)
    width = max(len(name) for name in values)
    text = f"valid configuration ({source}):\n" + "\n".join(
        f"  {name.ljust(width)} = {value}" for name, value in values.items()
    )
    return {"source": source, "config": values, "problems": []}, text, ExitCode.OK


# -- ready ---------------------------------------------------------------------


def _default_ready_url() -> str:
    addr = os.environ.get("SERVICE_ENGINE_HTTP_ADDR") or "127.0.0.1:8000"
    host, _, port = addr.rpartition(":")
    if host in ("", "0.0.0.0", "::", "[::]"):
        host = "127.0.0.1"
    return f"http://{host}:{port}/readyz"


def _get_readyz(url: str, timeout: float) -> tuple[int, dict[str, Any]]:
    import urllib.error
    import urllib.request

    request = urllib.request.Request(url, headers={"Accept": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        with exc:
            return exc.code, json.loads(exc.read())


@cli.command("ready")
@click.option(
    "--url", default=None,
    help="The pod's readiness URL (default: http://<SERVICE_ENGINE_HTTP_ADDR>/readyz, "
         "else http://127.0.0.1:8000/readyz).",
)
@click.option("--timeout", "wait", type=float, default=5.0, show_default=True,
              help="Seconds to wait for the answer.")
@json_option
@_runs
async def ready(url: str | None, wait: float) -> tuple[dict[str, Any], str, ExitCode]:
    """Ask a running pod whether it is ready (GET /readyz): exit 0 UP, 1 DOWN."""
    import asyncio

    target = url or _default_ready_url()
    try:
        status, body = await asyncio.to_thread(_get_readyz, target, wait)
    except (OSError, ValueError) as exc:
        raise Failed(
            ExitCode.UNAVAILABLE, "pod_unreachable", f"cannot read {target}: {exc}", url=target
        ) from exc
    reasons = body.get("reasons", [])
    up = status == 200 and body.get("status") == "UP"
    text = "UP" if up else "DOWN\n" + "\n".join(
        f"  {r.get('reason')}: {r.get('detail')}" for r in reasons
    )
    data = {"url": target, "status": body.get("status", "DOWN"), "http_status": status,
            "reasons": reasons}
    return data, text, ExitCode.OK if up else ExitCode.NO


# -- dead letters --------------------------------------------------------------


@cli.group("dead-letters")
def dead_letters() -> None:
    """List, show, retry and discard dead letters."""


def _source(value: str | None) -> DeadLetterSource | None:
    if value is None:
        return None
    from ..messaging.dead_letters import DeadLetterSource

    for source in DeadLetterSource:
        if value.lower() in (source.value.lower(), source.name.lower()):
            return source
    raise click.BadParameter(
        f"{value!r}; one of {', '.join(s.value for s in DeadLetterSource)}", param_hint="--source"
    )


def _letter_id(value: str) -> uuid.UUID:
    try:
        return uuid.UUID(value)
    except ValueError:
        raise click.BadParameter(f"{value!r} is not a dead letter id (a UUID)") from None


def _summary(letter: DeadLetter) -> dict[str, Any]:
    return {
        "id": letter.id, "source": letter.source, "work": letter.work, "reason": letter.reason,
        "occurrences": letter.occurrences, "attempts": letter.attempts,
        "retryable": letter.subject is not None and letter.payload is not None,
        "subject": letter.subject, "recorded_at": letter.recorded_at,
        "last_seen_at": letter.last_seen_at,
    }


def _detail(letter: DeadLetter) -> dict[str, Any]:
    payload: dict[str, Any] | None = None
    if letter.payload is not None:
        try:
            payload = {"text": letter.payload.decode()}
        except UnicodeDecodeError:
            payload = {"base64": base64.b64encode(letter.payload).decode()}
    return {
        **_summary(letter), "detail": letter.detail, "message_id": letter.message_id,
        "headers": dict(letter.headers), "payload": payload,
    }


async def _find(letters: DeadLetters, letter_id: uuid.UUID) -> DeadLetter:
    letter = await letters.get(letter_id)
    if letter is None:
        raise Failed(ExitCode.NOT_FOUND, "dead_letter_not_found", f"no dead letter {letter_id}",
                     id=letter_id)
    return letter


@dead_letters.command("list")
@click.option("--source", default=None,
              help="Only this source: Reaction, Scheduled, Cron, Mirror or Outbox.")
@click.option("--limit", type=click.IntRange(min=1), default=100, show_default=True)
@database_option
@json_option
@_runs
async def list_dead_letters(
    source: str | None, limit: int, database_url: str
) -> tuple[dict[str, Any], str, ExitCode]:
    """Dead letters waiting on a human, oldest first."""
    from ..messaging.dead_letters import DeadLetters

    wanted = _source(source)
    db = await _open_database(database_url)
    async with db:
        found = await DeadLetters(db).list(wanted, limit=limit)
    rows = [_summary(letter) for letter in found]
    lines = [
        f"{r['id']}  {r['source'].value:<9} {r['work']}  x{r['occurrences']}  {r['reason']}"
        + ("" if r["retryable"] else "  (not retryable)")
        for r in rows
    ]
    text = "\n".join(lines) if lines else "no dead letters waiting"
    return {"source": wanted, "dead_letters": rows}, text, ExitCode.OK


@dead_letters.command("show")
@click.argument("letter_id")
@database_option
@json_option
@_runs
async def show_dead_letter(
    letter_id: str, database_url: str
) -> tuple[dict[str, Any], str, ExitCode]:
    """One dead letter in full: reason, detail, headers and payload."""
    from ..messaging.dead_letters import DeadLetters

    db = await _open_database(database_url)
    async with db:
        letter = await _find(DeadLetters(db), _letter_id(letter_id))
    detail = _detail(letter)
    text = "\n".join(f"{k}: {v.value if isinstance(v, enum.Enum) else v}"
                     for k, v in detail.items())
    return {"dead_letter": detail}, text, ExitCode.OK


@dead_letters.command("retry")
@click.argument("letter_id")
@database_option
@click.option("--nats-url", envvar="NATS_URL", required=True, show_envvar=True)
@click.option("--connect-timeout", type=click.FloatRange(min=0.1), default=10.0,
              show_default=True, help="Seconds to wait for NATS.")
@json_option
@_runs
async def retry_dead_letter(
    letter_id: str, database_url: str, nats_url: str, connect_timeout: float
) -> tuple[dict[str, Any], str, ExitCode]:
    """Republish a dead message; it is deleted only once JetStream acknowledged it."""
    import asyncio

    from ..messaging.dead_letters import DeadLetters
    from ..messaging.nats import Acked, Duplicate, Rejected, Unanswered, open_nats

    wanted = _letter_id(letter_id)
    db = await _open_database(database_url)
    async with db:
        letters = DeadLetters(db)
        letter = await _find(letters, wanted)
        if letter.subject is None or letter.payload is None:
            raise Failed(
                ExitCode.NO, "not_retryable",
                f"dead letter {wanted} ({letter.source.value} {letter.work!r}) is not a message: "
                "fix the cause, then discard it", id=wanted,
            )
        try:
            # The engine's connect retries an unreachable server for ever.
            nats = await asyncio.wait_for(
                open_nats(nats_url, name="service-engine-cli"), connect_timeout
            )
        except (EngineError, TimeoutError) as exc:
            raise Failed(
                ExitCode.UNAVAILABLE, "nats_unreachable",
                str(exc) or f"no NATS at {nats_url} within {connect_timeout:g}s", id=wanted,
            ) from exc
        async with nats:
            try:
                outcome = await letters.retry(wanted, nats)
            except EngineError as exc:
                raise Failed(ExitCode.NO, "retry_refused", str(exc), id=wanted) from exc
    name = type(outcome).__name__
    done = isinstance(outcome, Acked | Duplicate)
    detail = outcome.detail if isinstance(outcome, Unanswered | Rejected) else ""
    text = (f"retried {wanted}: {name}; the dead letter is gone" if done
            else f"retry of {wanted} not acknowledged ({name}{': ' + detail if detail else ''}); "
                 "the dead letter stays")
    data = {"id": wanted, "outcome": name, "deleted": done, "subject": letter.subject,
            "detail": detail or None}
    return data, text, ExitCode.OK if done else ExitCode.NO


@dead_letters.command("discard")
@click.argument("letter_id")
@database_option
@json_option
@_runs
async def discard_dead_letter(
    letter_id: str, database_url: str
) -> tuple[dict[str, Any], str, ExitCode]:
    """Delete a dead letter a human resolved (the work will not run)."""
    from ..messaging.dead_letters import DeadLetters

    wanted = _letter_id(letter_id)
    db = await _open_database(database_url)
    async with db:
        deleted = await DeadLetters(db).discard(wanted)
    if not deleted:
        raise Failed(ExitCode.NOT_FOUND, "dead_letter_not_found", f"no dead letter {wanted}",
                     id=wanted)
    return {"id": wanted, "deleted": True}, f"discarded {wanted}", ExitCode.OK


# -- outbox --------------------------------------------------------------------


@cli.group("outbox")
def outbox() -> None:
    """The integration outbox."""


@outbox.command("status")
@database_option
@json_option
@_runs
async def outbox_status(database_url: str) -> tuple[dict[str, Any], str, ExitCode]:
    """Rows waiting to be published, the oldest one's age, failed and published rows."""
    from ..ops.queries import outbox_status as read_outbox_status

    db = await _open_database(database_url)
    async with db:
        status = await read_outbox_status(db)
    data = {
        "pending": status.pending, "failed": status.failed, "published": status.published,
        "oldest_pending_age_seconds": status.oldest_pending_age_seconds,
    }
    text = (f"pending {data['pending']} (oldest {data['oldest_pending_age_seconds']:g}s), "
            f"failed {data['failed']}, published {data['published']}")
    return data, text, ExitCode.OK
