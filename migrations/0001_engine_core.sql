-- The engine's core tables. The service_engine schema itself is created by
-- the migrator (it holds the migration history).

-- The schema-version singleton: which engine and service version own the
-- store, and when a live pod of that version last said so.
CREATE TABLE service_engine.schema_version (
    singleton       boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    engine_version  text        NOT NULL,
    service_version text        NOT NULL,
    claimed_by      text        NOT NULL,
    claimed_at      timestamptz NOT NULL DEFAULT now(),
    heartbeat_at    timestamptz NOT NULL DEFAULT now()
);

-- Fenced leases for leader work (offer relays, cron, mirrors' projection).
-- A holder's writes assert (slot, holder, fence); a takeover bumps the fence.
CREATE TABLE service_engine.leader_slot (
    slot        text PRIMARY KEY,
    holder      text        NOT NULL,
    fence       bigint      NOT NULL DEFAULT 1,
    acquired_at timestamptz NOT NULL DEFAULT now(),
    expires_at  timestamptz NOT NULL
);
