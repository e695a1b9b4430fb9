-- A reply's attachment: the opaque reference (a uuid text) of its blob in
-- service_engine.blob; the bytes live in the S3 bucket, never here.
ALTER TABLE reply ADD COLUMN attachment text;
