"""Give every pytest run its own temporary root, and every parallel worker
its own loopback ports.

pytest numbers its temporary directories under one shared folder and prunes
all but the newest few at the start of each run; two runs at once on one
machine would delete each other's embedded servers' data folders. A run that
names no ``--basetemp`` gets a private one, removed when the run ends (under
pytest-xdist each worker gets a folder of its own inside it).

``dev/test`` runs the battery in pytest-xdist workers (``-n auto``): it
mostly waits on servers, events and deadlines, so it runs several workers
per core. Each worker starts its own Postgres, NATS and S3 servers, on ports
from a range of its own below the kernel's ephemeral ports
(``SERVICE_ENGINE_PORT_RANGE``, read by ``embedded.free_port``): a port one
worker picked cannot be taken by another worker's server, or by any client
connection, before its server binds it.
"""

from __future__ import annotations

import os
import shutil
import tempfile

import pytest
from hypothesis import settings

settings.register_profile("battery", deadline=None)
settings.load_profile("battery")
"""Property tests assert properties, not speed: no per-example deadline
(Hypothesis's default 200 ms fails an example that merely waited for a core
the parallel battery's other workers held)."""

_PRIVATE = "_service_engine_private_basetemp"

WORKERS_PER_CORE = 4
"""Workers ``-n auto`` starts per core: the battery waits far more than it
computes (about half its wall time serially is CPU)."""

MAX_WORKERS = 12
"""Each worker holds its own embedded Postgres and spawns NATS and S3
servers; past this, start-up and memory cost more than waiting saves."""

PORTS_LOW, PORTS_HIGH = 10_000, 32_000
"""The loopback ports shared out between workers: below Linux's ephemeral
range (32768-60999), where the kernel never picks a port by itself."""


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    if config.option.basetemp is None:
        config.option.basetemp = tempfile.mkdtemp(prefix="service-engine-pytest-")
        setattr(config, _PRIVATE, config.option.basetemp)
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if worker is not None:
        count = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
        index = int(worker.removeprefix("gw"))
        span = (PORTS_HIGH - PORTS_LOW) // max(count, 1)
        low = PORTS_LOW + index * span
        os.environ["SERVICE_ENGINE_PORT_RANGE"] = f"{low}-{low + span - 1}"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The scenarios marked ``slow`` or ``soak`` first (each worker collects
    the same order): started early, the longest tests do not leave one
    worker running alone at the end of the run."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None
               and item.get_closest_marker("soak") is None)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """``-n auto``: several workers per core, bounded."""
    return min(MAX_WORKERS, WORKERS_PER_CORE * (os.cpu_count() or 1))


def pytest_unconfigure(config: pytest.Config) -> None:
    private = getattr(config, _PRIVATE, None)
    if private is not None:
        shutil.rmtree(private, ignore_errors=True)
