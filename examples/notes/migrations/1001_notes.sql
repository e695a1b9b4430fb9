-- The notes slice's table: one row per note, in its author's org.
CREATE TABLE note (
    id     text PRIMARY KEY,
    org    text NOT NULL,
    author text NOT NULL,
    body   text NOT NULL
);
CREATE INDEX note_org ON note (org, id);

-- The engine connects as the low-privilege app role: it reads and writes the table.
GRANT SELECT, INSERT, UPDATE, DELETE ON note TO service_engine_app;
