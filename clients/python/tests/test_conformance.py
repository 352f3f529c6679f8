"""The shared conformance scenarios (clients/conformance) on a live server."""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import re
import unittest

import grpc
from google.protobuf import json_format
import turnstile_client as ts
from turnstile_client.v1 import agent_pb2, agent_pb2_grpc, conversation_pb2

from .hitl import HitlRun
from .server import CONFORMANCE, CutProxy, Server

REATTACHING = "turnstile: re-attaching to the turn"


def user_request(text: str, media: list | None = None, history: list | None = None) -> agent_pb2.RunTurnRequest:
    """The scenario's history ({role, text} each), then the prompt and its media made with ts.media_part as one user message."""
    before = [
        conversation_pb2.Message(role=conversation_pb2.Role.Value("ROLE_" + h["role"]), parts=[conversation_pb2.Part(text=h["text"])])
        for h in history or []
    ]
    parts = [conversation_pb2.Part(text=text)]
    parts += [ts.media_part(base64.b64decode(m["data_base64"]), m["mime_type"], m["name"]) for m in media or []]
    return agent_pb2.RunTurnRequest(messages=before + [conversation_pb2.Message(role=conversation_pb2.ROLE_USER, parts=parts)])


def scenario_request(sc: dict) -> agent_pb2.RunTurnRequest:
    """The scenario's request: its history, prompt and media, with the fields of its `request` (protojson)."""
    req = json_format.ParseDict(sc.get("request", {}), agent_pb2.RunTurnRequest())
    req.MergeFrom(user_request(sc["prompt"], sc.get("media"), sc.get("history")))
    return req


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


class ReattachCounter(logging.Handler):
    """Counts the client's re-attaches from its log records."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.count = 0

    def emit(self, record: logging.LogRecord) -> None:
        if record.getMessage().startswith(REATTACHING):
            self.count += 1


def client_options(opts: dict, logger: logging.Logger) -> dict:
    """A client's options from a scenario's (delays in ms, no jitter)."""
    return dict(
        max_step_retries=opts["max_step_retries"],
        backoff=ts.Backoff(initial=opts["backoff_initial_ms"] / 1000, maximum=opts["backoff_max_ms"] / 1000, jitter=0),
        reattach_timeout=opts["reattach_timeout_ms"] / 1000,
        max_reattaches=opts.get("max_reattaches"),
        reattach_backoff=ts.Backoff(
            initial=opts["reattach_backoff_initial_ms"] / 1000, maximum=opts["reattach_backoff_max_ms"] / 1000, jitter=0
        ),
        logger=logger,
    )


def stored_log(addr: str, turn_id: str) -> list:
    """The run's stored log (attempt 1), read with WatchTurn."""
    events = []
    with grpc.insecure_channel(addr) as ch:
        try:
            for r in agent_pb2_grpc.AgentServiceStub(ch).WatchTurn(
                agent_pb2.WatchTurnRequest(turn_id=turn_id, attempt=1), timeout=10
            ):
                if r.HasField("event"):
                    events.append(r.event)
        except grpc.RpcError:
            # A failed run's stream ends with its status, after its events.
            if not events:
                raise
    return events


def observe_log(addr: str, turn_id: str, obs: dict) -> None:
    """Notes the stored run's model calls and how it ends."""
    log = stored_log(addr, turn_id)
    obs["log_model_calls"] = sum(1 for e in log if e.WhichOneof("payload") == "llm_call_started")
    if log:
        last = log[-1]
        if last.WhichOneof("payload") == "turn_completed":
            obs["log_end"] = "COMPLETED"
        elif last.WhichOneof("payload") == "error":
            obs["log_end"] = ts.code_name(last.error.code)


class Observation:
    """What a runner observes of one turn, event by event, in the keys of the scenarios' expect."""

    def __init__(self, cancel_on: str | None) -> None:
        self.cancel_on = cancel_on
        self.obs: dict = {"step_retries": [], "tools_started": [], "seq_gapless": True, "terminal_events": 0, "compactions": 0}
        self.kept = KeptText()
        self.next_seq: dict = {}  # the seq each attempt's next event must have

    def event(self, ev: ts.Event) -> bool:
        """Notes one event; reports whether the runner must cancel the turn now."""
        obs = self.obs
        self.kept.event(ev)
        if ev.agent is not None:
            if ev.agent.seq != self.next_seq.get(ev.attempt, 0) + 1:
                obs["seq_gapless"] = False
            self.next_seq[ev.attempt] = ev.agent.seq
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
            return False
        kind = ev.agent.WhichOneof("payload")
        if kind in ("error", "turn_completed"):
            obs["terminal_events"] += 1
        if kind == "tool_started":
            obs["tools_started"].append(ev.agent.tool_started.name)
        if kind == "compaction":
            obs["compactions"] += 1
        return self.cancel_on == "text_delta" and kind == "text_delta"

    def end(self, turn: "ts.Turn | ts.AsyncTurn", failure: ts.TurnError | None, read_log_of: str | None) -> dict:
        """Notes how the turn ended; returns the observations."""
        obs = self.obs
        obs["kept_text"] = str(self.kept)
        if read_log_of is not None:
            observe_log(read_log_of, turn.id, obs)
        res = turn.result
        if res is not None:
            obs["outcome"] = "completed"
            obs["end_reason"] = agent_pb2.EndReason.Name(res.end_reason).removeprefix("END_REASON_")
            obs["attempts"] = res.attempts
            obs["reattaches"] = res.reattaches
            obs["roles"] = role_names(res.messages)
            obs["conversation_roles"] = role_names(res.conversation)
            if res.messages:
                obs["final_text"] = message_text(res.messages[-1])
            c = res.usage.cost
            obs["cost"] = f"{c.currency} {c.units}.{c.nanos:09d}" if res.usage.HasField("cost") else "none"
            obs["cost_partial"] = res.usage.cost_partial
            return obs
        if failure is None:
            raise AssertionError("the turn ended with neither a result nor a TurnError")
        assert turn.error is failure
        obs["outcome"] = "error"
        obs["code"] = ts.code_name(failure.code)
        obs["retryable"] = failure.retryable
        obs["attempts"] = failure.attempts
        obs["reattaches"] = failure.reattaches
        obs["roles"] = role_names(failure.messages)
        obs["conversation_roles"] = role_names(failure.conversation)
        if failure.status_code is not None:
            obs["status"] = failure.status_code.name
        return obs


