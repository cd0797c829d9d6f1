// acp-client.js: a small Agent Client Protocol (ACP) client for browsers, for the acp-channels
// `/acp` endpoint (docs/wire-contract.md). A plain ES module, no dependencies, no build step:
//
//   import { AcpClient } from "/static/acp_channels/acp-client.js";
//   const client = new AcpClient({ url: "/acp", transport: "websocket", token });
//   client.addEventListener("update", (event) => show(event.detail.sessionId, event.detail.update));
//   await client.connect();
//   const { sessionId } = await client.newSession();
//   const { stopReason } = await client.prompt(sessionId, "hello");
//
// Attaching to a live session (another tab's, another device's) and listing them:
//
//   const { sessions } = await fetchDirectory({ url: "/acp", token });
//   const attached = new AcpClient({ url: "/acp", token, attachSession: sessions[0].sessionId });
//   attached.addEventListener("turnended", (event) => showEnd(event.detail.stopReason));
//   await attached.connect();   // then the session's retained output arrives, then live
//
// The API, its events and what it does on the wire: docs/browser.md.

/** The ACP protocol version this client speaks. */
export const PROTOCOL_VERSION = 1;
/** Where the server advertises resumable streams in `initialize`'s `result._meta`. */
export const RESUME_META_KEY = "acp-channels/resume";
/** Session streams held open at once over HTTP/1.1 (the browser allows about six connections per
 * origin: this many, the connection stream and one left for the POSTs). */
export const DEFAULT_MAX_SESSION_STREAMS = 4;
/** Messages sent on WebSockets and kept until the server is known to have them (to send them
 * again after a reattach): beyond this many the oldest are let go. */
export const MAX_UNCONFIRMED_MESSAGES = 1024;

// Shared sessions (docs/shared-sessions.md; the server's names are provisional).
/** Where an attachment's `initialize` result says what it is attached to, in `_meta`. */
export const ATTACHMENT_META_KEY = "acp-channels/attachment";
/** Where the `initialize` result says where the principal's live sessions are listed. */
export const SESSIONS_META_KEY = "acp-channels/sessions";
/** To a session's other clients: a turn another client prompted ended. */
export const TURN_ENDED_METHOD = "_acp-channels/session/turn_ended";
/** To a session's other clients: a permission request was answered (by another client, or the server). */
export const PERMISSION_RESOLVED_METHOD = "_acp-channels/session/permission_resolved";
/** To an attachment: the connection hosting its session ended (terminated); its streams end next. */
export const TERMINATED_METHOD = "_acp-channels/session/terminated";
/** JSON-RPC error: an observer may not send to the agent. */
export const OBSERVER_REFUSED = -32011;
/** JSON-RPC error: a prompt while a turn runs on a shared session (another client's, or ours). */
export const TURN_RUNNING = -32012;
/** JSON-RPC error: an attachment carries its one session only. */
export const NOT_THIS_SESSION = -32013;

/**
 * @typedef {"websocket" | "http"} Transport
 * @typedef {"controller" | "observer"} AttachRole
 * @typedef {{ sessionId: string, connectionId: string, role: AttachRole, turnRunning: boolean }} Attachment
 *   what an attachment's initialize result says it is attached to (`turnRunning`: when it attached)
 * @typedef {{ sessionId: string, connectionId: string, principal: string, agent?: string, created: string,
 *             lastActivity: string, turnRunning: boolean, pendingPermissions: number, attachments: number }} DirectorySession
 * @typedef {{ sessions: DirectorySession[], connections: any[], complete: boolean }} Directory
 *   `GET <endpoint>/sessions`: the caller's live sessions, most recently active first
 * @typedef {object} DirectoryOptions
 * @property {string} [url] the endpoint (default "/acp"); the directory is `<endpoint>/sessions`
 * @property {string | null} [directoryUrl] the directory's own URL, when it is elsewhere
 * @property {string} [token] a bearer token (else the site's cookies, same origin)
 * @property {RequestCredentials} [credentials] fetch's credentials mode (default "same-origin")
 * @typedef {"idle" | "connecting" | "connected" | "reconnecting" | "closed"} ConnectionState
 * @typedef {"origin" | "auth" | "unreachable" | "http" | "rpc" | "closed" | "lost"} ErrorKind
 * @typedef {{ jsonrpc: "2.0", id?: number | string | null, method?: string, params?: any,
 *             result?: any, error?: { code: number, message: string, data?: any } }} Message
 * @typedef {{ key: string, controller: AbortController, openedAt: number, lastActivity: number,
 *             opened: Promise<void> }} StreamState one SSE stream ("" is the connection stream)
 * @typedef {{ text: string, requestId: string | null }} Outgoing a message for the socket (with
 *   its id when it is a request: its reply proves the server has it, and what came before)
 * @typedef {Outgoing & { number: number }} SentMessage one sent on a socket, numbered from 1
 *   across the connection's sockets (the server counts the ones it received the same way)
 * @typedef {object} AcpClientOptions
 * @property {string} [url] the endpoint, absolute or relative to the page (default "/acp")
 * @property {Transport} [transport] "websocket" (default) or "http" (HTTP+SSE over fetch)
 * @property {string} [token] a bearer token: the `Authorization` header over HTTP; over
 *   WebSocket it asks for a single-use ticket (`POST <endpoint>/tickets`) before each socket,
 *   offered as the subprotocol `acp-ticket.<ticket>`. Without one, cookies (same origin) apply
 * @property {RequestCredentials} [credentials] fetch's credentials mode (default "same-origin")
 * @property {string | null} [ticketUrl] where WebSocket tickets are issued (default
 *   `<url>/tickets`; null: open sockets without a ticket, cookies alone)
 * @property {string} [csrfCookieName] the site's CSRF cookie (Django's CSRF_COOKIE_NAME, default
 *   "csrftoken"): without a token its value goes along as X-CSRFToken when asking for a ticket
 * @property {{ name: string, title?: string, version: string }} [clientInfo]
 * @property {object} [clientCapabilities] sent in initialize (default: no fs, no terminal)
 * @property {number} [maxSessionStreams] HTTP only: session streams open at once (default 4,
 *   unlimited when the browser reports HTTP/2 or HTTP/3 for the endpoint)
 * @property {number} [sliceMs] HTTP only: how long a session stream keeps its place while
 *   other sessions wait for one (default 1000)
 * @property {number} [reconnectForMs] how long to keep trying after a drop (default 30000)
 * @property {Storage | null} [storage] where the connection is remembered across a page reload
 *   (default: sessionStorage; null: nowhere)
 * @property {string} [attachSession] attach to this live session (the caller's own, from the
 *   directory) instead of starting an agent: the connection carries that session only
 * @property {AttachRole} [attachRole] "controller" (default: prompts, answers permission requests)
 *   or "observer" (sees what the others see, sends nothing to the agent)
 * @property {string | null} [directoryUrl] the session directory's URL (default: the one the
 *   server advertises, else `<url>/sessions`)
 */

