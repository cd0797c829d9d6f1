#!/usr/bin/env node
// @ts-check
/**
 * Interop driver: the official ACP TypeScript SDK client (@agentclientprotocol/sdk 2.4.0).
 *
 *   node ts_client.mjs http://127.0.0.1:8000/acp http   # experimental/http-client (POST + SSE)
 *   node ts_client.mjs ws://127.0.0.1:8000/acp ws       # experimental/ws-client (Node `ws`)
 *
 * Options: --timeout SECONDS (per step, default 20), --trace (every HTTP exchange / WebSocket
 * frame as a JSON line on stderr), --token TOKEN (default: the ACP_TOKEN environment variable):
 * `Authorization: Bearer <token>` on every request and on the WebSocket upgrade, through the
 * SDK's `headers` option; --token-subprotocol (ws only): send it instead as a browser must,
 * offering subprotocols `acp` and `acp.bearer.<token>` (the SDK's `protocols` option).
 *
 * Runs the interop scenario against a server hosting the demo agent (see ../README.md), its steps
 * from scenario.mjs: initialize -> session/new -> `stream 50 64` -> `permission` (answers `allow`)
 * -> `wait_for_cancel` + session/cancel -> close (DELETE on HTTP, socket close on WS).
 * Prints exactly one JSON line on stdout; exit 0 when every check passed, 1 when one failed
 * (with `status` when an HTTP status refused it, e.g. 401), 2 on bad usage.
 *
 * SDK 2.x has no ClientSideConnection any more: its replacement is the `client()` app
 * (onRequest/onNotification handlers) connected to a transport Stream.
 */
import { createHttpStream } from "@agentclientprotocol/sdk/experimental/http-client";
import { createWebSocketStream } from "@agentclientprotocol/sdk/experimental/ws-client";
import { WebSocket } from "ws";

import {
  cancelStep,
  check,
  describeError,
  describeMessage,
  initialize,
  newSession,
  parseJson,
  permissionStep,
  ScenarioClient,
  sdkVersion,
  step,
  streamStep,
  waitUntil,
} from "./scenario.mjs";

const CLOSE_MS = 5000;

/**
 * @typedef {object} Exchange One HTTP request made by the SDK's HTTP transport.
 * @property {string} method
 * @property {boolean} sse a GET asking for text/event-stream
 * @property {any} message the JSON-RPC message POSTed, if any
 * @property {number | undefined} status
 * @property {Promise<void>} done settles when the response headers arrived or the request failed
 */

/**
 * The HTTP status that refused the run, if one did: the SDK's HttpResponseError carries it; the
 * `ws` package reports a refused upgrade as "Unexpected server response: 403".
 * @param {unknown} error
 * @returns {number | undefined}
 */
function refusalStatus(error) {
  if (error && typeof error === "object" && "status" in error && typeof error.status === "number") {
    return error.status;
  }
  const match = /Unexpected server response: (\d+)/.exec(String(error instanceof Error ? error.message : error));
  return match ? Number(match[1]) : undefined;
}

/**
 * What the transports did on the wire, recorded at the SDK's injection points
 * (`options.fetch` for HTTP, `options.WebSocket` for WebSocket).
 */
class WireLog {
  /** @param {boolean} trace */
  constructor(trace) {
    this.trace = trace;
    /** @type {Exchange[]} */
    this.exchanges = [];
    /** Outgoing JSON-RPC messages in the order the server accepted them (HTTP 2xx / frame sent). */
    /** @type {any[]} */
    this.sent = [];
    /** @type {string | undefined} Acp-Connection-Id from a successful initialize POST */
    this.connectionId = undefined;
    /** @type {WebSocket | undefined} */
    this.socket = undefined;
    /** @type {number | undefined} */
    this.wsCloseCode = undefined;
    /** @type {Promise<void> | undefined} */
    this.wsClosed = undefined;
  }

  /** @param {Record<string, unknown>} entry */
  log(entry) {
    if (this.trace) process.stderr.write(`${JSON.stringify({ trace: "ts_client", ...entry })}\n`);
  }

