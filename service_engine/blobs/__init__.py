"""Blobs over S3-compatible object storage (see `service_engine.blobs.model`)."""
