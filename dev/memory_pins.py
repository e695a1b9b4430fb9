"""Debug only: which live objects keep pymalloc's arenas mapped.

pymalloc hands memory back only in whole 1 MiB arenas, so one live block
keeps its arena (and the arena's free pools) in the process. After a burst
of sessions closed, an arena that holds a handful of blocks is *pinned* by
them. Two reports find those blocks:

* `pin_report` walks every object reachable from the collector's, reads
  the header of the 16 KiB pool each object's block lies in (the pool's
  arena index, size class and blocks in use), and lists the objects found
  in the arenas that hold the fewest blocks, by type and by the type of the
  object they were reached from. Its counts of pools in use can exceed
  ``sys._debugmallocstats()``'s (headers of pools no longer in use read as
  in use): its per-arena figures are upper bounds, the objects it lists
  are real.
* `remember` (at a mark, and while the sessions are open) and
  `survivors_report` (after they closed) list the objects allocated while
  the sessions were open that outlived them, by address.

CPython 3.11's layout on 64-bit (``Objects/obmalloc.c``): pools of 16 KiB
aligned to their size, a 48-byte header (``ref.count`` at 0, ``arenaindex``
at 32, ``szidx`` at 36), blocks of ``16 * (szidx + 1)`` bytes from offset
48; an object of a collected type starts 16 bytes (its ``PyGC_Head``) into
its block. Only the process's readable anonymous mappings are read (the
arenas are among them), through ``/proc/self/mem`` (an address unmapped
meanwhile reads as an error). The reports' own records land in pools too.
"""

from __future__ import annotations

import array
import bisect
import collections
import gc
import os
import struct
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

POOL_SIZE = 1 << 14
POOL_HEADER = 48
SMALL_LIMIT = 512
GC_HEADER = 16
SPARSE_BYTES = 100 * 1024  # of an arena's 1 MiB
ARENA_SIZE = 1 << 20
MAX_ARENAS = 1 << 16  # an index above is not an arena's (static data read as a pool)


class _Memory:
    fd = -1


_MEMORY = _Memory()


@dataclass
class _Pool:
    arena: int
    block: int
    used: int
    objects: list[tuple[str, str, str]] = field(default_factory=list)  # (type, parent, sample)


def _mapped() -> tuple[list[int], list[int]]:
    starts: list[int] = []
    ends: list[int] = []
    with open("/proc/self/maps") as maps:
        for line in maps:
            fields = line.split()
            span, perms = fields[0], fields[1]
            if not perms.startswith("r") or (len(fields) > 5 and fields[5] != "[heap]"):
                continue  # a guard page, a file or a kernel page: no arena there
            low, high = span.split("-")
            starts.append(int(low, 16))
            ends.append(int(high, 16))
    return starts, ends


def _readable(starts: list[int], ends: list[int], address: int) -> bool:
    i = bisect.bisect_right(starts, address) - 1
    return i >= 0 and address + POOL_HEADER <= ends[i]


