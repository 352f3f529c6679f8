import { spawn, execFileSync, type ChildProcess } from "node:child_process";
import { mkdtempSync } from "node:fs";
import { type AddressInfo, connect, createServer, type Socket } from "node:net";
import { tmpdir } from "node:os";
import { join, resolve } from "node:path";
import { createInterface } from "node:readline";

/** The repository's root, from build/test. */
export const repoRoot = resolve(__dirname, "../../../..");

/** A running `turnstile serve`. */
export interface Server {
  /** The gRPC address, host:port. */
  addr: string;
  /** Stops it with signal (SIGTERM by default) and waits for it. */
  stop(signal?: NodeJS.Signals): Promise<void>;
}

/**
 * startServer runs `turnstile serve --config config` on a free loopback
 * port (the configuration listens on 127.0.0.1:0) and resolves once it logs
 * its address. TURNSTILE_BIN names a built binary; without it one is built
 * with the Go toolchain.
 */
export async function startServer(config = join(repoRoot, "clients/conformance/server.yaml")): Promise<Server> {
  let bin = process.env.TURNSTILE_BIN;
  if (!bin) {
    bin = join(mkdtempSync(join(tmpdir(), "turnstile-ts-")), "turnstile");
    execFileSync("go", ["build", "-o", bin, "./cmd/turnstile"], { cwd: repoRoot, stdio: "inherit" });
    // Built once for every server of this process.
    process.env.TURNSTILE_BIN = bin;
  }
  const child: ChildProcess = spawn(bin, ["serve", "--config", config], { stdio: ["ignore", "ignore", "pipe"] });
  const exited = new Promise<void>((res) => child.once("exit", () => res()));
  const addr = await new Promise<string>((res, rej) => {
    const log: string[] = [];
    const timer = setTimeout(() => rej(new Error("turnstile serve did not log its address within 30s")), 30_000);
    createInterface({ input: child.stderr! }).on("line", (line) => {
      try {
        const rec = JSON.parse(line) as { msg?: string; address?: string };
        if (rec.msg === "serving" && rec.address) {
          clearTimeout(timer);
          res(rec.address);
          return;
        }
      } catch {
        // Not a JSON log line.
      }
      log.push(line);
    });
    child.once("exit", (code) => {
      clearTimeout(timer);
      rej(new Error(`turnstile serve exited (${code}) before serving:\n${log.join("\n")}`));
    });
  });
  return {
    addr,
    async stop(signal: NodeJS.Signals = "SIGTERM") {
      if (child.exitCode === null) child.kill(signal);
      await exited;
    },
  };
}

/** A TCP proxy in front of a server that cuts its connections once. */
export interface CutProxy {
  /** The proxy's address, host:port. */
  addr: string;
  /** Closes the proxy and every connection through it. */
  close(): Promise<void>;
  /** Whether it has cut the connections. */
  readonly cut: boolean;
}

/**
 * startCutProxy forwards TCP connections on a free loopback port to target
 * (host:port) and cuts every one of them, once, the first time the server
 * sends an HTTP/2 DATA frame holding the bytes of on, instead of forwarding
 * that frame; with refuse it then takes no new connection, else it forwards
 * them as before. A server's side of an HTTP/2 connection is frames from its
 * first byte: a 9-byte header (24-bit length, type, flags, stream id), then
 * the payload.
 */
export async function startCutProxy(target: string, on: string, refuse: boolean): Promise<CutProxy> {
  const i = target.lastIndexOf(":");
  const host = target.slice(0, i);
  const port = Number(target.slice(i + 1));
  const marker = Buffer.from(on);
  const socks = new Set<Socket>();
  let cut = false;
  const server = createServer((c) => {
    const up = connect(port, host);
    socks.add(c);
    socks.add(up);
    const drop = () => {
      c.destroy();
      up.destroy();
      socks.delete(c);
      socks.delete(up);
    };
    for (const s of [c, up]) {
      s.on("error", drop);
      s.on("close", drop);
    }
    c.on("data", (d: Buffer) => up.write(d));
    let buf = Buffer.alloc(0);
    up.on("data", (d: Buffer) => {
      buf = Buffer.concat([buf, d]);
      while (buf.length >= 9) {
        const size = 9 + buf.readUIntBE(0, 3);
        if (buf.length < size) break;
        const frame = buf.subarray(0, size);
        buf = buf.subarray(size);
        if (!cut && frame[3] === 0 && frame.subarray(9).includes(marker)) {
          cut = true;
          if (refuse) server.close();
          for (const s of socks) s.destroy();
          socks.clear();
          return;
        }
        c.write(frame);
      }
    });
  });
  await new Promise<void>((res) => server.listen(0, "127.0.0.1", res));
  return {
    addr: `127.0.0.1:${(server.address() as AddressInfo).port}`,
    async close() {
      for (const s of socks) s.destroy();
      socks.clear();
      await new Promise<void>((res) => server.close(() => res()));
    },
    get cut() {
      return cut;
    },
  };
}
