"""A TCP relay in front of a MySQL/MariaDB server that counts the commands each
connection sends: what a client costs the server, measured on the wire.

Every command a MySQL client sends (``COM_QUERY``, ``COM_PING``, a prepared
statement's execution, ``COM_QUIT``) opens a new packet sequence: its first
packet has sequence number 0. The handshake's packets from the client have
numbers 1 and up, and so have the further packets of a payload longer than
16 MiB, so counting the client's packets numbered 0 counts its commands, the
same thing the server's ``Questions`` status counts for statements, but per
connection and without any statement of its own. It needs plain TCP (no TLS,
no compressed protocol: what PyMySQL and asyncmy speak unless told otherwise).

    with CommandCounter("127.0.0.1", 3306) as relay:
        url = sa.make_url(server_url).set(host="127.0.0.1", port=relay.port)
        ...
        relay.commands()  # every command sent through it so far
"""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from types import TracebackType

#: Command bytes worth naming in :attr:`Link.kinds`.
COMMANDS = {0x01: "quit", 0x03: "query", 0x0E: "ping", 0x16: "prepare", 0x17: "execute"}


@dataclass
class Link:
    """One relayed connection: the commands its client sent, by kind, and the
    text of its last query."""

    number: int
    commands: int = 0
    kinds: dict[str, int] = field(default_factory=dict)
    last_query: str = ""
    closed: bool = False
    _buffer: bytearray = field(default_factory=bytearray, repr=False)

    def feed(self, data: bytes) -> None:
        """Count the commands that begin in ``data`` (packets may span reads)."""
        buffer = self._buffer
        buffer += data
        while len(buffer) >= 4:
            length = int.from_bytes(buffer[:3], "little")
            if len(buffer) < 4 + length:
                return
            sequence = buffer[3]
            payload = bytes(buffer[4 : 4 + length])
            del buffer[: 4 + length]
            if sequence != 0 or not payload:
                continue
            self.commands += 1
            kind = COMMANDS.get(payload[0], f"0x{payload[0]:02x}")
            self.kinds[kind] = self.kinds.get(kind, 0) + 1
            if kind == "query":
                self.last_query = payload[1:200].decode("utf-8", "replace")


class CommandCounter:
    """Relays connections to ``host``:``port`` from a local port of its own
    (:attr:`port`), counting each client's commands (:class:`Link`)."""

    def __init__(self, host: str, port: int) -> None:
        self._upstream = (host, port)
        self._server = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._server.getsockname()[1]
        self._lock = threading.Lock()
        self.links: list[Link] = []
        self._sockets: list[socket.socket] = []
        self._threads: list[threading.Thread] = []
        self._closed = False
        self._accepting = self._start(self._accept, "relay-accept")

    def _start(self, target: Callable[..., None], name: str, *args: object) -> threading.Thread:
        thread = threading.Thread(target=target, args=args, name=name, daemon=True)
        thread.start()
        return thread

    def commands(self) -> int:
        """Every command relayed so far, over all connections."""
        with self._lock:
            return sum(link.commands for link in self.links)

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._server.accept()
            except OSError:
                return  # closed
            try:
                upstream = socket.create_connection(self._upstream)
            except OSError:
                client.close()
                continue
            for sock in (client, upstream):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            with self._lock:
                if self._closed:
                    client.close()
                    upstream.close()
                    return
                link = Link(len(self.links) + 1)
                self.links.append(link)
                self._sockets += [client, upstream]
                self._threads += [
                    self._start(self._pump, "relay-up", client, upstream, link),
                    self._start(self._pump, "relay-down", upstream, client, None),
                ]

    def _pump(self, source: socket.socket, sink: socket.socket, link: Link | None) -> None:
        try:
            while True:
                data = source.recv(65536)
                if not data:
                    break
                if link is not None:
                    with self._lock:
                        link.feed(data)
                sink.sendall(data)
        except OSError:
            pass
        finally:
            if link is not None:
                link.closed = True
            for sock in (source, sink):
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            sockets, self._sockets = self._sockets, []
            threads, self._threads = self._threads, []
        with contextlib.suppress(OSError):
            self._server.shutdown(socket.SHUT_RDWR)  # ends the accept() waiting
        self._server.close()
        for sock in sockets:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()
        for thread in [self._accepting, *threads]:
            thread.join(5)

    def __enter__(self) -> CommandCounter:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