/** An error the client reports: `kind` says what went wrong in words a page can show. */
export class AcpError extends Error {
  /**
   * @param {string} message
   * @param {{ kind?: ErrorKind, status?: number, code?: number, data?: unknown }} [details]
   */
  constructor(message, details = {}) {
    super(message);
    this.name = "AcpError";
    /** @type {ErrorKind} */
    this.kind = details.kind ?? "http";
    /** @type {number | undefined} the HTTP status, when there was one */
    this.status = details.status;
    /** @type {number | undefined} the JSON-RPC error code, for `kind: "rpc"` */
    this.code = details.code;
    this.data = details.data;
  }
}

/**
 * One ACP connection to an agent server. Events (all `CustomEvent`s, details below):
 * - `state`: `{ state, error? }` whenever `state` changes;
 * - `update`: `{ sessionId, update }` for each `session/update` notification;
 * - `request`: `{ id, method, params, sessionId }` for each request the agent sends
 *   (`session/request_permission`, `fs/*`, ...): answer it with `respond` or `respondError`;
 * - `message`: `{ message }` for every message the agent sends, before the events above;
 * - `error`: `{ error, sessionId? }` for problems that do not end the connection;
 * - on a shared session (docs/shared-sessions.md): `turnended` `{ sessionId, stopReason }` (a turn
 *   another client prompted ended), `permissionresolved` `{ sessionId, requestId, outcome }` (a
 *   permission request this client was asked was answered elsewhere: withdraw it), `terminated`
 *   `{ sessionId, connectionId }` (the session's connection ended; an attachment then closes).
 */
export class AcpClient extends EventTarget {
  /** @param {AcpClientOptions} [options] */
  constructor(options = {}) {
    super();
    this.url = new URL(options.url ?? "/acp", globalThis.location?.href).href;
    /** @type {Transport} */
    this.transport = options.transport ?? "websocket";
    if (this.transport !== "websocket" && this.transport !== "http") {
      throw new AcpError(`unknown transport ${JSON.stringify(this.transport)}`);
    }
    this.token = options.token || null;
    this.credentials = options.credentials ?? "same-origin";
    this.clientInfo = options.clientInfo ?? { name: "acp-channels-browser", version: "0.1.0" };
    this.clientCapabilities = options.clientCapabilities ?? { fs: { readTextFile: false, writeTextFile: false }, terminal: false };
    this.sliceMs = options.sliceMs ?? 1000;
    this.reconnectForMs = options.reconnectForMs ?? 30000;
    this.storage = options.storage === undefined ? globalThis.sessionStorage ?? null : options.storage;
    /** @type {string | null} the session this client attaches to (null: a connection of its own) */
    this.attachSession = options.attachSession || null;
    /** @type {AttachRole} */
    this.attachRole = options.attachRole ?? "controller";
    if (this.attachRole !== "controller" && this.attachRole !== "observer") {
      throw new AcpError(`unknown attach role ${JSON.stringify(this.attachRole)}`);
    }
    this.directoryUrl = options.directoryUrl ?? null;
    /** @type {string | null} */
    this.ticketUrl = options.ticketUrl === null ? null : new URL(options.ticketUrl ?? `${this.url.replace(/[?#].*$/, "").replace(/\/+$/, "")}/tickets`, this.url).href;
    this.csrfCookieName = options.csrfCookieName ?? "csrftoken";
    this.storageKey = `acp-client ${this.transport} ${this.url}${this.attachSession ? ` attach ${this.attachRole} ${this.attachSession}` : ""}`;
    /** @type {number} */
    this.maxSessionStreams = options.maxSessionStreams ?? DEFAULT_MAX_SESSION_STREAMS;
    this.#explicitMaxStreams = options.maxSessionStreams !== undefined;
    /** @type {ConnectionState} */
    this.state = "idle";
    /** @type {string | null} */
    this.connectionId = null;
    /** @type {any} the initialize result (the agent's capabilities and info) */
    this.initializeResult = null;
    /** @type {boolean} whether `connect()` picked up a connection from before a reload */
    this.resumed = false;
  }

  #explicitMaxStreams = false;
  #nextId = 1;
  /** @type {Map<string, { resolve: (value: any) => void, reject: (error: Error) => void, method: string, sessionId: string | null }>} */
  #pending = new Map();
  #closing = false;
  /** @type {Set<string>} streams (or the socket) currently failing, while state is "reconnecting" */
  #failing = new Set();
  /** @type {number | null} when the current outage started */
  #outageSince = null;

  /**
   * What this attachment is attached to (the initialize result's `_meta`), null for a connection
   * of its own. `turnRunning` is as it was when it attached: `turnended` says when that turn ends.
   * @returns {Attachment | null}
   */
  get attachment() {
    return this.initializeResult?._meta?.[ATTACHMENT_META_KEY] ?? null;
  }

  /**
   * The caller's live sessions, across the server's workers (`GET <endpoint>/sessions`, with
   * this client's credentials). Needs no connection: call it before `connect()` too.
   * @returns {Promise<Directory>}
   */
  directory() {
    const advertised = this.initializeResult?._meta?.[SESSIONS_META_KEY];
    if (advertised && advertised.directory === null && !this.directoryUrl) {
      return Promise.reject(new AcpError("this server lists no sessions (its endpoint is routed without acp_channels.urls)", { kind: "http", status: 404 }));
    }
    const directoryUrl = this.directoryUrl ?? (typeof advertised?.directory === "string" ? new URL(advertised.directory, this.url).href : null);
    return fetchDirectory({ url: this.url, directoryUrl, token: this.token ?? undefined, credentials: this.credentials });
  }

  // ---------------------------------------------------------------- public API

