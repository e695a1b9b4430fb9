"""Parsing passports keeps nothing alive once the passports are dropped (issue 11,
item 5): what a burst of sessions parses is not left scattered in the heap."""

from __future__ import annotations

import gc
import json
import tracemalloc
from pathlib import Path

from service_engine.server import passport as passport_module
from service_engine.server.passport import Passport, parse_passport


def test_parsed_passports_leave_no_block_alive_once_dropped() -> None:
    """1,000 distinct passports parsed and dropped leave no block allocated under
    the parse (the passport module or the JSON decoder it calls) alive: no per-call
    decoder, no cache keyed by a caller's values."""
    headers = [Passport(sub=f"u-{i}", org=f"org{i % 50}", roles=("member",),
                        claims={"team": f"t{i}"}).to_header() for i in range(1000)]
    parse_passport(headers[0])  # what the first parse builds once
    gc.collect()
    tracemalloc.start(8)
    try:
        parsed = [parse_passport(h) for h in headers]
        assert len({p.sub for p in parsed}) == 1000
        del parsed
        gc.collect()
        snapshot = tracemalloc.take_snapshot()
    finally:
        tracemalloc.stop()
    watched = {passport_module.__file__, str(Path(json.__file__).parent)}
    kept = [stat for stat in snapshot.statistics("traceback")
            if any(frame.filename == passport_module.__file__ for frame in stat.traceback)
            and any(frame.filename.startswith(tuple(watched)) for frame in stat.traceback)]
    assert not kept, [(stat.count, stat.traceback.format()[-4:]) for stat in kept[:3]]
