#!/usr/bin/env node
// @ts-check
/**
 * Peer server for the client tests: the official ACP TypeScript SDK server
 * (@agentclientprotocol/sdk 2.4.0: experimental/server AcpServer + experimental/node adapters,
 * WebSocket through the `ws` package) on 127.0.0.1, path /acp.
 *
 *   node server.mjs [PORT]      # 0 (default) picks a free port
 *
 * Prints `LISTENING <port>` on stdout once it accepts connections, and `CONNECTIONS <n>` (how many
 * ACP connections are open) whenever one opens or ends, so tests can see that none is left.
 * Each connection gets its own small agent whose prompts are text commands, like the demo agent's:
 *   echo <text>           one agent_message_chunk with exactly <text>
 *   stream <n> <bytes>    n chunks of exactly <bytes> characters ("00:xxx…")
 *   permission            session/request_permission (allow / reject), then "permission: <id>"
 *   wait_for_cancel       nothing until session/cancel; stopReason "cancelled"
 *   tool_calls            a tool call pending -> in_progress -> completed, then "tool call completed"
 *   fs_read <path>        fs/read_text_file for <path> (if the client advertised fs.readTextFile),
 *                         then one chunk with exactly the content it answered
 *   fail                  a JSON-RPC error (-32603 "ts failure")
 *   anything else         "You said: <text>"
 */
import { randomUUID } from "node:crypto";
import http from "node:http";

import { PROTOCOL_VERSION, RequestError, agent, methods } from "@agentclientprotocol/sdk";
import { createNodeHttpHandler, createNodeWebSocketUpgradeHandler } from "@agentclientprotocol/sdk/experimental/node";
import { AcpServer } from "@agentclientprotocol/sdk/experimental/server";
import { WebSocketServer } from "ws";

const PATH = "/acp";

function createAgent() {
  /** @type {Map<string, Set<AbortController>>} turns in flight per session */
  const sessions = new Map();
  /** What the client advertised in initialize: fs_read only calls what it may. */
  let readTextFile = false;

  /**
   * @param {import("@agentclientprotocol/sdk").AgentContext} client
   * @param {string} sessionId
   * @param {string} text
   */
  const say = (client, sessionId, text) =>
    client.notify(methods.client.session.update, {
      sessionId,
      update: { sessionUpdate: "agent_message_chunk", content: { type: "text", text } },
    });

  /** @param {AbortSignal} signal */
  const aborted = (signal) =>
    new Promise((resolve) => {
      if (signal.aborted) resolve(undefined);
      else signal.addEventListener("abort", () => resolve(undefined), { once: true });
    });

  return agent({ name: "ts-peer-agent" })
    .onRequest(methods.agent.initialize, ({ params }) => {
      readTextFile = params.clientCapabilities?.fs?.readTextFile === true;
      return {
        protocolVersion: PROTOCOL_VERSION,
        agentCapabilities: { loadSession: false },
        authMethods: [],
        agentInfo: { name: "ts-peer-agent", title: "TS SDK peer agent", version: "2.4.0" },
      };
    })
    .onRequest(methods.agent.session.new, () => {
      const sessionId = `ts-${randomUUID()}`;
      sessions.set(sessionId, new Set());
      return { sessionId };
    })
    .onNotification(methods.agent.session.cancel, ({ params }) => {
      for (const turn of sessions.get(params.sessionId) ?? []) turn.abort();
    })
    .onRequest(methods.agent.session.prompt, async ({ params, client }) => {
      const turns = sessions.get(params.sessionId);
      if (!turns) throw RequestError.invalidParams({ sessionId: params.sessionId });
      const turn = new AbortController();
      turns.add(turn);
      const sessionId = params.sessionId;
      const first = params.prompt.find((block) => block.type === "text");
      const text = (first && "text" in first ? first.text : "").trim();
      const [command = "", ...rest] = text.split(/\s+/);
      const argument = text.slice(command.length).trim();
      try {
        switch (command) {
          case "echo":
            await say(client, sessionId, argument);
            break;
          case "stream": {
            const [count, size] = rest.map(Number);
            const width = String(Math.max(count - 1, 0)).length;
            for (let index = 0; index < count && !turn.signal.aborted; index++) {
              const label = `${String(index).padStart(width, "0")}:`;
              await say(client, sessionId, size >= label.length ? label + "x".repeat(size - label.length) : "x".repeat(size));
            }
            break;
          }
          case "permission": {
            const asked = client.request(methods.client.session.requestPermission, {
              sessionId,
              toolCall: { toolCallId: `perm-${randomUUID()}`, title: "TS permission request", kind: "edit", status: "pending" },
              options: [
                { optionId: "allow", name: "Allow", kind: "allow_once" },
                { optionId: "reject", name: "Reject", kind: "reject_once" },
              ],
            });
            const answer = await Promise.race([asked, aborted(turn.signal)]);
            const outcome = answer?.outcome;
            await say(client, sessionId, `permission: ${outcome?.outcome === "selected" ? outcome.optionId : "cancelled"}`);
            break;
          }
          case "wait_for_cancel":
            await aborted(turn.signal);
            break;
          case "tool_calls": {
            const toolCallId = `call-${randomUUID()}`;
            const update = (/** @type {any} */ value) =>
              client.notify(methods.client.session.update, { sessionId, update: value });
            await update({ sessionUpdate: "tool_call", toolCallId, title: "TS tool", kind: "read", status: "pending" });
            await update({ sessionUpdate: "tool_call_update", toolCallId, status: "in_progress" });
            await update({
              sessionUpdate: "tool_call_update",
              toolCallId,
              status: "completed",
              content: [{ type: "content", content: { type: "text", text: "ts tool output" } }],
            });
            await say(client, sessionId, "tool call completed");
            break;
          }
          case "fs_read": {
            if (!readTextFile) {
              await say(client, sessionId, "cannot read: the client did not advertise fs.readTextFile");
              break;
            }
            const file = await client.request(methods.client.fs.readTextFile, { sessionId, path: argument });
            await say(client, sessionId, file.content);
            break;
          }
          case "fail":
            throw new RequestError(-32603, "ts failure", { details: "ts failure" });
          default:
            await say(client, sessionId, `You said: ${text}`);
        }
        return { stopReason: turn.signal.aborted ? "cancelled" : "end_turn" };
      } finally {
        turns.delete(turn);
      }
    });
}

