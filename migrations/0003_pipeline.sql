-- The write pipeline's engine-owned tables.

-- Integration outbox: rows a command staged in its own transaction
-- (cx.emit / cx.command); the leader's relay publishes them after commit
-- with Nats-Msg-Id = message_id, so a republish is deduplicated.
CREATE TABLE service_engine.integration_outbox (
    id           bigserial PRIMARY KEY,
    message_id   uuid        NOT NULL UNIQUE,
    subject      text        NOT NULL,
    payload      jsonb       NOT NULL,
    headers      jsonb       NOT NULL DEFAULT '{}',
    producer     text,
    seq_key      text,
    seq          bigint,
    status       text        NOT NULL DEFAULT 'PENDING'
                             CHECK (status IN ('PENDING', 'PUBLISHED', 'FAILED')),
    attempts     int         NOT NULL DEFAULT 0,
    last_error   text,
    created_at   timestamptz NOT NULL DEFAULT now(),
    published_at timestamptz
);
-- The relay scans only what is left to publish, oldest first.
CREATE INDEX integration_outbox_pending
    ON service_engine.integration_outbox (id) WHERE status = 'PENDING';

-- The full-EDA kit's log: one row per event, per (noun, key) a gap-free
-- seq from 1. The primary key is the append's concurrency barrier.
CREATE TABLE service_engine.event_log (
    noun          text        NOT NULL,
    key           text        NOT NULL,  -- the aggregate key's canonical JSON
    seq           bigint      NOT NULL CHECK (seq >= 1),
    event_type    text        NOT NULL,
    event_version int         NOT NULL CHECK (event_version >= 1),
    payload       jsonb       NOT NULL,
    recorded_at   timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (noun, key, seq)
);

-- The full-EDA kit's snapshot: the state at seq, rewritten only when an
-- append crosses a SNAPSHOT_EVERY boundary, so it lags the log.
CREATE TABLE service_engine.event_snapshot (
    noun       text        NOT NULL,
    key        text        NOT NULL,
    seq        bigint      NOT NULL CHECK (seq >= 1),
    state      jsonb       NOT NULL,
    updated_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (noun, key)
);