def observe(
    client: ts.Client, req: agent_pb2.RunTurnRequest, cancel_on: str | None, read_log_of: str | None = None,
    hitl: HitlRun | None = None,
) -> dict:
    h = hitl or HitlRun({})
    turn = client.run_turn(req, timeout=30, on_approval=h.on_approval())
    o = Observation(cancel_on)
    failure = None
    try:
        for ev in turn.events():
            h.event(turn, ev, o.obs)
            if o.event(ev):
                turn.cancel()
    except ts.TurnError as e:
        failure = e
    h.done(turn.result, o.obs)
    return o.end(turn, failure, read_log_of)


async def observe_async(
    client: ts.AsyncClient, req: agent_pb2.RunTurnRequest, cancel_on: str | None, read_log_of: str | None = None,
    hitl: HitlRun | None = None,
) -> dict:
    h = hitl or HitlRun({})
    turn = client.run_turn(req, timeout=30, on_approval=h.on_approval())
    o = Observation(cancel_on)
    failure = None
    try:
        async for ev in turn.events():
            h.event_async(turn, ev, o.obs)
            if o.event(ev):
                turn.cancel()
    except ts.TurnError as e:
        failure = e
    await h.done_async(turn.result, o.obs)
    return o.end(turn, failure, read_log_of)


SCENARIOS = json.loads((CONFORMANCE / "scenarios.json").read_text())


class ConformanceTest(unittest.TestCase):
    """The scenarios, each a test, on the servers they name, started for the class."""

    servers: dict

    @classmethod
    def setUpClass(cls) -> None:
        cls.servers = {}
        try:
            for sc in SCENARIOS["scenarios"]:
                name = sc.get("server", "")
                if name not in cls.servers:
                    cls.servers[name] = Server(CONFORMANCE / f"{name or 'server'}.yaml")
        except BaseException:
            cls.tearDownClass()
            raise

    @classmethod
    def tearDownClass(cls) -> None:
        for server in cls.servers.values():
            server.stop()

    def observe(self, addr: str, opts: dict, sc: dict) -> dict:
        """Runs the scenario's turn with a Client of opts on addr."""
        with ts.Client(addr, **opts) as client:
            return observe(
                client, scenario_request(sc), sc.get("cancel_on"), addr if sc.get("read_log") else None, HitlRun(sc)
            )

    def run_scenario(self, sc: dict) -> None:
        addr = self.servers[sc.get("server", "")].addr
        cut = sc.get("cut")
        if cut is not None:
            proxy = CutProxy(addr, cut["on"], refuse=cut.get("then") == "refuse")
            self.addCleanup(proxy.close)
            addr = proxy.addr
        logger = logging.getLogger(f"turnstile_client.conformance.{id(sc)}")
        logger.setLevel(logging.INFO)
        logger.propagate = False
        counter = ReattachCounter()
        logger.addHandler(counter)
        self.addCleanup(logger.removeHandler, counter)
        opts = client_options({**SCENARIOS["client"], **sc.get("client", {})}, logger)
        obs = self.observe(addr, opts, sc)
        # The count the turn reports is the count the client logged.
        self.assertEqual(obs["reattaches"], counter.count, f"{sc['name']}: reattaches differ from the client's log")
        for key, want in sc["expect"].items():
            self.assertEqual(obs.get(key), want, f"{sc['name']}: {key}")


def _scenario_test(sc: dict):
    def test(self: ConformanceTest) -> None:
        self.run_scenario(sc)

    test.__doc__ = sc["name"]
    return test


# One test per scenario of the shared file.
for _sc in SCENARIOS["scenarios"]:
    setattr(ConformanceTest, "test_" + re.sub(r"\W+", "_", _sc["name"]), _scenario_test(_sc))


class AsyncConformanceTest(ConformanceTest):
    """The scenarios on the asyncio client (AsyncClient)."""

    def observe(self, addr: str, opts: dict, sc: dict) -> dict:
        async def run() -> dict:
            async with ts.AsyncClient(addr, **opts) as client:
                return await observe_async(
                    client, scenario_request(sc), sc.get("cancel_on"), addr if sc.get("read_log") else None, HitlRun(sc)
                )

        return asyncio.run(run())


if __name__ == "__main__":
    unittest.main()
