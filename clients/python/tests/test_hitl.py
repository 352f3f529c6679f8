"""Approval and steering on a live server whose MCP tool deploy waits for approval (clients/conformance/hitl.yaml)."""

from __future__ import annotations

import asyncio
import threading
import unittest

import grpc
import turnstile_client as ts
from turnstile_client.v1 import agent_pb2, conversation_pb2, errors_pb2

from .server import CONFORMANCE, CutProxy, Server

DEPLOY = '[sim tool=deploy args={"env":"staging"}] deploy to staging'

# How the server's answer to a SteerTurn of attempt 1 starts on the wire: a
# gRPC message of 4 bytes, attempt 1, then seq. No event holds it, so a
# CutProxy on it loses exactly that answer (and cuts the event stream, which
# re-attaches).
STEER_ANSWER = "\x00\x00\x00\x00\x04\x08\x01\x10"


def request(text: str) -> agent_pb2.RunTurnRequest:
    return agent_pb2.RunTurnRequest(
        messages=[conversation_pb2.Message(role=conversation_pb2.ROLE_USER, parts=[conversation_pb2.Part(text=text)])]
    )


class HitlTest(unittest.TestCase):
    server: Server

    @classmethod
    def setUpClass(cls) -> None:
        cls.server = Server(CONFORMANCE / "hitl.yaml")

    @classmethod
    def tearDownClass(cls) -> None:
        cls.server.stop()

    def test_handler_error_cancels_the_turn(self) -> None:
        boom = RuntimeError("the approver is away")

        def fail(_req: agent_pb2.ToolApprovalRequested) -> ts.Decision:
            raise boom

        with ts.Client(self.server.addr) as client:
            turn = client.run_turn(request(DEPLOY), on_approval=fail, timeout=30)
            with self.assertRaises(ts.TurnError) as cm:
                turn.wait()
        self.assertEqual(cm.exception.code, errors_pb2.ERROR_CODE_CANCELLED)
        self.assertIs(cm.exception.__cause__, boom)

    def test_steer_answer_lost(self) -> None:
        """A steer whose answer is lost is sent again with its request id, and taken once."""
        proxy = CutProxy(self.server.addr, STEER_ANSWER)
        try:
            with ts.Client(proxy.addr) as client:
                turn = client.run_turn(request(DEPLOY), timeout=30)
                ids: list = []
                answers: list = []
                threads = []
                for ev in turn.events():
                    kind = ev.agent.WhichOneof("payload") if ev.agent is not None else None
                    if kind == "tool_approval_requested" and not threads:
                        t = threading.Thread(target=lambda: answers.append(turn.steer("not now, use staging", timeout=10)))
                        t.start()
                        threads.append(t)
                    elif kind == "steered":
                        ids.append(ev.agent.steered.request_id)
                for t in threads:
                    t.join()
            self.assertTrue(proxy.cut, "the proxy never cut the answer: the test proves nothing")
            self.assertEqual(len(answers), 1)
            self.assertTrue(answers[0].duplicate)
            self.assertEqual(len(ids), 1)
            self.assertRegex(ids[0], "^[0-9a-f]{32}$")
            assert turn.result is not None
            self.assertEqual(turn.result.counters.steered, 1)
            texts = [m.parts[0].text for m in turn.result.messages if m.parts and m.parts[0].text]
            self.assertEqual(texts.count("not now, use staging"), 1)
        finally:
            proxy.close()

    def test_async_steer_answer_lost(self) -> None:
        """AsyncTurn.steer, its answer lost: sent again with its request id, and taken once."""
        proxy = CutProxy(self.server.addr, STEER_ANSWER)

        async def run() -> tuple:
            async with ts.AsyncClient(proxy.addr) as client:
                turn = client.run_turn(request(DEPLOY), timeout=30)
                ids: list = []
                steering = None
                async for ev in turn.events():
                    kind = ev.agent.WhichOneof("payload") if ev.agent is not None else None
                    if kind == "tool_approval_requested" and steering is None:
                        steering = asyncio.ensure_future(turn.steer("not now, use staging", timeout=10))
                    elif kind == "steered":
                        ids.append(ev.agent.steered.request_id)
                assert steering is not None
                return await steering, ids, turn.result

        try:
            answer, ids, res = asyncio.run(run())
        finally:
            proxy.close()
        self.assertTrue(proxy.cut, "the proxy never cut the answer: the test proves nothing")
        self.assertTrue(answer.duplicate)
        self.assertEqual(len(ids), 1)
        self.assertRegex(ids[0], "^[0-9a-f]{32}$")
        self.assertEqual(res.counters.steered, 1)

    def test_approve_from_another_thread(self) -> None:
        with ts.Client(self.server.addr) as client:
            turn = client.run_turn(request(DEPLOY), timeout=30)
            with self.assertRaises(ts.NotStartedError):
                turn.steer("too early")
            results: list = []
            threads = []
            for ev in turn.events():
                if ev.agent is not None and ev.agent.WhichOneof("payload") == "tool_approval_requested":
                    call_id = ev.agent.tool_approval_requested.call_id

                    def decide() -> None:
                        results.append(turn.approve(call_id, ts.Decision(approved=True, reason="fine")))
                        # Deciding again changes nothing and says what stands.
                        again = client.approve_tool_call(
                            agent_pb2.ApproveToolCallRequest(turn_id=turn.id, call_id=call_id, approved=False)
                        )
                        results.append((again.applied, again.approved))

                    t = threading.Thread(target=decide)
                    t.start()
                    threads.append(t)
            for t in threads:
                t.join()
            self.assertEqual(results, [True, (False, True)])
            assert turn.result is not None
            self.assertEqual(turn.result.counters.approvals_requested, 1)
            self.assertEqual(turn.result.counters.approvals_denied, 0)
            # A finished turn takes no steering.
            with self.assertRaises(grpc.RpcError) as cm:
                turn.steer("too late")
            self.assertEqual(cm.exception.code(), grpc.StatusCode.FAILED_PRECONDITION)

    def test_async_coroutine_handler_denies(self) -> None:
        asked = []

        async def deny(req: agent_pb2.ToolApprovalRequested) -> ts.Decision:
            asked.append(req.name)
            await asyncio.sleep(0)
            return ts.Decision(approved=False, reason="not today")

        async def run() -> ts.Result:
            async with ts.AsyncClient(self.server.addr) as client:
                return await client.run_turn(request(DEPLOY), on_approval=deny, timeout=30).wait()

        res = asyncio.run(run())
        self.assertEqual(asked, ["deploy"])
        self.assertEqual(res.counters.approvals_denied, 1)
        self.assertIn("denied by the user: not today", res.messages[-1].parts[0].text)

    def test_async_handler_error_cancels_the_turn(self) -> None:
        boom = ValueError("no")

        async def fail(_req: agent_pb2.ToolApprovalRequested) -> ts.Decision:
            raise boom

        async def run() -> None:
            async with ts.AsyncClient(self.server.addr) as client:
                await client.run_turn(request(DEPLOY), on_approval=fail, timeout=30).wait()

        with self.assertRaises(ts.TurnError) as cm:
            asyncio.run(run())
        self.assertEqual(cm.exception.code, errors_pb2.ERROR_CODE_CANCELLED)
        self.assertIs(cm.exception.__cause__, boom)


if __name__ == "__main__":
    unittest.main()
