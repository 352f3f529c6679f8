"""The client and its turns: events, discard signalling, step retries."""

from __future__ import annotations

import logging
import secrets
import threading
import time
from typing import Callable, Iterator, List, Optional, Sequence, Tuple

import grpc

from ._errors import TurnError
from ._protocol import (
    CANCEL_TIMEOUT,
    REATTACH_BACKOFF,
    ApprovalHandler,
    Decision,
    approve_request,
    STEER_RETRY_CODES,
    new_request_id,
    steer_request,
    REATTACH_TIMEOUT,
    END,
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


class Client(ClientBase):
    """Runs turns on a turnstile server. Safe for use from several threads.

    target is a gRPC target such as "127.0.0.1:7700" or
    "dns:///turnstile.internal:7700". Without credentials the channel is
    plaintext; pass grpc.ssl_channel_credentials() for TLS, or a channel of
    your own. Close the client (or use it as a context manager) when done.

    load_balancing_policy is gRPC's policy over the addresses the target
    resolves to: "round_robin" (the default, as the Go client does: with
    "dns:///" and a headless Service, turns spread over every replica) or
    "pick_first" (one connection).

    AsyncClient is the same client for asyncio.
    """

    def __init__(
        self,
        target: str = "",
        *,
        channel: Optional[grpc.Channel] = None,
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
                channel = grpc.secure_channel(target, credentials, options=self._channel_options)
            else:
                channel = grpc.insecure_channel(target, options=self._channel_options)
            self._owned = True
        else:
            self._owned = False
        self._channel = channel
        self._stub = agent_pb2_grpc.AgentServiceStub(channel)

    def close(self) -> None:
        """Closes the channel the client made; turns still running fail CANCELLED."""
        if self._owned:
            self._channel.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def approve_tool_call(
        self, request: agent_pb2.ApproveToolCallRequest, *, timeout: Optional[float] = None
    ) -> agent_pb2.ApproveToolCallResponse:
        """Decides a tool call that waits for approval (a tool_approval_requested event of the turn).

        request names the turn, the attempt (0: the latest) and the call. It
        may be called from any thread, on any replica: the decision is stored
        in the turn's log before the call returns. Deciding a call already
        decided changes nothing: the response's applied is False and approved
        gives the decision that stands. A call the transport failed
        (UNAVAILABLE) is made again, as a decision may be sent twice, with the
        re-attach backoff for up to reattach_timeout. Other errors are raised
        as grpc.RpcError: INVALID_ARGUMENT, NOT_FOUND (no such run, or it never
        asked about the call), FAILED_PRECONDITION (the run ended first),
        PERMISSION_DENIED (another client key's turn).
        """
        start = time.monotonic()
        n = 0
        while True:
            n += 1
            try:
                return self._stub.ApproveToolCall(request, timeout=timeout, metadata=self._metadata)
            except grpc.RpcError as e:
                if not isinstance(e, grpc.Call) or e.code() != grpc.StatusCode.UNAVAILABLE:
                    raise
                delay = self.reattach_backoff.delay(n, self.random())
                if time.monotonic() - start + delay > self.reattach_timeout:
                    raise
                time.sleep(delay)

    def steer_turn(self, request: agent_pb2.SteerTurnRequest, *, timeout: Optional[float] = None) -> agent_pb2.SteerTurnResponse:
        """Gives a running turn a user message (role user or unset, text parts only).

        The turn takes it at its next step boundary (see
        AgentService.SteerTurn). The request goes as it is, once: after
        UNAVAILABLE or DEADLINE_EXCEEDED the message may or may not have been
        queued. Send it again with the same request.request_id to have it
        taken once (the response's duplicate says it was taken already), or
        use Turn.steer, which does so. Errors are raised as grpc.RpcError:
        INVALID_ARGUMENT, NOT_FOUND (no such run),
        FAILED_PRECONDITION (the run has ended), RESOURCE_EXHAUSTED (too many
        messages queued).
        """
        return self._stub.SteerTurn(request, timeout=timeout, metadata=self._metadata)

    def run_turn(
        self,
        request: agent_pb2.RunTurnRequest,
        *,
        timeout: Optional[float] = None,
        on_approval: Optional[ApprovalHandler] = None,
    ) -> "Turn":
        """Prepares one turn of request; it runs as the caller iterates over Turn.events().

        When request has no turn_id the client makes one, so every attempt
        shares it. Each attempt is a run of its own on the server, named by the
        turn id and its number (RunTurnRequest.attempt, and the
        turnstile-attempt metadata for older servers).

        A stream that breaks before the attempt's last event (a connection
        reset, a replica that went away) is first resumed, not retried: the
        client re-attaches to the same run with WatchTurn from the seq of the
        last event it received, for up to reattach_timeout (30 s) from the
        break, and the iteration goes on with the next event; nothing is run
        again and no event is repeated: a server restarting, or a replica
        taking the turn over, is outlasted. This needs a server with a turn store; a server
        without one (WatchTurn answers FAILED_PRECONDITION), or one that never
        stored the run (NOT_FOUND), makes the break stand. A call that never
        reached the server (it could not connect) is not re-attached.

        An attempt that ends with an error event whose retryable is true, or
        whose break stands with UNAVAILABLE, is followed by a StepRetry event
        and a new attempt, up to max_step_retries, after the server's retry
        delay or else the client's jittered backoff. The new attempt resumes
        the turn: its request carries the request's messages plus the messages
        the failed attempts committed (message_completed events). An error
        whose retryable is false or unset is raised at once; so is a break that
        stands while server-side tools were running, as they may have had
        effects. timeout (seconds) bounds the whole turn, retries and
        re-attaches included. request is not modified.

        Cancelling and leaving differ. Turn.cancel() (from any thread), a
        KeyboardInterrupt while the client waits for the server, leaving a
        ``with turn:`` block before the turn's end, and the timeout passing
        cancel the turn on the server: the client calls CancelTurn for the
        running attempt, bounded by cancel_timeout (2 s). After cancel() the
        iteration goes on with the events the server sends as it stops the
        turn: message_completed events for what the turn had (the partial
        reply, a "cancelled by the user" result for every tool call that did
        not run, an interruption note), then its CANCELLED error; it then
        raises TurnError CANCELLED (DEADLINE_EXCEEDED for the timeout) whose
        messages hold every message the turn committed: append them to the
        conversation and the next turn continues from it. After a
        KeyboardInterrupt, which propagates, turn.error holds that TurnError.
        A server without a turn store answers CancelTurn FAILED_PRECONDITION;
        there dropping the stream is what cancels the turn. Closing the
        generator (breaking out of a for loop) outside a ``with turn:``
        block only drops the stream: a server with a turn store keeps
        running the turn for turn.detach_grace (30 s), as it does when the
        process dies.

        on_approval answers every tool_approval_requested event of the turn:
        the client calls it with the request after yielding the event and
        sends the Decision it returns with ApproveToolCall (default: none;
        answer with Turn.approve or approve_tool_call, or the server's
        approval timeout denies the call). It is called once per call id and
        attempt: not for a request the server emits again (after a replica
        took the turn over) nor for one whose tool_approval_decided event was
        already received; the turn waits while it runs. When it raises, or the
        decision cannot be delivered (any error but FAILED_PRECONDITION, which
        says the run has ended), the client cancels the turn: it fails
        CANCELLED with that exception as the TurnError's __cause__.
        """
        req = agent_pb2.RunTurnRequest()
        req.CopyFrom(request)
        if not req.turn_id:
            req.turn_id = secrets.token_hex(16)
        return Turn(self, req, timeout, on_approval)

class Turn(TurnBase):
    """A turn started by Client.run_turn.

    Iterate over events() once to run it, then read result (or error).
    cancel() may be called from any thread. Used as a context manager
    (``with client.run_turn(req) as turn:``), a turn left before its end is
    cancelled on the server (see Client.run_turn).
    """

    def __init__(
        self,
        client: Client,
        request: agent_pb2.RunTurnRequest,
        timeout: Optional[float],
        on_approval: Optional[ApprovalHandler] = None,
    ) -> None:
        super().__init__(client, request, timeout, on_approval)
        self._c = client
        #: Set with _reason: the caller cancelled the turn, or its deadline passed.
        self._cancelled = threading.Event()
        self._lock = threading.Lock()
        self._call: Optional[grpc.Call] = None
        #: The attempt whose run may go on on the server (its stream open, or
        #: left when the caller closed the generator); 0 otherwise.
        self._live = 0
        #: Timers that drop a cancelled attempt's stream once cancel_timeout
        #: is over.
        self._timers: List[threading.Timer] = []

    def steer(self, text: str, *, timeout: Optional[float] = None) -> agent_pb2.SteerTurnResponse:
        """Sends text to the running turn as a user message (Client.steer_turn), from any thread.

        It goes to the attempt whose events the turn yields; before the
        turn's first event it raises NotStartedError. The turn takes it once:
        the request carries a fresh random request_id, and a call that fails
        with UNAVAILABLE (a connection cut, the turn's replica gone and
        another taking it over) or DEADLINE_EXCEEDED (timeout is each try's)
        is made again with the same id, with the re-attach backoff for up to
        reattach_timeout.
        """
        c = self._c
        req = steer_request(self.id, self._running_attempt(), text, new_request_id())
        start = time.monotonic()
        n = 0
        while True:
            n += 1
            try:
                return c.steer_turn(req, timeout=timeout)
            except grpc.RpcError as e:
                if not isinstance(e, grpc.Call) or e.code() not in STEER_RETRY_CODES:
                    raise
                delay = c.reattach_backoff.delay(n, c.random())
                if time.monotonic() - start + delay > c.reattach_timeout:
                    raise
                time.sleep(delay)

    def approve(self, call_id: str, decision: Decision, *, timeout: Optional[float] = None) -> bool:
        """Decides the tool call call_id of the attempt whose events the turn yields (Client.approve_tool_call).

        It returns whether this decision was taken (False: the call had been
        decided already). It may be called from any thread; before the
        turn's first event it raises NotStartedError.
        """
        req = approve_request(self.id, self._running_attempt(), call_id, decision)
        return self._c.approve_tool_call(req, timeout=timeout).applied

    def _answer(self, wire: int, req: agent_pb2.ToolApprovalRequested) -> None:
        """Calls the approval handler for req and sends its decision; a failure cancels the turn."""
        assert self._on_approval is not None
        try:
            decision = self._on_approval(req)
            try:
                self._c.approve_tool_call(approve_request(self.id, wire, req.call_id, decision), timeout=self._remaining())
            except grpc.RpcError as e:
                # FAILED_PRECONDITION: the run ended first; its stream says how.
                if not isinstance(e, grpc.Call) or e.code() != grpc.StatusCode.FAILED_PRECONDITION:
                    raise
        except Exception as e:  # noqa: BLE001 - the handler's failure, whatever it is, cancels the turn
            if self._stopping():
                return
            self._approval_failed(wire, req, e)
            self._stop("cancelled")

    def cancel(self) -> None:
        """Cancels the turn on the server, and any retry delay; it returns at once.

        The client calls CancelTurn from a thread of its own; the iteration
        goes on with the events the server sends as it stops the turn (its
        committed messages, its CANCELLED error), for at most the client's
        cancel_timeout, then raises TurnError CANCELLED.
        """
        self._stop("cancelled")

    def close(self) -> None:
        """Cancels the turn on the server if it has not ended, and waits for the answer.

        Bounded by the client's cancel_timeout; it drops the turn's stream
        without reading the events that follow. Nothing after the turn's end.
        ``with turn:`` calls it on leaving the block.
        """
        with self._lock:
            if self._ended:
                return
            if self._reason is None:
                self._reason = "cancelled"
            self._cancelled.set()
            call, n = self._call, self._live
            self._live = 0
        if n and self._c.cancel_timeout > 0:
            self._cancel_on_server(n, self._c.cancel_timeout, None)
        if call is not None:
            call.cancel()

    def __enter__(self) -> "Turn":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _stop(self, reason: str) -> None:
        """Marks the turn cancelled for reason and cancels its running attempt on the server."""
        with self._lock:
            if self._cancelled.is_set():
                return
            self._reason = reason
            self._cancelled.set()
            call, n = self._call, self._live
        if call is not None and n:
            self._cancel_run(call, n)

    def _cancel_run(self, call: grpc.Call, n: int) -> None:
        """Cancels attempt n's run on the server from a thread of its own.

        The stream (call) goes on, so the iteration reads the events the
        server sends as it stops the run; it is dropped when the server keeps
        no turn log (leaving is then what cancels the turn), when the call
        fails, or once cancel_timeout is over.
        """
        wait = self._c.cancel_timeout
        if wait <= 0:
            call.cancel()
            return
        timer = threading.Timer(wait, call.cancel)
        timer.daemon = True
        with self._lock:
            self._timers.append(timer)
        timer.start()

        def run() -> None:
            if not self._cancel_on_server(n, wait, call.is_active):
                call.cancel()

        threading.Thread(target=run, name="turnstile-cancel", daemon=True).start()

    def _cancel_on_server(self, n: int, wait: float, is_open: Optional[Callable[[], bool]]) -> bool:
        """Calls CancelTurn for attempt n for at most wait seconds; reports whether the server holds the run.

        A run not found yet, or a server out of reach, is asked again while
        is_open() holds (the server may not have stored the run yet). False
        when the server keeps no turn log (FAILED_PRECONDITION), has no such
        run, or could not be asked.
        """
        c = self._c
        end = time.monotonic() + wait
        req = agent_pb2.CancelTurnRequest(turn_id=self.id, attempt=n)
        while True:
            try:
                c._stub.CancelTurn(req, timeout=max(end - time.monotonic(), 0.001), metadata=c._metadata)
                return True
            except grpc.RpcError as e:
                code = e.code() if isinstance(e, grpc.Call) else None
                if code in (grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.UNIMPLEMENTED):
                    return False
                if (
                    code in (grpc.StatusCode.NOT_FOUND, grpc.StatusCode.UNAVAILABLE)
                    and is_open is not None
                    and is_open()
                    and time.monotonic() + 0.05 < end
                ):
                    time.sleep(0.05)
                    continue
                if code != grpc.StatusCode.NOT_FOUND:
                    cause = e.details() if isinstance(e, grpc.Call) else str(e)
                    c.logger.info(
                        "turnstile: could not cancel the turn on the server: turn %s, attempt %d (%s)",
                        self.id, n, cause, extra={"turn_id": self.id, "attempt": n, "cause": cause},
                    )
                return False

    def wait(self) -> Result:
        """Runs the turn to its end, dropping its events, and returns its result."""
        for _ in self.events():
            pass
        assert self.result is not None
        return self.result

    def events(self) -> Iterator[Event]:
        """Yields the turn's events as they happen; raises TurnError when the turn fails.

        Closing the generator (breaking out of a for loop) drops the stream
        at once, which leaves the run rather than cancelling it, unless the
        turn is used as a context manager (see Client.run_turn). It may be
        iterated only once.
        """
        if self._started:
            raise RuntimeError("turnstile: the events of a turn can be iterated only once")
        self._started = True
        deadline: Optional[threading.Timer] = None
        if self._deadline is not None:
            deadline = threading.Timer(max(self._deadline - time.monotonic(), 0), self._stop, args=("deadline",))
            deadline.daemon = True
            deadline.start()
        try:
            yield from self._run()
            with self._lock:
                self._ended = True
        except TurnError as e:
            with self._lock:
                self._ended = True
            self.error = e
            raise
        finally:
            if deadline is not None:
                deadline.cancel()
            # A caller that stopped early leaves the run here.
            with self._lock:
                call = self._call
                timers, self._timers = self._timers, []
            for t in timers:
                t.cancel()
            if call is not None:
                call.cancel()

    def _run(self) -> Iterator[Event]:
        n = 0
        while True:
            n += 1
            out = Outcome()
            # Each attempt's events are yielded as they arrive.
            yield from self._attempt(n, out)
            retry = self._settle(n, out)
            if retry is None:
                return
            yield retry
            assert retry.step_retry is not None
            if self._cancelled.wait(retry.step_retry.delay):
                raise self._stopped(n, self._carried)

    def _start(self, rpc: Callable[..., grpc.Call], request: object, n: int) -> grpc.Call:
        """Starts a streaming call of attempt n that turn.cancel() cancels on the server.

        The call outlives the turn's deadline by cancel_timeout, so the
        events the server sends as it stops the run arrive.
        """
        call = rpc(request, timeout=self._call_timeout(), metadata=self._metadata(n))
        with self._lock:
            self._call, self._live = call, n
            cancelled = self._cancelled.is_set()
        if cancelled:
            self._cancel_run(call, n)
        return call

    def _interrupted(
        self, call: grpc.Call, n: int, wire: int, last_seq: int, carried: List[conversation_pb2.Message], out: Outcome
    ) -> None:
        """Cancels attempt n (numbered wire on the wire) on the server after a KeyboardInterrupt, and notes the turn's error.

        The interrupted call cannot be read on (grpcio leaves its receive
        pending): it is dropped, and the events the server stored as it
        stopped the run are read with WatchTurn from last_seq, within
        cancel_timeout, without yielding them; turn.error gets the messages
        the turn committed.
        """
        with self._lock:
            self._reason = self._reason or "cancelled"
            self._cancelled.set()
            self._live = 0
        c = self._c
        wait = c.cancel_timeout
        end = time.monotonic() + wait
        held = wait > 0 and self._cancel_on_server(wire, wait, None)
        call.cancel()
        if held:
            watch = agent_pb2.WatchTurnRequest(turn_id=self.id, attempt=wire, after_seq=last_seq)
            try:
                for resp in c._stub.WatchTurn(watch, timeout=max(end - time.monotonic(), 0.001), metadata=c._metadata):
                    if resp.HasField("event"):
                        observe(resp.event, out)
            except grpc.RpcError:
                pass  # the run's status after its events, or the time is over
        self.error = self._stopped(n, standing(carried + out.committed))
        with self._lock:
            self._ended = True

    def _attempt(self, n: int, out: Outcome) -> Iterator[Event]:
        """Makes attempt number n, re-sending the messages the failed attempts committed.

        When the stream breaks before the attempt's last event, it re-attaches
        to the same run with WatchTurn from the last seq received, so the run
        goes on without loss or duplicates; only when that is impossible (the
        server keeps no turn log, or never stored the run) or keeps failing
        does the attempt end with the break.
        """
        c = self._c
        wire = self._wire
        a = Attempt(n, wire, out)
        carried = self._carried
        call = self._start(c._stub.RunTurn, self._attempt_request(wire), wire)
        try:
            while True:
                err: object = END
                try:
                    try:
                        for resp in call:
                            ev = a.accept(resp)
                            if ev is not None:
                                ask = self._approval_due(wire, ev)
                                yield Event(attempt=n, agent=ev)
                                if ask is not None:
                                    self._answer(wire, ask)
                    except KeyboardInterrupt:
                        self._interrupted(call, n, wire, a.last_seq, carried, out)
                        raise
                except grpc.RpcError as e:
                    err = e
                    if a.unreached(e):
                        return
                delay = a.ended(err, c, self._cancelled.is_set() or self._expired())
                if delay is not None:
                    wait = self._log_reattach(a, delay, err)
                    if not self._cancelled.wait(wait) and not self._expired():
                        call.cancel()
                        call = self._start(c._stub.WatchTurn, a.reattach_request(self.id), wire)
                        continue
                    a.give_up()
                a.finish()
                return
        finally:
            with self._lock:
                self._call = None
                if out.completed is not None or out.fail is not None:
                    self._live = 0  # else the caller left the run: close() cancels it
            call.cancel()


__all__ = ["Client", "Turn"]
