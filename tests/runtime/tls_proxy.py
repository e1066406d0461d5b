"""A TLS-terminating proxy for the rtmps:// tests: TLS on a loopback port, plain TCP to an upstream
port (a real nginx-rtmp). Run as its own process (`python tls_proxy.py ...`): a pusher in the test's
process holds the GIL while FFmpeg connects, so a proxy thread there could never answer.

It prints `PORT <n>` once listening, and appends one line per event to --log:
`accepted`, `handshake ok`, `handshake failed <reason>`, and at the end of each connection
`bytes <n>`: the bytes the client sent after the handshake (RTMP, with the stream key in it).
"""

from __future__ import annotations

import argparse
import asyncio
import ssl
import sys


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--cert", required=True)
    p.add_argument("--key", required=True)
    p.add_argument("--upstream-port", type=int, required=True)
    p.add_argument("--log", required=True)
    args = p.parse_args()
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(args.cert, args.key)

    def note(line: str) -> None:
        with open(args.log, "a") as f:
            f.write(line + "\n")

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        note("accepted")
        try:
            await writer.start_tls(ctx)
        except (OSError, ssl.SSLError) as e:
            note(f"handshake failed {type(e).__name__}: {e}")
            writer.close()
            return
        note("handshake ok")
        sent = 0
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", args.upstream_port)
        except OSError as e:
            note(f"upstream failed {e}")
            writer.close()
            return

        async def client_to_upstream() -> None:
            nonlocal sent
            try:
                while data := await reader.read(65536):
                    sent += len(data)
                    up_writer.write(data)
                    await up_writer.drain()
            except (OSError, ssl.SSLError):
                pass
            finally:
                up_writer.close()

        async def upstream_to_client() -> None:
            try:
                while data := await up_reader.read(65536):
                    writer.write(data)
                    await writer.drain()
            except (OSError, ssl.SSLError):
                pass
            finally:
                writer.close()

        await asyncio.gather(client_to_upstream(), upstream_to_client())
        note(f"bytes {sent}")

    async def serve() -> None:
        server = await asyncio.start_server(handle, "127.0.0.1", 0)
        sys.stdout.write(f"PORT {server.sockets[0].getsockname()[1]}\n")
        sys.stdout.flush()
        await server.serve_forever()

    asyncio.run(serve())
    return 0


if __name__ == "__main__":
    sys.exit(main())
