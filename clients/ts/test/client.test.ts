import assert from "node:assert/strict";
import { createServer } from "node:net";
import { join } from "node:path";
import { after, before, describe, it } from "node:test";
import { create } from "@bufbuild/protobuf";
import { anyPack, DurationSchema } from "@bufbuild/protobuf/wkt";
import { Code, ConnectError } from "@connectrpc/connect";

import { BadRequestSchema, ErrorInfoSchema, RetryInfoSchema } from "../src/gen/google/rpc/error_details_pb.js";
import { fromStatus, transportBreak } from "../src/errors.js";
import {
  Client,
  DEFAULT_REATTACH_BACKOFF,
  DEFAULT_REATTACH_TIMEOUT_MS,
  ErrorCode,
  Role,
  TurnError,
  CompactionSchema,
  applyCompaction,
  backoffDelay,
  standing,
  type Message,
} from "../src/index.js";
import { startServer, type Server } from "./server.js";

describe("backoffDelay", () => {
  const b = { initialMs: 1000, maxMs: 30000, multiplier: 2, jitter: 0.2 };
  for (const [n, u, want] of [
    [1, 0.5, 1000],
    [2, 0.5, 2000],
    [3, 0.5, 4000],
    [10, 0.5, 30000],
    [1, 0, 800],
    [1, 1, 1200],
  ] as const) {
    it(`retry ${n}, draw ${u}: ${want} ms`, () => assert.equal(Math.round(backoffDelay(b, n, u)), want));
  }
});

describe("options", () => {
  it("default to the Go client's", () => {
    const c = new Client("http://127.0.0.1:1");
    assert.equal(c.maxStepRetries, 1);
    assert.equal(c.reattachTimeoutMs, 30_000);
    assert.equal(c.reattachTimeoutMs, DEFAULT_REATTACH_TIMEOUT_MS);
    assert.equal(c.maxReattaches, Infinity);
    assert.equal(c.cancelTimeoutMs, 2_000);
    assert.deepEqual(c.reattachBackoff, { initialMs: 50, maxMs: 1000, multiplier: 2, jitter: 0.2 });
    assert.deepEqual(c.reattachBackoff, DEFAULT_REATTACH_BACKOFF);
  });
  for (const [name, opts] of [
    ["maxStepRetries -1", { maxStepRetries: -1 }],
    ["maxReattaches -1", { maxReattaches: -1 }],
    ["maxReattaches 1.5", { maxReattaches: 1.5 }],
    ["reattachTimeoutMs -1", { reattachTimeoutMs: -1 }],
    ["cancelTimeoutMs -1", { cancelTimeoutMs: -1 }],
    ["a reattach backoff with jitter 2", { reattachBackoff: { initialMs: 1, maxMs: 2, multiplier: 2, jitter: 2 } }],
  ] as const) {
    it(`refuse ${name}`, () => assert.throws(() => new Client("http://127.0.0.1:1", opts), RangeError));
  }
});

describe("transportBreak", () => {
  const live = new AbortController().signal;
  const nodeError = (code: string) => Object.assign(new Error(code), { code });
  it("a stream closed under the call is an UNAVAILABLE of a connected call", () => {
    for (const e of [
      new ConnectError("http/2 stream closed with error code CANCEL (0x8)", Code.Canceled),
      new ConnectError("read ECONNRESET", Code.Aborted, undefined, undefined, nodeError("ECONNRESET")),
      new ConnectError("http/2 stream closed with error code INTERNAL_ERROR (0x2)", Code.Internal),
    ]) {
      const b = transportBreak(e, live);
      assert.equal(b?.connected, true);
      assert.equal(b?.err.code, Code.Unavailable);
      assert.equal(fromStatus(b?.err).transport, true);
    }
  });
  it("a connection that could not be made never reached the server", () => {
    const b = transportBreak(new ConnectError("connect ECONNREFUSED", Code.Unavailable, undefined, undefined, nodeError("ECONNREFUSED")), live);
    assert.equal(b?.connected, false);
    assert.equal(b?.err.code, Code.Unavailable);
  });
  it("a status the server sent is not the transport's", () => {
    const e = new ConnectError("cancelled", Code.Canceled, { "grpc-status": "1" });
    assert.equal(transportBreak(e, live), undefined);
  });
  it("the caller's abort is not the transport's", () => {
    const ctl = new AbortController();
    ctl.abort();
    assert.equal(transportBreak(new ConnectError("aborted", Code.Canceled), ctl.signal), undefined);
  });
});

