"""Where live inputs and outputs may connect (the outbound policy), and how rtmps:// is verified.

The policy is for URLs that come from someone other than the operator: the control API's inputs and
RTMP outputs. A URL passes when

- its port is the one its scheme uses (rtmp 1935, rtmps 443) or one of `runtime.allowed_ports`;
- every address its host resolves to is allowed: an address inside a network of
  `runtime.allowed_hosts` (the default holds loopback: 127.0.0.0/8 and ::1), or a public address
  whose host, as written in the URL, matches a name pattern there (`*` by default).

Private, link-local, shared (CGNAT), unspecified, multicast and reserved addresses, and IPv6 forms
that carry one of those (IPv4-mapped, 6to4, NAT64), are refused unless a network of
`runtime.allowed_hosts` holds them; cloud metadata addresses (even public ones such as Azure's
168.63.129.16) unless it lists that very address.

A refusal says the same thing (`REFUSED`), with no network contact with the target, whatever its
cause: a closed, a silent and an open port, a private address and a name that does not resolve all
look alike to the client; the cause is logged for the operator.

The name is resolved once per connection (in a worker thread, with a timeout), every address is
checked, and the connection goes to a checked address: an rtmp:// URL is rewritten to that IP
literal, so that FFmpeg's own lookup, which could get another answer (DNS rebinding), never happens.
rtmps:// goes through a TLS relay process (`tlsrelay.py`) that connects to the checked address,
sends the name as SNI and verifies the certificate against it; FFmpeg speaks plain RTMP to the relay
on loopback. Without the relay the choice would be between pinning the address (no SNI, since
FFmpeg sends none to an IP literal) and keeping the name (a second lookup FFmpeg makes itself); and
FFmpeg through PyAV cannot verify a push at all (see `tlsrelay.py`).

This module imports nothing from `swapstream.live` or `swapstream.runtime`, so both can use it.
"""

from __future__ import annotations

import asyncio
import fnmatch
import ipaddress
import logging
import os
import re
import selectors
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Union

from pydantic import AfterValidator

from .errors import SwapStreamError

if TYPE_CHECKING:
    from .config import RuntimeConfig

log = logging.getLogger(__name__)

IPAddress = Union[ipaddress.IPv4Address, ipaddress.IPv6Address]
Network = Union[ipaddress.IPv4Network, ipaddress.IPv6Network]

SCHEME_PORTS: dict[str, int] = {"rtmp": 1935, "rtmps": 443}
"""The port each scheme uses, always allowed."""

DEFAULT_ALLOWED_HOSTS: tuple[str, ...] = ("*", "127.0.0.0/8", "::1")
"""Any public host, and loopback (local nginx-rtmp or MediaMTX setups)."""

RESOLVE_TIMEOUT_S = 5.0

REFUSED = ("this URL is not allowed by the server's outbound policy; the server's operator can allow "
           "its host and port (runtime.allowed_hosts, runtime.allowed_ports)")
"""The one answer to every refused URL, whatever the cause."""

METADATA: frozenset[IPAddress] = frozenset(ipaddress.ip_address(a) for a in (
    "169.254.169.254",  # AWS, GCP, Azure, OpenStack, DigitalOcean, Oracle instance metadata
    "169.254.170.2",  # AWS ECS task metadata and credentials
    "169.254.169.253",  # AWS VPC DNS
    "fd00:ec2::254",  # AWS instance metadata over IPv6
    "fd00:ec2::253",  # AWS VPC DNS over IPv6
    "100.100.100.200",  # Alibaba Cloud metadata
    "168.63.129.16",  # Azure wireserver: a public address, hence listed
))
"""Cloud metadata and platform addresses: allowed only by an entry of exactly that address, never by
`*` or a network around them."""

_NAT64 = (ipaddress.ip_network("64:ff9b::/96"),)
_REFUSED_V6 = (ipaddress.ip_network("64:ff9b:1::/48"),)  # local-use NAT64: where it leads is unknown

