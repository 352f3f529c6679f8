"""The client's load-balancing policy over the addresses its target names."""

from __future__ import annotations

import socket
import threading
import unittest

import turnstile_client as ts

from .server import ServerTestCase
from .test_conformance import user_request


class Forwarder:
    """A TCP forwarder on a free loopback port to target (host:port) that counts the connections it took."""

    def __init__(self, target: str) -> None:
        host, _, port = target.rpartition(":")
        self._target = (host, int(port))
        self._lis = socket.create_server(("127.0.0.1", 0))
        self.addr = "127.0.0.1:%d" % self._lis.getsockname()[1]
        self.accepted = 0
        self._lock = threading.Lock()
        self._socks: list = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._lis.accept()
            except OSError:
                return
            up = socket.create_connection(self._target)
            with self._lock:
                self.accepted += 1
                self._socks += [conn, up]
            for a, b in ((conn, up), (up, conn)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def _pipe(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def close(self) -> None:
        self._lis.close()
        with self._lock:
            for s in self._socks:
                s.close()


class BalancingTest(ServerTestCase):
    def forwarders(self) -> "tuple[Forwarder, Forwarder]":
        a, b = Forwarder(self.server.addr), Forwarder(self.server.addr)
        self.addCleanup(a.close)
        self.addCleanup(b.close)
        return a, b

    def test_round_robin_by_default_connects_to_every_address(self) -> None:
        a, b = self.forwarders()
        # Two addresses for one name, as dns:/// over a headless Service gives.
        with ts.Client("ipv4:%s,%s" % (a.addr, b.addr)) as c:
            for _ in range(4):
                c.run_turn(user_request("hi")).wait()
        self.assertGreaterEqual(a.accepted, 1)
        self.assertGreaterEqual(b.accepted, 1)

    def test_pick_first_connects_to_one(self) -> None:
        a, b = self.forwarders()
        with ts.Client("ipv4:%s,%s" % (a.addr, b.addr), load_balancing_policy="pick_first") as c:
            for _ in range(4):
                c.run_turn(user_request("hi")).wait()
        self.assertEqual(a.accepted + b.accepted, 1)

    def test_an_unknown_policy_is_refused(self) -> None:
        with self.assertRaises(ValueError):
            ts.Client("127.0.0.1:1", load_balancing_policy="grpclb")


if __name__ == "__main__":
    unittest.main()
