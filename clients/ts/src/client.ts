import { clone, create, type MessageInitShape } from "@bufbuild/protobuf";
import { createClient, type Client as RpcClient, type Transport } from "@connectrpc/connect";
import { createGrpcTransport } from "@connectrpc/connect-node";
import { randomBytes } from "node:crypto";

import {
  AgentService,
  type AgentEvent,
  type EndReason,
  type RunTurnRequest,
  RunTurnRequestSchema,
  type TurnCompleted,
  type TurnCounters,
  TurnCountersSchema,
} from "./gen/turnstile/v1/agent_pb.js";
import { type Message, Role, type Usage, UsageSchema } from "./gen/turnstile/v1/conversation_pb.js";
import { ErrorCode, type Error as ErrorEvent } from "./gen/turnstile/v1/errors_pb.js";
import { type Failure, TurnError, fromErrorEvent, fromStatus } from "./errors.js";

/**
 * The request metadata key in which the client numbers its attempts at one
 * turn id, from 1, so the server's logs tie them together.
 */
export const ATTEMPT_HEADER = "turnstile-attempt";

/**
 * Backoff describes the jittered exponential delays between step retries
 * when the server gives no delay: retry n (from 1) waits
 * initialMs × multiplier^(n-1), capped at maxMs, then spread uniformly by
 * ± jitter (a fraction).
 */
export interface Backoff {
  initialMs: number;
  maxMs: number;
  multiplier: number;
  jitter: number;
}

/** The default backoff: 1s doubling up to 30s, spread by ±20%. */
export const DEFAULT_BACKOFF: Readonly<Backoff> = { initialMs: 1000, maxMs: 30000, multiplier: 2, jitter: 0.2 };

/** backoffDelay returns the wait before retry n (n >= 1) for the jitter draw u in [0, 1). */
export function backoffDelay(b: Backoff, n: number, u: number): number {
  let d = b.initialMs;
  for (let i = 1; i < n; i++) {
    d *= Math.max(b.multiplier, 1);
    if (b.maxMs > 0 && d >= b.maxMs) break;
  }
  if (b.maxMs > 0) d = Math.min(d, b.maxMs);
  d *= 1 + b.jitter * (2 * u - 1);
  return Math.max(d, 0);
}

/** Options configure a Client. */
export interface ClientOptions {
  /** How many times a failed step of a turn is run again (default 1; 0 disables step retries). */
  maxStepRetries?: number;
  /** The delays between step retries when the server gives none (default DEFAULT_BACKOFF). */
  backoff?: Backoff;
  /**
   * The longest delay the client waits before a step retry (default 60000 ms).
   * When the server advises a longer wait, the error is thrown at once, with
   * its retryAfterMs, for the caller to decide.
   */
  maxRetryDelayMs?: number;
  /** Headers sent with every RPC, for example an authorization bearer token. */
  headers?: Record<string, string>;
  /**
   * The transport to use instead of the default gRPC-over-HTTP/2 one made
   * from the base URL (for TLS options, interceptors...).
   */
  transport?: Transport;
}

/**
 * Event is one step of a turn as the client sees it: either an event the
 * server sent (agent) or a signal of the client's own (stepRetry). Exactly
 * one of the two is set.
 */
export interface Event {
  /**
   * The client's attempt at the turn that the event belongs to, from 1. The
   * server numbers the events of each attempt (AgentEvent.seq) from 1 again.
   */
  attempt: number;
  /**
   * An event sent by the server. An error event ends an attempt, not
   * necessarily the turn: a stepRetry event or the turn's error follows it.
   */
  agent?: AgentEvent;
  /** The attempt failed and the client runs the failed step again once delayMs has passed. */
  stepRetry?: StepRetry;
}

/** StepRetry is the client's signal that it resumes a failed turn with a new attempt. */
export interface StepRetry {
  /** The number of the attempt about to start, from 2. */
  attempt: number;
  /** The most attempts the client makes at the turn. */
  maxAttempts: number;
  /** How long the client waits before the attempt, in ms. */
  delayMs: number;
  /** The failure of the attempt that ended. */
  error: TurnError;
  /**
   * Output was streamed since the last message that stands (the last of
   * messages, or the turn's start): text, thinking and tool call deltas, and
   * any message committed after it, were never committed and every consumer
   * must drop them. The new attempt streams that step afresh.
   */
  discardPartial: boolean;
  /**
   * The messages the turn committed so far that stand; the new attempt
   * re-sends them after the request's own, so the work they hold (tool
   * results above all) is not done again.
   */
  messages: Message[];
}