  /**
   * Open the connection: pick up the one remembered from before a reload when the server still
   * has it, else `initialize` a new one. Resolves with the initialize result.
   * @returns {Promise<any>}
   */
  async connect() {
    if (this.state !== "idle") throw new AcpError("connect() may be called once per client");
    const saved = this.#loadSaved();
    // Picking up the connection from before a reload is a reconnect, and shown as one.
    this.#setState(saved ? "reconnecting" : "connecting");
    try {
      if (saved && (await this.#tryResume(saved))) {
        this.resumed = true;
      } else {
        this.#forget();
        if (saved) this.#setState("connecting");
        await this.#openFresh();
      }
      this.#setState("connected");
      return this.initializeResult;
    } catch (error) {
      this.#end(asAcpError(error));
      throw error;
    }
  }

  /**
   * Send a request and resolve with its result (reject with an `AcpError` of kind "rpc" for an
   * error reply). `sessionId` defaults to `params.sessionId`.
   * @param {string} method
   * @param {Record<string, any>} [params]
   * @returns {Promise<any>}
   */
  request(method, params = {}) {
    if (this.state === "closed") return Promise.reject(new AcpError("the connection is closed", { kind: "closed" }));
    const id = this.#takeId();
    const sessionId = typeof params?.sessionId === "string" ? params.sessionId : null;
    const reply = new Promise((resolve, reject) => {
      this.#pending.set(String(id), { resolve, reject, method, sessionId });
    });
    if (sessionId !== null) this.#sessionWants(sessionId, +1);
    this.#send({ jsonrpc: "2.0", id, method, params }, sessionId).catch((error) => this.#settle(String(id), null, asAcpError(error)));
    return reply;
  }

  /**
   * Send a notification (no reply).
   * @param {string} method
   * @param {Record<string, any>} [params]
   */
  notify(method, params = {}) {
    const sessionId = typeof params?.sessionId === "string" ? params.sessionId : null;
    return this.#send({ jsonrpc: "2.0", method, params }, sessionId);
  }

  /**
   * Answer a request the agent sent (a `request` event).
   * @param {number | string} id
   * @param {any} result
   */
  respond(id, result) {
    return this.#send({ jsonrpc: "2.0", id, result }, null, { response: true });
  }

  /**
   * Answer a request the agent sent with an error.
   * @param {number | string} id
   * @param {number} code
   * @param {string} message
   */
  respondError(id, code, message) {
    return this.#send({ jsonrpc: "2.0", id, error: { code, message } }, null, { response: true });
  }

  /** `session/new`; resolves with `{ sessionId, ... }`. @param {object} [params] */
  newSession(params = {}) {
    return this.request("session/new", { cwd: "/", mcpServers: [], ...params });
  }

  /**
   * `session/prompt` with text (or content blocks); resolves with `{ stopReason }` at the end of
   * the turn, the updates arriving as `update` events meanwhile.
   * @param {string} sessionId
   * @param {string | object[]} prompt
   */
  prompt(sessionId, prompt) {
    const blocks = typeof prompt === "string" ? [{ type: "text", text: prompt }] : prompt;
    return this.request("session/prompt", { sessionId, prompt: blocks });
  }

  /** `session/cancel`: the running turn ends with stopReason "cancelled". @param {string} sessionId */
  cancel(sessionId) {
    return this.notify("session/cancel", { sessionId });
  }

  /** `session/list`; resolves with `{ sessions: [...] }`. @param {object} [params] */
  listSessions(params = {}) {
    return this.request("session/list", params);
  }

  /**
   * `session/load`: the agent replays the session's history as `update` events, then resolves.
   * @param {string} sessionId
   * @param {object} [params]
   */
  loadSession(sessionId, params = {}) {
    return this.request("session/load", { cwd: "/", mcpServers: [], ...params, sessionId });
  }

  /** End the connection (DELETE, or a WebSocket close with 1000) and forget it. */
  async close() {
    if (this.state === "closed") return;
    this.#closing = true;
    this.#forget();
    if (this.transport === "http") {
      this.#stopAllStreams();
      if (this.connectionId) {
        try {
          await this.#fetch({ method: "DELETE", headers: { "Acp-Connection-Id": this.connectionId }, keepalive: true });
        } catch {
          // the connection is gone either way: the server ends it when idle
        }
      }
    } else if (this.#socket) {
      this.#socket.close(1000, "client closed");
    }
    this.#end(null);
  }

  // ---------------------------------------------------------------- shared

  /** @param {ConnectionState} state @param {Error | null} [error] */
  #setState(state, error = null) {
    if (this.state === state && !error) return;
    this.state = state;
    this.dispatchEvent(new CustomEvent("state", { detail: { state, error } }));
  }

  /** The connection is over: every pending request fails, nothing is retried. @param {AcpError | null} error */
  #end(error) {
    if (this.state === "closed") return;
    this.#closing = true;
    clearTimeout(this.#rotationTimer);
    this.#stopAllStreams();
    const reason = error ?? new AcpError("the connection is closed", { kind: "closed" });
    for (const [id] of this.#pending) this.#settle(id, null, reason);
    this.#setState("closed", error);
  }

  #takeId() {
    const id = this.#nextId++;
    this.#save();
    return id;
  }

