"""Databases copied from a template once per worker and reset between tests.

Copying a template (``CREATE DATABASE ... TEMPLATE``) and dropping the copy
cost the embedded PostgreSQL about 0.4 s of CPU per test: most of the
battery's database work. A `DatabasePool` instead keeps each copy it made
and, when a test is done with it, puts it back as the template left it:

1. every session still connected to it is terminated (with it its LISTENs,
   advisory locks, temporary tables, prepared statements and settings);
2. the objects the test created (tables, views, sequences, functions,
   triggers, policies, types, schemas: anything with an object id newer than
   the copy's) are dropped;
3. a fingerprint of the catalog (relations, columns, defaults, constraints,
   indexes, triggers, policies, functions, types, grants, ownership, the
   database's own settings and grants, the roles) is compared with the
   copy's fresh one, and the rows of every table the migrations filled
   (``schema_migrations``) with theirs;
4. every other table that holds a row is emptied and vacuumed, every
   sequence is set back to its fresh value, and the database's statistics
   counters are reset.

A copy whose fingerprint or seeded rows differ (a test altered a table,
revoked a grant, ran a migration) or whose reset fails in any way is
dropped, and the next test gets a fresh copy: a test never sees another
test's state. The pool belongs to one process (a forked process starts an
empty pool of its own).
"""

from __future__ import annotations

import contextlib
import os
import secrets
from collections.abc import AsyncIterator
from dataclasses import dataclass

import asyncpg

from service_engine.embedded import (
    EmbeddedPostgres,
    ProvisionedDatabase,
    drop_database,
    provision_database,
)

FIRST_USER_OID = 16384
"""PostgreSQL's ``FirstNormalObjectId``: every object initdb made has a
lower object id, every object made since a higher one."""

TERMINATE_WAIT_MS = 5000
"""How long a reset waits for each terminated session to end."""

_USER_SCHEMAS = """
    n.nspname NOT IN ('pg_catalog', 'information_schema', 'pg_toast')
    AND n.nspname NOT LIKE 'pg\\_temp\\_%' AND n.nspname NOT LIKE 'pg\\_toast\\_temp\\_%'
"""