/** Result is the outcome of a turn that completed. */
export interface Result {
  turnId: string;
  /** Why the turn ended. */
  endReason: EndReason;
  /**
   * The messages the turn added, across every attempt, in order: append
   * them to the conversation. With TOOL_CALLS_REQUIRED the last one holds
   * the tool calls the caller must run.
   */
  messages: Message[];
  /** The tokens used by every attempt, failed ones included. */
  usage: Usage;
  /** What happened in every attempt. */
  counters: TurnCounters;
  /** The number of attempts the client made. */
  attempts: number;
}

/** Options of one turn. */
export interface TurnOptions {
  /** Aborting it cancels the turn, retries and their delays included. */
  signal?: AbortSignal;
  /** A deadline for the whole turn, retries included, in ms. */
  timeoutMs?: number;
}

/**
 * Client runs turns on a turnstile server over gRPC. baseUrl is
 * "http://host:port" for plaintext (h2c) or "https://host:port" for TLS.
 */
export class Client {
  private readonly rpc: RpcClient<typeof AgentService>;
  readonly maxStepRetries: number;
  readonly backoff: Backoff;
  readonly maxRetryDelayMs: number;
  private readonly headers: Record<string, string>;
  /** The jitter draw; replaceable in tests. */
  random: () => number = Math.random;

  constructor(baseUrl: string, options: ClientOptions = {}) {
    this.maxStepRetries = options.maxStepRetries ?? 1;
    this.backoff = options.backoff ?? { ...DEFAULT_BACKOFF };
    this.maxRetryDelayMs = options.maxRetryDelayMs ?? 60_000;
    this.headers = { ...options.headers };
    if (!Number.isInteger(this.maxStepRetries) || this.maxStepRetries < 0) {
      throw new RangeError("turnstile: maxStepRetries must be a non-negative integer");
    }
    const b = this.backoff;
    if (b.initialMs < 0 || b.maxMs < 0 || b.jitter < 0 || b.jitter > 1) {
      throw new RangeError("turnstile: invalid backoff");
    }
    let transport = options.transport;
    if (!transport) {
      if (!/^https?:\/\//.test(baseUrl)) {
        throw new TypeError(`turnstile: base URL ${JSON.stringify(baseUrl)} needs a scheme: http://host:port (plaintext) or https://host:port (TLS)`);
      }
      transport = createGrpcTransport({ baseUrl });
    }
    this.rpc = createClient(AgentService, transport);
  }

  /**
   * runTurn prepares one turn of req; it runs as the caller iterates over
   * Turn.events() (or awaits Turn.wait()).
   *
   * When req has no turnId the client makes one, so every attempt shares it.
   * An attempt that ends with an error event whose retryable is true, or
   * whose stream breaks without a terminal event with UNAVAILABLE (a replica
   * went away, a connection was reset), is followed by a stepRetry event
   * and a new attempt, up to maxStepRetries, after the server's retry delay
   * or else the client's jittered backoff. The new attempt resumes the turn:
   * its request carries req's messages plus the messages the failed attempts
   * committed (message_completed events), and the request metadata
   * turnstile-attempt numbers it. An error whose retryable is false or unset
   * is thrown at once; so is a transport break while server-side tools were
   * running, as they may have had effects. req is not modified.
   */
  runTurn(req: MessageInitShape<typeof RunTurnRequestSchema>, options: TurnOptions = {}): Turn {
    const r = clone(RunTurnRequestSchema, create(RunTurnRequestSchema, req));
    if (!r.turnId) r.turnId = randomBytes(16).toString("hex");
    return new Turn(this, r, options);
  }

  /** @internal */
  stream(req: RunTurnRequest, attempt: number, signal: AbortSignal): AsyncIterable<{ event?: AgentEvent }> {
    return this.rpc.runTurn(req, { signal, headers: { ...this.headers, [ATTEMPT_HEADER]: String(attempt) } });
  }
}

/** What one attempt left behind. */
interface AttemptOutcome {
  completed?: TurnCompleted;
  fail?: Failure;
  /** The messages the attempt committed, in order. */
  committed: Message[];
  /** Output streamed since the last commit. */
  partial: boolean;
  /** Server-side tools started since the last commit. */
  toolsRunning: string[];
  usage?: Usage;
  counters?: TurnCounters;
}

/**
 * Turn is a turn started by Client.runTurn. Iterate over events() once to
 * run it, then read result or error.
 */
export class Turn {
  /** The turn's outcome once the iteration ended; undefined while it runs or when it failed. */
  result?: Result;
  /** The turn's failure once the iteration ended; undefined on success or while it runs. */
  error?: TurnError;
  private started = false;

  /** @internal */
  constructor(
    private readonly client: Client,
    private readonly req: RunTurnRequest,
    private readonly options: TurnOptions,
  ) {}

