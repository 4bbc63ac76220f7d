"""The node's one HTTP endpoint (metrics_address:metrics_port, 127.0.0.1:9840 by default).

    server = start_web_server(client, "127.0.0.1", 9840, ("rig", "secret"))
    ...
    server.shutdown(); server.server_close()

``GET /metrics``        Prometheus' text (rig.metrics), no login: Prometheus scrapes it.
``GET /``               rig's web page (rig/web/page.html, one file, no outside assets).
``GET /api/overview``   the page's data (rig.web.overview), polled by the page.

The page and its data need HTTP basic auth with rig's admin login, the one Flower takes
(rig.stack.flower_credentials): both compared in constant time, never an empty one. A refused
login gets the browser's challenge (WWW-Authenticate) on the page only: on the data it would make
the page's fetch fail outright, and the page says the login was refused instead. HEAD answers
headers only (the data's without reading Redis). Anything else is a 404. A WSGI
app on wsgiref's server with a thread per request (what prometheus_client's own server is),
so a slow Redis read never holds up a scrape. Each request first asks rig.redis_up (about a
second): a Redis outage is `rig_redis_up 0` and a 503 line at once, not a wait.
"""

from __future__ import annotations

import base64
import binascii
import hmac
import json
import logging
import socket
from collections.abc import Callable, Iterable
from importlib import resources
from socketserver import ThreadingMixIn
from typing import TYPE_CHECKING, Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

import redis
from prometheus_client import make_wsgi_app

from rig.errors import RigError
from rig.metrics import make_registry
from rig.redis_up import RedisUp

if TYPE_CHECKING:
    from rig.client import Client

log = logging.getLogger(__name__)

PAGE_PATH = "/"
DATA_PATH = "/api/overview"
METRICS_PATH = "/metrics"
#: What a request without the right login is told (the page's realm names rig).
LOGIN_NEEDED = ("rig's page needs rig's admin login: the user and password Flower takes "
                "(`rig up` prints where they are)\n")

StartResponse = Callable[..., Any]


#: Connections the kernel holds while every thread is busy starting (socketserver's default, 5,
#: timed out a burst of 100 requests).
LISTEN_BACKLOG = 128


class _Server(ThreadingMixIn, WSGIServer):
    daemon_threads = True  # a hung browser never holds up `rig down`
    request_queue_size = LISTEN_BACKLOG


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - http.server's name
        log.debug("web: " + format, *args)


def page_html() -> bytes:
    """The page (package data: rig/web/page.html)."""
    return resources.files("rig.web").joinpath("page.html").read_bytes()


def authorised(header: str | None, user: str, password: str) -> bool:
    """Does an ``Authorization`` header carry ``user`` and ``password`` (basic auth)? Both are
    compared in constant time, whatever the header holds. Never with an empty user or password
    (rig.stack.check_login refuses those; this holds even if a caller skipped it)."""
    given_user, given_password = b"", b""
    if header and header[:6].lower() == "basic ":
        try:
            decoded = base64.b64decode(header[6:].strip(), validate=True)
        except (binascii.Error, ValueError):
            decoded = b""
        given_user, _, given_password = decoded.partition(b":")
    ok_user = hmac.compare_digest(given_user, user.encode())
    ok_password = hmac.compare_digest(given_password, password.encode())
    return ok_user and ok_password and bool(user) and bool(password)


