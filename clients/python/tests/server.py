"""Starts `turnstile serve` for the tests, on a free loopback port."""

from __future__ import annotations

import json
import os
import pathlib
import queue
import signal
import socket
import subprocess
import tempfile
import threading
import unittest

#: The repository: TURNSTILE_REPO, or the checkout the tests are in. CI runs
#: a copy of the tests against the installed package, naming the checkout.
REPO = pathlib.Path(os.environ.get("TURNSTILE_REPO") or pathlib.Path(__file__).resolve().parents[3])
CONFORMANCE = REPO / "clients" / "conformance"


_build: "tempfile.TemporaryDirectory[str] | None" = None


def _built() -> str:
    """Builds the turnstile binary once for every server of this process."""
    global _build
    if _build is None:
        _build = tempfile.TemporaryDirectory(prefix="turnstile-py-")
        subprocess.run(["go", "build", "-o", os.path.join(_build.name, "turnstile"), "./cmd/turnstile"], cwd=REPO, check=True)
    return os.path.join(_build.name, "turnstile")


class Server:
    """A running `turnstile serve --config config`.

    TURNSTILE_BIN names a built binary; without it one is built with the Go
    toolchain. The configuration listens on 127.0.0.1:0 and logs JSON; the
    address comes from its "serving" line.
    """

    def __init__(self, config: pathlib.Path = CONFORMANCE / "server.yaml") -> None:
        binary = os.environ.get("TURNSTILE_BIN") or _built()
        self._proc = subprocess.Popen(
            [binary, "serve", "--config", str(config)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        lines: "queue.Queue[str | None]" = queue.Queue()
        self._reader = threading.Thread(target=self._read, args=(lines,), daemon=True)
        self._reader.start()
        log = []
        while True:
            try:
                line = lines.get(timeout=30)
            except queue.Empty:
                self.stop()
                raise RuntimeError("turnstile serve did not log its address within 30s") from None
            if line is None:
                raise RuntimeError("turnstile serve exited before serving:\n" + "".join(log))
            try:
                rec = json.loads(line)
            except ValueError:
                rec = {}
            if rec.get("msg") == "serving":
                self.addr: str = rec["address"]
                return
            log.append(line)

    def _read(self, lines: "queue.Queue[str | None]") -> None:
        assert self._proc.stderr is not None
        with self._proc.stderr:  # closed once the server has exited
            for line in self._proc.stderr:
                lines.put(line)
        lines.put(None)

    def stop(self, sig: signal.Signals = signal.SIGTERM) -> None:
        """Stops the server with sig (SIGTERM by default) and waits for it."""
        if self._proc.poll() is None:
            self._proc.send_signal(sig)
            try:
                self._proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        self._reader.join(timeout=10)


class CutProxy:
    """A TCP proxy on a free loopback port in front of target (host:port) that cuts its connections once.

    It forwards bytes both ways and cuts every connection, once, the first
    time the server sends an HTTP/2 DATA frame holding the bytes of on,
    instead of forwarding that frame; with refuse it then takes no new
    connection, else it forwards them as before. A server's side of an
    HTTP/2 connection is frames from its first byte: a 9-byte header (24-bit
    length, type, flags, stream id), then the payload.
    """

    def __init__(self, target: str, on: str, refuse: bool = False) -> None:
        host, _, port = target.rpartition(":")
        self._target = (host, int(port))
        self._marker = on.encode()
        self._refuse = refuse
        self._lock = threading.Lock()
        self._socks: list = []
        self._cut = False
        self._lis = socket.create_server(("127.0.0.1", 0))
        self.addr = "127.0.0.1:%d" % self._lis.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                c, _ = self._lis.accept()
            except OSError:
                return
            try:
                up = socket.create_connection(self._target)
            except OSError:
                c.close()
                continue
            with self._lock:
                self._socks += [c, up]
            threading.Thread(target=self._upstream, args=(c, up), daemon=True).start()
            threading.Thread(target=self._downstream, args=(up, c), daemon=True).start()

    @staticmethod
    def _upstream(c: socket.socket, up: socket.socket) -> None:
        try:
            while data := c.recv(65536):
                up.sendall(data)
        except OSError:
            pass
        up.close()

    def _downstream(self, up: socket.socket, c: socket.socket) -> None:
        buf = b""
        try:
            while data := up.recv(65536):
                buf += data
                while len(buf) >= 9:
                    size = 9 + int.from_bytes(buf[:3], "big")
                    if len(buf) < size:
                        break
                    frame, buf = buf[:size], buf[size:]
                    if frame[3] == 0 and self._cut_on(frame[9:]):
                        return
                    c.sendall(frame)
        except OSError:
            pass
        finally:
            c.close()

    def _cut_on(self, payload: bytes) -> bool:
        """Cuts every connection when payload is the first to hold the marker; reports whether it did."""
        with self._lock:
            if self._cut or self._marker not in payload:
                return False
            self._cut = True
            if self._refuse:
                self._stop_listening()
            self._close_all()
            return True

    def _close_all(self) -> None:
        for s in self._socks:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()
        self._socks = []

    def _stop_listening(self) -> None:
        # A blocked accept() keeps a closed listener open; shutdown ends it.
        try:
            self._lis.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._lis.close()

    @property
    def cut(self) -> bool:
        """Whether it has cut the connections."""
        with self._lock:
            return self._cut

    def close(self) -> None:
        """Closes the proxy and every connection through it."""
        self._stop_listening()
        with self._lock:
            self._close_all()


class ServerTestCase(unittest.TestCase):
    """A test case whose tests share one live server, started for the class."""

    server: Server

    @classmethod
    def setUpClass(cls) -> None:
        cls.server = Server()

    @classmethod
    def tearDownClass(cls) -> None:
        cls.server.stop()