let openConnections = 0;
/** @param {number} change */
const countConnections = (change) => {
  openConnections += change;
  process.stdout.write(`CONNECTIONS ${openConnections}\n`);
};

/**
 * createAgent, counting the connections: each agent app serves one, until its stream ends.
 * @returns {import("@agentclientprotocol/sdk").AgentConnector}
 */
const createCountedAgent = () => {
  const app = createAgent();
  return {
    connect(stream, options) {
      // The server's options (deferConnectHandlers) must reach the app, which accepts them.
      const connectWithOptions = /** @type {(s: typeof stream, o: typeof options) => ReturnType<typeof app.connect>} */ (
        app.connect.bind(app)
      );
      const connection = connectWithOptions(stream, options);
      countConnections(1);
      void connection.closed.then(() => countConnections(-1));
      return connection;
    },
  };
};

const acpServer = new AcpServer({ createAgent: createCountedAgent });
const handleHttp = createNodeHttpHandler(acpServer);
const webSockets = new WebSocketServer({ noServer: true });
const handleUpgrade = createNodeWebSocketUpgradeHandler(acpServer, webSockets);

const server = http.createServer((req, res) => {
  if (new URL(req.url ?? "/", "http://localhost").pathname !== PATH) {
    res.writeHead(404).end();
    return;
  }
  handleHttp(req, res);
});
server.on("upgrade", (req, socket, head) => {
  if (new URL(req.url ?? "/", "http://localhost").pathname !== PATH) {
    socket.destroy();
    return;
  }
  handleUpgrade(req, socket, head);
});

const port = Number(process.argv[2] ?? 0);
server.listen(port, "127.0.0.1", () => {
  const address = server.address();
  process.stdout.write(`LISTENING ${typeof address === "object" && address ? address.port : port}\n`);
});

const shutdown = () => {
  void acpServer.close().finally(() => process.exit(0));
  server.closeAllConnections();
};
process.on("SIGTERM", shutdown);
process.on("SIGINT", shutdown);
