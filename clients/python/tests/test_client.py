"""Unit tests of the client's pieces, and its behaviour against a live server."""

from __future__ import annotations

import os
import signal
import socket
import threading
import time
import unittest

import grpc
import turnstile_client as ts
from google.protobuf import any_pb2, duration_pb2
from turnstile_client.rpc import error_details_pb2, status_pb2
from turnstile_client.v1 import agent_pb2, agent_pb2_grpc, conversation_pb2, errors_pb2
from turnstile_client._errors import from_status, never_connected

from .server import CONFORMANCE, Server, ServerTestCase
from .test_conformance import stored_log, user_request


class OptionsTest(unittest.TestCase):
    def test_bad_options_are_refused(self) -> None:
        for kwargs in [
            {"max_step_retries": -1},
            {"max_reattaches": -1},
            {"reattach_timeout": -1},
            {"cancel_timeout": -1},
            {"backoff": ts.Backoff(jitter=2)},
            {"reattach_backoff": ts.Backoff(initial=-1)},
        ]:
            with self.subTest(**{k: str(v) for k, v in kwargs.items()}), self.assertRaises(ValueError):
                ts.Client("127.0.0.1:1", **kwargs)

    def test_defaults_are_the_go_clients(self) -> None:
        with ts.Client("127.0.0.1:1") as c:
            self.assertEqual(c.max_step_retries, 1)
            self.assertEqual(c.reattach_timeout, 30.0)
            self.assertEqual(c.reattach_timeout, ts.REATTACH_TIMEOUT)
            self.assertIsNone(c.max_reattaches)
            self.assertEqual(c.cancel_timeout, 2.0)
            self.assertEqual(c.reattach_backoff, ts.Backoff(initial=0.05, maximum=1.0, multiplier=2, jitter=0.2))
            self.assertIs(c.logger, ts.LOGGER)


class BackoffTest(unittest.TestCase):
    def test_delays(self) -> None:
        b = ts.Backoff(initial=1, maximum=30, multiplier=2, jitter=0.2)
        for n, u, want in [(1, 0.5, 1.0), (2, 0.5, 2.0), (3, 0.5, 4.0), (10, 0.5, 30.0), (1, 0, 0.8), (1, 1, 1.2)]:
            with self.subTest(n=n, u=u):
                self.assertAlmostEqual(b.delay(n, u), want)


class StandingTest(unittest.TestCase):
    call = conversation_pb2.Message(
        role=conversation_pb2.ROLE_ASSISTANT,
        parts=[conversation_pb2.Part(tool_call=conversation_pb2.ToolCall(id="call_1", name="t", arguments="{}"))],
    )
    result = conversation_pb2.Message(
        role=conversation_pb2.ROLE_TOOL,
        parts=[conversation_pb2.Part(tool_result=conversation_pb2.ToolResult(call_id="call_1", content="ok"))],
    )

    def test_drops_a_trailing_call_without_results(self) -> None:
        self.assertEqual(ts.standing([self.call]), [])

    def test_keeps_a_call_with_its_results(self) -> None:
        self.assertEqual(len(ts.standing([self.call, self.result])), 2)


class ApplyCompactionTest(unittest.TestCase):
    @staticmethod
    def msg(text: str) -> conversation_pb2.Message:
        return conversation_pb2.Message(role=conversation_pb2.ROLE_USER, parts=[conversation_pb2.Part(text=text)])

    def test_cases(self) -> None:
        conv = [self.msg(t) for t in "abcde"]
        note = self.msg("[2 earlier messages were omitted]")
        for name, c, want in [
            ("the middle", agent_pb2.Compaction(replaced_from=1, replaced_count=3, replacement=[note]), ["a", note.parts[0].text, "e"]),
            ("one message rewritten", agent_pb2.Compaction(replaced_from=2, replaced_count=1, replacement=[self.msg("C")]), ["a", "b", "C", "d", "e"]),
            ("the whole", agent_pb2.Compaction(replaced_from=0, replaced_count=5, replacement=[note]), [note.parts[0].text]),
            ("omitted", agent_pb2.Compaction(replaced_from=1, replaced_count=3, replacement_omitted=True), None),
            ("out of range", agent_pb2.Compaction(replaced_from=4, replaced_count=2), None),
        ]:
            with self.subTest(name):
                got = ts.apply_compaction(conv, c)
                self.assertEqual(None if got is None else [m.parts[0].text for m in got], want)
                self.assertEqual([m.parts[0].text for m in conv], list("abcde"))


