-- The accumulated lane (lane A): streamed chunks, durable per (accumulator,
-- key, seq), and the seal marker that closes a key for good.

-- One durable chunk of a stream. The primary key is the idempotency of a
-- resubmit: the same (accumulator, key, seq) with identical bytes is a
-- no-op, with different bytes a ChunkConflict. A seal folds and deletes the
-- chunks it covers.
CREATE TABLE service_engine.accumulator_chunk (
    accumulator  text        NOT NULL,
    key          text        NOT NULL,
    seq          bigint      NOT NULL CHECK (seq >= 0),
    chunk        bytea       NOT NULL,
    committed_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (accumulator, key, seq)
);

-- The seal marker: the key is closed at high_water (last_seq + 1); every
-- chunk for it is refused from now on, on every pod. It outlives the NATS
-- stream (seal_retention >= the stream's max_age); stream_purged records
-- that the key's subject was purged after the commit (the beat retries it).
CREATE TABLE service_engine.accumulator_seal (
    accumulator  text        NOT NULL,
    key          text        NOT NULL,
    high_water   bigint      NOT NULL CHECK (high_water >= 0),
    hash         text,
    gesture      text        NOT NULL CHECK (gesture IN ('seal', 'partial', 'current')),
    sealed_at    timestamptz NOT NULL DEFAULT now(),
    stream_purged boolean    NOT NULL DEFAULT false,
    PRIMARY KEY (accumulator, key)
);
CREATE INDEX accumulator_seal_unpurged ON service_engine.accumulator_seal (sealed_at)
    WHERE NOT stream_purged;
CREATE INDEX accumulator_seal_by_age ON service_engine.accumulator_seal (sealed_at);
