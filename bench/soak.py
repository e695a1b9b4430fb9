"""The soak at scale: the reference service keeping every promise at once
under a mixed load while things fail (issue 18, item 1).

    python bench/soak.py [--seconds 120] [--sessions 1000] [--cohorts 50] [--rate 200]
                         [--faults 20] [--pods 2] [--keep DIR] [--quiet]

Starts a durable embedded Postgres (fsync on) in a temporary folder,
provisions the engine's and the example service's migrations, and runs
`conformance.support.soak.run_soak`: ``--pods`` processes of the reference
service on that Postgres and a nats-server of its own (``sync_interval:
always``), ``--sessions`` live subscriptions over real WebSockets spread over
``--cohorts`` orgs, ``--rate`` mixed operations/s (GraphQL mutations, twin
commands over NATS, lane-A chunk streams and seals, presence, offers), and
``--faults`` injections of each fault kind (nats-server SIGKILL, LISTEN
backend terminated, pod SIGKILL, a burst past the listener channel, a
stalled subscriber), one at a time. It stops by itself and prints the
table: faults by kind, deltas delivered, Resets by cause, messages,
duplicates and losses found (both must be 0), p50/p99 commit -> client
latency outside fault windows, and every violation of the contract.

The load runs for at least ``--seconds`` and until every fault was injected.
``--keep DIR`` keeps the pods' logs there.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import resource
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from conformance.blackbox.harness import EXAMPLE_MIGRATIONS  # noqa: E402
from conformance.support.soak import SoakConfig, run_soak  # noqa: E402
from example_service.slices import commands  # noqa: E402
from service_engine.commands import install_commands  # noqa: E402
from service_engine.db import service_migrations  # noqa: E402
from service_engine.embedded import EmbeddedPostgres, provision_database  # noqa: E402


def keep_logs(run: Path, keep: Path) -> None:
    keep.mkdir(parents=True, exist_ok=True)
    for log in run.glob("*.log"):
        shutil.copy(log, keep / log.name)


async def main(args: argparse.Namespace) -> int:
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    config = SoakConfig(
        pods=args.pods, sessions=args.sessions, cohorts=args.cohorts, rate=args.rate,
        seconds=args.seconds, faults=args.faults, verbose=not args.quiet,
        burst=args.burst, channel_capacity=args.channel_capacity,
    )
    with tempfile.TemporaryDirectory(prefix="bench-soak-") as tmp:
        work = Path(tmp)
        pg = EmbeddedPostgres(work / "pg", durable=True)
        await asyncio.to_thread(pg.start)
        try:
            store = await provision_database(
                pg, "soak", extra_migrations=service_migrations(EXAMPLE_MIGRATIONS),
                owner_setup=lambda conn: install_commands(conn, commands()))
            load0 = os.getloadavg()[0]
            began = time.monotonic()
            try:
                report = await run_soak(config, store, work / "run")
            finally:
                if args.keep:
                    await asyncio.to_thread(keep_logs, work / "run", Path(args.keep))
            print(f"\nsoak: {time.monotonic() - began:.0f}s wall, load average "
                  f"{load0:.2f} -> {os.getloadavg()[0]:.2f}, 2 cores shared")
            print(report.render())
            return 1 if report.violations else 0
        finally:
            await asyncio.to_thread(pg.stop)


def cli() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--seconds", type=float, default=120)
    parser.add_argument("--sessions", type=int, default=1000)
    parser.add_argument("--cohorts", type=int, default=50)
    parser.add_argument("--rate", type=float, default=200)
    parser.add_argument("--faults", type=int, default=20, help="injections of each kind")
    parser.add_argument("--pods", type=int, default=2)
    parser.add_argument("--burst", type=int, default=120, help="writes in one burst")
    parser.add_argument("--channel-capacity", type=int, default=64,
                        help="the pods' listener_channel_capacity")
    parser.add_argument("--keep", default="", help="copy the pods' logs to this folder")
    parser.add_argument("--quiet", action="store_true")
    sys.exit(asyncio.run(main(parser.parse_args())))


if __name__ == "__main__":
    cli()
