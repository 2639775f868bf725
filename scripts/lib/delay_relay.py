#!/usr/bin/env python3
"""A TCP relay that holds every chunk DELAY_MS in each direction, in order: a control plane a
network hop away where the kernel has no netem (this one's lacks CONFIG_NET_SCH_NETEM).
   usage: delay_relay.py LISTEN_HOST:PORT UPSTREAM_HOST:PORT DELAY_MS
Runs until killed; prints "ready" once listening."""

import asyncio
import sys


def split(addr: str) -> tuple[str, int]:
    host, _, port = addr.rpartition(":")
    if not host or not port.isdigit():
        sys.exit(f"delay_relay: {addr!r}: expected HOST:PORT")
    return host, int(port)


async def pipe(reader, writer, delay: float) -> None:
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue = asyncio.Queue()

    async def later() -> None:
        while True:
            due, data = await queue.get()
            await asyncio.sleep(max(0.0, due - loop.time()))
            if data is None:
                writer.close()
                return
            writer.write(data)
            await writer.drain()

    sender = asyncio.ensure_future(later())
    try:
        while True:
            data = await reader.read(65536)
            queue.put_nowait((loop.time() + delay, data or None))
            if not data:
                break
        await sender
    except (ConnectionError, OSError):
        sender.cancel()
        writer.close()


async def main() -> None:
    if len(sys.argv) != 4 or not sys.argv[3].isdigit():
        sys.exit(__doc__)
    listen, upstream, delay = split(sys.argv[1]), split(sys.argv[2]), int(sys.argv[3]) / 1000

    async def conn(reader, writer) -> None:
        try:
            up_r, up_w = await asyncio.open_connection(*upstream)
        except OSError:
            writer.close()
            return
        await asyncio.gather(pipe(reader, up_w, delay), pipe(up_r, writer, delay),
                             return_exceptions=True)

    server = await asyncio.start_server(conn, *listen, reuse_address=True)
    print("ready", flush=True)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    asyncio.run(main())
