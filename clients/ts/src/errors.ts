import { Code, ConnectError } from "@connectrpc/connect";
import type { Duration } from "@bufbuild/protobuf/wkt";

import { ErrorInfoSchema, RetryInfoSchema } from "./gen/google/rpc/error_details_pb.js";
import type { Message } from "./gen/turnstile/v1/conversation_pb.js";
import { ErrorCode, type Error as ErrorEvent, type ModelAttempts } from "./gen/turnstile/v1/errors_pb.js";

/** The google.rpc.ErrorInfo domain of turnstile's errors. */
export const ERROR_DOMAIN = "turnstile";

/**
 * codeName returns an ErrorCode without its ERROR_CODE_ prefix, for example
 * "RATE_LIMITED", as in the ErrorInfo reason.
 */
export function codeName(code: ErrorCode): string {
  return ErrorCode[code] ?? String(code);
}

/** The RPC's final status, when the turn reached the server's answer. */
export interface RpcStatus {
  /** The gRPC status code (Connect's Code enum has the same numbers). */
  code: Code;
  /** The status message. */
  message: string;
}

/**
 * The mark every TurnError carries, shared through the global symbol
 * registry by every copy of this package loaded in one process.
 */
const TURN_ERROR = Symbol.for("@turnstile-dev/client.TurnError");

/**
 * TurnError is the failure of a turn after the client's last attempt: the
 * async iterator of Turn.events() throws it, and Turn.wait() rejects with it.
 * `instanceof TurnError` holds for a TurnError of either build of the package:
 * an app that loads both the ES module and the CommonJS one (its code imports
 * the package, a dependency requires it) has two TurnError classes.
 */
export class TurnError extends Error {
  /** The turn's id, shared by every attempt. */
  turnId = "";
  /** The class of the failure. */
  code: ErrorCode;
  /**
   * True when the turn may succeed if run again later (the server advised
   * it, or the transport failed). False when the server advised against it
   * or gave no advice.
   */
  retryable = false;
  /** How long to wait before running the turn again, when known, in ms. */
  retryAfterMs = 0;
  /** The model alias the failure concerns, when one does. */
  model = "";
  /** The number of attempts the client made, the first included. */
  attempts = 0;
  /**
   * The number of times the client re-attached to a run whose stream broke
   * (WatchTurn calls), across every attempt.
   */
  reattaches = 0;
  /** The attempts the server made per model during the last attempt. */
  modelAttempts: ModelAttempts[] = [];
  /**
   * The messages the turn committed that stand: to run the turn again later,
   * re-send them after the request's own, with the same turn id.
   */
  messages: Message[] = [];
  /**
   * The conversation to send to continue: the request's messages and
   * messages, with the compactions the server made applied (see
   * Result.conversation).
   */
  conversation: Message[] = [];
  /** The RPC's final status; undefined when the turn never got the server's answer. */
  status?: RpcStatus;
  /** message says what went wrong, fit to show a person; toString() adds the code and attempts. */
  constructor(code: ErrorCode, message: string, options?: { cause?: unknown }) {
    super(message, options);
    this.name = "TurnError";
    this.code = code;
    Object.defineProperty(this, TURN_ERROR, { value: true });
  }

  /** Tells a TurnError of any copy of the package by its mark; a subclass tests its prototype chain as usual. */
  static override [Symbol.hasInstance](v: unknown): boolean {
    if (this !== TurnError) return Function.prototype[Symbol.hasInstance].call(this, v);
    return typeof v === "object" && v !== null && (v as { [TURN_ERROR]?: unknown })[TURN_ERROR] === true;
  }

  /** The code, the message and the attempts, as the Go client's Error(). */
  override toString(): string {
    let s = "turnstile: turn";
    if (this.turnId) s += " " + this.turnId;
    s += " failed";
    if (this.attempts > 1) s += ` after ${this.attempts} attempts`;
    return `${s}: ${codeName(this.code)}: ${this.message}`;
  }
}

/** One attempt's failure, with the client's verdict on it. */
export interface Failure {
  err: TurnError;
  /** The step may be run again. */
  retry: boolean;
  /** The stream broke without a terminal event. */
  transport: boolean;
}

/** durationMs converts a protobuf Duration to milliseconds. */
export function durationMs(d: Duration | undefined): number {
  if (!d) return 0;
  return Number(d.seconds) * 1000 + d.nanos / 1e6;
}

