"""The shared conformance scenarios (clients/conformance) on a live server."""

from __future__ import annotations

import json
import re
import unittest

import turnstile_client as ts
from turnstile.v1 import agent_pb2, conversation_pb2

from .server import CONFORMANCE, ServerTestCase


def user_request(text: str) -> agent_pb2.RunTurnRequest:
    return agent_pb2.RunTurnRequest(
        messages=[conversation_pb2.Message(role=conversation_pb2.ROLE_USER, parts=[conversation_pb2.Part(text=text)])]
    )


def role_names(msgs) -> list:
    return [conversation_pb2.Role.Name(m.role).removeprefix("ROLE_") for m in msgs]


def message_text(m: conversation_pb2.Message) -> str:
    return "".join(p.text for p in m.parts if p.WhichOneof("kind") == "text")


class KeptText:
    """Follows the discard signals as a consumer must.

    A server retry or fallback drops its attempt's deltas from
    discard_from_seq on; a step retry that discards drops everything since the
    last message that stands.
    """

    def __init__(self) -> None:
        self.deltas: list = []  # (attempt, seq, text)
        self.marks: list = []  # len(deltas) at each committed message

    def event(self, ev: ts.Event) -> None:
        if ev.step_retry is not None:
            if ev.step_retry.discard_partial:
                m = len(ev.step_retry.messages)
                cut = self.marks[m - 1] if 0 < m <= len(self.marks) else 0
                self.deltas, self.marks = self.deltas[:cut], self.marks[:m]
            return
        a = ev.agent
        kind = a.WhichOneof("payload")
        if kind == "text_delta":
            self.deltas.append((ev.attempt, a.seq, a.text_delta.text))
        elif kind == "message_completed":
            self.marks.append(len(self.deltas))
        elif kind in ("retry", "fallback"):
            p = getattr(a, kind)
            if p.discard_partial:
                self.deltas = [d for d in self.deltas if d[0] != ev.attempt or d[1] < p.discard_from_seq]

    def __str__(self) -> str:
        return "".join(d[2] for d in self.deltas)


def observe(client: ts.Client, prompt: str, cancel_on: str | None) -> dict:
    turn = client.run_turn(user_request(prompt), timeout=30)
    obs: dict = {"step_retries": [], "tools_started": []}
    kept = KeptText()
    failure = None
    try:
        for ev in turn.events():
            kept.event(ev)
            if ev.step_retry is not None:
                sr = ev.step_retry
                obs["step_retries"].append(
                    {
                        "attempt": sr.attempt,
                        "code": ts.code_name(sr.error.code),
                        "discard_partial": sr.discard_partial,
                        "messages": len(sr.messages),
                    }
                )
                continue
            kind = ev.agent.WhichOneof("payload")
            if kind == "tool_started":
                obs["tools_started"].append(ev.agent.tool_started.name)
            if cancel_on == "text_delta" and kind == "text_delta":
                turn.cancel()
    except ts.TurnError as e:
        failure = e
    obs["kept_text"] = str(kept)
    res = turn.result
    if res is not None:
        obs["outcome"] = "completed"
        obs["end_reason"] = agent_pb2.EndReason.Name(res.end_reason).removeprefix("END_REASON_")
        obs["attempts"] = res.attempts
        obs["roles"] = role_names(res.messages)
        if res.messages:
            obs["final_text"] = message_text(res.messages[-1])
        return obs
    if failure is None:
        raise AssertionError("the turn ended with neither a result nor a TurnError")
    assert turn.error is failure
    obs["outcome"] = "error"
    obs["code"] = ts.code_name(failure.code)
    obs["retryable"] = failure.retryable
    obs["attempts"] = failure.attempts
    obs["roles"] = role_names(failure.messages)
    if failure.status_code is not None:
        obs["status"] = failure.status_code.name
    return obs


class ConformanceTest(ServerTestCase):
    @classmethod
    def setUpClass(cls) -> None:
        super().setUpClass()
        cls.conf = json.loads((CONFORMANCE / "scenarios.json").read_text())
        cc = cls.conf["client"]
        cls.client = ts.Client(
            cls.server.addr,
            max_step_retries=cc["max_step_retries"],
            backoff=ts.Backoff(initial=cc["backoff_initial_ms"] / 1000, maximum=cc["backoff_max_ms"] / 1000, jitter=0),
        )

    @classmethod
    def tearDownClass(cls) -> None:
        cls.client.close()
        super().tearDownClass()



def _scenario_test(sc: dict):
    def test(self: ConformanceTest) -> None:
        obs = observe(self.client, sc["prompt"], sc.get("cancel_on"))
        for key, want in sc["expect"].items():
            self.assertEqual(obs.get(key), want, f"{sc['name']}: {key}")

    test.__doc__ = sc["name"]
    return test


# One test per scenario of the shared file.
for _sc in json.loads((CONFORMANCE / "scenarios.json").read_text())["scenarios"]:
    setattr(ConformanceTest, "test_" + re.sub(r"\W+", "_", _sc["name"]), _scenario_test(_sc))


if __name__ == "__main__":
    unittest.main()
