-- The render battery's sample: cards in orgs, rendered per org cohort, and
-- an RLS-gated copy that returns no rows without app.current_org_id.

CREATE TABLE sample_card (
    id    text    PRIMARY KEY,
    org   text    NOT NULL,
    rank  integer NOT NULL,
    title text    NOT NULL DEFAULT ''
);

CREATE TABLE sample_org_card (
    id    text    PRIMARY KEY,
    org   text    NOT NULL,
    title text    NOT NULL DEFAULT ''
);
ALTER TABLE sample_org_card ENABLE ROW LEVEL SECURITY;
ALTER TABLE sample_org_card FORCE ROW LEVEL SECURITY;
-- Deny when unset: after a setting was once set in a session,
-- current_setting(..., true) returns '' rather than NULL.
CREATE POLICY sample_org_card_by_org ON sample_org_card
    USING (org = nullif(current_setting('app.current_org_id', true), ''));

GRANT SELECT, INSERT, UPDATE, DELETE ON sample_card, sample_org_card TO service_engine_app;