def make_app(client: Client, credentials: tuple[str, str],
             probe: RedisUp | None = None) -> Callable[[dict, StartResponse], Iterable[bytes]]:
    """The WSGI app serving the three paths (see the module doc). ``probe``: asked before any
    read, so an outage is answered within about a second (default: one for the client's URL)."""
    from rig.web.overview import overview

    probe = probe or RedisUp(client.settings.redis_url)
    metrics = make_wsgi_app(make_registry(client, probe))
    user, password = credentials
    page = page_html()

    def app(environ: dict, start_response: StartResponse) -> Iterable[bytes]:
        path = environ.get("PATH_INFO") or "/"
        if path == METRICS_PATH:
            return metrics(environ, start_response)
        if path not in (PAGE_PATH, DATA_PATH):
            return _reply(start_response, "404 Not Found", b"not found: rig serves /, /api/overview and /metrics\n")
        if environ.get("REQUEST_METHOD", "GET") not in ("GET", "HEAD"):
            return _reply(start_response, "405 Method Not Allowed", b"only GET\n", [("Allow", "GET, HEAD")])
        head = environ.get("REQUEST_METHOD") == "HEAD"
        if not authorised(environ.get("HTTP_AUTHORIZATION"), user, password):
            # The challenge only on the page: on the data, a browser's fetch fails outright on
            # it ("Failed to fetch"), and the open page could not say that the login changed.
            challenge = [("WWW-Authenticate", 'Basic realm="rig", charset="UTF-8"')] if path == PAGE_PATH else []
            return _reply(start_response, "401 Unauthorized", LOGIN_NEEDED.encode(), challenge, head=head)
        if path == PAGE_PATH:
            return _reply(start_response, "200 OK", page, content_type="text/html; charset=utf-8", head=head)
        if head:  # headers only, and no Redis read (not even the probe)
            start_response("200 OK", _HEADERS + [("Content-Type", "application/json")])
            return []
        down = probe.down()
        if down:  # at once, not after the client's fail-over window
            return _error(start_response, "503 Service Unavailable", f"cannot read rig's state: {down}")
        try:
            data = overview(client, login=user)
        except (RigError, redis.RedisError, OSError) as exc:
            # The page keeps what it shows and says this, retrying at its next poll.
            return _error(start_response, "503 Service Unavailable", f"cannot read rig's state: {_line(exc)}")
        except Exception as exc:  # noqa: BLE001 - a server's edge: one line, the traceback in the log
            log.exception("web: /api/overview failed")
            return _error(start_response, "500 Internal Server Error",
                          f"rig's page could not be made ({type(exc).__name__}: {_line(exc)}); the traceback "
                          "is in rig up's log")
        return _reply(start_response, "200 OK", json.dumps(data, default=str).encode(),
                      content_type="application/json")

    return app


def _line(exc: BaseException) -> str:
    return str(exc).splitlines()[0] if str(exc) else type(exc).__name__


def _error(start_response: StartResponse, status: str, line: str) -> list[bytes]:
    """The data endpoint's failure: ``{"error": line}``, which the page shows as one line."""
    return _reply(start_response, status, json.dumps({"error": line}).encode(), content_type="application/json")


#: On every answer: not cached (fresh figures), never framed by another site, no script or
#: style from anywhere but the page itself.
_HEADERS = [("Cache-Control", "no-store"), ("X-Frame-Options", "DENY"), ("X-Content-Type-Options", "nosniff"),
            ("Content-Security-Policy", "default-src 'none'; script-src 'unsafe-inline'; "
             "style-src 'unsafe-inline'; connect-src 'self'; img-src 'self' data:")]


def _reply(start_response: StartResponse, status: str, body: bytes, headers: list[tuple[str, str]] | None = None,
           content_type: str = "text/plain; charset=utf-8", head: bool = False) -> list[bytes]:
    """One answer; ``head``: its headers only (HEAD)."""
    start_response(status, [("Content-Type", content_type), ("Content-Length", str(len(body))),
                            *_HEADERS, *(headers or [])])
    return [] if head else [body]


def _family(address: str, port: int) -> tuple[socket.AddressFamily, str]:
    """The socket family and host to bind for ``address`` (IPv4, IPv6, a name; "[::1]" too)."""
    host = address.strip("[]")
    family, _, _, _, sockaddr = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                                   flags=socket.AI_PASSIVE)[0]
    return family, sockaddr[0]


def start_web_server(client: Client, address: str, port: int, credentials: tuple[str, str]) -> WSGIServer:
    """Serve the endpoint on ``address:port`` from a daemon thread; returns the server (call
    ``.shutdown()`` then ``.server_close()`` to stop it; ``.server_port`` is the port actually
    bound, useful with port 0). Raises OSError when it cannot listen there."""
    import threading

    family, host = _family(address, port)

    class Server(_Server):
        address_family = family

    server = make_server(host, port, make_app(client, credentials), Server, handler_class=_QuietHandler)
    threading.Thread(target=server.serve_forever, name="rig-web", daemon=True).start()
    return server
