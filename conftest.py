"""Give every pytest run its own temporary root.

pytest numbers its temporary directories under one shared folder and prunes
all but the newest few at the start of each run; two runs at once on one
machine would delete each other's embedded servers' data folders. A run that
names no ``--basetemp`` gets a private one, removed when the run ends.
"""

from __future__ import annotations

import shutil
import tempfile

import pytest

_PRIVATE = "_service_engine_private_basetemp"


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    if config.option.basetemp is None:
        config.option.basetemp = tempfile.mkdtemp(prefix="service-engine-pytest-")
        setattr(config, _PRIVATE, config.option.basetemp)


def pytest_unconfigure(config: pytest.Config) -> None:
    private = getattr(config, _PRIVATE, None)
    if private is not None:
        shutil.rmtree(private, ignore_errors=True)