class FakeCall(grpc.RpcError, grpc.Call):
    """An RPC error as grpcio raises it, with the status details in its trailers."""

    def __init__(self, code: grpc.StatusCode, message: str, *details) -> None:
        self._code, self._message = code, message
        st = status_pb2.Status(code=code.value[0], message=message)
        for d in details:
            a = any_pb2.Any()
            a.Pack(d)
            st.details.append(a)
        self._trailers = (("grpc-status-details-bin", st.SerializeToString()),) if details else ()

    def code(self):
        return self._code

    def details(self):
        return self._message

    def trailing_metadata(self):
        return self._trailers

    def initial_metadata(self):
        return ()

    def is_active(self):
        return False

    def time_remaining(self):
        return None

    def cancel(self):
        return False

    def add_callback(self, callback):
        return False


def info(reason: str) -> error_details_pb2.ErrorInfo:
    return error_details_pb2.ErrorInfo(reason=reason, domain="turnstile", metadata={"model": "m"})


def retry_in(seconds: int) -> error_details_pb2.RetryInfo:
    return error_details_pb2.RetryInfo(retry_delay=duration_pb2.Duration(seconds=seconds))


class NeverConnectedTest(unittest.TestCase):
    def test_only_a_call_that_found_no_connection(self) -> None:
        for code, message, want in [
            (grpc.StatusCode.UNAVAILABLE, "failed to connect to all addresses; last error: UNKNOWN: ipv4:127.0.0.1:1: Connection refused", True),
            (grpc.StatusCode.UNAVAILABLE, "DNS resolution failed for nowhere.invalid:1: Domain name not found", True),
            (grpc.StatusCode.UNAVAILABLE, "connections to all backends failing; last error: UNKNOWN: ipv4:127.0.0.1:1: Failed to connect to remote host: Connection refused", True),
            (grpc.StatusCode.UNAVAILABLE, "Socket closed", False),
            (grpc.StatusCode.UNAVAILABLE, "recvmsg:Connection reset by peer", False),
            (grpc.StatusCode.DEADLINE_EXCEEDED, "failed to connect to all addresses", False),
        ]:
            with self.subTest(message=message):
                self.assertEqual(never_connected(FakeCall(code, message)), want)

    def test_a_status_from_the_server_is_not_the_transports(self) -> None:
        self.assertFalse(never_connected(FakeCall(grpc.StatusCode.UNAVAILABLE, "failed to connect to all addresses", info("UNAVAILABLE"))))


class FromStatusTest(unittest.TestCase):
    def test_error_info_and_retry_info(self) -> None:
        f = from_status(FakeCall(grpc.StatusCode.RESOURCE_EXHAUSTED, "slow down", info("RATE_LIMITED"), retry_in(2)))
        self.assertEqual(f.err.code, errors_pb2.ERROR_CODE_RATE_LIMITED)
        self.assertEqual(f.err.model, "m")
        self.assertTrue(f.err.retryable and f.retry)
        self.assertFalse(f.transport)
        self.assertEqual(f.err.retry_after, 2.0)
        self.assertEqual(f.err.status_code, grpc.StatusCode.RESOURCE_EXHAUSTED)

    def test_error_info_without_retry_info_is_not_retryable(self) -> None:
        f = from_status(FakeCall(grpc.StatusCode.FAILED_PRECONDITION, "no", info("AUTH")))
        self.assertEqual(f.err.code, errors_pb2.ERROR_CODE_AUTH)
        self.assertFalse(f.retry)

    def test_unavailable_without_error_info_is_the_transports(self) -> None:
        f = from_status(FakeCall(grpc.StatusCode.UNAVAILABLE, "connection reset"))
        self.assertEqual(f.err.code, errors_pb2.ERROR_CODE_UNAVAILABLE)
        self.assertTrue(f.retry and f.transport)

    def test_every_error_codes_reason_reads_as_that_code(self) -> None:
        # The server's reasons are the codes' names (docs/contract.md): a
        # code added to the contract must never read as INTERNAL.
        for name, v in errors_pb2.ErrorCode.items():
            if v == errors_pb2.ERROR_CODE_UNSPECIFIED:
                continue
            reason = name[len("ERROR_CODE_"):]
            with self.subTest(reason=reason):
                f = from_status(FakeCall(grpc.StatusCode.RESOURCE_EXHAUSTED, "x", info(reason)))
                self.assertEqual(f.err.code, v)
        f = from_status(FakeCall(grpc.StatusCode.RESOURCE_EXHAUSTED, "full", info("STORE_FULL"), retry_in(5)))
        self.assertEqual(f.err.code, errors_pb2.ERROR_CODE_STORE_FULL)
        self.assertTrue(f.retry)

    def test_invalid_argument_with_retry_info_is_not_retryable(self) -> None:
        f = from_status(FakeCall(grpc.StatusCode.INVALID_ARGUMENT, "bad", retry_in(1)))
        self.assertEqual(f.err.code, errors_pb2.ERROR_CODE_INVALID_REQUEST)
        self.assertFalse(f.retry)


