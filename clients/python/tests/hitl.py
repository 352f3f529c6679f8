"""The conformance runner's part for approval and steering.

The scenario's approve and steer fields, and the observations approvals,
approvals_asked, steered and counters (see the scenarios' about).
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any, Optional

import turnstile_client as ts


class HitlRun:
    """Observes one scenario's approvals and steering, for Client and AsyncClient alike."""

    def __init__(self, sc: dict) -> None:
        self.approve: Optional[dict] = sc.get("approve")
        self.steer: Optional[dict] = sc.get("steer")
        self.asked = 0
        self._steering: Any = None  # the thread or task that steers
        self._steer_error: Optional[BaseException] = None

    def on_approval(self) -> Optional[ts.ApprovalHandler]:
        """The approval handler of the scenario's turn, or None."""
        a = self.approve
        if a is None:
            return None

        def decide(_req: Any) -> ts.Decision:
            self.asked += 1
            return ts.Decision(approved=a["decision"] == "approve", reason=a.get("reason", ""))

        return decide

    def _steers_on(self, ev: ts.Event, obs: dict) -> bool:
        """Notes ev; reports whether the runner must steer the turn now."""
        if self.approve is not None:
            obs.setdefault("approvals", [])
        if self.approve is not None or self.steer is not None:
            obs.setdefault("steered", 0)
        if ev.agent is None:
            return False
        kind = ev.agent.WhichOneof("payload")
        if kind == "tool_approval_decided":
            d = ev.agent.tool_approval_decided
            obs["approvals"].append({"name": d.name, "approved": d.approved, "reason": d.reason})
        elif kind == "steered":
            obs["steered"] += 1
        return (
            kind == "text_delta" and self.steer is not None and self.steer["on"] == "text_delta" and self._steering is None
        )

    def event(self, turn: ts.Turn, ev: ts.Event, obs: dict) -> None:
        """Notes ev, and steers the turn from another thread, as a caller would, on the scenario's event."""
        if not self._steers_on(ev, obs):
            return
        assert self.steer is not None
        text = self.steer["text"]

        def run() -> None:
            try:
                turn.steer(text)
            except BaseException as e:  # noqa: BLE001 - reported by done()
                self._steer_error = e

        self._steering = threading.Thread(target=run, name="steer")
        self._steering.start()

    def event_async(self, turn: ts.AsyncTurn, ev: ts.Event, obs: dict) -> None:
        """event() for an AsyncTurn: the steering runs in a task of its own."""
        if not self._steers_on(ev, obs):
            return
        assert self.steer is not None
        self._steering = asyncio.get_running_loop().create_task(turn.steer(self.steer["text"]))

    async def done_async(self, res: Optional[ts.Result], obs: dict) -> None:
        """done() for an AsyncTurn."""
        if self._steering is not None:
            try:
                await self._steering
            except BaseException as e:  # noqa: BLE001 - reported by done()
                self._steer_error = e
            self._steering = None
        self.done(res, obs)

    def done(self, res: Optional[ts.Result], obs: dict) -> None:
        """Notes what the turn's end says."""
        if isinstance(self._steering, threading.Thread):
            self._steering.join()
        if self._steer_error is not None:
            raise AssertionError(f"steering failed: {self._steer_error}")
        if self.approve is None and self.steer is None:
            return
        obs["approvals_asked"] = self.asked
        if res is not None:
            c = res.counters
            obs["counters"] = {
                "approvals_requested": c.approvals_requested,
                "approvals_denied": c.approvals_denied,
                "steered": c.steered,
            }
