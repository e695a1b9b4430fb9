"""The operator CLI: ``python -m service_engine <command>``.

Commands: ``migrate`` (as the owner role), ``check-config`` (every bound and
relation, without booting), ``ready`` (a running pod's /readyz),
``dead-letters list|show|retry|discard``, ``outbox status``. Every command
takes ``--json`` and then prints exactly one JSON object on stdout, errors
included (``{"ok": false, "error": {"code": ..., "message": ...}}``).

Exit codes an operator can script on (`ExitCode`): 0 done / UP / valid; 1
the answer is no (the pod is DOWN, the configuration is invalid, a retry
was not acknowledged, a migration was refused); 2 bad usage; 3 no such dead
letter; 4 a dependency (database, pod, NATS) could not be reached.

click parses the commands: subcommands, typed options, environment
fallbacks (``DATABASE_URL``, ``NATS_URL``) and usage errors come from a
well-kept library instead of hand-written parsing; uvicorn already depends
on it.
"""

from __future__ import annotations

from .commands import ExitCode, cli, main

__all__ = ["ExitCode", "cli", "main"]
