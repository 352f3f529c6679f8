"""The asyncio client's own ways: task cancellation, async with, the async generator; on live servers."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import unittest

import grpc
import turnstile_client as ts
from turnstile_client.v1 import agent_pb2, agent_pb2_grpc, errors_pb2

from .server import CONFORMANCE, Server, ServerTestCase
from . import test_client
from .test_conformance import user_request


def first_text_delta(ev: ts.Event) -> bool:
    return ev.agent is not None and ev.agent.WhichOneof("payload") == "text_delta"


class AsyncOptionsTest(unittest.TestCase):
    def test_bad_options_are_refused_as_by_client(self) -> None:
        for kwargs in [
            {"max_step_retries": -1},
            {"reattach_timeout": -1},
            {"cancel_timeout": -1},
            {"backoff": ts.Backoff(jitter=2)},
            {"load_balancing_policy": "grpclb"},
        ]:
            with self.subTest(**{k: str(v) for k, v in kwargs.items()}), self.assertRaises(ValueError):
                ts.AsyncClient("127.0.0.1:1", **kwargs)


class AsyncLiveTest(ServerTestCase):
    def run_with(self, body, **kw):
        async def main():
            async with ts.AsyncClient(
                self.server.addr, backoff=ts.Backoff(initial=0.005, maximum=0.01, jitter=0), **kw
            ) as c:
                return await body(c)

        return asyncio.run(main())

    def test_a_step_retry_then_the_result(self) -> None:
        async def body(c: ts.AsyncClient):
            req = user_request("[sim fail=server_error times=1] [sim reply=ok] hi")
            req.turn_id = "my-async-turn"
            turn = c.run_turn(req)
            events = [ev async for ev in turn.events()]
            return turn, events, req

        turn, events, req = self.run_with(body)
        retries = [ev.step_retry for ev in events if ev.step_retry is not None]
        self.assertEqual([(r.attempt, ts.code_name(r.error.code)) for r in retries], [(2, "SERVER_ERROR")])
        self.assertEqual({ev.agent.turn_id for ev in events if ev.agent is not None}, {"my-async-turn"})
        self.assertEqual(turn.result.attempts, 2)
        self.assertEqual(turn.result.end_reason, agent_pb2.END_REASON_END_TURN)
        self.assertEqual(len(req.messages), 1)

    def test_permanent_failure_is_raised_by_wait(self) -> None:
        async def body(c: ts.AsyncClient):
            with self.assertRaises(ts.TurnError) as cm:
                await c.run_turn(user_request("[sim fail=auth] hi")).wait()
            return cm.exception

        e = self.run_with(body, max_step_retries=3)
        self.assertEqual(e.code, errors_pb2.ERROR_CODE_AUTH)
        self.assertEqual(e.attempts, 1)
        self.assertFalse(e.retryable)

    def test_status_details_off_the_wire_name_the_field(self) -> None:
        async def body(c: ts.AsyncClient):
            req = user_request("hi")
            req.model = "nope"
            with self.assertRaises(ts.TurnError) as cm:
                await c.run_turn(req).wait()
            return cm.exception

        e = self.run_with(body)
        self.assertEqual(e.code, errors_pb2.ERROR_CODE_INVALID_REQUEST)
        self.assertEqual(e.status_code, grpc.StatusCode.INVALID_ARGUMENT)
        fields = []
        for d in e.status.details:
            if d.Is(ts.rpc.error_details_pb2.BadRequest.DESCRIPTOR):
                br = ts.rpc.error_details_pb2.BadRequest()
                d.Unpack(br)
                fields += [v.field for v in br.field_violations]
        self.assertEqual(fields, ["model"])

    def test_timeout_is_deadline_exceeded(self) -> None:
        async def body(c: ts.AsyncClient):
            with self.assertRaises(ts.TurnError) as cm:
                await c.run_turn(user_request("[sim fail=timeout] hangs"), timeout=0.3).wait()
            return cm.exception

        self.assertEqual(self.run_with(body).code, errors_pb2.ERROR_CODE_DEADLINE_EXCEEDED)


class AsyncDurableCancelTest(unittest.TestCase):
    """Cancelling and leaving a turn on a server with a turn store, where a dropped stream is a detach."""

    server: Server
    PROMPT = test_client.DurableCancelTest.PROMPT
    assert_cancelled_on_server = test_client.DurableCancelTest.assert_cancelled_on_server

    @classmethod
    def setUpClass(cls) -> None:
        cls.server = Server(CONFORMANCE / "durable.yaml")

    @classmethod
    def tearDownClass(cls) -> None:
        cls.server.stop()

    def run_with(self, body):
        async def main():
            async with ts.AsyncClient(self.server.addr) as c:
                return await body(c)

        return asyncio.run(main())

    def test_task_cancellation_cancels_the_turn_on_the_server(self) -> None:
        async def body(c: ts.AsyncClient):
            turn = c.run_turn(user_request(self.PROMPT))

            async def consume():
                async for ev in turn.events():
                    if first_text_delta(ev):
                        streaming.set()

            streaming = asyncio.Event()
            task = asyncio.create_task(consume())
            await asyncio.wait_for(streaming.wait(), 30)
            task.cancel()  # while the iteration waits for the next event
            with self.assertRaises(asyncio.CancelledError):
                await task
            return turn

        turn = self.run_with(body)
        self.assertIsInstance(turn.error, ts.TurnError)
        self.assertEqual(turn.error.code, errors_pb2.ERROR_CODE_CANCELLED)
        self.assert_cancelled_on_server(turn.id)

    def test_leaving_the_async_with_block_early_cancels_the_turn_on_the_server(self) -> None:
        async def body(c: ts.AsyncClient):
            async with c.run_turn(user_request(self.PROMPT)) as turn:
                async with contextlib.aclosing(turn.events()) as events:
                    async for ev in events:
                        if first_text_delta(ev):
                            break
            return turn

        self.assert_cancelled_on_server(self.run_with(body).id)

    def test_cancel_keeps_the_committed_messages(self) -> None:
        async def body(c: ts.AsyncClient):
            turn = c.run_turn(user_request(self.PROMPT))
            committed = []
            with self.assertRaises(ts.TurnError) as cm:
                async for ev in turn.events():
                    kind = ev.agent.WhichOneof("payload") if ev.agent is not None else None
                    if kind == "text_delta":
                        turn.cancel()
                    if kind == "message_completed":
                        committed.append(ev.agent.message_completed.message)
            return turn, committed, cm.exception

        turn, committed, e = self.run_with(body)
        self.assertEqual(e.code, errors_pb2.ERROR_CODE_CANCELLED)
        self.assertGreater(len(committed), 0)
        self.assertEqual(list(e.messages), ts.standing(committed))
        self.assert_cancelled_on_server(turn.id)

    def test_closing_the_generator_alone_leaves_the_turn_running(self) -> None:
        async def body(c: ts.AsyncClient):
            turn = c.run_turn(user_request(self.PROMPT))
            events = turn.events()
            async for ev in events:
                if first_text_delta(ev):
                    break
            await events.aclose()
            return turn

        turn = self.run_with(body)
        # The run still goes on: this CancelTurn is the one that stops it.
        with grpc.insecure_channel(self.server.addr) as ch:
            res = agent_pb2_grpc.AgentServiceStub(ch).CancelTurn(
                agent_pb2.CancelTurnRequest(turn_id=turn.id, attempt=1), timeout=10
            )
        self.assertTrue(res.cancelled)
        self.assertIsNone(turn.result)
        self.assertIsNone(turn.error)


class AsyncNoServerTest(unittest.TestCase):
    def test_unavailable_and_retryable_after_the_step_retry(self) -> None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]

        async def main():
            async with ts.AsyncClient(f"127.0.0.1:{port}", backoff=ts.Backoff(initial=0.005, maximum=0.01, jitter=0)) as c:
                with self.assertRaises(ts.TurnError) as cm:
                    await c.run_turn(user_request("hi")).wait()
                return cm.exception

        e = asyncio.run(main())
        self.assertEqual(e.code, errors_pb2.ERROR_CODE_UNAVAILABLE)
        self.assertTrue(e.retryable)
        self.assertEqual(e.attempts, 2)
        self.assertEqual(e.reattaches, 0)


if __name__ == "__main__":
    unittest.main()