  /** The turn's id, the caller's or the one the client made. */
  get id(): string {
    return this.req.turnId;
  }

  /**
   * events yields the turn's events as they happen and throws a TurnError
   * when the turn fails. Breaking out of the loop cancels the RPC at once.
   * It may be iterated only once.
   */
  async *events(): AsyncGenerator<Event, Result, undefined> {
    if (this.started) throw new Error("turnstile: the events of a turn can be iterated only once");
    this.started = true;
    const turnCtl = new AbortController();
    const onAbort = () => turnCtl.abort(this.options.signal?.reason);
    this.options.signal?.addEventListener("abort", onAbort, { once: true });
    if (this.options.signal?.aborted) onAbort();
    let deadline: ReturnType<typeof setTimeout> | undefined;
    let timedOut = false;
    const deadlineAt = this.options.timeoutMs !== undefined ? Date.now() + this.options.timeoutMs : undefined;
    if (this.options.timeoutMs !== undefined) {
      deadline = setTimeout(() => {
        timedOut = true;
        turnCtl.abort(new Error("deadline"));
      }, this.options.timeoutMs);
    }
    const cancelled = (n: number, carried: Message[]): TurnError => {
      const te = timedOut
        ? new TurnError(ErrorCode.DEADLINE_EXCEEDED, "the turn's deadline passed")
        : new TurnError(ErrorCode.CANCELLED, "the turn was cancelled", { cause: turnCtl.signal.reason });
      return this.stamp(te, n, carried);
    };
    try {
      const c = this.client;
      let carried: Message[] = [];
      const usage = create(UsageSchema);
      const counters = create(TurnCountersSchema);
      for (let n = 1; ; n++) {
        const out: AttemptOutcome = { committed: [], partial: false, toolsRunning: [] };
        // Each attempt's events are yielded as they arrive.
        yield* this.attempt(n, carried, turnCtl.signal, out);
        addUsage(usage, out.usage);
        addCounters(counters, out.counters);
        if (out.completed) {
          const tc = out.completed;
          addUsage(usage, tc.usage);
          addCounters(counters, tc.counters);
          this.result = {
            turnId: this.id,
            endReason: tc.endReason,
            // Too large for one event, they came in message_completed only.
            messages: [...carried, ...(tc.messagesOmitted ? out.committed : tc.messages)],
            usage,
            counters,
            attempts: n,
          };
          return this.result;
        }
        const fail = out.fail!;
        carried = [...carried, ...out.committed];
        const kept = standing(carried);
        const discard = out.partial || kept.length < carried.length;
        carried = kept;
        this.stamp(fail.err, n, carried);
        if (turnCtl.signal.aborted) throw cancelled(n, carried);
        if (fail.transport && out.toolsRunning.length > 0) {
          // The server may have run them: resuming could run them again.
          fail.err.code = ErrorCode.TOOLS_UNSAFE;
          fail.err.message = `${fail.err.message}; the connection broke while the tools ${out.toolsRunning.join(", ")} were running, check their effects before running the turn again`;
          fail.err.retryable = false;
          fail.retry = false;
        }
        if (!fail.retry || n > c.maxStepRetries) throw fail.err;
        let delay = fail.err.retryAfterMs;
        if (delay <= 0) delay = backoffDelay(c.backoff, n, c.random());
        if (delay > c.maxRetryDelayMs) throw fail.err;
        if (deadlineAt !== undefined && deadlineAt - Date.now() <= delay) throw fail.err;
        yield {
          attempt: n,
          stepRetry: {
            attempt: n + 1,
            maxAttempts: c.maxStepRetries + 1,
            delayMs: delay,
            error: fail.err,
            discardPartial: discard,
            messages: [...carried],
          },
        };
        if (!(await sleep(delay, turnCtl.signal))) throw cancelled(n, carried);
      }
    } catch (e) {
      if (e instanceof TurnError) this.error = e;
      throw e;
    } finally {
      clearTimeout(deadline);
      this.options.signal?.removeEventListener("abort", onAbort);
      // A caller that broke out of the loop cancels the RPC here.
      turnCtl.abort(new Error("iteration stopped before the turn ended"));
    }
  }

  /** wait runs the turn to its end, dropping its events, and returns its result. */
  async wait(): Promise<Result> {
    for await (const _ of this.events()) {
      // Dropped.
    }
    return this.result!;
  }

  private stamp(te: TurnError, n: number, carried: Message[]): TurnError {
    te.turnId = this.id;
    te.attempts = n;
    te.messages = [...carried];
    return te;
  }