  /** @param {Message | Message[]} frame */
  #dispatch(frame) {
    for (const message of Array.isArray(frame) ? frame : [frame]) {
      if (message === null || typeof message !== "object") continue;
      this.dispatchEvent(new CustomEvent("message", { detail: { message } }));
      if (typeof message.method === "string") {
        const sessionId = typeof message.params?.sessionId === "string" ? message.params.sessionId : null;
        if (message.id !== undefined && message.id !== null) {
          this.dispatchEvent(new CustomEvent("request", { detail: { id: message.id, method: message.method, params: message.params, sessionId } }));
        } else if (message.method === "session/update" && sessionId !== null) {
          this.dispatchEvent(new CustomEvent("update", { detail: { sessionId, update: message.params.update } }));
        } else if (message.method === TURN_ENDED_METHOD && sessionId !== null) {
          this.dispatchEvent(new CustomEvent("turnended", { detail: { sessionId, stopReason: message.params.stopReason } }));
        } else if (message.method === PERMISSION_RESOLVED_METHOD && sessionId !== null) {
          const { requestId, outcome } = message.params;
          this.dispatchEvent(new CustomEvent("permissionresolved", { detail: { sessionId, requestId, outcome } }));
        } else if (message.method === TERMINATED_METHOD && sessionId !== null) {
          this.dispatchEvent(new CustomEvent("terminated", { detail: { sessionId, connectionId: message.params.connectionId ?? null } }));
          if (sessionId === this.attachSession) this.#terminated(sessionId);
        }
      } else if (message.id !== undefined && message.id !== null) {
        this.#confirmedBy(String(message.id));
        const error = message.error
          ? new AcpError(message.error.message ?? "error", { kind: "rpc", code: message.error.code, data: message.error.data })
          : null;
        this.#settle(String(message.id), message.result, error);
      } else if (message.error) {
        // an error without an id: the transport could not read something we sent
        this.dispatchEvent(new CustomEvent("error", { detail: { error: new AcpError(message.error.message, { kind: "rpc", code: message.error.code }) } }));
      }
    }
  }

  /** The connection hosting the attached session ended: so does this attachment (its streams
   * end next). @param {string} sessionId */
  #terminated(sessionId) {
    this.#closing = true;
    this.#forget();
    this.#socket?.close(1000, "the session ended");
    this.#end(new AcpError(`the session ${sessionId} ended: its connection was terminated`, { kind: "closed" }));
  }

  /** @param {string} id @param {any} result @param {Error | null} error */
  #settle(id, result, error) {
    const pending = this.#pending.get(id);
    if (!pending) return; // a reply to a request of the page before a reload: nobody waits for it
    this.#pending.delete(id);
    if (pending.sessionId !== null) this.#sessionWants(pending.sessionId, -1);
    if (error) pending.reject(error);
    else pending.resolve(result);
  }

  /** @param {Message} message @param {string | null} sessionId @param {{ response?: boolean }} [how] */
  #send(message, sessionId, how = {}) {
    if (this.state === "closed") return Promise.reject(new AcpError("the connection is closed", { kind: "closed" }));
    return this.transport === "http" ? this.#post(message, sessionId, how) : this.#socketSend(message);
  }

  /** @returns {Record<string, string>} */
  #authHeaders() {
    return this.token ? { Authorization: `Bearer ${this.token}` } : {};
  }

  /** fetch() the endpoint with credentials; a network failure becomes an AcpError saying why. @param {RequestInit} init */
  async #fetch(init) {
    try {
      return await fetch(this.url, {
        ...init,
        credentials: this.credentials,
        cache: "no-store",
        headers: { ...this.#authHeaders(), ...init.headers },
      });
    } catch (/** @type {any} */ error) {
      if (error?.name === "AbortError") throw error;
      throw (await this.diagnose()) ?? new AcpError(`the request to ${this.url} failed: ${error?.message ?? error}`, { kind: "unreachable" });
    }
  }

  /**
   * Why requests to the server fail, in words a page can show: a refused origin, refused
   * credentials, or an unreachable server. null when a plain request goes through (the failure
   * was something else). A page cannot see a CORS failure's cause, so this asks twice: once
   * as a CORS request, once as a no-cors one (which succeeds whenever the server answers).
   * @returns {Promise<AcpError | null>}
   */
  async diagnose() {
    const target = new URL(this.url);
    const crossOrigin = target.origin !== globalThis.location?.origin;
    try {
      const response = await fetch(this.url, {
        headers: { Accept: "text/event-stream", ...this.#authHeaders() },
        credentials: this.credentials,
        cache: "no-store",
      });
      const text = (await response.text()).trim();
      if (response.status === 401 || response.status === 403) return refusal(response.status, text, Boolean(this.token));
      return null;
    } catch {
      try {
        await fetch(this.url, { mode: "no-cors", credentials: "omit", cache: "no-store" });
      } catch {
        return new AcpError(`cannot reach the server at ${target.origin}`, { kind: "unreachable" });
      }
      if (crossOrigin) {
        return new AcpError(
          `the server at ${target.origin} refused this page's origin (${globalThis.location?.origin}): ` +
            `it must be listed in the server's ACP_CHANNELS["CORS_ALLOWED_ORIGINS"]`,
          { kind: "origin" },
        );
      }
      return new AcpError(`the server at ${target.origin} answered, but the browser blocked the answer`, { kind: "http" });
    }
  }

  /** A stream or the socket failed: show "reconnecting" until it is back, give up after reconnectForMs. @param {string} what */
  #outage(what) {
    this.#failing.add(what);
    this.#outageSince ??= Date.now();
    if (Date.now() - this.#outageSince > this.reconnectForMs) {
      this.#end(new AcpError(`lost the connection to the server and could not resume it within ${Math.round(this.reconnectForMs / 1000)} s`, { kind: "unreachable" }));
      return false;
    }
    if (this.state === "connected") this.#setState("reconnecting");
    return true;
  }

  /** @param {string} what */
  #recovered(what) {
    this.#failing.delete(what);
    if (this.#failing.size === 0) {
      this.#outageSince = null;
      if (this.state === "reconnecting") this.#setState("connected");
    }
  }

  // ---------------------------------------------------------------- remembering across reloads

  #loadSaved() {
    try {
      const text = this.storage?.getItem(this.storageKey);
      return text ? JSON.parse(text) : null;
    } catch {
      return null;
    }
  }

  #save() {
    if (!this.storage || !this.connectionId || this.#closing) return;
    const saved = {
      connectionId: this.connectionId,
      initializeResult: this.initializeResult,
      nextId: this.#nextId,
      received: this.#received,
      lastEventIds: Object.fromEntries(this.#lastEventIds),
    };
    try {
      this.storage.setItem(this.storageKey, JSON.stringify(saved));
    } catch {
      // storage full or disabled: a reload then starts a new connection
    }
  }

  #forget() {
    try {
      this.storage?.removeItem(this.storageKey);
    } catch {
      // nothing remembered then
    }
  }

  async #openFresh() {
    if (this.transport === "http") await this.#initializeOverHttp();
    else await this.#initializeOverSocket();
  }

  /** @param {any} saved */
  async #tryResume(saved) {
    this.connectionId = saved.connectionId;
    this.initializeResult = saved.initializeResult;
    this.#nextId = Math.max(1, Number(saved.nextId) || 1);
    this.#received = Number(saved.received) || 0;
    this.#lastEventIds = new Map(Object.entries(saved.lastEventIds ?? {}));
    const resumed = this.transport === "http" ? await this.#resumeHttp() : await this.#resumeSocket();
    if (!resumed) {
      this.connectionId = null;
      this.initializeResult = null;
      this.#nextId = 1;
      this.#received = 0;
      this.#lastEventIds = new Map();
    }
    return resumed;
  }

  #initializeParams() {
    return { protocolVersion: PROTOCOL_VERSION, clientCapabilities: this.clientCapabilities, clientInfo: this.clientInfo };
  }

  // ---------------------------------------------------------------- HTTP + SSE over fetch

  /** @type {Map<string, string>} the last event id seen per stream ("" is the connection stream) */
  #lastEventIds = new Map();
  /** @type {Map<string, StreamState>} */
  #streams = new Map();
  /** @type {Map<string, number>} session id -> requests waiting for a reply on its stream */
  #wants = new Map();
  /** @type {string[]} sessions in the order they get a stream (first: longest waiting) */
  #queue = [];
  /** @type {ReturnType<typeof setTimeout> | undefined} */
  #rotationTimer = undefined;
  /** @type {Promise<unknown>} call POSTs go one at a time, in order (docs/wire-contract.md, section 11) */
  #postChain = Promise.resolve();
  /** whether an attachment's session holds its stream for good */
  #pinned = false;

  async #initializeOverHttp() {
    const id = this.#takeId();
    /** @type {Record<string, string>} */
    const headers = { "Content-Type": "application/json" };
    if (this.attachSession) {
      headers["Acp-Attach-Session"] = this.attachSession;
      headers["Acp-Attach-Role"] = this.attachRole;
    }
    const response = await this.#fetch({
      method: "POST",
      headers,
      body: JSON.stringify({ jsonrpc: "2.0", id, method: "initialize", params: this.#initializeParams() }),
    });
    if (response.status !== 200) {
      throw await httpError(response, this.attachSession ? `attaching to session ${this.attachSession}` : "initialize", Boolean(this.token));
    }
    const reply = await response.json();
    const message = Array.isArray(reply) ? reply.find((entry) => String(entry.id) === String(id)) : reply;
    if (message?.error) throw new AcpError(`initialize failed: ${message.error.message}`, { kind: "rpc", code: message.error.code });
    const connectionId = response.headers.get("Acp-Connection-Id");
    if (!connectionId) {
      throw new AcpError("the server did not say the connection's id (a cross-origin server must expose Acp-Connection-Id)", { kind: "http" });
    }
    this.connectionId = connectionId;
    this.initializeResult = message.result;
    this.#detectMultiplexing();
    this.#save();
    await this.#startStream("");
    this.#pinAttachedSession();
  }

  /** An attachment's session stream carries everything it is for: open it and keep it open. */
  #pinAttachedSession() {
    if (this.attachSession && !this.#pinned) {
      this.#pinned = true;
      this.#sessionWants(this.attachSession, +1);
    }
  }

  async #resumeHttp() {
    // The connection stream again, after its last event: 404 means the connection is gone.
    try {
      await this.#startStream("");
    } catch (error) {
      if (error instanceof AcpError && (error.status === 404 || error.kind === "lost")) return false;
      throw error;
    }
    this.#detectMultiplexing();
    this.#pinAttachedSession();
    return true;
  }

  /** Over HTTP/2 or HTTP/3 streams share one TCP connection: no six-connection limit then. */
  #detectMultiplexing() {
    if (this.#explicitMaxStreams || typeof performance === "undefined") return;
    const entries = performance.getEntriesByName?.(this.url) ?? [];
    const last = /** @type {PerformanceResourceTiming | undefined} */ (entries[entries.length - 1]);
    const protocol = last?.nextHopProtocol ?? "";
    if (protocol === "h2" || protocol === "h3") this.maxSessionStreams = Infinity;
  }

  /**
   * POST one message; call POSTs wait for each 202 in turn, responses skip ahead.
   * @param {Message} message @param {string | null} sessionId @param {{ response?: boolean }} how
   */
  #post(message, sessionId, how) {
    const send = async () => {
      if (this.state === "closed") throw new AcpError("the connection is closed", { kind: "closed" });
      /** @type {Record<string, string>} */
      const headers = { "Content-Type": "application/json", "Acp-Connection-Id": this.connectionId ?? "" };
      if (sessionId !== null) headers["Acp-Session-Id"] = sessionId;
      const response = await this.#fetch({ method: "POST", headers, body: JSON.stringify(message) });
      if (response.status === 404) {
        this.#end(new AcpError("the server no longer has this connection (it ended or timed out)", { kind: "closed", status: 404 }));
      }
      if (response.status !== 202) throw await httpError(response, message.method ?? "the reply");
    };
    if (how.response) return send();
    const sent = this.#postChain.then(send);
    this.#postChain = sent.catch(() => undefined);
    return sent;
  }

  /** A request naming a session waits for its reply there: the session needs its stream. @param {string} sessionId @param {number} delta */
  #sessionWants(sessionId, delta) {
    if (this.transport !== "http") return;
    const count = (this.#wants.get(sessionId) ?? 0) + delta;
    if (count > 0) {
      this.#wants.set(sessionId, count);
      if (!this.#queue.includes(sessionId)) this.#queue.push(sessionId);
    } else {
      this.#wants.delete(sessionId);
      this.#queue = this.#queue.filter((id) => id !== sessionId);
    }
    this.#schedule();
  }

  /**
   * Give session streams to the sessions that wait for something, at most maxSessionStreams at
   * once: idle streams stay open while there is room and are closed first; when more sessions
   * wait than there are places, each stream gives its place up after sliceMs (the server keeps
   * its events, and the stream resumes after its last event id).
   */
  #schedule() {
    if (this.#closing || this.state === "closed" || this.transport !== "http" || !this.connectionId) return;
    clearTimeout(this.#rotationTimer);
    /** @returns {StreamState[]} */
    const sessionStreams = () => [...this.#streams.values()].filter((stream) => stream.key !== "");
    const waiting = this.#queue.filter((id) => !this.#streams.has(id));
    for (const sessionId of waiting) {
      const open = sessionStreams();
      if (open.length >= this.maxSessionStreams) {
        const idle = open.filter((stream) => !this.#wants.has(stream.key));
        if (idle.length === 0) break;
        this.#stopStream(idle.reduce((a, b) => (a.lastActivity <= b.lastActivity ? a : b)).key);
      }
      this.#startStream(sessionId).catch((error) => this.#streamFailed(sessionId, error));
    }
    const holders = sessionStreams();
    if (holders.length && this.#queue.some((id) => !this.#streams.has(id))) {
      // More sessions wait than there are places: the stream open longest gives way next.
      const oldest = holders.reduce((a, b) => (a.openedAt <= b.openedAt ? a : b));
      const due = Math.max(0, oldest.openedAt + this.sliceMs - Date.now());
      this.#rotationTimer = setTimeout(() => {
        if (this.#streams.get(oldest.key) === oldest) {
          this.#stopStream(oldest.key);
          const others = this.#queue.filter((id) => id !== oldest.key);
          this.#queue = this.#wants.has(oldest.key) ? [...others, oldest.key] : others;
        }
        this.#schedule();
      }, due);
    }
  }

  /** @param {string} sessionId @param {unknown} error */
  #streamFailed(sessionId, error) {
    const failure = asAcpError(error);
    if (failure.status === 404) {
      this.#end(new AcpError("the server no longer has this connection (it ended or timed out)", { kind: "closed", status: 404 }));
    } else if (failure.kind === "auth" || failure.kind === "origin") {
      this.#end(failure);
    } else {
      this.dispatchEvent(new CustomEvent("error", { detail: { error: failure, sessionId } }));
    }
  }

  /** @param {string} key */
  #stopStream(key) {
    const stream = this.#streams.get(key);
    if (!stream) return;
    this.#streams.delete(key);
    stream.controller.abort();
    this.#recovered(key);
  }

  #stopAllStreams() {
    for (const key of [...this.#streams.keys()]) this.#stopStream(key);
  }

  /**
   * Open a stream and keep reading it (resuming after drops) until it is stopped or the
   * connection ends. Resolves once the stream is open (its 200 arrived); rejects when it cannot
   * be opened at all (404: the connection is gone; 401/403; events lost).
   * @param {string} key "" for the connection stream, else a session id
   */
  #startStream(key) {
    const controller = new AbortController();
    /** @type {(value?: void) => void} */ let opened = () => {};
    /** @type {(error: Error) => void} */ let refused = () => {};
    /** @type {StreamState} */
    const stream = {
      key,
      controller,
      openedAt: Date.now(),
      lastActivity: Date.now(),
      opened: new Promise((resolve, reject) => ((opened = resolve), (refused = reject))),
    };
    this.#streams.set(key, stream);
    this.#readStream(stream, opened, refused);
    return stream.opened;
  }

  /**
   * @param {StreamState} stream
   * @param {() => void} opened @param {(error: Error) => void} refused
   */
  async #readStream(stream, opened, refused) {
    const { key, controller } = stream;
    const live = () => this.#streams.get(key) === stream && !this.#closing;
    let everOpened = false;
    let delay = 100;
    while (live()) {
      /** @type {Record<string, string>} */
      const headers = { Accept: "text/event-stream", "Acp-Connection-Id": this.connectionId ?? "" };
      if (key) headers["Acp-Session-Id"] = key;
      const lastId = this.#lastEventIds.get(key);
      if (lastId) headers["Last-Event-ID"] = lastId;
      /** @type {"quiet" | "outage"} how to try again: quietly (a cap, a reader not yet gone) or showing "reconnecting" */
      let retry = "outage";
      try {
        const response = await this.#fetch({ method: "GET", headers, signal: controller.signal });
        if (response.status === 200) {
          if (!everOpened) opened();
          everOpened = true;
          this.#recovered(key);
          delay = 100;
          stream.openedAt = Date.now();
          // A stream ends only with its connection; a drop ends it too: the next GET tells (404).
          await this.#readEvents(stream, response);
        } else {
          const error = await httpError(response, key ? `the stream of session ${key}` : "the connection stream");
          if (response.status === 409 && lastId) {
            // The server no longer has what came after our last event: read the stream from now on.
            this.#lastEventIds.delete(key);
            const lost = new AcpError(`some events of ${key ? `session ${key}` : "the connection"} were lost: ${error.message}`, { kind: "lost", status: 409 });
            this.dispatchEvent(new CustomEvent("error", { detail: { error: lost, sessionId: key || null } }));
            continue;
          }
          if (response.status === 409 || response.status === 429 || response.status === 503) {
            retry = "quiet"; // the old reader is still attached (the server has not noticed it left), or a cap
          } else if (!everOpened) {
            this.#streams.delete(key);
            refused(error);
            return;
          } else {
            // 404: the connection ended; 401/403: the credentials no longer pass
            this.#end(response.status === 404 ? new AcpError("the server ended the connection", { kind: "closed", status: 404 }) : error);
            return;
          }
        }
      } catch (error) {
        if (controller.signal.aborted || !live()) return;
        const failure = asAcpError(error);
        if (!everOpened && (key === "" || failure.kind !== "unreachable")) {
          this.#streams.delete(key);
          refused(failure);
          return;
        }
        if (failure.kind === "auth" || failure.kind === "origin") {
          this.#end(failure);
          return;
        }
      }
      if (!live()) return;
      if (retry === "outage" && !this.#outage(key)) return;
      await new Promise((resolve) => setTimeout(resolve, delay));
      delay = Math.min(delay * 2, 2000);
    }
  }

  /**
   * Read SSE events off a fetch body until it ends: `id:` lines are remembered (to resume),
   * `data:` lines make the event, comments (keep-alives) are skipped.
   * @param {StreamState} stream @param {Response} response
   */
  async #readEvents(stream, response) {
    if (!response.body) return;
    const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
    let buffer = "";
    /** @type {string[]} */ let data = [];
    /** @type {string | null} */ let eventId = null;
    try {
      for (;;) {
        const { value, done } = await reader.read();
        if (done) return;
        buffer += value;
        let newline;
        while ((newline = buffer.indexOf("\n")) >= 0) {
          const line = buffer.slice(0, newline).replace(/\r$/, "");
          buffer = buffer.slice(newline + 1);
          if (line === "") {
            if (data.length) {
              if (eventId !== null) this.#lastEventIds.set(stream.key, eventId);
              stream.lastActivity = Date.now();
              const text = data.join("\n");
              data = [];
              eventId = null;
              this.#save();
              let frame;
              try {
                frame = JSON.parse(text);
              } catch {
                this.dispatchEvent(new CustomEvent("error", { detail: { error: new AcpError(`the server sent something that is not JSON: ${text.slice(0, 200)}`, { kind: "http" }) } }));
                continue;
              }
              this.#dispatch(frame);
            }
          } else if (line.startsWith("data:")) {
            data.push(line.slice(5).replace(/^ /, ""));
          } else if (line.startsWith("id:")) {
            eventId = line.slice(3).replace(/^ /, "");
          }
        }
      }
    } finally {
      reader.releaseLock?.();
    }
  }

  // ---------------------------------------------------------------- WebSocket

  /** @type {WebSocket | null} */
  #socket = null;
  /** text messages received on this connection's sockets (to reattach after them) */
  #received = 0;
  /** @type {Outgoing[]} messages sent while no socket could take them: sent once one can */
  #outbox = [];
  /** text messages handed to this connection's sockets (the client's numbering) */
  #sent = 0;
  /** @type {SentMessage[]} sent on a socket, not yet known to have reached the server */
  #unconfirmed = [];
  /** @type {WebSocket | null} a reattached socket whose first message, the server's count of
   * what it received from us, has not arrived yet: new messages wait in the outbox meanwhile */
  #awaitingReceived = null;

  #socketUrl(query = "") {
    const url = new URL(this.url);
    url.protocol = url.protocol === "https:" ? "wss:" : "ws:";
    return url.href + query;
  }

  /**
   * A single-use ticket for the next socket (`POST <endpoint>/tickets`, with the token or the
   * site's cookies and CSRF token): a page can set no header on a WebSocket, and a token must
   * not travel in its URL or subprotocol. null where the server issues none (404, 405): the
   * socket goes with cookies alone.
   * @returns {Promise<string | null>}
   */
  async #ticket() {
    if (this.ticketUrl === null) return null;
    /** @type {Record<string, string>} */
    const headers = { Accept: "application/json", ...this.#authHeaders() };
    const csrf = this.token ? null : cookie(this.csrfCookieName);
    if (csrf && new URL(this.ticketUrl).origin === globalThis.location?.origin) headers["X-CSRFToken"] = csrf;
    let response;
    try {
      response = await fetch(this.ticketUrl, { method: "POST", headers, credentials: this.credentials, cache: "no-store" });
    } catch (/** @type {any} */ error) {
      throw (await this.diagnose()) ?? new AcpError(`cannot ask ${this.ticketUrl} for a WebSocket ticket: ${error?.message ?? error}`, { kind: "unreachable" });
    }
    if (response.status === 404 || response.status === 405) return null;
    if (response.status !== 200) throw await httpError(response, `a WebSocket ticket (${this.ticketUrl})`, Boolean(this.token));
    const body = await response.json();
    if (typeof body?.ticket !== "string") throw new AcpError(`${this.ticketUrl} answered no ticket`, { kind: "http", status: 200 });
    return body.ticket;
  }

  /**
   * Open a socket, with a fresh ticket; resolves once it is open, rejects (with the reason,
   * found out over HTTP) when it is refused.
   * @param {string} query
   * @returns {Promise<WebSocket>}
   */
  async #openSocket(query = "") {
    const ticket = await this.#ticket();
    const protocols = ticket ? ["acp", `acp-ticket.${ticket}`] : ["acp"];
    const attaching = query.startsWith("?acp_attach_session=");
    return new Promise((resolve, reject) => {
      let socket;
      try {
        socket = new WebSocket(this.#socketUrl(query), protocols);
      } catch (/** @type {any} */ error) {
        reject(new AcpError(`cannot open a WebSocket: ${error?.message ?? error}`, { kind: "http" }));
        return;
      }
      const refused = async () => {
        // A browser sees neither the refusal's status nor its body: ask over HTTP why.
        const why = attaching
          ? `the server refused to attach to session ${this.attachSession}: it ended, is not yours, or has too many clients attached`
          : "the server refused the WebSocket";
        reject((await this.diagnose()) ?? new AcpError(why, { kind: "http" }));
      };
      socket.addEventListener("open", () => {
        socket.removeEventListener("close", refused);
        resolve(socket);
      }, { once: true });
      socket.addEventListener("close", refused, { once: true });
    });
  }

  /**
   * Carry the connection on `socket`. A reattached one (`reattached`) first hears how many of our
   * messages the server has (a browser cannot read the 101's Acp-Received): those after it are
   * sent again, in order, then what waited in the outbox.
   * @param {WebSocket} socket @param {boolean} [reattached]
   */
  #attachSocket(socket, reattached = false) {
    this.#socket = socket;
    const told = this.initializeResult?._meta?.[RESUME_META_KEY]?.receivedNotification;
    this.#awaitingReceived = reattached && typeof told === "string" ? socket : null;
    socket.addEventListener("message", (event) => {
      if (this.#socket !== socket || typeof event.data !== "string") return; // binary: not counted
      let frame;
      try {
        frame = JSON.parse(event.data);
      } catch {
        frame = undefined;
      }
      if (this.#awaitingReceived === socket) {
        this.#awaitingReceived = null;
        const received = frame?.method === told ? frame?.params?.received : undefined;
        // Not one of the server's numbered messages: neither counted nor the page's.
        if (Number.isSafeInteger(received)) return this.#sendAfterReceived(socket, received);
        this.#flushOutbox(socket); // a server that does not say: what is queued goes now
      }
      this.#received += 1;
      this.#save();
      if (frame !== undefined) this.#dispatch(frame);
    });
    socket.addEventListener("close", (event) => {
      if (this.#socket !== socket) return;
      this.#socket = null;
      this.#awaitingReceived = null;
      this.#socketClosed(event.code, event.reason);
    });
    if (this.#awaitingReceived !== socket) this.#flushOutbox(socket);
  }

  /**
   * The server has our first `received` messages: send the later ones again (they were on the
   * old socket when it dropped), in order, then the queued new ones.
   * @param {WebSocket} socket @param {number} received
   */
  #sendAfterReceived(socket, received) {
    const missing = this.#unconfirmed.filter((message) => message.number > received);
    const oldestKept = this.#unconfirmed[0]?.number ?? this.#sent + 1;
    if (received + 1 < oldestKept && received < this.#sent) {
      // Beyond MAX_UNCONFIRMED_MESSAGES: some the server never got are no longer here.
      const lost = new AcpError(`messages ${received + 1} to ${oldestKept - 1} sent before the drop were lost`, { kind: "lost" });
      this.dispatchEvent(new CustomEvent("error", { detail: { error: lost, sessionId: null } }));
    }
    this.#unconfirmed = missing;
    // After a reload the page does not know what it sent before: the server's count is the truth.
    this.#sent = Math.max(this.#sent, received);
    for (const message of missing) socket.send(message.text);
    this.#flushOutbox(socket);
  }

  /** @param {WebSocket} socket */
  #flushOutbox(socket) {
    for (const message of this.#outbox.splice(0)) this.#sendNumbered(socket, message);
  }

  /** @param {WebSocket} socket @param {Outgoing} message */
  #sendNumbered(socket, message) {
    socket.send(message.text);
    this.#sent += 1;
    this.#unconfirmed.push({ ...message, number: this.#sent });
    if (this.#unconfirmed.length > MAX_UNCONFIRMED_MESSAGES) this.#unconfirmed.shift();
  }

  /**
   * A reply to request `id` arrived: the server had that message, and every one before it (it
   * hands them to the agent in order). @param {string} id
   */
  #confirmedBy(id) {
    const index = this.#unconfirmed.findIndex((message) => message.requestId === id);
    if (index >= 0) this.#unconfirmed.splice(0, index + 1);
  }

  /** @param {number} code @param {string} reason */
  async #socketClosed(code, reason) {
    if (this.#closing) return;
    if (code === 1000 || code === 4409 || !this.#canReattach()) {
      const why = code === 4409 ? "another page took this connection over" : code === 1000 ? "the server ended the connection" : `the WebSocket closed (${code}${reason ? ` ${reason}` : ""})`;
      this.#forget();
      this.#end(new AcpError(why, { kind: "closed" }));
      return;
    }
    let delay = 100;
    let refused = 0;
    while (!this.#closing && this.#outage("socket")) {
      try {
        const socket = await this.#openSocket(this.#reattachQuery());
        this.#attachSocket(socket, true);
        this.#recovered("socket");
        return;
      } catch (error) {
        const failure = asAcpError(error);
        if (failure.kind === "auth" || failure.kind === "origin") return this.#end(failure);
        // The server answers, yet refuses the reattach. A page cannot see why: the connection is
        // gone (404) or lost (409), or a worker is shutting down (503, try again): a few tries.
        if (failure.kind !== "unreachable" && ++refused >= 3) {
          this.#forget();
          return this.#end(new AcpError("the connection could not be resumed (the server no longer has it)", { kind: "closed" }));
        }
      }
      await new Promise((resolve) => setTimeout(resolve, delay));
      delay = Math.min(delay * 2, 2000);
    }
  }

  #canReattach() {
    const resume = this.initializeResult?._meta?.[RESUME_META_KEY];
    return Boolean(resume?.websocket && this.connectionId);
  }

  #reattachQuery() {
    return `?acp_connection_id=${encodeURIComponent(this.connectionId ?? "")}&last_event_id=${this.#received}`;
  }

  /** The upgrade's query for an attachment (a browser sets no headers on a WebSocket). */
  #attachQuery() {
    if (!this.attachSession) return "";
    const role = this.attachRole === "observer" ? "&acp_attach_role=observer" : "";
    return `?acp_attach_session=${encodeURIComponent(this.attachSession)}${role}`;
  }

  async #initializeOverSocket() {
    const socket = await this.#openSocket(this.#attachQuery());
    this.#attachSocket(socket);
    const result = await this.request("initialize", this.#initializeParams());
    this.initializeResult = result;
    this.connectionId = result?._meta?.[RESUME_META_KEY]?.connectionId ?? null;
    this.#save();
  }

  async #resumeSocket() {
    if (!this.#canReattach()) return false;
    let socket;
    try {
      socket = await this.#openSocket(this.#reattachQuery());
    } catch (error) {
      const failure = asAcpError(error);
      if (failure.kind === "auth" || failure.kind === "origin" || failure.kind === "unreachable") throw failure;
      return false; // refused (404, 409): start over
    }
    this.#attachSocket(socket, true);
    return true;
  }

  /** @param {Message} message */
  async #socketSend(message) {
    const isRequest = typeof message.method === "string" && message.id !== undefined && message.id !== null;
    /** @type {Outgoing} */
    const outgoing = { text: JSON.stringify(message), requestId: isRequest ? String(message.id) : null };
    const socket = this.#socket;
    if (socket && socket.readyState === WebSocket.OPEN && this.#awaitingReceived !== socket) this.#sendNumbered(socket, outgoing);
    else this.#outbox.push(outgoing); // reconnecting: sent after the reattach (and what it resends), in order
  }
}

