"""``python -m service_engine``: the operator CLI (see `service_engine.cli`)."""

from __future__ import annotations

from .cli import main

if __name__ == "__main__":
    main()