  /**
   * attempt makes attempt number n at the turn, re-sending carried after the
   * request's messages, yields its events and fills out.
   */
  private async *attempt(n: number, carried: Message[], turnSignal: AbortSignal, out: AttemptOutcome): AsyncGenerator<Event> {
    const ctl = new AbortController();
    const onAbort = () => ctl.abort(turnSignal.reason);
    turnSignal.addEventListener("abort", onAbort, { once: true });
    if (turnSignal.aborted) onAbort();
    let req = this.req;
    if (carried.length > 0) {
      req = clone(RunTurnRequestSchema, this.req);
      req.messages.push(...carried);
    }
    out.counters = create(TurnCountersSchema);
    let errEvent: ErrorEvent | undefined;
    try {
      for await (const resp of this.client.stream(req, n, ctl.signal)) {
        const ev = resp.event;
        if (!ev) continue;
        observe(ev, out, (e) => (errEvent = e));
        yield { attempt: n, agent: ev };
      }
      if (!out.completed) {
        out.fail = errEvent
          ? fromErrorEvent(errEvent)
          : {
              retry: true,
              transport: true,
              err: Object.assign(new TurnError(ErrorCode.UNAVAILABLE, "the stream ended without a terminal event"), {
                retryable: true,
              }),
            };
      }
    } catch (e) {
      if (out.completed) return;
      if (errEvent) {
        out.fail = fromErrorEvent(errEvent);
        const st = fromStatus(e);
        out.fail.err.status = st.err.status;
        out.fail.err.cause = e;
      } else {
        out.fail = fromStatus(e);
      }
    } finally {
      turnSignal.removeEventListener("abort", onAbort);
      ctl.abort();
    }
  }
}

/** observe updates an attempt's outcome with one of its events. */
function observe(ev: AgentEvent, out: AttemptOutcome, onError: (e: ErrorEvent) => void): void {
  const p = ev.payload;
  switch (p.case) {
    case "textDelta":
    case "thinkingDelta":
    case "toolCallDelta":
      out.partial = true;
      break;
    case "messageCompleted":
      if (p.value.message) out.committed.push(p.value.message);
      out.partial = false;
      out.toolsRunning = [];
      break;
    case "toolStarted":
      out.toolsRunning.push(p.value.name);
      break;
    case "toolFinished":
      out.counters!.toolCalls++;
      if (p.value.isError) out.counters!.toolErrors++;
      break;
    case "llmCallStarted":
      out.counters!.modelCalls++;
      break;
    case "retry":
      out.counters!.retries++;
      if (p.value.discardPartial) out.partial = false; // the server told consumers to drop it
      break;
    case "fallback":
      out.counters!.fallbacks++;
      if (p.value.discardPartial) out.partial = false;
      break;
    case "compaction":
      out.counters!.compactions++;
      break;
    case "hedge":
      out.counters!.hedges++;
      break;
    case "usage":
      out.usage = p.value;
      break;
    case "error":
      onError(p.value);
      break;
    case "turnCompleted":
      out.completed = p.value;
      // The final attempt's own counters are in TurnCompleted.
      out.usage = undefined;
      out.counters = undefined;
      break;
  }
}

/**
 * standing returns the prefix of the committed messages that a new attempt
 * can resume from: a trailing assistant message whose tool calls have no
 * results is dropped, since the step that runs them has to be made again.
 */
export function standing(msgs: Message[]): Message[] {
  const last = msgs[msgs.length - 1];
  if (!last || last.role !== Role.ASSISTANT) return msgs;
  return last.parts.some((p) => p.kind.case === "toolCall") ? msgs.slice(0, -1) : msgs;
}

function addUsage(dst: Usage, u: Usage | undefined): void {
  if (!u) return;
  dst.inputTokens += u.inputTokens;
  dst.outputTokens += u.outputTokens;
  dst.cacheReadTokens += u.cacheReadTokens;
  dst.cacheWriteTokens += u.cacheWriteTokens;
}

function addCounters(dst: TurnCounters, c: TurnCounters | undefined): void {
  if (!c) return;
  dst.modelCalls += c.modelCalls;
  dst.retries += c.retries;
  dst.fallbacks += c.fallbacks;
  dst.toolCalls += c.toolCalls;
  dst.toolErrors += c.toolErrors;
  dst.compactions += c.compactions;
  dst.hedges += c.hedges;
}

/** sleep waits ms or until signal aborts; it reports whether the wait ran out. */
function sleep(ms: number, signal: AbortSignal): Promise<boolean> {
  if (signal.aborted) return Promise.resolve(false);
  return new Promise((resolve) => {
    const done = (ok: boolean) => {
      clearTimeout(timer);
      signal.removeEventListener("abort", onAbort);
      resolve(ok);
    };
    const onAbort = () => done(false);
    const timer = setTimeout(() => done(true), ms);
    signal.addEventListener("abort", onAbort, { once: true });
  });
}