FINGERPRINT = f"""
SELECT md5(string_agg(line, E'\\n' ORDER BY line)) FROM (
  SELECT ROW('namespace', n.oid, n.nspname, n.nspowner, n.nspacl)::text
    FROM pg_namespace n WHERE n.oid >= {FIRST_USER_OID} AND {_USER_SCHEMAS}
  UNION ALL
  SELECT ROW('class', c.oid, c.relname, c.relnamespace, c.relkind, c.relowner,
             c.relpersistence, c.relacl, c.reloptions, c.relrowsecurity,
             c.relforcerowsecurity, c.relreplident, c.relnatts, c.relchecks,
             c.reltype, c.relam, c.relispartition)::text
    FROM pg_class c WHERE c.oid >= {FIRST_USER_OID} AND c.relpersistence <> 't'
  UNION ALL
  SELECT ROW('column', a.attrelid, a.attnum, a.attname, a.atttypid, a.atttypmod,
             a.attnotnull, a.attisdropped, a.attidentity, a.attgenerated,
             a.attcollation, a.attacl, a.attoptions)::text
    FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid
   WHERE a.attrelid >= {FIRST_USER_OID} AND a.attnum > 0 AND c.relpersistence <> 't'
  UNION ALL
  SELECT ROW('default', d.adrelid, d.adnum, pg_get_expr(d.adbin, d.adrelid))::text
    FROM pg_attrdef d WHERE d.adrelid >= {FIRST_USER_OID}
  UNION ALL
  SELECT ROW('constraint', k.oid, k.conname, k.conrelid, k.contypid, k.convalidated,
             k.condeferrable, k.condeferred, pg_get_constraintdef(k.oid))::text
    FROM pg_constraint k WHERE k.oid >= {FIRST_USER_OID}
  UNION ALL
  SELECT ROW('index', i.indexrelid, i.indisvalid, i.indisready, i.indisreplident,
             pg_get_indexdef(i.indexrelid))::text
    FROM pg_index i WHERE i.indexrelid >= {FIRST_USER_OID}
  UNION ALL
  SELECT ROW('trigger', t.oid, t.tgrelid, t.tgname, t.tgfoid, t.tgtype, t.tgenabled,
             t.tgdeferrable, t.tginitdeferred, t.tgargs, t.tgattr)::text
    FROM pg_trigger t WHERE t.oid >= {FIRST_USER_OID} AND NOT t.tgisinternal
  UNION ALL
  SELECT ROW('policy', p.oid, p.polname, p.polrelid, p.polcmd, p.polpermissive,
             p.polroles, pg_get_expr(p.polqual, p.polrelid),
             pg_get_expr(p.polwithcheck, p.polrelid))::text
    FROM pg_policy p
  UNION ALL
  SELECT ROW('function', f.oid, f.oid::regprocedure, f.proowner, f.prokind,
             f.provolatile, f.prosecdef, f.proleakproof, f.proisstrict, f.prorettype,
             f.proacl, f.proconfig, md5(f.prosrc), f.prolang)::text
    FROM pg_proc f WHERE f.oid >= {FIRST_USER_OID}
  UNION ALL
  SELECT ROW('type', y.oid, y.typname, y.typnamespace, y.typowner, y.typtype,
             y.typrelid, y.typbasetype, y.typnotnull, y.typacl,
             pg_get_expr(y.typdefaultbin, 0))::text
    FROM pg_type y WHERE y.oid >= {FIRST_USER_OID}
  UNION ALL
  SELECT ROW('enum', e.enumtypid, e.enumsortorder, e.enumlabel)::text FROM pg_enum e
  UNION ALL
  SELECT ROW('rule', r.oid, r.ev_class, r.rulename, r.ev_type, r.ev_enabled,
             md5(pg_get_ruledef(r.oid)))::text
    FROM pg_rewrite r WHERE r.oid >= {FIRST_USER_OID}
  UNION ALL
  SELECT ROW('sequence', s.seqrelid, s.seqtypid, s.seqstart, s.seqincrement, s.seqmax,
             s.seqmin, s.seqcache, s.seqcycle)::text
    FROM pg_sequence s
  UNION ALL
  SELECT ROW('default acl', x.oid, x.defaclrole, x.defaclnamespace, x.defaclobjtype,
             x.defaclacl)::text
    FROM pg_default_acl x
  UNION ALL
  SELECT ROW('statistics', o.oid, o.stxname, o.stxrelid)::text FROM pg_statistic_ext o
  UNION ALL
  SELECT ROW('extension', x.extname, x.extversion, x.extnamespace)::text FROM pg_extension x
  UNION ALL
  SELECT ROW('event trigger', x.evtname, x.evtevent, x.evtfoid, x.evtenabled)::text
    FROM pg_event_trigger x
  UNION ALL
  SELECT ROW('publication', x.pubname)::text FROM pg_publication x
  UNION ALL
  SELECT ROW('object', 'operator', o.oid)::text FROM pg_operator o
   WHERE o.oid >= {FIRST_USER_OID}
  UNION ALL
  SELECT ROW('object', 'cast', o.oid)::text FROM pg_cast o WHERE o.oid >= {FIRST_USER_OID}
  UNION ALL
  SELECT ROW('object', 'collation', o.oid)::text FROM pg_collation o
   WHERE o.oid >= {FIRST_USER_OID}
  UNION ALL
  SELECT ROW('object', 'language', o.oid)::text FROM pg_language o
   WHERE o.oid >= {FIRST_USER_OID}
  UNION ALL
  SELECT ROW('object', 'foreign server', o.oid)::text FROM pg_foreign_server o
  UNION ALL
  SELECT ROW('object', 'large object', o.oid)::text FROM pg_largeobject_metadata o
  UNION ALL
  SELECT ROW('database', d.datname, d.datdba, d.datacl, d.datconnlimit, d.datallowconn,
             d.datistemplate)::text
    FROM pg_database d WHERE d.datname = current_database()
  UNION ALL
  SELECT ROW('setting', s.setdatabase = (SELECT oid FROM pg_database
                                          WHERE datname = current_database()),
             s.setrole, s.setconfig)::text
    FROM pg_db_role_setting s
  UNION ALL
  SELECT ROW('role', r.rolname, r.rolsuper, r.rolinherit, r.rolcreaterole,
             r.rolcreatedb, r.rolcanlogin, r.rolreplication, r.rolbypassrls,
             r.rolconnlimit, r.rolvaliduntil, r.rolconfig)::text
    FROM pg_roles r
  UNION ALL
  SELECT ROW('member', m.roleid, m.member, m.admin_option, m.inherit_option,
             m.set_option)::text
    FROM pg_auth_members m
) AS catalog(line)
"""
"""One hash of everything a test could change in a database's schema, its
grants and the roles, without the row data and what a TRUNCATE renews
(relfilenodes, page counts)."""

TABLES = f"""
SELECT format('%I.%I', n.nspname, c.relname) AS name
  FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
 WHERE c.relkind IN ('r', 'p') AND c.relpersistence <> 't' AND {_USER_SCHEMAS}
 ORDER BY 1
"""

SEQUENCES = """
SELECT format('%I.%I', schemaname, sequencename) AS name,
       coalesce(last_value, start_value) AS value, last_value IS NOT NULL AS called
  FROM pg_sequences
"""

