import { lookup } from "node:dns/promises";
import { isIP } from "node:net";
import { Code, ConnectError, type Transport } from "@connectrpc/connect";
import { createGrpcTransport } from "@connectrpc/connect-node";

/**
 * LoadBalancing is how a client spreads its calls over the addresses its
 * target names: "pick_first" sends every call to one connection;
 * "round_robin" sends each call to the next address, as the Go client does
 * with a dns:/// target.
 */
export type LoadBalancing = "pick_first" | "round_robin";

/** How often a round_robin transport resolves a host name again, in ms. */
export const RESOLVE_EVERY_MS = 30_000;

/** A target: its scheme and its host:port entries. */
export interface Target {
  /** "http:" (plaintext, h2c) or "https:" (TLS). */
  protocol: "http:" | "https:";
  /** host and port of each entry, the host as written (a name or an IP). */
  hosts: { host: string; port: string }[];
  /** The policy the target asks for when the options name none. */
  balancing: LoadBalancing;
}

/**
 * parseTarget reads a client's target: "http://host:port" (plaintext) or
 * "https://host:port" (TLS), one connection by default; "dns:///host:port",
 * TLS over every address host resolves to, round robin (the Go client's
 * target, for a Kubernetes headless Service); or a comma-separated list of
 * host:port after the scheme ("http://10.0.0.1:7700,10.0.0.2:7700"),
 * round robin over them.
 */
export function parseTarget(target: string): Target {
  let protocol: "http:" | "https:";
  let rest: string;
  let balancing: LoadBalancing = "pick_first";
  const m = /^(https?):\/\/([^/]*)\/?$/.exec(target);
  if (m) {
    protocol = `${m[1]}:` as "http:" | "https:";
    rest = m[2]!;
  } else if (target.startsWith("dns:///")) {
    protocol = "https:";
    rest = target.slice("dns:///".length);
    balancing = "round_robin";
  } else {
    throw new TypeError(
      `turnstile: target ${JSON.stringify(target)} needs a scheme: http://host:port (plaintext), https://host:port (TLS) or dns:///host:port (TLS, every address, round robin)`,
    );
  }
  const hosts = rest.split(",").map((entry) => {
    const hp = /^(\[[^\]]+\]|[^:\[\]]+)(?::(\d+))?$/.exec(entry);
    if (!hp) throw new TypeError(`turnstile: target ${JSON.stringify(target)}: ${JSON.stringify(entry)} is not host:port`);
    return { host: hp[1]!, port: hp[2] ?? (protocol === "https:" ? "443" : "80") };
  });
  if (hosts.length > 1) balancing = "round_robin";
  return { protocol, hosts, balancing };
}

/**
 * balancedTransport sends each call to the next of the target's addresses,
 * resolving host names (every address, again every RESOLVE_EVERY_MS) and
 * keeping one HTTP/2 connection per address. Over TLS the certificate is
 * checked against the name, not the address. A name that does not resolve
 * fails the call UNAVAILABLE, which the client treats as a connection that
 * could not be made.
 */
export function balancedTransport(t: Target): Transport {
  const transports = new Map<string, Transport>();
  let addrs: { addr: string; servername: string }[] = [];
  let resolvedAt = 0;
  let next = 0;
  const resolve = async () => {
    const out: { addr: string; servername: string }[] = [];
    for (const { host, port } of t.hosts) {
      const bare = host.replace(/^\[|\]$/g, "");
      if (isIP(bare)) {
        out.push({ addr: `${host}:${port}`, servername: "" });
        continue;
      }
      for (const a of await lookup(bare, { all: true })) {
        out.push({ addr: `${a.family === 6 ? `[${a.address}]` : a.address}:${port}`, servername: bare });
      }
    }
    return out;
  };
  const pick = async (): Promise<Transport> => {
    if (addrs.length === 0 || Date.now() - resolvedAt > RESOLVE_EVERY_MS) {
      try {
        addrs = await resolve();
        resolvedAt = Date.now();
      } catch (e) {
        // Keep the addresses known before; without any, the call fails.
        if (addrs.length === 0) throw new ConnectError(`turnstile: resolving the target: ${String(e)}`, Code.Unavailable);
      }
      if (addrs.length === 0) throw new ConnectError("turnstile: the target resolves to no address", Code.Unavailable);
    }
    // pick_first (a dns:/// target asked to keep one connection): the
    // first address, while it resolves.
    const a = addrs[t.balancing === "pick_first" ? 0 : next++ % addrs.length]!;
    let tr = transports.get(a.addr);
    if (!tr) {
      tr = createGrpcTransport({
        baseUrl: `${t.protocol}//${a.addr}`,
        ...(a.servername && t.protocol === "https:" ? { nodeOptions: { servername: a.servername } } : {}),
      });
      transports.set(a.addr, tr);
    }
    return tr;
  };
  return {
    async unary(...args: Parameters<Transport["unary"]>) {
      return (await pick()).unary(...args);
    },
    async stream(...args: Parameters<Transport["stream"]>) {
      return (await pick()).stream(...args);
    },
  } as Transport;
}