/**
 * The caller's live sessions (`GET <endpoint>/sessions`): most recently active first, each with
 * its connection, whether a turn runs, permission requests waiting and clients attached. An
 * anonymous caller gets none (give a token or log in). Needs no connection.
 * @param {DirectoryOptions} [options]
 * @returns {Promise<Directory>}
 */
export async function fetchDirectory(options = {}) {
  const endpoint = new URL(options.url ?? "/acp", globalThis.location?.href);
  let target;
  if (options.directoryUrl) {
    target = new URL(options.directoryUrl, endpoint).href;
  } else {
    const directory = new URL(endpoint.href);
    directory.pathname = `${directory.pathname.replace(/\/+$/, "")}/sessions`;
    directory.search = "";
    directory.hash = "";
    target = directory.href;
  }
  let response;
  try {
    response = await fetch(target, {
      headers: { Accept: "application/json", ...(options.token ? { Authorization: `Bearer ${options.token}` } : {}) },
      credentials: options.credentials ?? "same-origin",
      cache: "no-store",
    });
  } catch (/** @type {any} */ error) {
    throw new AcpError(`cannot reach the session directory at ${target}: ${error?.message ?? error}`, { kind: "unreachable" });
  }
  if (response.status !== 200) throw await httpError(response, `the session directory (${target})`, Boolean(options.token));
  const body = await response.json();
  return { sessions: body.sessions ?? [], connections: body.connections ?? [], complete: body.complete !== false };
}

