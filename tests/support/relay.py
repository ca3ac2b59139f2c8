"""A TCP relay on 127.0.0.1 for tests that watch or slow down what a client sends a server."""

from __future__ import annotations

import contextlib
import socket
import threading
from typing import Callable, Optional

Hook = Callable[[bytes], None]


class Relay:
    """Listens on 127.0.0.1 (``port``) and connects every client to ``target``; each chunk
    passes ``upstream`` (client to server) or ``downstream`` (server to client) before it is
    forwarded, so a hook can record it or hold it back. An end of stream is passed on as a
    half-close; ``close`` stops accepting."""

    def __init__(
        self,
        target: tuple[str, int],
        upstream: Optional[Hook] = None,
        downstream: Optional[Hook] = None,
    ) -> None:
        self.target = target
        self.hooks = (upstream, downstream)
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            server = socket.create_connection(self.target)
            upstream, downstream = self.hooks
            for src, dst, hook in ((client, server, upstream), (server, client, downstream)):
                threading.Thread(target=self._pump, args=(src, dst, hook), daemon=True).start()

    @staticmethod
    def _pump(src: socket.socket, dst: socket.socket, hook: Optional[Hook]) -> None:
        try:
            while data := src.recv(65536):
                if hook is not None:
                    hook(data)
                dst.sendall(data)
        except OSError:
            pass
        with contextlib.suppress(OSError):
            dst.shutdown(socket.SHUT_WR)

    def close(self) -> None:
        self.listener.close()