RELAY_SCRIPT = Path(__file__).resolve().with_name("tlsrelay.py")

_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
# The last label starts with a letter: no top-level domain is numeric, and glibc reads names such as
# 2130706433, 127.1 or 0x7f000001 as IPv4 addresses without asking DNS.
_HOST_NAME = re.compile(rf"(?:{_LABEL}\.)*[A-Za-z](?:[A-Za-z0-9-]{{0,61}}[A-Za-z0-9])?", re.ASCII)
_URL = re.compile(r"(?P<scheme>rtmps?)://(?P<authority>[^/?#@\s]*)(?P<rest>[/?][\x21-\x7e]*)?",
                  re.ASCII | re.IGNORECASE)
_AUTHORITY = re.compile(r"(?:\[(?P<v6>[0-9A-Fa-f:.]+)\]|(?P<host>[^\[\]:]+))(?::(?P<port>[0-9]{1,5}))?",
                        re.ASCII)
_NAME_PATTERN = re.compile(r"[A-Za-z0-9*?.-]{1,253}", re.ASCII)
_NETWORKISH = re.compile(r"[0-9.]+(?:/[0-9]{1,3})?|.*[:/].*", re.ASCII)


class UrlSyntaxError(SwapStreamError, ValueError):
    """An rtmp:// or rtmps:// URL that is malformed; the message says what is wrong."""


class OutboundRefused(SwapStreamError):
    """The outbound policy refused a URL. The message is always `REFUSED`, so that whoever sent the
    URL learns nothing about the network from it; `reason` says why, for the operator's log."""

    def __init__(self, reason: str) -> None:
        super().__init__(REFUSED)
        self.reason = reason


class TlsError(OSError):
    """An rtmps:// server could not be reached over TLS, or its certificate was not accepted."""


# -- URLs -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RtmpUrl:
    """An rtmp:// or rtmps:// URL, taken apart."""

    scheme: str
    """'rtmp' or 'rtmps'."""
    host: str
    """A lower-case name, or an IP address without brackets."""
    address: IPAddress | None
    """The address when the host is an IP literal."""
    port: int | None
    """The port written in the URL, if any."""
    rest: str
    """Path and query, as written ('/app/key')."""

    @property
    def effective_port(self) -> int:
        return self.port or SCHEME_PORTS[self.scheme]

    def to(self, host: str, port: int, scheme: str | None = None) -> str:
        """The same URL, pointed at another host (a name or an address) and port."""
        shown = f"[{host}]" if ":" in host else host
        return f"{scheme or self.scheme}://{shown}:{port}{self.rest}"


def parse_rtmp_url(url: str) -> RtmpUrl:
    """Take an rtmp:// or rtmps:// URL apart; UrlSyntaxError says what is wrong with a bad one."""
    m = _URL.fullmatch(url)
    if m is None:
        raise UrlSyntaxError(f"{url!r} is not an rtmp:// or rtmps:// URL (rtmp://HOST[:PORT]/APP/KEY)")
    a = _AUTHORITY.fullmatch(m["authority"])
    if a is None:
        raise UrlSyntaxError(f"{m['authority']!r} is not a host with an optional :PORT")
    port = int(a["port"]) if a["port"] is not None else None
    if port is not None and not 1 <= port <= 65535:
        raise UrlSyntaxError(f"port {port} is not between 1 and 65535")
    address: IPAddress | None
    if a["v6"] is not None:
        try:
            address = ipaddress.IPv6Address(a["v6"])
        except ValueError:
            raise UrlSyntaxError(f"[{a['v6']}] is not an IPv6 address") from None
        host = str(address)
    else:
        host = a["host"]
        try:
            address = ipaddress.IPv4Address(host)
            host = str(address)
        except ValueError:
            address = None
            if len(host) > 253 or not _HOST_NAME.fullmatch(host):
                raise UrlSyntaxError(f"{host!r} is not a host name or an IPv4 address") from None
            host = host.lower()
    return RtmpUrl(m["scheme"].lower(), host, address, port, m["rest"] or "")