describe("standing", () => {
  const call: Message = {
    role: Role.ASSISTANT,
    parts: [{ kind: { case: "toolCall", value: { id: "call_1", name: "t", arguments: "{}" } } }],
  } as Message;
  const result: Message = {
    role: Role.TOOL,
    parts: [{ kind: { case: "toolResult", value: { callId: "call_1", content: "ok", isError: false, name: "t" } } }],
  } as Message;
  it("drops a trailing tool call without its results", () => assert.deepEqual(standing([call]), []));
  it("keeps a tool call with its results", () => assert.equal(standing([call, result]).length, 2));
  it("keeps nothing from nothing", () => assert.deepEqual(standing([]), []));
});

describe("applyCompaction", () => {
  const msg = (role: Role, text: string): Message =>
    ({ role, parts: [{ kind: { case: "text", value: text } }] }) as unknown as Message;
  const conv = [msg(Role.USER, "a"), msg(Role.ASSISTANT, "b"), msg(Role.USER, "c"), msg(Role.ASSISTANT, "d"), msg(Role.USER, "e")];
  const note = msg(Role.USER, "[2 earlier messages were omitted]");
  const texts = (msgs: Message[] | undefined) => msgs?.map((m) => m.parts[0].kind.value as string);
  for (const [name, c, want] of [
    ["replaces the middle", { replacedFrom: 1, replacedCount: 3, replacement: [note] }, ["a", "[2 earlier messages were omitted]", "e"]],
    ["rewrites one message", { replacedFrom: 2, replacedCount: 1, replacement: [msg(Role.USER, "C")] }, ["a", "b", "C", "d", "e"]],
    ["replaces the whole", { replacedFrom: 0, replacedCount: 5, replacement: [note] }, ["[2 earlier messages were omitted]"]],
    ["cannot apply an omitted replacement", { replacedFrom: 1, replacedCount: 3, replacementOmitted: true }, undefined],
    ["cannot apply a range outside the conversation", { replacedFrom: 4, replacedCount: 2 }, undefined],
  ] as const) {
    it(name, () => {
      assert.deepEqual(texts(applyCompaction(conv, create(CompactionSchema, c as never))), want);
      assert.equal(conv.length, 5);
    });
  }
});

describe("fromStatus", () => {
  const info = (reason: string) => ({ desc: ErrorInfoSchema, value: { reason, domain: "turnstile", metadata: { model: "m" } } });
  const retryIn = (s: number) => ({ desc: RetryInfoSchema, value: { retryDelay: create(DurationSchema, { seconds: BigInt(s) }) } });
  it("reads ErrorInfo and RetryInfo: retryable after the delay", () => {
    const f = fromStatus(new ConnectError("slow down", Code.ResourceExhausted, undefined, [info("RATE_LIMITED"), retryIn(2)]));
    assert.equal(f.err.code, ErrorCode.RATE_LIMITED);
    assert.equal(f.err.model, "m");
    assert.equal(f.err.retryable, true);
    assert.equal(f.err.retryAfterMs, 2000);
    assert.equal(f.retry, true);
    assert.equal(f.transport, false);
    assert.equal(f.err.status?.code, Code.ResourceExhausted);
  });
  it("ErrorInfo without RetryInfo is not retryable", () => {
    const f = fromStatus(new ConnectError("no", Code.FailedPrecondition, undefined, [info("AUTH")]));
    assert.equal(f.err.code, ErrorCode.AUTH);
    assert.equal(f.retry, false);
  });
  it("UNAVAILABLE without ErrorInfo is the transport's, retried", () => {
    const f = fromStatus(new ConnectError("connection reset", Code.Unavailable));
    assert.equal(f.err.code, ErrorCode.UNAVAILABLE);
    assert.equal(f.retry, true);
    assert.equal(f.transport, true);
  });
  it("reads every ErrorCode's reason, the code's name, as that code", () => {
    // The server's reasons are the codes' names (docs/contract.md): a code
    // added to the contract must never read as INTERNAL.
    for (const [name, v] of Object.entries(ErrorCode)) {
      if (typeof v !== "number" || v === ErrorCode.UNSPECIFIED) continue;
      const f = fromStatus(new ConnectError("x", Code.ResourceExhausted, undefined, [info(name)]));
      assert.equal(f.err.code, v, `reason ${name}`);
    }
    assert.equal(fromStatus(new ConnectError("full", Code.ResourceExhausted, undefined, [info("STORE_FULL"), retryIn(5)])).err.code, ErrorCode.STORE_FULL);
  });
  it("INVALID_ARGUMENT with RetryInfo is not retryable", () => {
    const f = fromStatus(new ConnectError("bad", Code.InvalidArgument, undefined, [retryIn(1)]));
    assert.equal(f.err.code, ErrorCode.INVALID_REQUEST);
    assert.equal(f.retry, false);
  });
  it("decodes details as they come off the wire (packed Any)", () => {
    // What connect-node hands over after reading grpc-status-details-bin.
    const packed = anyPack(ErrorInfoSchema, create(ErrorInfoSchema, { reason: "OVERLOADED", domain: "turnstile" }));
    const e = new ConnectError("busy", Code.Unavailable);
    e.details.push({ type: "google.rpc.ErrorInfo", value: packed.value, debug: undefined });
    const f = fromStatus(e);
    assert.equal(f.err.code, ErrorCode.OVERLOADED);
    assert.equal(f.transport, false);
  });
});

