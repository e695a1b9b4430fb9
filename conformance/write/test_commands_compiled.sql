CREATE TABLE IF NOT EXISTS cmp_item (
    org text NOT NULL, id text NOT NULL, title text NOT NULL, n bigint NOT NULL,
    flag boolean NOT NULL, state text NOT NULL, version integer NOT NULL,
    PRIMARY KEY (org, id));
GRANT SELECT, INSERT, UPDATE, DELETE ON cmp_item TO service_engine_app;
CREATE TABLE IF NOT EXISTS cmp_note (
    id text PRIMARY KEY, org text NOT NULL, text text NOT NULL, hits bigint NOT NULL,
    version integer NOT NULL);
CREATE TABLE IF NOT EXISTS cmp_note_fact (
    seq bigserial PRIMARY KEY, note_id text NOT NULL, fact_type text NOT NULL,
    payload jsonb NOT NULL);
GRANT SELECT, INSERT, UPDATE, DELETE ON cmp_note, cmp_note_fact TO service_engine_app;
GRANT USAGE ON SEQUENCE cmp_note_fact_seq_seq TO service_engine_app;
CREATE TABLE IF NOT EXISTS cmp_part (
    org text NOT NULL, id text NOT NULL, item_id text NOT NULL, label text NOT NULL,
    pinned boolean NOT NULL, version integer NOT NULL, PRIMARY KEY (org, id));
GRANT SELECT, INSERT, UPDATE, DELETE ON cmp_part TO service_engine_app;
