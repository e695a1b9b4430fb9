-- Erase a person: the durable fact and its post-commit purge manifest.

-- One row per erased person, written in the erasure's own transaction with
-- every slice's erase. manifest holds what the commit could not remove
-- itself (lane-A stream keys, presence keys, blob references); the purge
-- after the commit removes them and sets purged_at, and the beat drains a
-- row a pod died before purging.
CREATE TABLE service_engine.person_erasure (
    person        text        PRIMARY KEY,
    erased_at     timestamptz NOT NULL DEFAULT clock_timestamp(),
    manifest      jsonb       NOT NULL DEFAULT '{}'::jsonb,
    purged_at     timestamptz,
    purge_attempts integer    NOT NULL DEFAULT 0
);
CREATE INDEX person_erasure_unpurged ON service_engine.person_erasure (erased_at)
    WHERE purged_at IS NULL;