/** fromErrorEvent reads the terminal error event of an attempt. */
export function fromErrorEvent(e: ErrorEvent): Failure {
  const err = new TurnError(e.code, e.message);
  err.retryable = e.retryable === true;
  err.model = e.model;
  err.modelAttempts = e.attempts;
  err.retryAfterMs = durationMs(e.retryAfter);
  // Unset advice is no advice: do not retry.
  return { err, retry: e.retryable === true, transport: false };
}

/**
 * fromStatus reads an attempt that ended with a non-OK status and no
 * terminal event. A turnstile ErrorInfo says the server classified the
 * failure: it is retryable when a RetryInfo comes with it. Without one the
 * failure is the transport's (or a proxy's): UNAVAILABLE, a replica gone or
 * a connection reset, is retried.
 */
export function fromStatus(reason: unknown): Failure {
  const ce = ConnectError.from(reason);
  const err = new TurnError(ErrorCode.INTERNAL, ce.rawMessage, { cause: reason });
  err.status = { code: ce.code, message: ce.rawMessage };
  const info = ce.findDetails(ErrorInfoSchema).find((d) => d.domain === ERROR_DOMAIN);
  const retry = ce.findDetails(RetryInfoSchema)[0];
  if (info) {
    err.code = codeFromReason(info.reason);
    err.model = info.metadata["model"] ?? "";
    if (retry) {
      err.retryable = true;
      err.retryAfterMs = durationMs(retry.retryDelay);
    }
    return { err, retry: err.retryable, transport: false };
  }
  err.code = codeFromStatus(ce.code);
  if (retry && ce.code !== Code.InvalidArgument) {
    err.retryable = true;
    err.retryAfterMs = durationMs(retry.retryDelay);
  }
  if (ce.code === Code.Unavailable) {
    err.retryable = true;
    return { err, retry: true, transport: true };
  }
  return { err, retry: err.retryable, transport: false };
}

/** Node's error codes of a connection that could not be made. */
const connectFailures = new Set(["ECONNREFUSED", "ENOTFOUND", "EAI_AGAIN", "ETIMEDOUT", "EHOSTUNREACH", "ENETUNREACH"]);

/**
 * transportBreak reads an error that ended a call without a gRPC status from
 * the server (no trailers, no error response) and without the caller's
 * abort: the transport's. connected is false when the connection could not
 * be made, so the call never reached the server; otherwise the stream broke
 * (connect-node says CANCELED, ABORTED or INTERNAL for a connection closed or
 * reset under it) and err is an UNAVAILABLE, as grpc-go and grpc-core report
 * it. It returns undefined for a status the server sent and for an abort.
 */
export function transportBreak(reason: unknown, signal: AbortSignal): { err: ConnectError; connected: boolean } | undefined {
  if (signal.aborted) return undefined;
  const ce = ConnectError.from(reason);
  if ([...ce.metadata.keys()].length > 0) return undefined;
  for (let e: unknown = ce; e instanceof Error; e = e.cause) {
    const code = (e as { code?: unknown }).code;
    if (typeof code === "string" && connectFailures.has(code)) return { err: ce, connected: false };
    if (e.cause === e) break;
  }
  if (ce.code === Code.Unavailable) return { err: ce, connected: true };
  return {
    err: new ConnectError(`the connection broke: ${ce.rawMessage}`, Code.Unavailable, undefined, undefined, reason),
    connected: true,
  };
}

/** codeFromReason maps an ErrorInfo reason to its error code. */
export function codeFromReason(reason: string): ErrorCode {
  const v = (ErrorCode as unknown as Record<string, number | undefined>)[reason];
  return typeof v === "number" && v !== ErrorCode.UNSPECIFIED ? v : ErrorCode.INTERNAL;
}

/** codeFromStatus maps a status code that came without an ErrorInfo. */
export function codeFromStatus(c: Code): ErrorCode {
  switch (c) {
    case Code.Unavailable:
      return ErrorCode.UNAVAILABLE;
    case Code.Canceled:
      return ErrorCode.CANCELLED;
    case Code.DeadlineExceeded:
      return ErrorCode.DEADLINE_EXCEEDED;
    case Code.InvalidArgument:
    case Code.OutOfRange:
      return ErrorCode.INVALID_REQUEST;
    case Code.Unauthenticated:
    case Code.PermissionDenied:
      return ErrorCode.AUTH;
    case Code.NotFound:
    case Code.Unimplemented:
      return ErrorCode.NOT_FOUND;
    case Code.Aborted:
      return ErrorCode.TOOLS_UNSAFE;
    default:
      return ErrorCode.INTERNAL;
  }
}
