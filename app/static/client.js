/**
 * The reference client of the auth-rt service, for pages served from the service's own origin.
 * No dependencies; an ES module.
 *
 * Tokens: they live only in HttpOnly cookies. This script never sees a token and stores nothing in
 * localStorage or sessionStorage. On a 401 it refreshes once (POST /auth/refresh sends the refresh
 * cookie) and retries the request once. Refreshes are serialised across tabs with the Web Locks API,
 * and a tab that waited for the lock first asks whether another tab already refreshed (the cookies
 * are shared), so two tabs never present the same refresh token.
 *
 * Events: EventFeed follows the user's channels by server-sent events, WebSocket, long polling or
 * polling, always resuming from the last cursor, so switching transports or reconnecting loses
 * nothing. EventSource gives up on any non-200 answer (an expired access token, say), so it is
 * recreated after a refresh; WebSocket reconnects with back-off; long polling pauses a fixed
 * interval after a time-out. A stream that ends because the session ended leads to a session check,
 * and so to `onLoggedOut` when the session is gone.
 */

const REFRESH_LOCK = "auth-rt-refresh";
const LONG_POLL_SECONDS = 20;
const LONG_POLL_PAUSE_MS = 500;
const POLL_INTERVAL_MS = 1000;
const BACKOFF_START_MS = 250;
const BACKOFF_CAP_MS = 5000;

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

export class Client {
  constructor({ onLoggedOut = () => {} } = {}) {
    this.onLoggedOut = onLoggedOut;
    this.refreshing = null;
    this.signedIn = false;
  }

  /** fetch() with the session cookies; on a 401, one refresh and one retry. */
  async request(path, { method = "GET", body, signal } = {}) {
    const init = { method, credentials: "same-origin", headers: {}, signal };
    if (body !== undefined) {
      init.headers["Content-Type"] = "application/json";
      init.body = JSON.stringify(body);
    }
    let response = await fetch(path, init);
    if (response.status === 401 && !path.startsWith("/auth/login")) {
      if (await this.refresh()) response = await fetch(path, init);
      if (response.status === 401) this.loggedOut();
    }
    return response;
  }

  /** Resolves true when the session is valid again. One refresh at a time across every tab. */
  refresh() {
    if (!this.refreshing) {
      this.refreshing = navigator.locks
        .request(REFRESH_LOCK, async () => {
          const check = await fetch("/auth/me", { credentials: "same-origin" });
          if (check.ok) return true; // another tab refreshed while this one waited
          const response = await fetch("/auth/refresh", { method: "POST", credentials: "same-origin" });
          return response.ok;
        })
        .finally(() => {
          this.refreshing = null;
        });
    }
    return this.refreshing;
  }

  loggedIn() {
    this.signedIn = true;
  }

  loggedOut() {
    if (this.signedIn) {
      this.signedIn = false;
      this.onLoggedOut();
    }
  }
}

export class EventFeed {
  /**
   * @param {Client} client
   * @param {{onEvent: (event: object) => void, onState: (text: string) => void, names?: string[]}} options
   * `names`: event names to receive over SSE (EventSource only delivers names it listens for);
   * `listen(name)` adds more. The other transports deliver every event.
   */
  constructor(client, { onEvent, onState, names = ["message", "note", "notice", "announce", "reset"] }) {
    this.client = client;
    this.onEvent = onEvent;
    this.onState = onState;
    this.names = new Set(names);
    this.cursor = null;
    this.generation = 0;
    this.transport = null;
  }

  listen(name) {
    if (this.names.has(name)) return;
    this.names.add(name);
    if (this.source) this.source.addEventListener(name, this.deliverSse);
  }

  start(transport) {
    this.stop();
    this.transport = transport;
    const generation = ++this.generation;
    this.attempts = 0;
    this.open(generation);
  }

  stop() {
    this.generation++;
    this.source?.close();
    this.source = null;
    if (this.socket) {
      this.socket.onclose = null;
      this.socket.close(1000);
      this.socket = null;
    }
    this.abort?.abort();
    this.abort = null;
  }

  live(generation) {
    return generation === this.generation;
  }

