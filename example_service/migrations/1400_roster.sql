-- The roster slice: the people the twin publishes (KV, twin.person.*),
-- mirrored by the leader pod. Only the mirror writes it.
CREATE TABLE known_persons (
    id   text PRIMARY KEY,
    name text NOT NULL,
    org  text NOT NULL
);
CREATE INDEX known_persons_org ON known_persons (org, id);

GRANT SELECT, INSERT, UPDATE, DELETE ON known_persons TO service_engine_app;