# -- host patterns --------------------------------------------------------------------------------


def check_host_pattern(entry: str) -> str:
    """One entry of `runtime.allowed_hosts`: `*`, a name pattern, an address or a network."""
    e = entry.strip()
    if e == "*":
        return e
    if _NETWORKISH.fullmatch(e):
        try:
            return str(ipaddress.ip_network(e, strict=True))
        except ValueError as err:
            raise ValueError(f"{entry!r} is not an IP address or network ({err})") from None
    if not _NAME_PATTERN.fullmatch(e):
        raise ValueError(f"{entry!r} is not a host pattern: give a name (live.example.com), a name "
                         f"pattern (*.example.com), an address or a network (10.0.0.0/8)")
    return e.lower()


HostPattern = Annotated[str, AfterValidator(check_host_pattern)]
"""The config type of one `runtime.allowed_hosts` entry."""


@dataclass(frozen=True)
class _Rules:
    names: tuple[str, ...]
    networks: tuple[Network, ...]

    @classmethod
    def parse(cls, entries: tuple[str, ...]) -> _Rules:
        names: list[str] = []
        networks: list[Network] = []
        for entry in entries:
            e = check_host_pattern(entry)
            if e != "*" and _NETWORKISH.fullmatch(e):
                networks.append(ipaddress.ip_network(e))
            else:
                names.append(e)
        return cls(tuple(names), tuple(networks))


# -- addresses ------------------------------------------------------------------------------------


def _plain(a: IPAddress) -> IPAddress:
    """An IPv4-mapped IPv6 address (::ffff:10.0.0.1) is the IPv4 address it maps: that is where a
    connection to it goes."""
    if isinstance(a, ipaddress.IPv6Address) and a.ipv4_mapped is not None:
        return a.ipv4_mapped
    return a


def is_public(a: IPAddress) -> bool:
    """A globally routed unicast address that is no cloud metadata address, and no IPv6 address
    that leads to an IPv4 address which is not public."""
    a = _plain(a)
    if a in METADATA or a.is_multicast or not a.is_global:
        return False
    if isinstance(a, ipaddress.IPv6Address):
        if any(a in n for n in _REFUSED_V6):
            return False
        if int(a) >> 32 == 0:  # IPv4-compatible ::a.b.c.d, deprecated: nothing legitimate uses it
            return False
        if a.sixtofour is not None:
            return is_public(a.sixtofour)
        if any(a in n for n in _NAT64):
            return is_public(ipaddress.IPv4Address(int(a) & 0xFFFFFFFF))
    return True


# Lookups that hang (a silent DNS server) keep a thread each until the resolver gives up; a few
# threads bound that, and the caller waits only RESOLVE_TIMEOUT_S.
_resolver = ThreadPoolExecutor(4, thread_name_prefix="resolve")


def _resolve(host: str, port: int, timeout: float) -> list[IPAddress]:
    fut = _resolver.submit(socket.getaddrinfo, host, port, 0, socket.SOCK_STREAM)
    try:
        infos = fut.result(timeout=timeout)
    except FutureTimeout:
        raise OutboundRefused(f"no answer for {host!r} within {timeout:g} s") from None
    except (OSError, UnicodeError) as e:
        raise OutboundRefused(f"{host!r} does not resolve ({e})") from None
    out: list[IPAddress] = []
    for info in infos:
        try:
            a = _plain(ipaddress.ip_address(str(info[4][0]).split("%", 1)[0]))
        except ValueError:
            continue
        if a not in out:
            out.append(a)
    if not out:
        raise OutboundRefused(f"{host!r} resolves to no IP address")
    # IPv4 first: the connection is pinned to one address, and RTMP servers often listen on IPv4
    # only (nginx-rtmp's `listen 1935`), where the resolver would put ::1 before 127.0.0.1.
    return sorted(out, key=lambda a: a.version)


