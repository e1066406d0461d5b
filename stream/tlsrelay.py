"""A one-connection TLS relay for rtmps://, run as a process of its own by `swapstream.netpolicy`.

Why a process: FFmpeg, through PyAV 18.1, cannot verify the server of a push. PyAV opens an
output's connection with `avio_open` and no options, so `tls_verify`, `ca_file` and `verifyhost`
never reach FFmpeg's TLS layer (PyAV even logs them as unused), and FFmpeg's own default is not to
verify. A relay thread inside the pushing process cannot work either: PyAV holds the GIL while FFmpeg
connects an output and waits for the RTMP handshake, so the thread could never answer.

So this process does the TLS side with Python's ssl (OpenSSL): it connects to the address the
outbound policy checked, sends the host name as SNI, verifies the certificate chain and the name,
and only then listens on loopback for FFmpeg's plain RTMP, which it passes through unchanged. No
byte of RTMP, and so no stream key, goes anywhere before the certificate is accepted.

Standard library only, so that `python -I tlsrelay.py` starts in a few tens of milliseconds.
The parent reads one line from stdout: `READY <port>` or `ERROR <reason>`.
"""

from __future__ import annotations

import argparse
import asyncio
import ssl
import sys


def _context(ca_file: str | None, insecure: bool) -> ssl.SSLContext:
    if insecure:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
        return ctx
    # Without a CA file: OpenSSL's default paths, which honour $SSL_CERT_FILE and $SSL_CERT_DIR.
    return ssl.create_default_context(cafile=ca_file)


def _say(line: str) -> None:
    sys.stdout.write(" ".join(line.split()) + "\n")
    sys.stdout.flush()


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except (OSError, ssl.SSLError, asyncio.IncompleteReadError):
        pass
    finally:
        # Closing one side ends the other's reads too: the relay lives as long as both sides do.
        writer.close()


async def _relay(args: argparse.Namespace) -> int:
    try:
        ctx = _context(args.ca_file, args.insecure)
    except (OSError, ssl.SSLError) as e:
        _say(f"ERROR cannot load the CA file {args.ca_file}: {e}")
        return 2
    upstream: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None
    failure = "no address to connect to"
    for address in args.address:
        try:
            upstream = await asyncio.wait_for(
                asyncio.open_connection(address, args.port, ssl=ctx, server_hostname=args.host,
                                        ssl_handshake_timeout=args.timeout), args.timeout)
            break
        except ssl.SSLCertVerificationError as e:
            # Another address of the same name would present the same certificate: stop here.
            _say(f"ERROR the server's TLS certificate was not accepted for {args.host}: "
                 f"{e.verify_message or e.reason}")
            return 2
        except (OSError, ssl.SSLError, asyncio.TimeoutError) as e:
            failure = f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
    if upstream is None:
        _say(f"ERROR cannot connect to {args.host} port {args.port} over TLS: {failure}")
        return 2
    up_reader, up_writer = upstream
    client: asyncio.Future[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = (
        asyncio.get_running_loop().create_future())

    def accept(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if client.done():
            writer.close()  # one connection per relay: a second comer gets nothing
        else:
            client.set_result((reader, writer))

    server = await asyncio.start_server(accept, "127.0.0.1", 0)
    _say(f"READY {server.sockets[0].getsockname()[1]}")
    try:
        down_reader, down_writer = await asyncio.wait_for(client, args.accept_timeout)
    except asyncio.TimeoutError:
        up_writer.close()
        return 1
    finally:
        server.close()
    await asyncio.gather(_pipe(down_reader, up_writer), _pipe(up_reader, down_writer))
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--host", required=True, help="name the certificate must hold (and SNI)")
    p.add_argument("--address", action="append", default=[], help="address to connect to (repeat)")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--ca-file", default=None)
    p.add_argument("--insecure", action="store_true")
    p.add_argument("--timeout", type=float, default=5.0)
    p.add_argument("--accept-timeout", type=float, default=30.0)
    args = p.parse_args(argv)
    try:
        return asyncio.run(_relay(args))
    except KeyboardInterrupt:
        return 1


if __name__ == "__main__":
    sys.exit(main())
