-- Integration over NATS JetStream: dead letters, the inbound idempotency
-- claim and sequence guard, scheduled messages and cron slots.

-- The one table for every source of dead work. The id is derived from the
-- work (a message id, a worker name), so re-recording the same failure hits
-- one row; occurrences counts the re-records.
CREATE TABLE service_engine.dead_letter (
    id           uuid PRIMARY KEY,
    source       text        NOT NULL
                             CHECK (source IN ('Reaction', 'Scheduled', 'Cron', 'Mirror', 'Outbox')),
    work         text        NOT NULL,  -- the reaction, cron, mirror or relay that failed
    reason       text        NOT NULL,
    detail       text        NOT NULL DEFAULT '',
    subject      text,                  -- a message's subject, when the work was a message
    message_id   uuid,                  -- its logical id (a retry republishes under it)
    payload      bytea,                 -- the message as it was or would have been published
    headers      jsonb       NOT NULL DEFAULT '{}',
    attempts     int,
    occurrences  int         NOT NULL DEFAULT 1,
    recorded_at  timestamptz NOT NULL DEFAULT now(),
    last_seen_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX dead_letter_by_source ON service_engine.dead_letter (source, recorded_at, id);

-- The idempotency claim of the inbound loop, written in the effect's own
-- transaction, with the confirmation(s) the reaction emitted so a re-sent
-- command re-emits them instead of re-running the effect.
CREATE TABLE service_engine.message_claim (
    message_id    uuid        NOT NULL,
    reaction      text        NOT NULL,
    confirmations jsonb       NOT NULL DEFAULT '[]',
    claimed_at    timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (message_id, reaction)
);
-- The retention sweep deletes by age.
CREATE INDEX message_claim_claimed_at ON service_engine.message_claim (claimed_at);

-- The per-(producer, reaction, key) watermark: a message at or below it is
-- a stale replay and a no-op.
CREATE TABLE service_engine.sequence_guard (
    producer   text        NOT NULL,
    reaction   text        NOT NULL,
    seq_key    text        NOT NULL,
    seq        bigint      NOT NULL,
    updated_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (producer, reaction, seq_key)
);

-- Messages to publish once the database clock passes due_at (cx.schedule_at).
-- Claimed one row per transaction (SKIP LOCKED) and deleted once published;
-- attempts counts genuine broker rejections only.
CREATE TABLE service_engine.scheduled_message (
    id         bigserial PRIMARY KEY,
    message_id uuid        NOT NULL UNIQUE,
    subject    text        NOT NULL,
    payload    jsonb       NOT NULL,
    headers    jsonb       NOT NULL DEFAULT '{}',
    producer   text,
    seq_key    text,
    seq        bigint,
    due_at     timestamptz NOT NULL,
    attempts   int         NOT NULL DEFAULT 0,
    last_error text,
    created_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX scheduled_message_due ON service_engine.scheduled_message (due_at, id);

-- One row per (cron, slot) that fired or is being retried: a slot fires once
-- across pods. FIRED and DEAD are final; RETRY is retried on later beats.
CREATE TABLE service_engine.cron_slot (
    cron       text        NOT NULL,
    slot       timestamptz NOT NULL,
    status     text        NOT NULL CHECK (status IN ('FIRED', 'RETRY', 'DEAD')),
    attempts   int         NOT NULL DEFAULT 0,
    holder     text        NOT NULL,
    last_error text,
    updated_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (cron, slot)
);
CREATE INDEX cron_slot_retry ON service_engine.cron_slot (cron, slot) WHERE status = 'RETRY';