class LiveTest(ServerTestCase):
    def client(self, **kw) -> ts.Client:
        c = ts.Client(self.server.addr, backoff=ts.Backoff(initial=0.005, maximum=0.01, jitter=0), **kw)
        self.addCleanup(c.close)
        return c

    def test_closing_the_generator_leaves_the_turn_which_a_server_without_a_store_cancels(self) -> None:
        turn = self.client().run_turn(user_request("[sim fail=timeout after=1] never ends"))
        start = time.monotonic()
        events = turn.events()
        for ev in events:
            if ev.agent is not None and ev.agent.WhichOneof("payload") == "text_delta":
                break
        events.close()
        self.assertIsNone(turn.result)
        self.assertIsNone(turn.error)
        self.assertLess(time.monotonic() - start, 5)

    def test_permanent_failure_is_raised_by_wait(self) -> None:
        with self.assertRaises(ts.TurnError) as cm:
            self.client(max_step_retries=3).run_turn(user_request("[sim fail=auth] hi")).wait()
        e = cm.exception
        self.assertEqual(e.code, errors_pb2.ERROR_CODE_AUTH)
        self.assertEqual(e.attempts, 1)
        self.assertFalse(e.retryable)
        self.assertRegex(str(e), r"^turnstile: turn [0-9a-f]{32} failed: AUTH: ")

    def test_status_details_off_the_wire_name_the_field(self) -> None:
        req = user_request("hi")
        req.model = "nope"
        with self.assertRaises(ts.TurnError) as cm:
            self.client().run_turn(req).wait()
        e = cm.exception
        self.assertEqual(e.code, errors_pb2.ERROR_CODE_INVALID_REQUEST)
        self.assertEqual(e.status_code, grpc.StatusCode.INVALID_ARGUMENT)
        fields = []
        for d in e.status.details:
            if d.Is(error_details_pb2.BadRequest.DESCRIPTOR):
                br = error_details_pb2.BadRequest()
                d.Unpack(br)
                fields += [v.field for v in br.field_violations]
        self.assertEqual(fields, ["model"])

    def test_turn_id_is_kept_and_request_not_modified(self) -> None:
        req = user_request("[sim fail=server_error times=1] [sim reply=ok] hi")
        req.turn_id = "my-turn"
        turn = self.client().run_turn(req)
        ids = {ev.agent.turn_id for ev in turn.events() if ev.agent is not None}
        self.assertEqual(ids, {"my-turn"})
        self.assertEqual(turn.result.attempts, 2)
        self.assertEqual(len(req.messages), 1)

    def test_timeout_is_deadline_exceeded(self) -> None:
        with self.assertRaises(ts.TurnError) as cm:
            self.client().run_turn(user_request("[sim fail=timeout] hangs"), timeout=0.3).wait()
        self.assertEqual(cm.exception.code, errors_pb2.ERROR_CODE_DEADLINE_EXCEEDED)


