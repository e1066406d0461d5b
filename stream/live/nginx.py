"""nginx with the RTMP module: a config builder (a pure function) and a process wrapper.

SwapStream does not speak RTMP's handshake itself: a real server (nginx-rtmp here, or MediaMTX)
accepts publishers such as OBS, and SwapStream pulls from it and pushes back to it. The config's
`on_publish` points at SwapStream's stream-key check (`live/auth.py`), so a wrong key is refused by
the server before any media flows.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import time
from pathlib import Path
from types import TracebackType

from ..errors import ConfigError, SwapStreamError

RTMP_MODULE_PATHS = ("/usr/lib/nginx/modules/ngx_rtmp_module.so",
                     "/usr/share/nginx/modules/ngx_rtmp_module.so")

# What may be pasted into nginx.conf. Allowlists, matched whole (`fullmatch`): nginx ends a directive
# at ';', opens and closes blocks at '{' '}', quotes with ' and ", comments with '#', expands '$'
# and escapes with '\'; whitespace separates arguments and a newline could start a directive.
APP_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
CONF_PATH = re.compile(r"/[A-Za-z0-9._/+@%,=:~-]{0,1023}")
AUTH_URL = re.compile(r"https?://(?:[A-Za-z0-9.-]{1,253}|\[[0-9A-Fa-f:.]{2,45}\])(?::[0-9]{1,5})?"
                      r"(?:/[A-Za-z0-9._~/%+=&?:@,!-]{0,1000})?")
USER_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]{0,31}")


def _checked(what: str, value: str, pattern: re.Pattern[str], expected: str) -> str:
    if not pattern.fullmatch(value):
        raise ConfigError(f"{what} {value!r} cannot go into nginx.conf: it must be {expected}")
    return value


def nginx_rtmp_config(*, rtmp_port: int, prefix: Path, app: str = "live",
                      auth_url: str | None = None, module_path: str | None = None,
                      user: str | None = None) -> str:
    """An nginx.conf for one RTMP application on 127.0.0.1:`rtmp_port`, running unprivileged in
    `prefix` (pid, logs and temp files there), with live streams only (no recording) and, when
    `auth_url` is given, publishers checked by an HTTP callback (2xx accepts, anything else refuses).
    `user`: nginx started as root looks up its build's default user (www-data on Debian) unless
    told one, and refuses to start on a machine without it; `NginxRtmp` passes root's own name.

    Every value is checked against an allowlist before it is written (a `;`, brace, quote, space or
    newline would end the directive and start another): ConfigError names the value and the rule."""
    _checked("the RTMP application name", app, APP_NAME, "1-64 letters, digits, '_' or '-'")
    path_rule = ("an absolute path of letters, digits and . _ / + @ % , = : ~ - (no spaces, quotes, "
                 "';', braces, '#', '$' or '\\')")
    _checked("the nginx prefix folder", str(prefix), CONF_PATH, path_rule)
    if module_path is not None:
        _checked("the RTMP module path", module_path, CONF_PATH, path_rule)
    if auth_url is not None:
        _checked("the on_publish URL", auth_url, AUTH_URL,
                 "an http:// or https:// URL with a host, an optional port and a path without spaces, "
                 "quotes, ';', braces, '#', '$' or '\\'")
    if user is not None:
        _checked("the nginx user", user, USER_NAME, "a user name of letters, digits, '_', '.' or '-'")
    if isinstance(rtmp_port, bool) or not isinstance(rtmp_port, int) or not 1 <= rtmp_port <= 65535:
        raise ConfigError(f"the RTMP port {rtmp_port!r} cannot go into nginx.conf: it must be a whole "
                          f"number from 1 to 65535")
    load = f"load_module {module_path};\n" if module_path else ""
    auth = f"            on_publish {auth_url};\n" if auth_url else ""
    who = f"user {user};\n" if user else ""
    return (
        f"{load}"
        f"{who}"
        f"daemon off;\n"
        f"master_process off;\n"
        f"pid {prefix}/nginx.pid;\n"
        f"error_log {prefix}/error.log info;\n"
        f"events {{ worker_connections 256; }}\n"
        f"rtmp {{\n"
        f"    access_log off;\n"  # its default is a path under /var/log, which may not exist
        f"    server {{\n"
        f"        listen 127.0.0.1:{rtmp_port};\n"
        f"        chunk_size 4096;\n"
        f"        application {app} {{\n"
        f"            live on;\n"
        f"            record off;\n"
        f"{auth}"
        f"        }}\n"
        f"    }}\n"
        f"}}\n"
    )


def free_port() -> int:
    """An ephemeral TCP port on loopback that was free a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_for_port(port: int, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise SwapStreamError(f"nothing listens on 127.0.0.1:{port} after {timeout:.0f} s")


def find_nginx_rtmp(env: dict[str, str] | None = None) -> tuple[str, str]:
    """The nginx binary and its RTMP module: $SWAPSTREAM_NGINX and $SWAPSTREAM_NGINX_RTMP_MODULE
    where set (an nginx of its own, e.g. on a machine without the Debian packages), else the
    Debian packages' paths. Raises `SwapStreamError` naming what to install."""
    env = dict(os.environ) if env is None else env
    binary = env.get("SWAPSTREAM_NGINX") or shutil.which("nginx") or (
        "/usr/sbin/nginx" if Path("/usr/sbin/nginx").exists() else None)
    if binary is None or not Path(binary).exists():
        raise SwapStreamError("nginx is not installed: install the Debian packages nginx and "
                              "libnginx-mod-rtmp (or point SwapStream at another RTMP server)")
    given = env.get("SWAPSTREAM_NGINX_RTMP_MODULE")
    module = given or next((p for p in RTMP_MODULE_PATHS if Path(p).exists()), None)
    if module is None or not Path(module).exists():
        raise SwapStreamError("nginx's RTMP module is missing: install libnginx-mod-rtmp")
    return binary, module


def _root_name() -> str:
    import pwd

    return pwd.getpwuid(0).pw_name


class NginxRtmp:
    """An nginx-rtmp server process on loopback, for local setups and tests. Context manager."""

    def __init__(self, prefix: Path, *, rtmp_port: int | None = None, app: str = "live",
                 auth_url: str | None = None) -> None:
        binary, module = find_nginx_rtmp()
        self.binary = binary
        self.prefix = prefix
        self.port = rtmp_port or free_port()
        self.app = app
        prefix.mkdir(parents=True, exist_ok=True)
        self.conf = prefix / "nginx.conf"
        self.conf.write_text(nginx_rtmp_config(rtmp_port=self.port, prefix=prefix, app=app,
                                               auth_url=auth_url, module_path=module,
                                               user=_root_name() if os.geteuid() == 0 else None))
        self._proc: subprocess.Popen[bytes] | None = None

    def url(self, key: str) -> str:
        return f"rtmp://127.0.0.1:{self.port}/{self.app}/{key}"

    def start(self) -> "NginxRtmp":
        self._proc = subprocess.Popen([self.binary, "-p", str(self.prefix), "-c", str(self.conf)],
                                      stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        try:
            wait_for_port(self.port)
        except SwapStreamError:
            said = b""
            if self._proc.poll() is not None and self._proc.stderr is not None:
                said = self._proc.stderr.read()[-400:]  # it exited: what it said on the way out
            self.stop()
            log = (self.prefix / "error.log")
            tail = (log.read_text()[-400:] if log.exists() else "") + said.decode(errors="replace")
            raise SwapStreamError(f"nginx did not start on port {self.port}: {tail.strip()}") from None
        return self

    def stop(self) -> None:
        if self._proc is not None:
            self._proc.terminate()
            try:
                self._proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
            self._proc = None

    def __enter__(self) -> "NginxRtmp":
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()
