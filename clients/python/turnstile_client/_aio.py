"""The asyncio client (grpc.aio) and its turns: the protocol of _protocol.py over asyncio."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import secrets
import time
from typing import AsyncIterator, Callable, List, Optional, Sequence, Set, Tuple

import grpc
import grpc.aio

from ._errors import TurnError
from ._protocol import (
    CANCEL_TIMEOUT,
    END,
    ApprovalHandler,
    Decision,
    approve_request,
    STEER_RETRY_CODES,
    new_request_id,
    steer_request,
    REATTACH_BACKOFF,
    REATTACH_TIMEOUT,
    Attempt,
    Backoff,
    ClientBase,
    Event,
    Outcome,
    Result,
    TurnBase,
    observe,
    standing,
)
from .v1 import agent_pb2, agent_pb2_grpc, conversation_pb2


class AsyncClient(ClientBase):
    """Runs turns on a turnstile server from asyncio: Client's protocol, options and errors over grpc.aio.

    target, credentials, load_balancing_policy and the other options are
    Client's; channel, when given, is a grpc.aio.Channel of your own. Use it
    from one event loop, and close it (``await client.close()``, or
    ``async with``) when done.
    """

    def __init__(
        self,
        target: str = "",
        *,
        channel: Optional[grpc.aio.Channel] = None,
        credentials: Optional[grpc.ChannelCredentials] = None,
        max_step_retries: int = 1,
        backoff: Backoff = Backoff(),
        max_retry_delay: float = 60.0,
        reattach_timeout: float = REATTACH_TIMEOUT,
        max_reattaches: Optional[int] = None,
        reattach_backoff: Backoff = REATTACH_BACKOFF,
        cancel_timeout: float = CANCEL_TIMEOUT,
        metadata: Sequence[Tuple[str, str]] = (),
        logger: Optional[logging.Logger] = None,
        load_balancing_policy: str = "round_robin",
    ) -> None:
        super().__init__(
            max_step_retries=max_step_retries,
            backoff=backoff,
            max_retry_delay=max_retry_delay,
            reattach_timeout=reattach_timeout,
            max_reattaches=max_reattaches,
            reattach_backoff=reattach_backoff,
            cancel_timeout=cancel_timeout,
            metadata=metadata,
            logger=logger,
            load_balancing_policy=load_balancing_policy,
        )
        if channel is None:
            if not target:
                raise ValueError("turnstile: empty target")
            if credentials is not None:
                channel = grpc.aio.secure_channel(target, credentials, options=self._channel_options)
            else:
                channel = grpc.aio.insecure_channel(target, options=self._channel_options)
            self._owned = True
        else:
            self._owned = False
        self._channel = channel
        self._stub = agent_pb2_grpc.AgentServiceStub(channel)

    async def close(self) -> None:
        """Closes the channel the client made; turns still running fail CANCELLED."""
        if self._owned:
            await self._channel.close()

    async def __aenter__(self) -> "AsyncClient":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def approve_tool_call(
        self, request: agent_pb2.ApproveToolCallRequest, *, timeout: Optional[float] = None
    ) -> agent_pb2.ApproveToolCallResponse:
        """Decides a tool call that waits for approval, as Client.approve_tool_call does (UNAVAILABLE made again)."""
        start = time.monotonic()
        n = 0
        while True:
            n += 1
            try:
                return await self._stub.ApproveToolCall(request, timeout=timeout, metadata=self._metadata)
            except grpc.aio.AioRpcError as e:
                if e.code() != grpc.StatusCode.UNAVAILABLE:
                    raise
                delay = self.reattach_backoff.delay(n, self.random())
                if time.monotonic() - start + delay > self.reattach_timeout:
                    raise
                await asyncio.sleep(delay)

    async def steer_turn(
        self, request: agent_pb2.SteerTurnRequest, *, timeout: Optional[float] = None
    ) -> agent_pb2.SteerTurnResponse:
        """Gives a running turn a user message, as Client.steer_turn does (sent as it is, once)."""
        return await self._stub.SteerTurn(request, timeout=timeout, metadata=self._metadata)

    def run_turn(
        self,
        request: agent_pb2.RunTurnRequest,
        *,
        timeout: Optional[float] = None,
        on_approval: Optional[ApprovalHandler] = None,
    ) -> "AsyncTurn":
        """Prepares one turn of request; it runs as the caller iterates over AsyncTurn.events().

        Everything Client.run_turn says holds (turn ids and attempts,
        re-attaching, step retries, timeout), with asyncio's ways of
        cancelling: AsyncTurn.cancel(), the cancellation of the task that
        iterates events() while it waits for the server, leaving an ``async
        with turn:`` block before the turn's end (a break, an exception, the
        task's cancellation), and the timeout passing cancel the turn on the
        server (CancelTurn, bounded by cancel_timeout). After cancel() the
        iteration goes on with the events the server sends as it stops the
        turn, then raises TurnError CANCELLED whose messages hold every
        message the turn committed. After a task's cancellation, which
        propagates (asyncio.CancelledError), turn.error holds that TurnError.
        Leaving the iteration alone (closing the async generator, outside
        ``async with turn:``) only drops the stream, as a process that dies
        does. on_approval is Client.run_turn's, and may be a coroutine
        function. request is not modified.
        """
        req = agent_pb2.RunTurnRequest()
        req.CopyFrom(request)
        if not req.turn_id:
            req.turn_id = secrets.token_hex(16)
        return AsyncTurn(self, req, timeout, on_approval)


def _dropped() -> grpc.aio.AioRpcError:
    """The end of a stream the client cancelled itself, as grpcio's sync client reports it.

    grpc.aio raises asyncio.CancelledError from a call cancelled locally;
    the protocol takes it as the CANCELLED status it is.
    """
    return grpc.aio.AioRpcError(
        grpc.StatusCode.CANCELLED, grpc.aio.Metadata(), grpc.aio.Metadata(), "Locally cancelled by application!"
    )


def _task_cancelled() -> bool:
    """Reports whether the running task is being cancelled (rather than a call the client cancelled)."""
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0


class AsyncTurn(TurnBase):
    """A turn started by AsyncClient.run_turn.

    Iterate over events() once (``async for``) to run it, then read result
    (or error). Used as an async context manager (``async with
    client.run_turn(req) as turn:``), a turn left before its end is
    cancelled on the server (see AsyncClient.run_turn).
    """

    def __init__(
        self,
        client: AsyncClient,
        request: agent_pb2.RunTurnRequest,
        timeout: Optional[float],
        on_approval: Optional[ApprovalHandler] = None,
    ) -> None:
        super().__init__(client, request, timeout, on_approval)
        self._c = client
        #: Set with _reason: the caller cancelled the turn, or its deadline passed.
        self._cancelled = asyncio.Event()
        self._call: Optional[grpc.aio.UnaryStreamCall] = None
        #: The attempt whose run may go on on the server (its stream open, or
        #: left when the caller closed the generator); 0 otherwise.
        self._live = 0
        #: Timers that drop a cancelled attempt's stream once cancel_timeout is over.
        self._timers: List[asyncio.TimerHandle] = []
        #: The CancelTurn calls running in the background.
        self._tasks: Set["asyncio.Task[None]"] = set()

    async def steer(self, text: str, *, timeout: Optional[float] = None) -> agent_pb2.SteerTurnResponse:
        """Sends text to the running turn as a user message, as Turn.steer does (taken once: a request id, retried)."""
        c = self._c
        req = steer_request(self.id, self._running_attempt(), text, new_request_id())
        start = time.monotonic()
        n = 0
        while True:
            n += 1
            try:
                return await c.steer_turn(req, timeout=timeout)
            except grpc.aio.AioRpcError as e:
                if e.code() not in STEER_RETRY_CODES:
                    raise
                delay = c.reattach_backoff.delay(n, c.random())
                if time.monotonic() - start + delay > c.reattach_timeout:
                    raise
                await asyncio.sleep(delay)

    async def approve(self, call_id: str, decision: Decision, *, timeout: Optional[float] = None) -> bool:
        """Decides the tool call call_id of the running attempt, as Turn.approve does."""
        req = approve_request(self.id, self._running_attempt(), call_id, decision)
        return (await self._c.approve_tool_call(req, timeout=timeout)).applied

    async def _answer(self, wire: int, req: agent_pb2.ToolApprovalRequested) -> None:
        """Calls the approval handler for req (awaiting a coroutine) and sends its decision; a failure cancels the turn."""
        assert self._on_approval is not None
        try:
            decision = self._on_approval(req)
            if inspect.isawaitable(decision):
                decision = await decision
            try:
                await self._c.approve_tool_call(approve_request(self.id, wire, req.call_id, decision), timeout=self._remaining())
            except grpc.aio.AioRpcError as e:
                # FAILED_PRECONDITION: the run ended first; its stream says how.
                if e.code() != grpc.StatusCode.FAILED_PRECONDITION:
                    raise
        except Exception as e:  # noqa: BLE001 - the handler's failure, whatever it is, cancels the turn
            if self._stopping():
                return
            self._approval_failed(wire, req, e)
            self._stop("cancelled")

    def cancel(self) -> None:
        """Cancels the turn on the server, and any retry delay; it returns at once.

        The client calls CancelTurn in a task of its own; the iteration goes
        on with the events the server sends as it stops the turn (its
        committed messages, its CANCELLED error), for at most the client's
        cancel_timeout, then raises TurnError CANCELLED. Call it from the
        event loop's thread.
        """
        self._stop("cancelled")

    async def close(self) -> None:
        """Cancels the turn on the server if it has not ended, and waits for the answer.

        Bounded by the client's cancel_timeout; it drops the turn's stream
        without reading the events that follow. Nothing after the turn's
        end. ``async with turn:`` calls it on leaving the block.
        """
        if self._ended:
            return
        if self._reason is None:
            self._reason = "cancelled"
        self._cancelled.set()
        call, n = self._call, self._live
        self._live = 0
        if n and self._c.cancel_timeout > 0:
            await self._cancel_on_server(n, self._c.cancel_timeout, None)
        if call is not None:
            call.cancel()

    async def __aenter__(self) -> "AsyncTurn":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def _stop(self, reason: str) -> None:
        """Marks the turn cancelled for reason and cancels its running attempt on the server."""
        if self._cancelled.is_set():
            return
        self._reason = reason
        self._cancelled.set()
        if self._call is not None and self._live:
            self._cancel_run(self._call, self._live)

    def _cancel_run(self, call: grpc.aio.UnaryStreamCall, n: int) -> None:
        """Cancels attempt n's run on the server from a task of its own.

        The stream (call) goes on, so the iteration reads the events the
        server sends as it stops the run; it is dropped when the server keeps
        no turn log (leaving is then what cancels the turn), when the call
        fails, or once cancel_timeout is over.
        """
        wait = self._c.cancel_timeout
        if wait <= 0:
            call.cancel()
            return
        loop = asyncio.get_running_loop()
        self._timers.append(loop.call_later(wait, call.cancel))

        async def run() -> None:
            if not await self._cancel_on_server(n, wait, lambda: not call.done()):
                call.cancel()

        task = loop.create_task(run(), name="turnstile-cancel")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _cancel_on_server(self, n: int, wait: float, is_open: Optional[Callable[[], bool]]) -> bool:
        """Calls CancelTurn for attempt n for at most wait seconds; reports whether the server holds the run.

        As Turn's: a run not found yet, or a server out of reach, is asked
        again while is_open() holds.
        """
        c = self._c
        end = time.monotonic() + wait
        req = agent_pb2.CancelTurnRequest(turn_id=self.id, attempt=n)
        while True:
            try:
                await c._stub.CancelTurn(req, timeout=max(end - time.monotonic(), 0.001), metadata=c._metadata)
                return True
            except grpc.aio.AioRpcError as e:
                code = e.code()
                if code in (grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.UNIMPLEMENTED):
                    return False
                if (
                    code in (grpc.StatusCode.NOT_FOUND, grpc.StatusCode.UNAVAILABLE)
                    and is_open is not None
                    and is_open()
                    and time.monotonic() + 0.05 < end
                ):
                    await asyncio.sleep(0.05)
                    continue
                if code != grpc.StatusCode.NOT_FOUND:
                    cause = e.details() or ""
                    c.logger.info(
                        "turnstile: could not cancel the turn on the server: turn %s, attempt %d (%s)",
                        self.id, n, cause, extra={"turn_id": self.id, "attempt": n, "cause": cause},
                    )
                return False

    async def wait(self) -> Result:
        """Runs the turn to its end, dropping its events, and returns its result."""
        async for _ in self.events():
            pass
        assert self.result is not None
        return self.result

    async def events(self) -> AsyncIterator[Event]:
        """Yields the turn's events as they happen; raises TurnError when the turn fails.

        Closing the async generator (aclose(), or its finalization after a
        break) drops the stream, which leaves the run rather than cancelling
        it, unless the turn is used as an async context manager (see
        AsyncClient.run_turn). It may be iterated only once.
        """
        if self._started:
            raise RuntimeError("turnstile: the events of a turn can be iterated only once")
        self._started = True
        deadline: Optional[asyncio.TimerHandle] = None
        remaining = self._remaining()
        if remaining is not None:
            deadline = asyncio.get_running_loop().call_later(remaining, self._stop, "deadline")
        try:
            async with contextlib.aclosing(self._run()) as run:
                async for ev in run:
                    yield ev
            self._ended = True
        except TurnError as e:
            self._ended = True
            self.error = e
            raise
        finally:
            if deadline is not None:
                deadline.cancel()
            # A caller that stopped early leaves the run here.
            timers, self._timers = self._timers, []
            for t in timers:
                t.cancel()
            if self._call is not None:
                self._call.cancel()

    async def _wait_cancelled(self, delay: float) -> bool:
        """Waits delay seconds unless the turn is cancelled first; reports whether it was."""
        try:
            await asyncio.wait_for(self._cancelled.wait(), delay)
        except TimeoutError:
            pass
        return self._cancelled.is_set()

    async def _run(self) -> AsyncIterator[Event]:
        n = 0
        while True:
            n += 1
            out = Outcome()
            async with contextlib.aclosing(self._attempt(n, out)) as attempt:
                async for ev in attempt:
                    yield ev
            retry = self._settle(n, out)
            if retry is None:
                return
            yield retry
            assert retry.step_retry is not None
            if await self._wait_cancelled(retry.step_retry.delay):
                raise self._stopped(n, self._carried)

    def _start(self, rpc: Callable[..., grpc.aio.UnaryStreamCall], request: object, n: int) -> grpc.aio.UnaryStreamCall:
        """Starts a streaming call of attempt n that turn.cancel() cancels on the server."""
        call = rpc(request, timeout=self._call_timeout(), metadata=self._metadata(n))
        self._call, self._live = call, n
        if self._cancelled.is_set():
            self._cancel_run(call, n)
        return call

    async def _interrupted(
        self, call: grpc.aio.UnaryStreamCall, n: int, wire: int, last_seq: int, carried: List[conversation_pb2.Message], out: Outcome
    ) -> None:
        """Cancels attempt n on the server after the task's cancellation, and notes the turn's error.

        The cancelled call is dropped, and the events the server stored as it
        stopped the run are read with WatchTurn from last_seq, within
        cancel_timeout, without yielding them; turn.error gets the messages
        the turn committed.
        """
        self._reason = self._reason or "cancelled"
        self._cancelled.set()
        self._live = 0
        c = self._c
        wait = c.cancel_timeout
        end = time.monotonic() + wait
        held = wait > 0 and await self._cancel_on_server(wire, wait, None)
        call.cancel()
        if held:
            watch = agent_pb2.WatchTurnRequest(turn_id=self.id, attempt=wire, after_seq=last_seq)
            try:
                async for resp in c._stub.WatchTurn(watch, timeout=max(end - time.monotonic(), 0.001), metadata=c._metadata):
                    if resp.HasField("event"):
                        observe(resp.event, out)
            except grpc.aio.AioRpcError:
                pass  # the run's status after its events, or the time is over
        self.error = self._stopped(n, standing(carried + out.committed))
        self._ended = True

    async def _attempt(self, n: int, out: Outcome) -> AsyncIterator[Event]:
        """Makes attempt number n as Turn._attempt does, re-attaching to its run when its stream breaks."""
        c = self._c
        wire = self._wire
        a = Attempt(n, wire, out)
        carried = self._carried
        call = self._start(c._stub.RunTurn, self._attempt_request(wire), wire)
        try:
            while True:
                err: object = END
                try:
                    async for resp in call:
                        ev = a.accept(resp)
                        if ev is not None:
                            ask = self._approval_due(wire, ev)
                            yield Event(attempt=n, agent=ev)
                            if ask is not None:
                                await self._answer(wire, ask)
                except grpc.aio.AioRpcError as e:
                    err = e
                    if a.unreached(e):
                        return
                except asyncio.CancelledError:
                    if _task_cancelled():
                        await self._interrupted(call, n, wire, a.last_seq, carried, out)
                        raise
                    err = _dropped()  # the client dropped the stream: cancel_timeout passed
                delay = a.ended(err, c, self._cancelled.is_set() or self._expired())
                if delay is not None:
                    wait = self._log_reattach(a, delay, err)
                    if not await self._wait_cancelled(wait) and not self._expired():
                        call.cancel()
                        call = self._start(c._stub.WatchTurn, a.reattach_request(self.id), wire)
                        continue
                    a.give_up()
                a.finish()
                return
        finally:
            self._call = None
            if out.completed is not None or out.fail is not None:
                self._live = 0  # else the caller left the run: close() cancels it
            call.cancel()


__all__ = ["AsyncClient", "AsyncTurn"]
