-- Blobs over S3-compatible object storage.

-- One row per minted upload, staged by cx.blob / cx.blob_owned in the
-- pipeline's transaction (the reference commits with the aggregate).
--   pending   the upload URL was handed out; the object may not exist yet
--   complete  the beat found the object (HEAD) and recorded its size
--   released  the referencing aggregate dropped, repointed or deleted it
-- The beat's reaper removes exactly two categories past orphan_after: a
-- pending row whose object never landed, and a released blob (object and
-- row). owner_store / owner_key name the aggregate that holds the
-- reference, once known (blob_owned at once, else its first save).
CREATE TABLE service_engine.blob (
    id            uuid        PRIMARY KEY,
    kind          text        NOT NULL,
    object_key    text        NOT NULL UNIQUE,
    state         text        NOT NULL DEFAULT 'pending'
                  CHECK (state IN ('pending', 'complete', 'released')),
    content_type  text,
    max_bytes     bigint      NOT NULL,
    size          bigint,
    owner_store   text,
    owner_key     jsonb,
    orphan_after  interval    NOT NULL,
    created_at    timestamptz NOT NULL DEFAULT clock_timestamp(),
    completed_at  timestamptz,
    released_at   timestamptz
);
CREATE INDEX blob_pending ON service_engine.blob (created_at) WHERE state = 'pending';
CREATE INDEX blob_released ON service_engine.blob (released_at) WHERE state = 'released';
CREATE INDEX blob_owner ON service_engine.blob (owner_store, owner_key) WHERE owner_store IS NOT NULL;