# -- the policy -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class OutboundPolicy:
    """Which rtmp:// and rtmps:// URLs may be connected to (module doc)."""

    allowed_hosts: tuple[str, ...] = DEFAULT_ALLOWED_HOSTS
    allowed_ports: tuple[int, ...] = ()
    resolve_timeout: float = RESOLVE_TIMEOUT_S
    _rules: _Rules = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_rules", _Rules.parse(tuple(self.allowed_hosts)))

    @classmethod
    def from_config(cls, rc: RuntimeConfig) -> OutboundPolicy:
        return cls(tuple(rc.allowed_hosts), tuple(rc.allowed_ports))

    def decide(self, url: str) -> tuple[RtmpUrl, list[IPAddress]]:
        """The URL taken apart and the addresses it may connect to (all of its host's, checked), or
        OutboundRefused. Nothing is sent to the host; a name is resolved (the resolver is asked)."""
        try:
            u = parse_rtmp_url(url)
        except UrlSyntaxError as e:
            raise self._refuse(str(e)[:200]) from None
        port = u.effective_port
        where = f"{u.scheme}://{f'[{u.host}]' if ':' in u.host else u.host}:{port}"
        if port != SCHEME_PORTS[u.scheme] and port not in self.allowed_ports:
            raise self._refuse(f"{where}: port {port} is not in runtime.allowed_ports")
        addresses = [_plain(u.address)] if u.address is not None else _resolve(u.host, port,
                                                                              self.resolve_timeout)
        for a in addresses:
            if not self._allows(u.host, a):
                raise self._refuse(f"{where}: address {a} is not allowed by runtime.allowed_hosts")
        return u, addresses

    async def check(self, url: str) -> None:
        """`decide` without blocking the event loop (the lookup runs in a worker thread)."""
        await asyncio.get_running_loop().run_in_executor(None, self.decide, url)

    def _allows(self, host: str, a: IPAddress) -> bool:
        networks = [n for n in self._rules.networks if n.version == a.version]
        if a in METADATA:
            return any(n.num_addresses == 1 and a in n for n in networks)
        if any(a in n for n in networks):
            return True
        if not is_public(a):
            return False
        return any(fnmatch.fnmatchcase(host, pattern) for pattern in self._rules.names)

    @staticmethod
    def _refuse(reason: str) -> OutboundRefused:
        log.warning("outbound policy refused a URL: %s", reason)
        return OutboundRefused(reason)


# -- connecting -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class TlsSettings:
    """How rtmps:// servers are verified."""

    insecure: bool = False
    """Accept any certificate (--insecure-tls): labs only."""
    ca_file: Path | None = None
    """CA certificates (PEM); None: $SSL_CERT_FILE, else the system's."""


class TlsRelay:
    """The relay process of one rtmps:// connection (`tlsrelay.py`): TLS to the server is up and
    verified once this is built; FFmpeg connects to rtmp://127.0.0.1:`port`."""

    def __init__(self, host: str, addresses: list[str], port: int, tls: TlsSettings,
                 timeout: float = 5.0) -> None:
        cmd = [sys.executable, "-I", str(RELAY_SCRIPT), "--host", host, "--port", str(port),
               "--timeout", f"{timeout:g}"]
        for a in addresses:
            cmd += ["--address", a]
        if tls.insecure:
            cmd.append("--insecure")
        elif tls.ca_file is not None:
            cmd += ["--ca-file", str(tls.ca_file)]
        self._proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                      stderr=subprocess.DEVNULL)
        # The interpreter's start, the connection and the handshake, each bounded by `timeout`.
        line = self._first_line(timeout * (len(addresses) or 1) + 10.0)
        if not line.startswith("READY "):
            self.close()
            reason = line.removeprefix("ERROR ").strip() or "the TLS relay process did not start"
            if "certificate was not accepted" in reason:
                reason += ("; if this is the right server, give its CA certificate with "
                           "SSL_CERT_FILE or runtime.tls_ca_file, or for a lab server with a "
                           "self-signed certificate use --insecure-tls")
            raise TlsError(reason)
        self.port = int(line.split()[1])

    def _first_line(self, timeout: float) -> str:
        assert self._proc.stdout is not None
        fd = self._proc.stdout.fileno()
        buf = b""
        deadline = time.monotonic() + timeout
        with selectors.DefaultSelector() as sel:
            sel.register(fd, selectors.EVENT_READ)
            while b"\n" not in buf:
                left = deadline - time.monotonic()
                if left <= 0 or not sel.select(left):
                    return ""
                chunk = os.read(fd, 4096)
                if not chunk:
                    break
                buf += chunk
        return buf.split(b"\n", 1)[0].decode("utf-8", "replace")

    def close(self) -> None:
        """End the relay (it also ends by itself when either side closes). Safe to call twice."""
        if self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(2.0)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        if self._proc.stdout is not None:
            self._proc.stdout.close()


