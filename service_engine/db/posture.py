"""The boot posture assertion: the engine's role may not be privileged.

RLS and the engine's other guarantees assume the app role is an ordinary
role: not a superuser, without BYPASSRLS, neither owning nor a member of the
owner of the engine schema or the database (an owner bypasses RLS unless
FORCE ROW LEVEL SECURITY, and can alter what it is checked against).
"""

from __future__ import annotations

from ..failures import MigrationError, PostureBypassRls, PostureOwner, PostureSuperuser
from .types import Conn


async def assert_posture(conn: Conn) -> None:
    """Raise a `PostureError` subclass naming what is wrong with the role."""
    row = await conn.fetchrow(
        """
        SELECT r.rolname, r.rolsuper, r.rolbypassrls,
               n.nspowner::regrole::text AS schema_owner,
               pg_has_role(current_user, n.nspowner, 'MEMBER') AS schema_member,
               d.datdba::regrole::text AS database_owner,
               pg_has_role(current_user, d.datdba, 'MEMBER') AS database_member
          FROM pg_roles r
          CROSS JOIN pg_database d
          LEFT JOIN pg_namespace n ON n.nspname = 'service_engine'
         WHERE r.rolname = current_user AND d.datname = current_database()
        """
    )
    assert row is not None
    role = row["rolname"]
    if row["rolsuper"]:
        raise PostureSuperuser(f"role {role!r} is a superuser; the engine refuses to run as one")
    if row["rolbypassrls"]:
        raise PostureBypassRls(f"role {role!r} has BYPASSRLS; row-level security would not apply")
    if row["schema_owner"] is None:
        raise MigrationError("schema service_engine does not exist: run the migrations first")
    if row["schema_member"]:
        raise PostureOwner(
            f"role {role!r} owns or is a member of {row['schema_owner']!r}, "
            "the owner of schema service_engine"
        )
    if row["database_member"]:
        raise PostureOwner(
            f"role {role!r} owns or is a member of {row['database_owner']!r}, "
            "the owner of the database"
        )