  open(generation) {
    const run = { sse: this.openSse, websocket: this.openWebSocket, "long-poll": this.longPoll, poll: this.poll };
    run[this.transport].call(this, generation);
  }

  deliver(event, cursor) {
    if (cursor) this.cursor = cursor;
    this.onEvent(event);
  }

  /** After a stream ended: check the session (refreshing if need be), then reopen, or stop. */
  async recover(generation, delay = 0) {
    if (delay) await sleep(delay);
    if (!this.live(generation)) return;
    const response = await this.client.request("/auth/me");
    if (response.ok && this.live(generation)) this.open(generation);
  }

  backoff() {
    this.attempts = (this.attempts || 0) + 1;
    return Math.min(BACKOFF_CAP_MS, BACKOFF_START_MS * 2 ** (this.attempts - 1));
  }

  query(extra = {}) {
    const params = new URLSearchParams(extra);
    if (this.cursor) params.set("cursor", this.cursor);
    const text = params.toString();
    return text ? `?${text}` : "";
  }

  openSse(generation) {
    const source = new EventSource(`/events/stream${this.query()}`);
    this.source = source;
    this.deliverSse = (message) => this.deliver(JSON.parse(message.data), message.lastEventId);
    for (const name of this.names) source.addEventListener(name, this.deliverSse);
    source.onopen = () => {
      this.attempts = 0;
      this.onState("Connected by server-sent events.");
    };
    source.addEventListener("session_ended", () => {
      source.close();
      this.onState("Stream ended; checking the session…");
      this.recover(generation);
    });
    source.onerror = () => {
      // CONNECTING: the browser reconnects by itself (with Last-Event-ID). CLOSED: it gave up, for
      // example on a 401 after the access token expired: refresh, then make a new EventSource.
      if (source.readyState === EventSource.CLOSED && this.live(generation)) this.recover(generation, this.backoff());
    };
  }

  openWebSocket(generation) {
    const scheme = location.protocol === "https:" ? "wss:" : "ws:";
    const socket = new WebSocket(`${scheme}//${location.host}/ws${this.query()}`);
    this.socket = socket;
    socket.onmessage = (message) => {
      const frame = JSON.parse(message.data);
      if (frame.type === "welcome") {
        this.attempts = 0;
        this.cursor ??= frame.cursor;
        this.onState("Connected by WebSocket.");
      } else if (frame.type === "event") {
        this.deliver(frame, frame.cursor);
      }
    };
    socket.onclose = (close) => {
      if (!this.live(generation)) return;
      this.onState(`WebSocket closed (${close.code}); reconnecting…`);
      // 1008: the token expired or the session ended; 1006: the handshake may have been refused (401).
      this.recover(generation, close.code === 1008 ? 0 : this.backoff());
    };
  }

  async longPoll(generation) {
    this.onState("Connected by long polling.");
    while (this.live(generation)) {
      this.abort = new AbortController();
      let response;
      try {
        response = await this.client.request(`/events/wait${this.query({ timeout: LONG_POLL_SECONDS })}`, {
          signal: this.abort.signal,
        });
      } catch {
        await sleep(this.backoff());
        continue;
      }
      if (!this.live(generation) || !this.client.signedIn) return;
      if (response.status === 200) {
        const body = await response.json();
        for (const event of body.events) this.deliver(event);
        this.cursor = body.cursor;
      } else if (response.status === 204) {
        this.cursor = response.headers.get("Event-Cursor") || this.cursor;
        await sleep(LONG_POLL_PAUSE_MS); // the fixed interval after a time-out
      } else {
        await sleep(this.backoff());
      }
    }
  }

  async poll(generation) {
    this.onState("Connected by polling.");
    while (this.live(generation)) {
      try {
        const response = await this.client.request(`/events${this.query()}`);
        if (!this.live(generation) || !this.client.signedIn) return;
        if (response.status === 200) {
          const body = await response.json();
          for (const event of body.events) this.deliver(event);
          this.cursor = body.cursor;
          continue; // more may be waiting
        }
        if (response.status === 204) this.cursor = response.headers.get("Event-Cursor") || this.cursor;
      } catch {
        // network trouble: try again at the next interval
      }
      await sleep(POLL_INTERVAL_MS);
    }
  }
}
