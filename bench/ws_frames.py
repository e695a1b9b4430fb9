"""What one WebSocket frame write costs the server, per uvicorn WebSocket implementation.

    python bench/ws_frames.py [--sockets 200] [--frames 20000] [--size 600]
                              [--impls websockets-sansio,websockets,wsproto]

For each implementation (``uvicorn.Config(ws=...)``) a server process runs
uvicorn with a bare ASGI app; this process opens ``--sockets`` client
sockets (the ``websockets`` library, compression off) and tells the server
to write ``--frames`` text frames of ``--size`` bytes spread round-robin
over them, one frame per socket per round (a cohort's delivery: every
subscriber gets one frame), each write awaited as the engine's operation
task awaits it. Reported: the server process's CPU (user+sys) per frame,
how much of it the write path takes beyond building the frame's text, and
the frames/s. Each variant also runs the same writes straight through the
transport's own ``write`` (``raw``: the ASGI layers and the WebSocket
library skipped; what the syscall alone costs).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import sys
from typing import Any

from websockets.asyncio.client import connect

SERVER = r'''
import asyncio, json, os, resource, socket, sys, time
import uvicorn

impl, size = sys.argv[1], int(sys.argv[2])
sockets: list = []
ready = asyncio.Event()
wanted = 0


def cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


async def app(scope, receive, send):
    global wanted
    if scope["type"] != "websocket":
        return
    await receive()  # websocket.connect
    await send({"type": "websocket.accept"})
    message = await receive()
    if message.get("text", "").startswith("control:"):
        wanted = int(message["text"].split(":")[1])
        while True:
            message = await receive()
            if message["type"] != "websocket.receive":
                return
            frames, mode = message["text"].split(":")
            await run(int(frames), mode, send)
    sockets.append((send, message))
    if len(sockets) >= wanted:
        ready.set()
    while (await receive())["type"] == "websocket.receive":
        pass


async def run(frames, mode, control):
    await ready.wait()
    text = json.dumps({"id": "1", "type": "next", "payload": {"data": {"x": "y" * size}}})
    sends = [s for s, _ in sockets]
    began, t0 = cpu(), time.perf_counter()
    n = 0
    if mode == "asgi":
        while n < frames:
            for s in sends:
                await s({"type": "websocket.send", "text": text})
                n += 1
    elif mode == "text":
        while n < frames:
            for s in sends:
                # the frame text built per frame, not sent
                f'{text[:20]}{n}{text[20:]}'
                n += 1
    else:  # raw: a pre-framed binary write on each transport
        from websockets.frames import Frame, Opcode
        protocols = [s.__self__ for s in sends]
        while n < frames:
            for p in protocols:
                data = Frame(Opcode.TEXT, text.encode()).serialize(mask=False, extensions=[])
                p.transport.write(data) if hasattr(p, "transport") else None
                n += 1
    used, wall = cpu() - began, time.perf_counter() - t0
    await control({"type": "websocket.send", "text": json.dumps({"cpu": used, "wall": wall, "n": n})})


sock = socket.socket()
sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
sock.bind(("127.0.0.1", 0))
sock.listen(4096)
print(sock.getsockname()[1], flush=True)
config = uvicorn.Config(app, ws=impl, lifespan="off", log_level="warning",
                        ws_per_message_deflate=False, ws_ping_interval=None)
asyncio.run(uvicorn.Server(config).serve(sockets=[sock]))
'''


async def measure(impl: str, sockets: int, frames: int, size: int) -> dict[str, Any]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", SERVER, impl, str(size), stdout=asyncio.subprocess.PIPE)
    try:
        assert proc.stdout is not None
        port = (await proc.stdout.readline()).strip()
        if not port:
            return {"impl": impl, "missing": True}  # e.g. wsproto not installed
        url = f"ws://127.0.0.1:{int(port)}/"
        control = await connect(url, compression=None, max_size=None)
        await control.send(f"control:{sockets}")
        clients = [await connect(url, compression=None, max_size=None, max_queue=None)
                   for _ in range(sockets)]
        for c in clients:
            await c.send("hello")
        received = 0

        async def drain(c: Any) -> None:
            nonlocal received
            async for _ in c:
                received += 1

        readers = [asyncio.create_task(drain(c)) for c in clients]
        out: dict[str, Any] = {"impl": impl}
        for mode in ("text", "asgi", "raw"):
            await control.send(f"{frames}:{mode}")
            result = json.loads(await control.recv())
            out[mode] = result
        for c in clients:
            await c.close()
        await control.close()
        for r in readers:
            r.cancel()
        return out
    finally:
        proc.terminate()
        await proc.wait()


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--sockets", type=int, default=200)
    parser.add_argument("--frames", type=int, default=20000)
    parser.add_argument("--size", type=int, default=600)
    parser.add_argument("--impls", default="websockets-sansio,websockets,wsproto")
    args = parser.parse_args()
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    rows = [await measure(impl, args.sockets, args.frames, args.size)
            for impl in args.impls.split(",")]
    print(f"load average {os.getloadavg()[0]:.2f}; {args.sockets} sockets, {args.frames} "
          f"frames of ~{args.size} B, one per socket per round")
    print(f"{'ws impl':20} {'write us/frame':>15} {'raw write us':>13} {'text us':>8} "
          f"{'frames/s':>10}")
    for r in rows:
        if r.get("missing"):
            print(f"{r['impl']:20} (not installed)")
            continue
        n = r["asgi"]["n"]
        print(f"{r['impl']:20} {r['asgi']['cpu'] / n * 1e6:15.1f} "
              f"{r['raw']['cpu'] / r['raw']['n'] * 1e6:13.1f} "
              f"{r['text']['cpu'] / r['text']['n'] * 1e6:8.2f} {n / r['asgi']['wall']:10.0f}")


if __name__ == "__main__":
    asyncio.run(main())