TERMINATE = f"""
SELECT count(pg_terminate_backend(pid, {TERMINATE_WAIT_MS})) FROM pg_stat_activity
 WHERE datname = current_database() AND pid <> pg_backend_pid()
"""
"""Ends every other session on the database, waiting for each (one that
ended by itself meanwhile answers false with a warning: `CONNECTED` decides)."""

CONNECTED = """
SELECT count(*) FROM pg_stat_activity
 WHERE datname = current_database() AND pid <> pg_backend_pid()
"""

HELD = """
SELECT (SELECT count(*) FROM pg_prepared_xacts WHERE database = current_database())
     + (SELECT count(*) FROM pg_replication_slots WHERE database = current_database())
"""
"""What terminating sessions does not end and the pool cannot undo."""

CREATED = f"""
SELECT kind, name FROM (
  SELECT 1 AS step, CASE c.relkind WHEN 'v' THEN 'VIEW' WHEN 'm' THEN 'MATERIALIZED VIEW'
                    WHEN 'S' THEN 'SEQUENCE' WHEN 'f' THEN 'FOREIGN TABLE'
                    ELSE 'TABLE' END AS kind,
         format('%I.%I', n.nspname, c.relname) AS name
    FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
   WHERE c.oid > $1 AND c.relkind IN ('r', 'p', 'v', 'm', 'S', 'f')
     AND c.relpersistence <> 't' AND {_USER_SCHEMAS}
  UNION ALL
  SELECT 2, 'TRIGGER', format('%I ON %s', t.tgname, t.tgrelid::regclass)
    FROM pg_trigger t WHERE t.oid > $1 AND t.tgrelid <= $1 AND NOT t.tgisinternal
  UNION ALL
  SELECT 2, 'POLICY', format('%I ON %s', p.polname, p.polrelid::regclass)
    FROM pg_policy p WHERE p.oid > $1 AND p.polrelid <= $1
  UNION ALL
  SELECT 3, CASE f.prokind WHEN 'a' THEN 'AGGREGATE' ELSE 'ROUTINE' END,
         f.oid::regprocedure::text
    FROM pg_proc f JOIN pg_namespace n ON n.oid = f.pronamespace
   WHERE f.oid > $1 AND {_USER_SCHEMAS}
  UNION ALL
  SELECT 4, 'TYPE', format_type(y.oid, NULL)
    FROM pg_type y JOIN pg_namespace n ON n.oid = y.typnamespace
   WHERE y.oid > $1 AND y.typrelid = 0 AND y.typelem = 0 AND {_USER_SCHEMAS}
  UNION ALL
  SELECT 5, 'SCHEMA', format('%I', n.nspname)
    FROM pg_namespace n WHERE n.oid > $1 AND {_USER_SCHEMAS}
) AS created ORDER BY step, name
"""
"""The objects made after the copy (an object id above its newest), in an
order their drops can run in (a schema's contents before the schema)."""

NEWEST_OID = f"""
SELECT greatest(
  (SELECT max(oid) FROM pg_class), (SELECT max(oid) FROM pg_proc),
  (SELECT max(oid) FROM pg_type), (SELECT max(oid) FROM pg_namespace),
  (SELECT max(oid) FROM pg_trigger), (SELECT coalesce(max(oid), 0) FROM pg_policy),
  {FIRST_USER_OID})
"""


@dataclass(frozen=True, slots=True)
class _Fresh:
    """What a copy looked like when it was made."""

    newest_oid: int
    fingerprint: str
    tables: tuple[str, ...]
    seeded: dict[str, str]
    """The tables the migrations filled, with a hash of their rows."""
    sequences: tuple[tuple[str, int, bool], ...]


@dataclass(frozen=True, slots=True)
class _Copy:
    database: ProvisionedDatabase
    fresh: _Fresh


async def _rows_hash(conn: asyncpg.Connection, table: str) -> str:
    value = await conn.fetchval(
        f"SELECT coalesce(md5(string_agg(t::text, E'\\n' ORDER BY t::text)), '') FROM {table} t"
    )
    return str(value)


async def _filled(conn: asyncpg.Connection, tables: tuple[str, ...]) -> list[str]:
    """The tables of ``tables`` that hold at least one row (one statement)."""
    if not tables:
        return []
    probe = " UNION ALL ".join(
        f"SELECT {i} WHERE EXISTS (SELECT FROM {table})" for i, table in enumerate(tables)
    )
    return [tables[row[0]] for row in await conn.fetch(probe)]


