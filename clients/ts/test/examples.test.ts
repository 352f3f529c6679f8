import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { existsSync } from "node:fs";
import { join } from "node:path";
import { after, before, describe, it } from "node:test";
import { promisify } from "node:util";

import { repoRoot, startServer, type Server } from "./server.js";

const run = promisify(execFile);
const example = join(repoRoot, "examples/node");

// examples/node/hello.mjs, run as a program against a live server; it
// imports the package as its users do, so examples/node needs `npm ci`.
describe("examples/node", () => {
  let server: Server;
  before(async () => {
    assert.ok(existsSync(join(example, "node_modules/@turnstile-dev/client")), "run `npm ci` in examples/node first");
    server = await startServer();
  });
  after(async () => {
    await server?.stop();
  });
  const env = () => ({ ...process.env, TURNSTILE_ADDR: server.addr });

  it("streams the reply across a step retry", async () => {
    const { stdout } = await run("node", ["hello.mjs", '[sim fail=server_error times=1 after=1] [sim reply="Hello from Node."]', "hi"], { cwd: example, env: env() });
    assert.equal(stdout, "Hello \n[retrying: SERVER_ERROR]\nHello from Node.\nEND_TURN\n");
  });

  it("reports a failed turn and exits 1", async () => {
    await assert.rejects(run("node", ["hello.mjs", "[sim fail=auth] hi"], { cwd: example, env: env() }), (e: { code?: number; stderr?: string }) => {
      assert.equal(e.code, 1);
      assert.match(e.stderr ?? "", /AUTH: invalid x-api-key/);
      return true;
    });
  });
});
