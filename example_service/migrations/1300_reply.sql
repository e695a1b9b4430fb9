-- The reply slice (CRUD): a reply streamed in chunks on the accumulated
-- lane and sealed against its hash. The chunks live in the engine's
-- accumulator_chunk until the seal; the sealed text lands here.

CREATE TABLE reply (
    id          text        PRIMARY KEY CHECK (id ~ '^[A-Za-z0-9_-]{1,64}$'),
    org         text        NOT NULL CHECK (org <> ''),
    author      text        NOT NULL,
    status      text        NOT NULL CHECK (status IN ('streaming', 'finished', 'cancelled')),
    text        text        NOT NULL DEFAULT '',
    hash        text,
    chunks      bigint      NOT NULL DEFAULT 0 CHECK (chunks >= 0),
    created_at  timestamptz NOT NULL,
    version     integer     NOT NULL CHECK (version >= 1)
);
CREATE INDEX reply_org_created ON reply (org, created_at DESC, id DESC);

GRANT SELECT, INSERT, UPDATE, DELETE ON reply TO service_engine_app;