def _header(address: int) -> tuple[int, int, int] | None:
    """A pool header's blocks in use, arena index and block size, or None
    when the bytes there are not a pymalloc pool's header (its offsets must
    agree with its size class)."""
    try:  # through /proc/self/mem: an address unmapped meanwhile is an error, not a fault
        raw = os.pread(_MEMORY.fd, POOL_HEADER, address)
    except OSError:
        return None
    if len(raw) < POOL_HEADER:
        return None
    used, _, arena, size_index, next_offset, max_next = struct.unpack_from("<I4xQ16xIIII", raw)
    if size_index >= SMALL_LIMIT // 16 or arena >= MAX_ARENAS:
        return None
    block = 16 * (size_index + 1)
    if (max_next != POOL_SIZE - block or not POOL_HEADER <= next_offset <= POOL_SIZE
            or used > (POOL_SIZE - POOL_HEADER) // block):
        return None
    return used, arena, block


def _arenas(pools: dict[int, _Pool], starts: list[int],
            ends: list[int]) -> dict[int, tuple[int, int]]:
    """Per arena an object was found in: its pools in use and the bytes of
    their blocks in use, read from every pool header within 1 MiB of the
    arena's pools found (an unused pool's count is 0)."""
    found: dict[int, list[int]] = collections.defaultdict(list)
    for base, pool in pools.items():
        found[pool.arena].append(base)
    out: dict[int, tuple[int, int]] = {}
    for index, bases in found.items():
        used_pools = used_bytes = 0
        for base in range(max(bases) - ARENA_SIZE, min(bases) + ARENA_SIZE, POOL_SIZE):
            if not _readable(starts, ends, base):
                continue
            header = _header(base)
            if header is not None and header[1] == index and header[0] > 0:
                used_pools += 1
                used_bytes += header[0] * header[2]
        out[index] = (used_pools, used_bytes)
    return out


def _label(obj: object) -> str:
    kind = type(obj)
    return f"{kind.__module__}.{kind.__qualname__}"


def pin_report(target: Path, arenas_shown: int = 40) -> None:
    """Write to ``target`` the arenas holding the fewest blocks in use and
    the objects found in them (see the module's docstring)."""
    _MEMORY.fd = os.open("/proc/self/mem", os.O_RDONLY)
    try:
        _pin_report(target, arenas_shown)
    finally:
        os.close(_MEMORY.fd)


def _pin_report(target: Path, arenas_shown: int) -> None:
    starts, ends = _mapped()
    pools: dict[int, _Pool] = {}
    for obj, parent in walk():
        if obj is pools:
            continue
        try:
            size = sys.getsizeof(obj)
        except TypeError:
            continue
        if size > SMALL_LIMIT:
            continue
        start = id(obj) - (GC_HEADER if type(obj).__flags__ & (1 << 14) else 0)
        base = start & ~(POOL_SIZE - 1)
        pool = pools.get(base)
        if pool is None:
            if not _readable(starts, ends, base):
                continue
            header = _header(base)
            if header is None or header[0] == 0 or (start - base - POOL_HEADER) % header[2]:
                continue  # not a pymalloc pool (a block of glibc's heap, static data)
            pool = pools[base] = _Pool(header[1], header[2], header[0])
        if len(pool.objects) < 64:
            try:
                sample = repr(obj)[:90]
            except Exception:  # a broken repr is still a block in use
                sample = "<no repr>"
            pool.objects.append((_label(obj), "(a root)" if parent is None else _label(parent),
                                 sample))
    for base, pool in pools.items():  # again: the walk's own blocks are gone
        header = _header(base)
        pool.used = header[0] if header is not None else 0
    arenas = _arenas(pools, starts, ends)
    ranked = sorted(arenas.items(), key=lambda kv: kv[1][1])
    lines = [f"{len(arenas)} arenas holding objects; {sum(u for u, _ in arenas.values())} pools "
             "in use in them; the arenas with the fewest bytes in use first"]
    classes: collections.Counter[str] = collections.Counter()
    holders: collections.Counter[str] = collections.Counter()
    sparse = 0
    for index, (used_pools, used_bytes) in ranked:
        if used_bytes > SPARSE_BYTES:
            continue
        sparse += 1
        seen_pools = [p for p in pools.values() if p.arena == index]
        for pool in seen_pools:
            for kind, parent, _ in pool.objects:
                classes[kind] += 1
                holders[f"{kind} in {parent}"] += 1
        if sparse > arenas_shown:
            continue
        lines.append(f"\narena {index}: {used_pools} pools in use ({len(seen_pools)} with an "
                     f"object found), {used_bytes} bytes in their blocks")
        for pool in sorted(seen_pools, key=lambda p: p.block):
            lines.append(f"  pool of {pool.block}-byte blocks, {pool.used} in use, "
                         f"{len(pool.objects)} objects found")
            for kind, parent, sample in pool.objects[:6]:
                lines.append(f"    {kind} (in {parent}): {sample}")
    lines.insert(1, f"{sparse} sparse arenas (at most {SPARSE_BYTES // 1024} KiB in blocks "
                    "in use)")
    lines.append("\nevery arena: pools in use, KiB in use, objects found, the commonest types")
    for index, (used_pools, used_bytes) in sorted(arenas.items()):
        kinds: collections.Counter[str] = collections.Counter(
            kind for p in pools.values() if p.arena == index for kind, _, _ in p.objects)
        lines.append(f"  {index:6} {used_pools:3} {used_bytes // 1024:6} {sum(kinds.values()):6}  "
                     + ", ".join(f"{k.rsplit('.', 1)[-1]} {n}" for k, n in kinds.most_common(5)))
    lines.append("\nobjects in the sparse arenas, by type")
    lines += [f"{n:7} {k}" for k, n in classes.most_common(40)]
    lines.append("\nby type and holder")
    lines += [f"{n:7} {k}" for k, n in holders.most_common(60)]
    lines.append("\n" + _whole_scan(starts, ends))
    target.write_text("\n".join(lines) + "\n")


def _whole_scan(starts: list[int], ends: list[int]) -> str:
    """Every pool header with blocks in use in every readable mapping, per
    arena index: a check of the per-arena figures (an index with more than
    64 pools holds stale headers)."""
    per: collections.Counter[int] = collections.Counter()
    where: dict[int, list[int]] = collections.defaultdict(list)
    used_bytes = 0
    for low, high in zip(starts, ends, strict=True):
        base = (low + POOL_SIZE - 1) & ~(POOL_SIZE - 1)
        while base + POOL_HEADER <= high:
            header = _header(base)
            if header is not None and header[0] > 0:
                per[header[1]] += 1
                where[header[1]].append(base)
                used_bytes += header[0] * header[2]
            base += POOL_SIZE
    over = {k: n for k, n in per.items() if n > 64}
    wide = {k: f"{(max(v) - min(v)) / 2**20:.1f} MiB" for k, v in where.items()
            if max(v) - min(v) >= ARENA_SIZE}
    regions = collections.Counter(
        next(f"{lo:x}-{hi:x}" for lo, hi in zip(starts, ends, strict=True) if lo <= b < hi)
        for v in where.values() for b in v)
    return (f"whole scan: {sum(per.values())} pools in use, {used_bytes / 2**20:.1f} MB in "
            f"their blocks, {len(per)} arena indexes; indexes with over 64 pools: {over}; "
            f"indexes spanning over 1 MiB: {wide}; pools per mapping: {dict(regions)}")


_REMEMBERED: dict[str, array.array[int]] = {}


def walk() -> Iterator[tuple[object, object | None]]:
    """Every object reachable from the collector's (untracked tuples,
    strings and ints included), each with the object it was reached from
    (None for the collector's own)."""
    stack: list[tuple[object, object | None]] = [(obj, None) for obj in gc.get_objects()]
    seen = {id(obj) for obj, _ in stack}
    while stack:
        obj, parent = stack.pop()
        for child in gc.get_referents(obj):
            if id(child) not in seen:
                seen.add(id(child))
                stack.append((child, obj))
        yield obj, parent


def cyclic_garbage() -> list[object]:
    """What a full collection would free now (it frees it, keeping these)."""
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        gc.collect()
        found = list(gc.garbage)
        gc.garbage.clear()
    finally:
        gc.set_debug(0)
    return found


def remember(step: str) -> None:
    """Keep the addresses of every object reachable now (one sorted array,
    outside pymalloc's arenas), for `survivors_report`."""
    _REMEMBERED[step] = array.array("Q", sorted(id(obj) for obj, _ in walk()))


def _in(ids: array.array[int], address: int) -> bool:
    i = bisect.bisect_left(ids, address)
    return i < len(ids) and ids[i] == address


def survivors_report(target: Path, before: str = "mark", during: str = "held",
                     also: tuple[str, ...] = ()) -> None:
    """Write to ``target`` the objects reachable now that were reachable at
    ``during`` but not at ``before`` (by address: an address reused by a
    later object reads as a survivor only if it was in use at ``during``
    too): what was allocated while the sessions were open and outlived
    them, the blocks that keep the burst's arenas; with ``also``, only those
    reachable at those steps too (a short-lived object whose address was
    reused at every one of them is unlikely). By type, by type and the type
    it is reached from, with samples."""
    old, mid = _REMEMBERED.get(before), _REMEMBERED.get(during)
    more = [_REMEMBERED.get(step) for step in also]
    if old is None or mid is None or any(ids is None for ids in more):
        target.write_text(f"no {before}, {during} or {also} remembered\n")
        return
    kinds: collections.Counter[str] = collections.Counter()
    holders: collections.Counter[str] = collections.Counter()
    samples: dict[str, str] = {}
    for obj, parent in walk():
        address = id(obj)
        if _in(old, address) or not _in(mid, address):
            continue
        if not all(ids is not None and _in(ids, address) for ids in more):
            continue
        kind = _label(obj)
        kinds[kind] += 1
        key = f"{kind} in {'(a root)' if parent is None else _label(parent)}"
        holders[key] += 1
        if samples.get(key, "").count("\n") < 4:
            try:
                held_by = repr(parent)[:100] if parent is not None else ""
                samples[key] = (samples.get(key, "") + "\n" if key in samples else "") + (
                    f"          {repr(obj)[:100]}  <-  {held_by}")
            except Exception:  # a broken repr is still a survivor
                samples.setdefault(key, "          <no repr>")
    steps = ", ".join((during, *also))
    lines = [f"{sum(kinds.values())} objects reachable now and at {steps}, not at {before}",
             "\nby type"]
    lines += [f"{n:7} {k}" for k, n in kinds.most_common(40)]
    lines.append("\nby type and holder, with a sample")
    for key, n in holders.most_common(80):
        lines.append(f"{n:7} {key}\n{samples[key]}")
    target.write_text("\n".join(lines) + "\n")
