import assert from "node:assert/strict";
import { createConnection, createServer, type Server as NetServer, type Socket } from "node:net";
import { after, before, describe, it } from "node:test";

import { Client, Role, parseTarget } from "../src/index.js";
import { startServer, type Server } from "./server.js";

describe("parseTarget", () => {
  for (const [target, want] of [
    ["http://127.0.0.1:7700", { protocol: "http:", hosts: [{ host: "127.0.0.1", port: "7700" }], balancing: "pick_first" }],
    ["https://turnstile:7700", { protocol: "https:", hosts: [{ host: "turnstile", port: "7700" }], balancing: "pick_first" }],
    ["dns:///turnstile-headless.ns.svc:7700", { protocol: "https:", hosts: [{ host: "turnstile-headless.ns.svc", port: "7700" }], balancing: "round_robin" }],
    [
      "http://10.0.0.1:7700,[::1]:7701",
      { protocol: "http:", hosts: [{ host: "10.0.0.1", port: "7700" }, { host: "[::1]", port: "7701" }], balancing: "round_robin" },
    ],
  ] as const) {
    it(target, () => assert.deepEqual(parseTarget(target), want));
  }
  for (const bad of ["127.0.0.1:7700", "grpc://x:1", "http://a:1,", "dns:///"]) {
    it(`refuses ${bad}`, () => assert.throws(() => parseTarget(bad), TypeError));
  }
  it("refuses an unknown policy, and pick_first over a list", () => {
    assert.throws(() => new Client("http://127.0.0.1:1", { loadBalancing: "grpclb" as "round_robin" }), RangeError);
    assert.throws(() => new Client("http://127.0.0.1:1,127.0.0.1:2", { loadBalancing: "pick_first" }), RangeError);
  });
});

/** A TCP forwarder to target that counts the connections it took. */
async function forwarder(target: string): Promise<{ addr: string; accepted: () => number; close: () => Promise<void> }> {
  const [host, port] = [target.slice(0, target.lastIndexOf(":")), Number(target.slice(target.lastIndexOf(":") + 1))];
  let n = 0;
  const socks: Socket[] = [];
  const srv: NetServer = createServer((c) => {
    n++;
    const up = createConnection({ host, port });
    socks.push(c, up);
    c.pipe(up).pipe(c);
    c.on("error", () => up.destroy());
    up.on("error", () => c.destroy());
  });
  await new Promise<void>((r) => srv.listen(0, "127.0.0.1", r));
  const a = srv.address();
  if (a === null || typeof a === "string") throw new Error("no address");
  return {
    addr: `127.0.0.1:${a.port}`,
    accepted: () => n,
    close: () => {
      for (const s of socks) s.destroy();
      return new Promise((r) => srv.close(() => r()));
    },
  };
}

describe("load balancing against a server", () => {
  let server: Server;
  before(async () => {
    server = await startServer();
  });
  after(async () => {
    await server?.stop();
  });
  const ask = { messages: [{ role: Role.USER, parts: [{ kind: { case: "text" as const, value: "hi" } }] }] };

  it("round_robin over two addresses uses both", async () => {
    const [a, b] = [await forwarder(server.addr), await forwarder(server.addr)];
    try {
      const c = new Client(`http://${a.addr},${b.addr}`);
      for (let i = 0; i < 4; i++) await c.runTurn(ask).wait();
      assert.ok(a.accepted() >= 1 && b.accepted() >= 1, `connections: ${a.accepted()}, ${b.accepted()}`);
    } finally {
      await a.close();
      await b.close();
    }
  });

  it("one URL keeps one connection", async () => {
    const a = await forwarder(server.addr);
    try {
      const c = new Client(`http://${a.addr}`);
      for (let i = 0; i < 4; i++) await c.runTurn(ask).wait();
      assert.equal(a.accepted(), 1);
    } finally {
      await a.close();
    }
  });
});
