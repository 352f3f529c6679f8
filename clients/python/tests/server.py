"""Starts `turnstile serve` for the tests, on a free loopback port."""

from __future__ import annotations

import json
import os
import pathlib
import queue
import signal
import subprocess
import tempfile
import threading
import unittest

REPO = pathlib.Path(__file__).resolve().parents[3]
CONFORMANCE = REPO / "clients" / "conformance"


class Server:
    """A running `turnstile serve --config config`.

    TURNSTILE_BIN names a built binary; without it one is built with the Go
    toolchain. The configuration listens on 127.0.0.1:0 and logs JSON; the
    address comes from its "serving" line.
    """

    def __init__(self, config: pathlib.Path = CONFORMANCE / "server.yaml") -> None:
        binary = os.environ.get("TURNSTILE_BIN")
        if not binary:
            self._tmp = tempfile.TemporaryDirectory(prefix="turnstile-py-")
            binary = os.path.join(self._tmp.name, "turnstile")
            subprocess.run(["go", "build", "-o", binary, "./cmd/turnstile"], cwd=REPO, check=True)
        self._proc = subprocess.Popen(
            [binary, "serve", "--config", str(config)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        lines: "queue.Queue[str | None]" = queue.Queue()
        threading.Thread(target=self._read, args=(lines,), daemon=True).start()
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
        for line in self._proc.stderr:
            lines.put(line)
        lines.put(None)

    def stop(self) -> None:
        """Stops the server with SIGTERM and waits for it."""
        if self._proc.poll() is None:
            self._proc.send_signal(signal.SIGTERM)
            try:
                self._proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()


class ServerTestCase(unittest.TestCase):
    """A test case whose tests share one live server, started for the class."""

    server: Server

    @classmethod
    def setUpClass(cls) -> None:
        cls.server = Server()

    @classmethod
    def tearDownClass(cls) -> None:
        cls.server.stop()
