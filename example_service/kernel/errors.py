"""The service's error base."""

from __future__ import annotations


class ServiceError(Exception):
    """The root of the service's own failures (not the engine's: those are
    `service_engine.errors.EngineError`). A domain refusal inside a mutation is not
    one of these: a handler refuses with a gate or `service_engine.errors.Refused`,
    which the pipeline answers as a typed `MutationError`."""


class ConfigurationError(ServiceError, ValueError):
    """The service was started with a configuration it refuses."""