/** @param {Response} response @param {string} what @param {boolean} [withToken] */
async function httpError(response, what, withToken = false) {
  let text = "";
  try {
    text = (await response.text()).trim();
  } catch {
    // no body
  }
  if (response.status === 401 || response.status === 403) return refusal(response.status, text, withToken);
  return new AcpError(`${what}: HTTP ${response.status}${text ? ` ${text}` : ""}`, { kind: "http", status: response.status });
}

/** A 401 or 403 in words: refused credentials, or a refused origin. @param {number} status @param {string} text @param {boolean} withToken */
function refusal(status, text, withToken) {
  if (status === 403 && /origin|cross-site/.test(text)) {
    return new AcpError(`the server refused this page's origin (${globalThis.location?.origin}): ${text}`, { kind: "origin", status });
  }
  if (status === 401) {
    const advice = withToken ? "check the token" : "give a token, or log in to the site";
    return new AcpError(`the server refused the credentials (401${text ? `: ${text}` : ""}): ${advice}`, { kind: "auth", status });
  }
  return new AcpError(`the server refused access (403${text ? `: ${text}` : ""})`, { kind: "auth", status });
}

/** A cookie of this page, or null. @param {string} name @returns {string | null} */
function cookie(name) {
  const cookies = globalThis.document?.cookie ?? "";
  for (const pair of cookies.split(";")) {
    const [key, ...value] = pair.trim().split("=");
    if (key === name) return decodeURIComponent(value.join("="));
  }
  return null;
}

/** @param {unknown} error @returns {AcpError} */
function asAcpError(error) {
  if (error instanceof AcpError) return error;
  return new AcpError(String(/** @type {any} */ (error)?.message ?? error), { kind: "http" });
}