  /** @returns {typeof globalThis.fetch} */
  fetch() {
    return async (input, init = {}) => {
      const method = init.method ?? "GET";
      const requestHeaders = Object.fromEntries(new Headers(init.headers).entries());
      const message = parseJson(init.body);
      const sse = method === "GET" && requestHeaders.accept === "text/event-stream";
      /** @type {() => void} */
      let finish = () => {};
      /** @type {Exchange} */
      const entry = {
        method,
        sse,
        message,
        status: undefined,
        done: new Promise((r) => (finish = () => r())),
      };
      this.exchanges.push(entry);
      try {
        const response = await globalThis.fetch(input, init);
        entry.status = response.status;
        const connectionId = response.headers.get("acp-connection-id");
        if (response.ok && message?.method === "initialize" && connectionId) this.connectionId = connectionId;
        if (response.ok && method === "POST" && message) this.sent.push(message);
        this.log({
          http: method,
          jsonrpc: describeMessage(message),
          requestHeaders,
          status: response.status,
          responseHeaders: Object.fromEntries(response.headers.entries()),
        });
        return response;
      } catch (error) {
        this.log({ http: method, jsonrpc: describeMessage(message), requestHeaders, error: String(error) });
        throw error;
      } finally {
        finish();
      }
    };
  }

  /** A `ws` WebSocket subclass that records frames sent, the 101's headers and the close code. */
  webSocket() {
    const wire = this;
    return class RecordingWebSocket extends WebSocket {
      /**
       * @param {string} url
       * @param {string | string[] | undefined} protocols
       * @param {{headers?: Record<string, string>}} [options]
       */
      constructor(url, protocols, options) {
        super(url, protocols, options);
        wire.socket = this;
        // The SDK detaches its listeners when the stream closes; without one of ours, an error
        // after that (e.g. closing before the handshake finished) would crash the process.
        this.on("error", (error) => wire.log({ ws: "error", error: String(error) }));
        wire.wsClosed = new Promise((resolve) => {
          this.once("close", (code) => {
            wire.wsCloseCode = code;
            wire.log({ ws: "close", code });
            resolve();
          });
        });
        this.once("upgrade", (response) =>
          wire.log({ ws: "upgrade", status: response.statusCode, responseHeaders: response.headers }),
        );
        this.on("message", (data) =>
          wire.log({ ws: "recv", jsonrpc: describeMessage(parseJson(String(data))) }),
        );
      }

      /**
       * @param {any} data
       * @param {any[]} rest
       */
      send(data, ...rest) {
        super.send(data, ...rest);
        const message = parseJson(data);
        if (message) wire.sent.push(message);
        wire.log({ ws: "send", jsonrpc: describeMessage(message) });
      }
    };
  }

  sentMethods() {
    return this.sent.filter((m) => "method" in m).map((m) => String(m.method));
  }

  responsesSent() {
    return this.sent.filter((m) => !("method" in m)).length;
  }

  httpSummary() {
    const deletes = this.exchanges.filter((e) => e.method === "DELETE");
    const errors = this.exchanges
      .filter((e) => e.status !== undefined && (e.status < 200 || e.status >= 300))
      .map((e) => ({ method: e.method, status: e.status, jsonrpc: describeMessage(e.message) }));
    return {
      posts: this.exchanges.filter((e) => e.method === "POST").length,
      streams: this.exchanges.filter((e) => e.sse).length,
      delete: deletes.length ? (deletes[deletes.length - 1].status ?? null) : null,
      ...(errors.length ? { errors } : {}),
    };
  }
}

/**
 * @param {string} url
 * @param {"http" | "ws"} transport
 * @param {number} ms
 * @param {WireLog} wire
 * @param {Record<string, unknown>} summary
 * @param {{token?: string, subprotocol?: boolean}} [auth]
 */