class DurableCancelTest(unittest.TestCase):
    """Cancelling and leaving a turn on a server with a turn store, where a dropped stream is a detach."""

    server: Server
    #: A reply that streams one token, then hangs until the run is stopped.
    PROMPT = "[sim fail=timeout after=1] never ends"

    @classmethod
    def setUpClass(cls) -> None:
        cls.server = Server(CONFORMANCE / "durable.yaml")

    @classmethod
    def tearDownClass(cls) -> None:
        cls.server.stop()

    def client(self, **kw) -> ts.Client:
        c = ts.Client(self.server.addr, **kw)
        self.addCleanup(c.close)
        return c

    def assert_cancelled_on_server(self, turn_id: str) -> None:
        log = stored_log(self.server.addr, turn_id)
        self.assertEqual(sum(1 for e in log if e.WhichOneof("payload") == "llm_call_started"), 1)
        self.assertEqual(log[-1].WhichOneof("payload"), "error")
        self.assertEqual(log[-1].error.code, errors_pb2.ERROR_CODE_CANCELLED)

    def test_keyboard_interrupt_cancels_the_turn_on_the_server(self) -> None:
        turn = self.client().run_turn(user_request(self.PROMPT))
        with self.assertRaises(KeyboardInterrupt):
            for ev in turn.events():
                if ev.agent is not None and ev.agent.WhichOneof("payload") == "text_delta":
                    # Ctrl-C while the client waits for the next event.
                    threading.Timer(0.2, os.kill, args=(os.getpid(), signal.SIGINT)).start()
        self.assertIsInstance(turn.error, ts.TurnError)
        self.assertEqual(turn.error.code, errors_pb2.ERROR_CODE_CANCELLED)
        self.assert_cancelled_on_server(turn.id)

    def test_leaving_the_with_block_early_cancels_the_turn_on_the_server(self) -> None:
        with self.client().run_turn(user_request(self.PROMPT)) as turn:
            for ev in turn.events():
                if ev.agent is not None and ev.agent.WhichOneof("payload") == "text_delta":
                    break
        self.assert_cancelled_on_server(turn.id)

    def test_cancel_keeps_the_committed_messages(self) -> None:
        turn = self.client().run_turn(user_request(self.PROMPT))
        committed = []
        with self.assertRaises(ts.TurnError) as cm:
            for ev in turn.events():
                kind = ev.agent.WhichOneof("payload") if ev.agent is not None else None
                if kind == "text_delta":
                    turn.cancel()
                if kind == "message_completed":
                    committed.append(ev.agent.message_completed.message)
        self.assertEqual(cm.exception.code, errors_pb2.ERROR_CODE_CANCELLED)
        self.assertEqual(list(cm.exception.messages), ts.standing(committed))
        self.assert_cancelled_on_server(turn.id)

    def test_closing_the_generator_alone_leaves_the_turn_running(self) -> None:
        turn = self.client().run_turn(user_request(self.PROMPT))
        events = turn.events()
        for ev in events:
            if ev.agent is not None and ev.agent.WhichOneof("payload") == "text_delta":
                break
        events.close()
        # The run still goes on: this CancelTurn is the one that stops it.
        with grpc.insecure_channel(self.server.addr) as ch:
            res = agent_pb2_grpc.AgentServiceStub(ch).CancelTurn(agent_pb2.CancelTurnRequest(turn_id=turn.id, attempt=1), timeout=10)
        self.assertTrue(res.cancelled)


class SmallEventsTest(unittest.TestCase):
    """A server whose turn_completed is too large to carry its messages."""

    def test_omitted_messages_are_rebuilt_from_message_completed(self) -> None:
        server = Server(CONFORMANCE / "small_events.yaml")
        self.addCleanup(server.stop)
        c = ts.Client(server.addr)
        self.addCleanup(c.close)
        # Two steps each calling a tool with 40 KB of arguments: each
        # message fits an event, the turn's messages together do not.
        pad = "x" * 40000
        call = '[sim tool=current_time args={"zone":"UTC","pad":"%s"} step=%d]'
        turn = c.run_turn(user_request(f"{call % (pad, 1)} {call % (pad, 2)} go"))
        events = [ev.agent for ev in turn.events() if ev.agent is not None]
        tc = events[-1].turn_completed
        self.assertTrue(tc.messages_omitted)
        self.assertEqual(len(tc.messages), 0)
        committed = [ev.message_completed.message for ev in events if ev.WhichOneof("payload") == "message_completed"]
        self.assertEqual(len(committed), 5)
        self.assertEqual(list(turn.result.messages), committed)
        self.assertIn(pad, turn.result.messages[0].parts[0].tool_call.arguments)


class NoServerTest(unittest.TestCase):
    def test_unavailable_and_retryable_after_the_step_retry(self) -> None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        with ts.Client(f"127.0.0.1:{port}", backoff=ts.Backoff(initial=0.005, maximum=0.01, jitter=0)) as c:
            with self.assertRaises(ts.TurnError) as cm:
                c.run_turn(user_request("hi")).wait()
        e = cm.exception
        self.assertEqual(e.code, errors_pb2.ERROR_CODE_UNAVAILABLE)
        self.assertTrue(e.retryable)
        self.assertEqual(e.attempts, 2)


if __name__ == "__main__":
    unittest.main()
