"""The public surface is pinned here: a removal or an accidental addition is
a deliberate change.

The root exports what a service author writes every day (at most 60
names, no exception); every exception the library defines is importable
from `service_engine.errors`; the feature namespaces export what their
author uses."""

from __future__ import annotations

import importlib
import inspect
from pathlib import Path

import service_engine
import service_engine.errors

EXPECTED = {
    # the engine, its configuration and what it is booted on
    "Engine", "EngineConfig", "ReadinessHandle", "Database", "Conn", "connect_pool",
    "Nats", "open_nats", "service_migrations", "run_on_allocator",
    # stores and aggregates (the three persistence styles)
    "Aggregate", "CrudStore", "SoftEdaStore", "EventSourced", "FullEda", "DomainEvent",
    "RecordsEvents",
    # the write contexts and what a write answers and stages
    "Mutation", "MutationExecutor", "Reaction", "OneShot", "Bulk", "Success", "MutationError",
    "Cause", "Impact",
    # projectors, windows, cohorts and visibility
    "Projector", "Populate", "PerImpact", "Coalesced", "Visibility", "Unrestricted",
    "RlsApplier", "Query", "WindowSpec", "TableWindow", "Emission", "CohortKey", "Keys", "Ordered",
    # gates
    "Gate", "gated", "Reason", "ActionName", "Affordances", "affordances",
    # erasure, time, principal facts
    "Erase", "Erasable", "Timestamp", "Clock", "PrincipalFactLoader", "PrincipalFactBatchLoader",
    # the integration envelope a reaction reads and a write emits
    "IntegrationEvent", "IntegrationCommand", "InboundReaction", "EventMetadata", "Actor",
}

NAMESPACES = {
    "service_engine.blobs": {
        "BlobBucketMissing", "BlobError", "BlobKind", "BlobPolicy", "BlobStoreConfig",
        "DownloadUrl", "UploadUrl",
    },
    "service_engine.offers": {
        "HostedKvRelay", "KvDrainRelay", "KvPut", "KvRetract", "KvSource", "Offer", "Published",
    },
    "service_engine.mirrors": {"Known", "KnownScope", "Merged", "Mirror", "Projection", "Shadow"},
    "service_engine.scopes": {
        "EmptyScopeManifest", "MalformedScopeKey", "ScopeDeclaration", "ScopeError",
        "ScopeManifest", "ScopeManifestSpansServices", "ScopeRejected", "ScopeWithoutNats",
    },
    "service_engine.server": {
        "CONNECTION_REFUSED_CLOSE_CODE", "DEFAULT_OPS_ROLE", "PASSPORT_HEADER",
        "SESSION_MAX_AGE_CLOSE_CODE", "SESSION_MAX_AGE_CLOSE_REASON", "OrgMember", "Passport",
        "PassportError", "PassportMalformed", "PassportMissing", "PassportPrincipal",
        "PassportRefused", "PodSlot", "bind_listener", "graphql_app", "parse_passport",
        "run_pods", "run_with", "run_with_listener", "serve_embedded",
    },
}
"""The new namespaces' surfaces in full (lanes, integration, erasure,
commands and props carry longer lists of their own)."""

PACKAGE = Path(service_engine.__file__).parent


def test_the_root_surface_is_exactly_the_listed_names() -> None:
    """The root's ``__all__`` is the chosen list, at most 60 names."""
    assert set(service_engine.__all__) == EXPECTED
    assert len(service_engine.__all__) == len(EXPECTED) <= 60


def test_every_listed_name_resolves() -> None:
    """Every name in the root's ``__all__`` is defined at the root."""
    for name in service_engine.__all__:
        assert getattr(service_engine, name) is not None


def test_no_exception_class_at_the_root() -> None:
    """An author catches an error from `service_engine.errors`, never the root."""
    exceptions = [
        name for name in service_engine.__all__
        if inspect.isclass(obj := getattr(service_engine, name)) and issubclass(obj, BaseException)
    ]
    assert exceptions == []


def _library_modules() -> list[str]:
    names = []
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        name = ".".join(parts)
        if name.startswith("service_engine.testing") or name.endswith("__main__"):
            continue
        names.append(name)
    return names


def defined_exceptions() -> dict[str, type[BaseException]]:
    """Every public exception class the library defines (test support and
    underscore names aside), by name, imported where it is defined."""
    found: dict[str, type[BaseException]] = {}
    for module_name in _library_modules():
        module = importlib.import_module(module_name)
        for name, obj in vars(module).items():
            if (inspect.isclass(obj) and issubclass(obj, BaseException)
                    and obj.__module__ == module_name and obj.__name__ == name
                    and not name.startswith("_")):
                assert name not in found, f"two exception classes named {name}"
                found[name] = obj
    return found


def test_every_exception_of_the_library_is_in_errors() -> None:
    """Each exception class defined anywhere in the library is importable from
    `service_engine.errors` (the very class) and listed in its ``__all__``;
    the module lists nothing else."""
    defined = defined_exceptions()
    assert len(defined) > 100
    assert set(service_engine.errors.__all__) == set(defined)
    for name, cls in defined.items():
        assert getattr(service_engine.errors, name) is cls, name


def test_the_namespaces_export_their_listed_names() -> None:
    """Each feature namespace's ``__all__`` is exactly its listed names, each defined there."""
    for module_name, expected in NAMESPACES.items():
        module = importlib.import_module(module_name)
        assert set(module.__all__) == expected, module_name
        for name in expected:
            assert getattr(module, name) is not None


def test_a_namespace_error_is_the_one_in_errors() -> None:
    """A feature namespace re-exports the same classes `errors` does."""
    for module_name in (*NAMESPACES, "service_engine.lanes", "service_engine.integration"):
        module = importlib.import_module(module_name)
        for name in module.__all__:
            obj = getattr(module, name)
            if inspect.isclass(obj) and issubclass(obj, BaseException):
                assert getattr(service_engine.errors, name) is obj, (module_name, name)