class DatabasePool:
    """Copies of ``template`` on ``server`` for one process's tests (see the
    module's docstring)."""

    def __init__(self, server: EmbeddedPostgres, template: str, prefix: str) -> None:
        self.server = server
        self.template = template
        self.prefix = prefix
        self._free: list[_Copy] = []
        self._out: dict[str, _Fresh] = {}

    def _admin(self, database: str) -> str:
        return self.server.url(self.server.SUPERUSER, self.server.superuser_password, database)

    @contextlib.asynccontextmanager
    async def database(self) -> AsyncIterator[ProvisionedDatabase]:
        """A database as fresh as a new copy of the template, for the block."""
        provisioned = await self._take()
        try:
            yield provisioned
        finally:
            await self._give_back(provisioned)

    async def _take(self) -> ProvisionedDatabase:
        if self._free:
            copy = self._free.pop()
            self._out[copy.database.name] = copy.fresh
            return copy.database
        name = f"{self.prefix}_{secrets.token_hex(6)}"
        provisioned = await provision_database(self.server, name, template=self.template)
        try:
            conn = await asyncpg.connect(self._admin(name))
            try:
                self._out[name] = await self._look(conn)
            finally:
                await conn.close()
        except BaseException:
            await drop_database(self.server, name)
            raise
        return provisioned

    async def _look(self, conn: asyncpg.Connection) -> _Fresh:
        tables = tuple(row["name"] for row in await conn.fetch(TABLES))
        seeded = {table: await _rows_hash(conn, table) for table in await _filled(conn, tables)}
        return _Fresh(
            newest_oid=int(await conn.fetchval(NEWEST_OID)),
            fingerprint=str(await conn.fetchval(FINGERPRINT)),
            tables=tuple(table for table in tables if table not in seeded),
            seeded=seeded,
            sequences=tuple(
                (row["name"], int(row["value"]), bool(row["called"]))
                for row in await conn.fetch(SEQUENCES)
            ),
        )

    async def _give_back(self, provisioned: ProvisionedDatabase) -> None:
        fresh = self._out.pop(provisioned.name)
        try:
            reset = await self._reset(provisioned.name, fresh)
        except Exception:  # whatever failed, the copy is not known to be fresh
            reset = False
        if reset:
            self._free.append(_Copy(provisioned, fresh))
        else:
            await drop_database(self.server, provisioned.name)

    async def _reset(self, name: str, fresh: _Fresh) -> bool:
        """Put database ``name`` back as ``fresh`` describes it; False when
        it cannot be (it is then dropped)."""
        conn = await asyncpg.connect(self._admin(name))
        try:
            await conn.fetchval(TERMINATE)
            if await conn.fetchval(CONNECTED) or await conn.fetchval(HELD):
                return False
            for kind, object_name in await conn.fetch(CREATED, fresh.newest_oid):
                await conn.execute(f"DROP {kind} IF EXISTS {object_name} CASCADE")
            if await conn.fetchval(FINGERPRINT) != fresh.fingerprint:
                return False
            for table, rows in fresh.seeded.items():
                if await _rows_hash(conn, table) != rows:
                    return False
            filled = await _filled(conn, fresh.tables)
            if filled:
                # Foreign keys and triggers (both triggers) do not fire for
                # the replication role: every filled table is emptied, so
                # no reference is left dangling. Far cheaper than TRUNCATE,
                # which renews every file of every table it names; the
                # VACUUM returns the emptied pages.
                await conn.execute(
                    "SET session_replication_role = replica; "
                    + "".join(f"DELETE FROM {table}; " for table in filled)
                    + "RESET session_replication_role"
                )
                await conn.execute(f"VACUUM {', '.join(filled)}")
            if fresh.sequences:
                names, values, called = zip(*fresh.sequences, strict=True)
                await conn.execute(
                    "SELECT setval(name::regclass, value, called)"
                    " FROM unnest($1::text[], $2::int8[], $3::bool[]) AS s(name, value, called)",
                    list(names), list(values), list(called),
                )
            # This session's own counts (the deletes, the scans) reach the
            # shared statistics when it goes idle after a forced flush: the
            # reset comes after them.
            await conn.execute("SELECT pg_stat_force_next_flush()")
            await conn.execute("SELECT pg_stat_reset()")
            return True
        finally:
            await conn.close()

    async def close(self) -> None:
        """Drop every copy not in use."""
        while self._free:
            await drop_database(self.server, self._free.pop().database.name)


_pools: dict[tuple[int, str, int], DatabasePool] = {}


def pool_for(server: EmbeddedPostgres, template: str, prefix: str) -> DatabasePool:
    """This process's pool of ``template`` copies on ``server``."""
    key = (id(server), template, os.getpid())
    pool = _pools.get(key)
    if pool is None:
        pool = _pools[key] = DatabasePool(server, template, prefix)
    return pool


async def close_pools(server: EmbeddedPostgres) -> None:
    """Drop this process's unused copies on ``server``."""
    for (server_id, _template, pid), pool in list(_pools.items()):
        if server_id == id(server) and pid == os.getpid():
            await pool.close()