describe("against a server", () => {
  let server: Server;
  before(async () => {
    server = await startServer();
  });
  after(async () => {
    await server?.stop();
  });
  const ask = (text: string) => ({ messages: [{ role: Role.USER, parts: [{ kind: { case: "text" as const, value: text } }] }] });

  it("breaking out of the loop leaves the turn, which a server without a store cancels", async () => {
    const c = new Client(`http://${server.addr}`);
    const turn = c.runTurn(ask("[sim fail=timeout after=1] never ends"));
    const started = Date.now();
    for await (const ev of turn.events()) {
      if (ev.agent?.payload.case === "textDelta") break;
    }
    assert.equal(turn.result, undefined);
    assert.equal(turn.error, undefined);
    assert.ok(Date.now() - started < 5000);
  });

  it("a permanent failure is thrown by wait() without a step retry", async () => {
    const c = new Client(`http://${server.addr}`, { maxStepRetries: 3 });
    await assert.rejects(c.runTurn(ask("[sim fail=auth] hi")).wait(), (e: unknown) => {
      assert.ok(e instanceof TurnError);
      assert.equal(e.code, ErrorCode.AUTH);
      assert.equal(e.attempts, 1);
      assert.match(e.toString(), /^turnstile: turn [0-9a-f]{32} failed: AUTH: /);
      return true;
    });
  });

  it("a timeout ends the turn DEADLINE_EXCEEDED", async () => {
    const c = new Client(`http://${server.addr}`);
    const started = Date.now();
    await assert.rejects(c.runTurn(ask("[sim fail=timeout] hangs"), { timeoutMs: 300 }).wait(), (e: unknown) => {
      assert.ok(e instanceof TurnError);
      assert.equal(e.code, ErrorCode.DEADLINE_EXCEEDED);
      assert.equal(e.attempts, 1);
      return true;
    });
    assert.ok(Date.now() - started < 5000);
  });

  it("decodes the status details off the wire: an unknown model names the field", async () => {
    const c = new Client(`http://${server.addr}`);
    await assert.rejects(c.runTurn({ model: "nope", ...ask("hi") }).wait(), (e: unknown) => {
      assert.ok(e instanceof TurnError);
      assert.equal(e.code, ErrorCode.INVALID_REQUEST);
      assert.equal(e.retryable, false);
      assert.equal(e.status?.code, Code.InvalidArgument);
      const fields = ConnectError.from(e.cause).findDetails(BadRequestSchema).flatMap((b) => b.fieldViolations.map((v) => v.field));
      assert.deepEqual(fields, ["model"]);
      return true;
    });
  });

  it("the caller's turn id is kept and the request is not modified", async () => {
    const c = new Client(`http://${server.addr}`);
    const req = { turnId: "my-turn", ...ask("[sim fail=server_error times=1] [sim reply=ok] hi") };
    const turn = c.runTurn(req);
    const ids = new Set<string>();
    for await (const ev of turn.events()) if (ev.agent) ids.add(ev.agent.turnId);
    assert.deepEqual([...ids], ["my-turn"]);
    assert.equal(turn.result?.attempts, 2);
    assert.equal(req.messages.length, 1);
  });
});

