"""``python -m notes``: the notes service on embedded Postgres and NATS
kept under ``.data/``, GraphiQL on http://127.0.0.1:8000/graphql."""

from pathlib import Path

from service_engine.server import serve_embedded

from . import SERVICE

serve_embedded(SERVICE, "notes", migrations=Path(__file__).parent / "migrations")
