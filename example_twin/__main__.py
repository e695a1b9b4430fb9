"""``python -m example_twin``: the twin of the reference service.

Environment: ``NATS_URL`` (required), ``EXAMPLE_TWIN_NAME`` (the twin's own
service, default ``twin``), ``EXAMPLE_TWIN_TARGET`` (the service it talks
to, default ``example``), ``EXAMPLE_TWIN_LOG_LEVEL`` (default ``WARNING``).

* ``--cycle N``: drive N cross-service cycles, print a JSON summary on one
  line and exit 0 when every cycle closed (1 otherwise); ``--org`` the org
  the cards are created in, ``--due-in`` a deadline in seconds (the cycle
  then also waits for ``card.overdue``), ``--timeout`` the bound on each
  cycle;
* ``--roster``: publish the twin's roster (KV, ``twin.person.*``) and exit;
* ``--boards``: print the boards the service offers (KV, ``example.board.*``)
  as JSON on one line and exit;
* no ``--cycle``: the reviewer — approve the review of every card the
  service creates, until SIGINT or SIGTERM.

Exit codes: 0 done, 1 a cycle did not close, 2 bad configuration or no NATS.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import signal
import sys

from service_engine.errors import NatsUnavailable

from .reply import reply_cycle, split_text
from .roster import DEFAULT_ROSTER, publish_roster, read_boards
from .runner import Twin, TwinError


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m example_twin", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cycle", type=int, metavar="N",
                        help="drive N cycles, print a JSON summary and exit")
    parser.add_argument("--org", default="acme", help="the org the cards are created in")
    parser.add_argument("--due-in", type=float, metavar="SECONDS",
                        help="give each card a deadline; the cycle waits for card.overdue")
    parser.add_argument("--timeout", type=float, default=30.0, metavar="SECONDS",
                        help="the bound on each cycle (default 30)")
    parser.add_argument("--reply", metavar="ID",
                        help="stream reply ID's --text over the service's lane, finish it, "
                             "print a JSON summary and exit")
    parser.add_argument("--text", default="a reply streamed by the twin",
                        help="the reply's text (with --reply)")
    parser.add_argument("--chunk-size", type=int, default=8, metavar="BYTES",
                        help="bytes per chunk (with --reply)")
    parser.add_argument("--wrong-hash", action="store_true",
                        help="send a finish with a wrong hash first; the corrected one follows "
                             "the service's reply.seal_failed")
    parser.add_argument("--roster", action="store_true",
                        help="publish the roster (KV twin.person.*) and exit")
    parser.add_argument("--boards", action="store_true",
                        help="print the boards the service offers (KV) and exit")
    return parser


async def _main(args: argparse.Namespace, url: str) -> int:
    name = os.environ.get("EXAMPLE_TWIN_NAME", "twin")
    target = os.environ.get("EXAMPLE_TWIN_TARGET", "example")
    async with Twin.connect(url, name=name, target=target) as twin:
        if args.roster:
            written = await publish_roster(twin.nats, DEFAULT_ROSTER)
            print(json.dumps({"roster": len(DEFAULT_ROSTER), "written": written}), flush=True)
            return 0
        if args.boards:
            boards = await read_boards(twin.nats)
            print(json.dumps({k: b.model_dump() for k, b in sorted(boards.items())}), flush=True)
            return 0
        if args.reply is not None:
            chunks = split_text(args.text, args.chunk_size)
            first = (len(chunks) - 1, "0" * 64) if args.wrong_hash else None
            run = await reply_cycle(
                twin, args.reply, chunks, org=args.org, first_finish=first, bound=args.timeout
            )
            print(run.to_json(), flush=True)
            return 0 if run.finished else 1
        if args.cycle is not None:
            summary = await twin.run_cycles(
                args.cycle, org=args.org, bound=args.timeout, due_in=args.due_in
            )
            print(summary.to_json(), flush=True)
            return 0 if summary.ok else 1
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        approved = await twin.review(stop)
        print(f"reviewer stopped after {approved} approval(s)", file=sys.stderr)
        return 0


def run(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    logging.basicConfig(
        level=os.environ.get("EXAMPLE_TWIN_LOG_LEVEL", "WARNING").upper(),
        format="%(asctime)s %(levelname)s %(name)s %(message)s", stream=sys.stderr,
    )
    url = os.environ.get("NATS_URL")
    if not url:
        print("example_twin: set NATS_URL", file=sys.stderr)
        return 2
    if args.cycle is not None and args.cycle < 1:
        print("example_twin: --cycle takes a positive count", file=sys.stderr)
        return 2
    try:
        return asyncio.run(_main(args, url))
    except NatsUnavailable as exc:
        print(f"example_twin: {exc}", file=sys.stderr)
        return 2
    except TwinError as exc:
        print(f"example_twin: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(run())