async function scenario(url, transport, ms, wire, summary, auth = {}) {
  const scenarioClient = new ScenarioClient("acp-channels-interop-ts");
  /** @type {Record<string, string>} */
  const headers = auth.token && !auth.subprotocol ? { Authorization: `Bearer ${auth.token}` } : {};
  const protocols = auth.token && auth.subprotocol ? ["acp", `acp.bearer.${auth.token}`] : undefined;
  const stream =
    transport === "http"
      ? createHttpStream(url, { fetch: wire.fetch(), headers })
      : createWebSocketStream(url, { WebSocket: wire.webSocket(), headers, protocols });
  const connection = scenarioClient.app.connect(stream);
  /** @type {import("./scenario.mjs").Run} */
  const run = {
    agent: connection.agent,
    client: scenarioClient,
    ms,
    summary,
    // accepted = answered 2xx (HTTP) / frame sent (WebSocket)
    promptsSent: () => wire.sentMethods().filter((m) => m === "session/prompt").length,
  };

  let closed = false;
  try {
    await initialize(run, { readTextFile: false });
    const sessionId = await newSession(run, "session/new");
    summary.session = true;
    await streamStep(run, sessionId);
    await permissionStep(run, sessionId);
    await cancelStep(run, sessionId);

    // close: the HTTP transport DELETEs the connection, the WebSocket one closes the socket
    connection.close();
    closed = true;
    await step("close", closeTransport(transport, wire), ms);
    summary.closed = true;
  } finally {
    if (!closed) {
      connection.close();
      await Promise.race([
        closeTransport(transport, wire),
        new Promise((r) => setTimeout(r, CLOSE_MS)),
      ]).catch(() => {});
    }
    summary.sent = wire.sentMethods();
    summary.responsesSent = wire.responsesSent();
  }
  if (transport === "http") {
    const status = wire.httpSummary().delete;
    check(status !== null && status >= 200 && status < 300, `close: DELETE answered ${status}, expected 2xx`);
  }
}

/**
 * Wait for the transport's own close (started by connection.close()) to finish on the wire.
 * @param {"http" | "ws"} transport
 * @param {WireLog} wire
 */
async function closeTransport(transport, wire) {
  if (transport === "http") {
    if (!wire.connectionId) return; // nothing to DELETE
    const found = await waitUntil(() => wire.exchanges.some((e) => e.method === "DELETE"), CLOSE_MS);
    check(found, "close: no DELETE was sent");
    await Promise.all(wire.exchanges.filter((e) => e.method === "DELETE").map((e) => e.done));
    return;
  }
  if (wire.wsClosed) await wire.wsClosed;
}

async function main() {
  const args = process.argv.slice(2);
  let timeoutSeconds = 20;
  let trace = process.env.ACP_INTEROP_TRACE === "1";
  let token = process.env.ACP_TOKEN || undefined;
  let subprotocol = false;
  /** @type {string[]} */
  const positional = [];
  for (let i = 0; i < args.length; i++) {
    if (args[i] === "--trace") trace = true;
    else if (args[i] === "--timeout") timeoutSeconds = Number(args[++i]);
    else if (args[i] === "--token") token = args[++i];
    else if (args[i] === "--token-subprotocol") subprotocol = true;
    else positional.push(args[i]);
  }
  const [url, transport] = positional;
  /** @type {Record<string, unknown>} */
  const summary = {
    ok: false,
    client: "typescript-sdk",
    sdk: sdkVersion(),
    transport: transport ?? null,
    url: url ?? null,
    auth: token ? (subprotocol ? "subprotocol" : "bearer") : "none",
  };
  const usable = url && (transport === "http" || transport === "ws") && timeoutSeconds > 0;
  if (!usable || (subprotocol && (transport !== "ws" || !token))) {
    summary.error =
      "usage: node ts_client.mjs URL http|ws [--timeout SECONDS] [--trace] [--token TOKEN] [--token-subprotocol (ws)]";
    process.stdout.write(`${JSON.stringify(summary)}\n`);
    process.stderr.write(`ts_client: ${summary.error}\n`);
    return 2;
  }
  const wire = new WireLog(trace);
  try {
    await scenario(url, transport, timeoutSeconds * 1000, wire, summary, { token, subprotocol });
    summary.ok = true;
  } catch (error) {
    summary.error = describeError(error);
    const status = refusalStatus(error);
    if (status !== undefined) summary.status = status;
  }
  if (transport === "http") summary.http = wire.httpSummary();
  else summary.ws = { closeCode: wire.wsCloseCode ?? null };
  process.stdout.write(`${JSON.stringify(summary)}\n`);
  if (!summary.ok) process.stderr.write(`ts_client: FAILED: ${summary.error}\n`);
  return summary.ok ? 0 : 1;
}

// Exit explicitly: a failed run can leave sockets or timers open.
main().then(
  (code) => process.exit(code),
  (error) => {
    process.stderr.write(`ts_client: crashed: ${error instanceof Error ? error.stack : error}\n`);
    process.exit(1);
  },
);
