"""``python -m example_service [--pods N]``: run the reference service.

The process first moves onto its allocator (`run_on_allocator` executes it
again on mimalloc, ``SERVICE_ENGINE_ALLOCATOR``), then imports the service
(`boot`), so nothing is imported twice.
"""

from __future__ import annotations

import sys

from service_engine import run_on_allocator


def run(argv: list[str] | None = None) -> int:
    """Run until stopped; the process exit code."""
    try:
        allocator = run_on_allocator()
    except ValueError as exc:  # the engine's ConfigError: an unknown allocator
        print(f"example_service: {exc}", file=sys.stderr)
        return 2
    from .boot import serve

    return serve(allocator, argv)


if __name__ == "__main__":
    sys.exit(run())
