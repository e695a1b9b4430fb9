-- The card slice (soft EDA): `card` is the state row, the truth every read
-- uses; `card_fact` holds the facts each command produced, written in the
-- same statement as the state row, so a constraint failure on either rolls
-- both back.

CREATE TABLE card (
    id          text        PRIMARY KEY CHECK (id ~ '^[A-Za-z0-9_-]{1,64}$'),
    org         text        NOT NULL CHECK (org <> ''),
    title       text        NOT NULL CHECK (length(title) BETWEEN 1 AND 200),
    stage       text        NOT NULL CHECK (stage IN ('todo', 'doing', 'done')),
    owner       text        NOT NULL,
    due_at      timestamptz,
    overdue     boolean     NOT NULL DEFAULT false,
    reviewed_by text,
    created_at  timestamptz NOT NULL,
    version     integer     NOT NULL CHECK (version >= 1)
);
-- A window lists an org's cards newest first and pages back by (created_at, id).
CREATE INDEX card_org_created ON card (org, created_at DESC, id DESC);

CREATE TABLE card_fact (
    id          bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    card_id     text        NOT NULL REFERENCES card (id) ON DELETE CASCADE,
    fact_type   text        NOT NULL CHECK (fact_type <> ''),
    payload     jsonb       NOT NULL,
    recorded_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX card_fact_card ON card_fact (card_id, id);

GRANT SELECT, INSERT, UPDATE, DELETE ON card, card_fact TO service_engine_app;
