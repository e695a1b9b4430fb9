"""Samples per function of py-spy raw profiles (``storm.py --py-spy``,
``e2e.py --py-spy``), side by side.

    python bench/spy_profile.py FILE [FILE ...] [--top 40] [--attach]
                                [--function NAME ...]

Only the main thread's samples count (the loop's; an executor's idle
workers would inflate the total). For each function: its inclusive samples
(the function or anything it called on the stack) and its self samples (the
function on top), as a share of the busy samples of each file. ``--attach``
leaves out the close phase of a storm (a socket's close, the transports'
release, the upkeep's memory release), so the shares are those of the
attach path; ``--function`` prints those functions only (``Class.method``
as py-spy names it), else the ``--top`` by inclusive and by self samples of
the first file.
"""

from __future__ import annotations

import argparse
import re
from collections import Counter
from pathlib import Path

CLOSE_PHASE = (
    "WireSocket._peer_closed", "WireSocket.connection_lost", "release_free_memory",
    "Upkeep._release_after_close", "_call_connection_lost", "socket._real_close",
    "_SelectorTransport.close", "WireSocket._ended", "Metrics.exposition",
)
_LINE = re.compile(r"^(.*) (\d+)$")
_WHERE = re.compile(r" \(.*\)$")


class Profile:
    """One file's inclusive and self samples per function."""

    def __init__(self, path: Path, *, attach: bool) -> None:
        self.name = path.name
        self.inclusive: Counter[str] = Counter()
        self.own: Counter[str] = Counter()
        self.busy = 0
        for line in path.read_text().splitlines():
            match = _LINE.match(line)
            if match is None:
                continue
            frames = [_WHERE.sub("", frame) for frame in match.group(1).split(";")]
            if not frames or not frames[0].startswith("_run_module_as_main"):
                continue  # not the main thread
            if attach and any(frame in CLOSE_PHASE for frame in frames):
                continue
            count = int(match.group(2))
            self.busy += count
            for frame in set(frames):
                self.inclusive[frame] += count
            self.own[frames[-1]] += count

    def share(self, counter: Counter[str], name: str) -> str:
        return f"{100 * counter[name] / max(1, self.busy):5.1f}%"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("files", nargs="+", type=Path)
    parser.add_argument("--top", type=int, default=40)
    parser.add_argument("--attach", action="store_true")
    parser.add_argument("--function", action="append", default=[])
    args = parser.parse_args()
    profiles = [Profile(path, attach=args.attach) for path in args.files]
    print(f"{'busy samples':60}" + "".join(f"{p.busy:>16}" for p in profiles))
    first = profiles[0]
    for title, counter_of in (("inclusive", lambda p: p.inclusive), ("self", lambda p: p.own)):
        names = args.function or [name for name, _ in counter_of(first).most_common(args.top)]
        print(f"--- {title}" + "".join(f"{p.name[-16:]:>16}" for p in profiles))
        for name in names:
            print(f"{name[:60]:60}" + "".join(f"{p.share(counter_of(p), name):>16}"
                                             for p in profiles))


if __name__ == "__main__":
    main()
