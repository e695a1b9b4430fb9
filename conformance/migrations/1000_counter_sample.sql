-- The counter sample of the pipeline and persistence battery: one counter
-- aggregate in three styles (CRUD, soft EDA here; full EDA lives in the
-- engine's event_log / event_snapshot), an FK target, an invite table and
-- a table whose deferred trigger fails COMMIT (fault injection).

CREATE TABLE sample_counter_group (
    id text PRIMARY KEY
);

CREATE TABLE sample_counter_crud (
    id         text    PRIMARY KEY,
    value      bigint  NOT NULL DEFAULT 0 CHECK (value BETWEEN 0 AND 1000000),
    frozen     boolean NOT NULL DEFAULT false,
    last_actor text,
    group_id   text REFERENCES sample_counter_group (id)
);

CREATE TABLE sample_counter_soft (
    id         text    PRIMARY KEY,
    value      bigint  NOT NULL DEFAULT 0 CHECK (value BETWEEN 0 AND 1000000),
    frozen     boolean NOT NULL DEFAULT false,
    last_actor text,
    group_id   text REFERENCES sample_counter_group (id)
);

-- Soft-EDA facts: history, so no FK to the state row (a deleted counter's
-- facts stay).
CREATE TABLE sample_counter_soft_fact (
    id          bigserial   PRIMARY KEY,
    counter_id  text        NOT NULL,
    fact_type   text        NOT NULL CHECK (fact_type <> ''),
    payload     jsonb       NOT NULL,
    recorded_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX sample_counter_soft_fact_counter ON sample_counter_soft_fact (counter_id, id);

-- Invites hold only a hash of the one-shot secret the caller receives.
CREATE TABLE sample_counter_invite (
    token_hash text PRIMARY KEY,
    counter_id text NOT NULL
);

-- Fault injection: a row inserted here fails the transaction's COMMIT.
CREATE TABLE sample_commit_fault (
    id bigserial PRIMARY KEY
);
CREATE FUNCTION sample_fail_at_commit() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'injected commit fault';
END
$$;
CREATE CONSTRAINT TRIGGER sample_commit_fault_fails
    AFTER INSERT ON sample_commit_fault
    DEFERRABLE INITIALLY DEFERRED
    FOR EACH ROW EXECUTE FUNCTION sample_fail_at_commit();

GRANT SELECT, INSERT, UPDATE, DELETE ON
    sample_counter_group, sample_counter_crud, sample_counter_soft,
    sample_counter_soft_fact, sample_counter_invite, sample_commit_fault
    TO service_engine_app;
GRANT USAGE, SELECT ON SEQUENCE
    sample_counter_soft_fact_id_seq, sample_commit_fault_id_seq
    TO service_engine_app;
