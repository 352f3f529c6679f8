// Approval and steering on a live server whose MCP tool deploy waits for
// approval (clients/conformance/hitl.yaml).
import assert from "node:assert/strict";
import { join } from "node:path";
import { after, before, describe, it } from "node:test";
import { Code, ConnectError } from "@connectrpc/connect";

import { Client, ErrorCode, Role, TurnError } from "../src/index.js";
import { repoRoot, startCutProxy, startServer, type Server } from "./server.js";

const DEPLOY = '[sim tool=deploy args={"env":"staging"}] deploy to staging';
const request = (text: string) => ({ messages: [{ role: Role.USER, parts: [{ kind: { case: "text" as const, value: text } }] }] });

describe("approval and steering (hitl.yaml on a live turnstile serve)", () => {
  let server: Server;
  before(async () => {
    server = await startServer(join(repoRoot, "clients/conformance/hitl.yaml"));
  });
  after(async () => {
    await server.stop();
  });

  it("a handler that throws cancels the turn with its error as the cause", async () => {
    const boom = new Error("the approver is away");
    const client = new Client(`http://${server.addr}`);
    const turn = client.runTurn(request(DEPLOY), {
      onApproval: () => {
        throw boom;
      },
    });
    await assert.rejects(turn.wait(), (e: unknown) => e instanceof TurnError && e.code === ErrorCode.CANCELLED && e.cause === boom);
  });

  it("a call approved from elsewhere runs, and deciding it again changes nothing", async () => {
    const client = new Client(`http://${server.addr}`);
    const turn = client.runTurn(request(DEPLOY));
    await assert.rejects(turn.steer("too early"), /has not started/);
    const decisions: Promise<unknown>[] = [];
    for await (const ev of turn.events()) {
      const p = ev.agent?.payload;
      if (p?.case === "toolApprovalRequested") {
        const callId = p.value.callId;
        decisions.push(
          (async () => {
            const applied = await turn.approve(callId, { approved: true, reason: "fine" });
            const again = await client.approveToolCall({ turnId: turn.id, callId, approved: false });
            return [applied, again.applied, again.approved];
          })(),
        );
      }
    }
    assert.deepStrictEqual(await Promise.all(decisions), [[true, false, true]]);
    assert.equal(turn.result!.counters.approvalsRequested, 1);
    await assert.rejects(turn.steer("too late"), (e: unknown) => ConnectError.from(e).code === Code.FailedPrecondition);
  });

  it("a steer whose answer is lost is sent again with its request id, and taken once", async () => {
    // How the server's answer to a SteerTurn of attempt 1 starts on the
    // wire: a gRPC message of 4 bytes, attempt 1, then seq. No event holds
    // it, so the proxy loses exactly that answer (and cuts the event
    // stream, which re-attaches).
    const proxy = await startCutProxy(server.addr, "\x00\x00\x00\x00\x04\x08\x01\x10", false);
    try {
      const client = new Client(`http://${proxy.addr}`);
      const turn = client.runTurn(request(DEPLOY));
      const ids: string[] = [];
      let steering: Promise<unknown> | undefined;
      for await (const ev of turn.events()) {
        const p = ev.agent?.payload;
        if (p?.case === "toolApprovalRequested" && !steering) steering = turn.steer("not now, use staging");
        if (p?.case === "steered") ids.push(p.value.requestId);
      }
      const resp = (await steering) as { duplicate: boolean };
      assert.ok(proxy.cut, "the proxy never cut the answer: the test proves nothing");
      assert.equal(resp.duplicate, true);
      assert.equal(ids.length, 1);
      assert.match(ids[0], /^[0-9a-f]{32}$/);
      assert.equal(turn.result!.counters.steered, 1);
      const steered = turn.result!.messages.filter((m) => m.parts[0]?.kind.case === "text" && m.parts[0].kind.value === "not now, use staging");
      assert.equal(steered.length, 1);
    } finally {
      await proxy.close();
    }
  });

  it("an approval whose answer is lost is sent again, and the tool runs once", async () => {
    // How the server's answer to an ApproveToolCall that applied an approval
    // of attempt 1 starts on the wire: a gRPC message of 8 bytes, attempt 1,
    // applied, approved, then seq. No event holds it.
    const proxy = await startCutProxy(server.addr, "\x00\x00\x00\x00\x08\x08\x01\x10\x01\x18\x01\x20", false);
    try {
      const client = new Client(`http://${proxy.addr}`);
      const turn = client.runTurn(request(DEPLOY));
      let deciding: Promise<{ applied: boolean; approved: boolean }> | undefined;
      for await (const ev of turn.events()) {
        const p = ev.agent?.payload;
        if (p?.case === "toolApprovalRequested" && !deciding) {
          deciding = client.approveToolCall({ turnId: turn.id, callId: p.value.callId, approved: true, reason: "fine" });
        }
      }
      const resp = await deciding!;
      assert.ok(proxy.cut, "the proxy never cut the answer: the test proves nothing");
      // The first call's decision was stored; the second finds it standing.
      assert.deepStrictEqual([resp.applied, resp.approved], [false, true]);
      assert.equal(turn.result!.counters.approvalsRequested, 1);
      assert.equal(turn.result!.counters.approvalsDenied, 0);
      const results = turn.result!.messages.flatMap((m) => m.parts).filter((pt) => pt.kind.case === "toolResult");
      assert.equal(results.length, 1);
    } finally {
      await proxy.close();
    }
  });

  it("an async handler's denial reaches the model", async () => {
    const asked: string[] = [];
    const client = new Client(`http://${server.addr}`);
    const res = await client
      .runTurn(request(DEPLOY), {
        onApproval: async (req) => {
          asked.push(req.name);
          return { approved: false, reason: "not today" };
        },
      })
      .wait();
    assert.deepStrictEqual(asked, ["deploy"]);
    assert.equal(res.counters.approvalsDenied, 1);
    const last = res.messages[res.messages.length - 1].parts[0].kind;
    assert.ok(last.case === "text" && last.value.includes("denied by the user: not today"), JSON.stringify(last));
  });
});
