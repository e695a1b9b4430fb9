-- The erasure battery's sample: a person's notes under a strict,
-- deny-when-unset RLS policy that whitelists the erasure.

CREATE TABLE sample_person_note (
    id     text PRIMARY KEY,
    person text NOT NULL,
    body   text NOT NULL
);
ALTER TABLE sample_person_note ENABLE ROW LEVEL SECURITY;
ALTER TABLE sample_person_note FORCE ROW LEVEL SECURITY;
CREATE POLICY sample_person_note_strict ON sample_person_note
    USING (person = nullif(current_setting('app.current_person', true), '')
           OR current_setting('app.erasing', true) = 'on')
    WITH CHECK (person = nullif(current_setting('app.current_person', true), '')
                OR current_setting('app.erasing', true) = 'on');

GRANT SELECT, INSERT, UPDATE, DELETE ON sample_person_note TO service_engine_app;
