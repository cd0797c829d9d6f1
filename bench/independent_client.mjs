// A second load generator, independent of bench/client.py: Node's own fetch (undici) for POST and
// the SSE streams, the `ws` package for WebSocket, longer windows. Used by bench/independent.py.
//
//   node bench/independent_client.mjs URL http|ws stream|rtt COUNT REPS WARMUP
//
// Prints one JSON line: {"samples": [...]} (stream: msg/s per rep; rtt: p50 ms per rep).
// Every chunk is checked (index in order, then the reply), as bench/scenarios.py does.

import { createRequire } from "node:module";

const require = createRequire(new URL("../tests/peers/ts_server/package.json", import.meta.url));
const WebSocket = require("ws");

const [url, transport, scenario, countText, repsText, warmupText] = process.argv.slice(2);
const count = Number(countText);
const reps = Number(repsText);
const warmup = Number(warmupText);
const JSON_HEADERS = { "Content-Type": "application/json", Accept: "application/json, text/event-stream" };

class Client {
  constructor() {
    this.nextId = 1;
    this.waiting = new Map(); // request id -> resolve
    this.sink = null;
  }

  deliver(message) {
    if (message.id !== undefined && message.method === undefined && this.waiting.has(message.id) && !this.sink) {
      const resolve = this.waiting.get(message.id);
      this.waiting.delete(message.id);
      resolve(message);
    } else if (this.sink) {
      this.sink(message);
    }
  }

  call(method, params, session) {
    const id = this.nextId++;
    const reply = new Promise((resolve) => this.waiting.set(id, resolve));
    return this.send({ jsonrpc: "2.0", id, method, params }, session).then(() => reply);
  }

  async newSession() {
    const reply = await this.call("session/new", { cwd: "/tmp", mcpServers: [] });
    this.sessionId = reply.result.sessionId;
    await this.openSession();
    return this.sessionId;
  }

  prompt(id, text) {
    return { jsonrpc: "2.0", id, method: "session/prompt", params: { sessionId: this.sessionId, prompt: [{ type: "text", text }] } };
  }
}

class HttpClient extends Client {
  async open() {
    const response = await fetch(url, {
      method: "POST",
      headers: JSON_HEADERS,
      body: JSON.stringify({ jsonrpc: "2.0", id: 0, method: "initialize", params: { protocolVersion: 1, clientCapabilities: {} } }),
    });
    await response.json();
    this.connectionId = response.headers.get("acp-connection-id");
    if (response.status !== 200 || !this.connectionId) throw new Error(`initialize: ${response.status}`);
    this.stream(null); // not awaited: a server may send the head only with the first event
  }

  async openSession() {
    this.stream(this.sessionId);
  }

  async stream(session) {
    const headers = { Accept: "text/event-stream", "Acp-Connection-Id": this.connectionId };
    if (session) headers["Acp-Session-Id"] = session;
    const response = await fetch(url, { headers });
    if (response.status !== 200) throw new Error(`GET stream: ${response.status}`);
    const decoder = new TextDecoder();
    let buffer = "";
    for await (const bytes of response.body) {
      buffer += decoder.decode(bytes, { stream: true });
      let end;
      while ((end = buffer.indexOf("\n\n")) >= 0) {
        const event = buffer.slice(0, end);
        buffer = buffer.slice(end + 2);
        const data = event.split("\n").filter((line) => line.startsWith("data:")).map((line) => line.slice(5).trimStart());
        if (data.length) this.deliver(JSON.parse(data.join("\n")));
      }
    }
  }

  async send(message, session) {
    const headers = { ...JSON_HEADERS, "Acp-Connection-Id": this.connectionId };
    if (session) headers["Acp-Session-Id"] = session;
    const response = await fetch(url, { method: "POST", headers, body: JSON.stringify(message) });
    await response.arrayBuffer();
    if (response.status !== 202) throw new Error(`POST ${message.method}: ${response.status}`);
  }

  async close() {
    await fetch(url, { method: "DELETE", headers: { "Acp-Connection-Id": this.connectionId } });
  }
}

class WsClient extends Client {
  async open() {
    this.socket = new WebSocket(url.replace("http://", "ws://"));
    await new Promise((resolve, reject) => {
      this.socket.once("open", resolve);
      this.socket.once("error", reject);
    });
    this.socket.on("message", (data) => this.deliver(JSON.parse(data.toString())));
    const reply = await this.call("initialize", { protocolVersion: 1, clientCapabilities: {} });
    if (!reply.result) throw new Error(`initialize: ${JSON.stringify(reply)}`);
  }

  async openSession() {}

  async send(message) {
    this.socket.send(JSON.stringify(message));
  }

  async close() {
    this.socket.close(1000);
  }
}

async function streamOnce(client, n) {
  const id = client.nextId++;
  let next = 0;
  const done = new Promise((resolve, reject) => {
    client.sink = (message) => {
      if (message.method === "session/update") {
        const text = message.params.update.content.text;
        const index = Number(text.slice(0, text.indexOf(":")));
        if (index !== next) reject(new Error(`chunk ${index} where ${next} was due`));
        next += 1;
      } else if (message.id === id) {
        if (next !== n) reject(new Error(`reply after ${next} of ${n} chunks`));
        resolve(performance.now());
      }
    };
  });
  const started = performance.now();
  await client.send(client.prompt(id, `stream ${n} 64`), client.sessionId);
  const ended = await done;
  client.sink = null;
  return n / ((ended - started) / 1000);
}

async function rttOnce(client, n) {
  const samples = [];
  for (let i = 0; i < n; i += 1) {
    const id = client.nextId++;
    const want = `r${i}`;
    let text = null;
    const done = new Promise((resolve, reject) => {
      client.sink = (message) => {
        if (message.method === "session/update") text = message.params.update.content.text;
        else if (message.id === id) (text === want ? resolve : reject)(text === want ? performance.now() : new Error(`echo ${text}`));
      };
    });
    const started = performance.now();
    await client.send(client.prompt(id, `echo ${want}`), client.sessionId);
    samples.push((await done) - started);
  }
  client.sink = null;
  samples.sort((a, b) => a - b);
  return samples[Math.floor(samples.length / 2)];
}

const client = transport === "http" ? new HttpClient() : new WsClient();
await client.open();
await client.newSession();
const once = scenario === "stream" ? streamOnce : rttOnce;
if (warmup > 0) await once(client, warmup);
const samples = [];
for (let rep = 0; rep < reps; rep += 1) samples.push(await once(client, count));
await client.close();
console.log(JSON.stringify({ samples }));
process.exit(0);
