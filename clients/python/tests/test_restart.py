"""A server restart that every client outlasts, with its default options."""

from __future__ import annotations

import json
import signal
import socket
import tempfile
import threading
import time
import unittest
from pathlib import Path

import turnstile_client as ts
from turnstile_client.v1 import agent_pb2

from .server import Server
from .test_conformance import user_request

#: Longer than the ten re-attaches of the client's former budget (about 6.4 s) took.
OUTAGE = 12.0

ANSWER = "A restart is an outage the client waits out, however many tries it takes, until the turn goes on where it stopped."


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RestartTest(unittest.TestCase):
    def test_a_server_killed_and_started_again_12s_later_loses_no_turn(self) -> None:
        tmp = tempfile.TemporaryDirectory(prefix="turnstile-py-restart-")
        self.addCleanup(tmp.cleanup)
        config = Path(tmp.name) / "turnstile.yaml"
        config.write_text(
            f"""listen: 127.0.0.1:{free_port()}
log: {{format: json, level: info}}
providers:
  sim: {{type: simulator, token_delay: 20ms}}
models:
  sim: {{provider: sim, model: turnstile-sim-1, context_window: 32000}}
default_model: sim
server: {{shutdown_grace: 100ms, drain_delay: 0s}}
store: {{mode: embedded, dir: {json.dumps(str(Path(tmp.name) / "jetstream"))}}}
"""
        )
        server = Server(config)
        self.addCleanup(lambda: server.stop())
        outcomes: list = [None, None]
        streaming = [threading.Event(), threading.Event()]

        def run(i: int) -> None:
            with ts.Client(server.addr) as client:
                turn = client.run_turn(user_request(f'[sim reply="{ANSWER}"] go on {i}'))
                text, step_retries = "", 0
                try:
                    for ev in turn.events():
                        if ev.step_retry is not None:
                            step_retries += 1
                            continue
                        kind = ev.agent.WhichOneof("payload")
                        if kind == "text_delta":
                            text += ev.agent.text_delta.text
                            streaming[i].set()
                        if kind == "retry" and ev.agent.retry.discard_partial:
                            text = ""  # the call taken over streams afresh
                except ts.TurnError as e:
                    outcomes[i] = e
                    return
                outcomes[i] = (turn.result, text.strip(), step_retries)

        threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
        for t in threads:
            t.start()
        for e in streaming:
            self.assertTrue(e.wait(30), "a turn never streamed")
        down = time.monotonic()
        server.stop(signal.SIGKILL)
        time.sleep(max(OUTAGE - (time.monotonic() - down), 0))
        server = Server(config)
        for t in threads:
            t.join(60)
        for i, out in enumerate(outcomes):
            with self.subTest(turn=i):
                self.assertIsInstance(out, tuple, f"the turn failed: {out}")
                result, text, step_retries = out
                self.assertEqual(result.end_reason, agent_pb2.END_REASON_END_TURN)
                self.assertEqual(step_retries, 0, "the run was not re-attached: a step retry ran it again")
                self.assertGreater(result.reattaches, 0)
                self.assertEqual(text, ANSWER)


if __name__ == "__main__":
    unittest.main()
