"""examples/python/hello.py, run as a program against a live server."""

from __future__ import annotations

import os
import subprocess
import sys
import unittest

from .server import REPO, ServerTestCase


class ExampleTest(ServerTestCase):
    def run_example(self, *args: str) -> subprocess.CompletedProcess:
        # The example imports turnstile_client as this process does: installed, or on PYTHONPATH.
        env = dict(os.environ, TURNSTILE_ADDR=self.server.addr)
        return subprocess.run(
            [sys.executable, str(REPO / "examples" / "python" / "hello.py"), *args],
            env=env, capture_output=True, text=True, timeout=60,
        )

    def test_streams_the_reply_across_a_step_retry(self) -> None:
        p = self.run_example('[sim fail=server_error times=1 after=1] [sim reply="Hello from Python."]', "hi")
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertEqual(p.stdout, "Hello \n[retrying: SERVER_ERROR]\nHello from Python.\nEND_REASON_END_TURN\n")

    def test_reports_a_failed_turn(self) -> None:
        p = self.run_example("[sim fail=auth] hi")
        self.assertEqual(p.returncode, 1)
        self.assertIn("AUTH: invalid x-api-key", p.stderr)


if __name__ == "__main__":
    unittest.main()