describe("no server", () => {
  it("is a retryable UNAVAILABLE after the step retry", async () => {
    const port = await new Promise<number>((res) => {
      const s = createServer();
      s.listen(0, "127.0.0.1", () => {
        const p = (s.address() as { port: number }).port;
        s.close(() => res(p));
      });
    });
    const c = new Client(`http://127.0.0.1:${port}`, { backoff: { initialMs: 5, maxMs: 10, multiplier: 2, jitter: 0 } });
    await assert.rejects(c.runTurn({ messages: [{ role: Role.USER, parts: [{ kind: { case: "text", value: "hi" } }] }] }).wait(), (e: unknown) => {
      assert.ok(e instanceof TurnError);
      assert.equal(e.code, ErrorCode.UNAVAILABLE);
      assert.equal(e.retryable, true);
      assert.equal(e.attempts, 2);
      return true;
    });
  });
});

describe("against a server whose events are small", () => {
  let server: Server;
  before(async () => {
    server = await startServer(join(__dirname, "../../../conformance/small_events.yaml"));
  });
  after(async () => {
    await server?.stop();
  });

  it("rebuilds messages turn_completed omitted from message_completed", async () => {
    // Two steps each calling a tool with 40 KB of arguments: each message
    // fits an event, the turn's messages together do not.
    const pad = "x".repeat(40000);
    const call = (step: number) => `[sim tool=current_time args={"zone":"UTC","pad":"${pad}"} step=${step}]`;
    const c = new Client(`http://${server.addr}`);
    const turn = c.runTurn({ messages: [{ role: Role.USER, parts: [{ kind: { case: "text", value: `${call(1)} ${call(2)} go` } }] }] });
    const committed: Message[] = [];
    let omitted = false;
    for await (const ev of turn.events()) {
      const p = ev.agent?.payload;
      if (p?.case === "messageCompleted" && p.value.message) committed.push(p.value.message);
      if (p?.case === "turnCompleted") omitted = p.value.messagesOmitted && p.value.messages.length === 0;
    }
    assert.ok(omitted, "turn_completed carried its messages: the test does not test the rebuild");
    assert.equal(committed.length, 5);
    assert.deepEqual(turn.result?.messages, committed);
  });
});

describe("module formats", () => {
  // The package by its name (a self-reference through package.json's
  // exports): require takes dist/cjs, import takes dist/esm, and both work.
  it("loads with require (CommonJS) and import (ES modules)", async () => {
    const name = "@turnstile-dev/client";
    assert.match(require.resolve(name), /[\\/]dist[\\/]cjs[\\/]index\.js$/);
    // eslint-disable-next-line @typescript-eslint/no-require-imports
    const cjs = require(name) as typeof import("../src/index.js");
    const esm = (await import(name)) as typeof import("../src/index.js");
    assert.equal(typeof cjs.Client, "function");
    assert.equal(typeof esm.Client, "function");
    assert.notEqual(esm.Client, cjs.Client, "import loaded the CommonJS build");
    assert.equal(esm.ErrorCode.RATE_LIMITED, 2);
    assert.equal(cjs.ErrorCode.RATE_LIMITED, 2);
  });

  it("a TurnError of either build is instanceof the other's TurnError, and nothing else is", async () => {
    const name = "@turnstile-dev/client";
    // eslint-disable-next-line @typescript-eslint/no-require-imports
    const cjs = require(name) as typeof import("../src/index.js");
    const esm = (await import(name)) as typeof import("../src/index.js");
    assert.notEqual(esm.TurnError, cjs.TurnError);
    const fromCjs = new cjs.TurnError(cjs.ErrorCode.AUTH, "from require");
    const fromEsm = new esm.TurnError(esm.ErrorCode.AUTH, "from import");
    for (const e of [fromCjs, fromEsm]) {
      assert.ok(e instanceof esm.TurnError);
      assert.ok(e instanceof cjs.TurnError);
      assert.ok(e instanceof Error);
    }
    for (const v of [new Error("x"), Object.assign(new Error("x"), { name: "TurnError", code: 5 }), null, undefined, "TurnError", {}]) {
      assert.ok(!(v instanceof esm.TurnError), `${String(v)} is a TurnError`);
      assert.ok(!(v instanceof cjs.TurnError), `${String(v)} is a TurnError`);
    }
    class Sub extends esm.TurnError {}
    assert.ok(new Sub(esm.ErrorCode.AUTH, "sub") instanceof esm.TurnError);
    assert.ok(new Sub(esm.ErrorCode.AUTH, "sub") instanceof Sub);
    assert.ok(!(fromEsm instanceof Sub));
  });
});