@dataclass
class Connection:
    """What FFmpeg opens for one connection to a URL, and what to release when it is closed."""

    url: str
    relay: TlsRelay | None = None

    def close(self) -> None:
        if self.relay is not None:
            self.relay.close()


class Outbound:
    """How live inputs and outputs connect: through the outbound policy, or with none (the operator's
    own URLs on the command line), and with rtmps:// verified unless `tls.insecure`."""

    def __init__(self, policy: OutboundPolicy | None = None, tls: TlsSettings | None = None) -> None:
        self.policy = policy
        self.tls = tls or TlsSettings()
        self._warned = False
        self._lock = threading.Lock()

    @classmethod
    def from_config(cls, rc: RuntimeConfig, *, enforce: bool) -> Outbound:
        """From the runtime section: the policy when `enforce` (URLs from the API), TLS always."""
        return cls(OutboundPolicy.from_config(rc) if enforce else None,
                   TlsSettings(rc.insecure_tls, rc.tls_ca_file))

    def connect(self, url: str, timeout: float = 5.0) -> Connection:
        """Check `url` (with a policy) and give the URL FFmpeg is to open for one connection: an
        rtmp:// URL pinned to the checked address, or rtmp:// to a verified TLS relay for rtmps://.
        Raises OutboundRefused, or TlsError (an OSError) when TLS to the server fails."""
        lowered = url.lower()
        if not lowered.startswith(("rtmp://", "rtmps://")):
            if self.policy is not None:
                raise OutboundRefused(f"scheme of {url.split('://', 1)[0][:20]!r}:// is not rtmp or rtmps")
            return Connection(url)
        if self.policy is not None:
            u, checked = self.policy.decide(url)
            addresses = [str(a) for a in checked]
        else:
            try:
                u = parse_rtmp_url(url)
            except UrlSyntaxError:
                if lowered.startswith("rtmp://"):
                    return Connection(url)  # the operator's own URL: FFmpeg judges it
                raise TlsError(f"cannot tell the host of {url.split('/')[2][:100]!r} for TLS") from None
            addresses = [u.host]  # the relay resolves it: no policy, nothing to pin
        if u.scheme == "rtmp":
            # The checked address, literally: FFmpeg makes no lookup of its own. (Servers that pick
            # a virtual host from the RTMP tcUrl see the address; nginx-rtmp and MediaMTX do not.)
            return Connection(u.to(addresses[0], u.effective_port) if self.policy else url)
        if self.tls.insecure:
            self._warn_insecure(u.host)
        relay = TlsRelay(u.host, addresses, u.effective_port, self.tls, timeout)
        # The RTMP tcUrl names the relay (as with stunnel in front of FFmpeg, which ingest services
        # such as Facebook's document); the stream key travels only inside the verified TLS.
        return Connection(u.to("127.0.0.1", relay.port, scheme="rtmp"), relay)

    def _warn_insecure(self, host: str) -> None:
        with self._lock:
            if self._warned:
                return
            self._warned = True
        log.warning("rtmps:// to %s: the server's certificate is NOT verified (--insecure-tls, "
                    "runtime.insecure_tls): whoever is on the path can read the stream key", host)
