-- The board slice. `board` is the plain source of the cohort projector
-- BoardsView (no RLS: it must see every candidate so that a board
-- membership can grant a cross-org member visibility in the app layer);
-- `org_board` is the fail-closed projection the RLS projector OrgBoardsRls
-- reads: with no app.current_org_id in the transaction it returns no rows.

CREATE TABLE board (
    id         text        PRIMARY KEY CHECK (id ~ '^[A-Za-z0-9_-]{1,64}$'),
    org        text        NOT NULL,
    title      text        NOT NULL CHECK (length(title) BETWEEN 1 AND 200),
    archived   boolean     NOT NULL DEFAULT false,
    owner      text        NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX board_org ON board (org, id);

-- A person from any org invited onto one board (the BoardMemberships fact).
CREATE TABLE board_member (
    id       text        PRIMARY KEY,
    board_id text        NOT NULL REFERENCES board (id) ON DELETE CASCADE,
    person   text        NOT NULL,
    added_at timestamptz NOT NULL DEFAULT now(),
    UNIQUE (board_id, person)
);
CREATE INDEX board_member_person ON board_member (person);

-- An invite keeps only a hash of the one-shot secret its creator received.
CREATE TABLE board_invite (
    token_hash  text        PRIMARY KEY,
    board_id    text        NOT NULL REFERENCES board (id) ON DELETE CASCADE,
    created_by  text        NOT NULL,
    redeemed_by text,
    created_at  timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE org_board (
    id       text    PRIMARY KEY REFERENCES board (id) ON DELETE CASCADE,
    org      text    NOT NULL,
    title    text    NOT NULL,
    archived boolean NOT NULL DEFAULT false
);
ALTER TABLE org_board ENABLE ROW LEVEL SECURITY;
-- The owner would bypass the policy without FORCE.
ALTER TABLE org_board FORCE ROW LEVEL SECURITY;
-- Deny when unset: once a setting was set in a session,
-- current_setting(..., true) returns '' (not NULL) outside its transaction.
CREATE POLICY org_board_by_org ON org_board
    USING (org = nullif(current_setting('app.current_org_id', true), ''));

GRANT SELECT, INSERT, UPDATE, DELETE ON board, board_member, board_invite, org_board
    TO service_engine_app;
