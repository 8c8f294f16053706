// One WebSocket to /v1/stream, opened on demand, kept alive with pings, and re-established
// with backoff when it is lost. Text frames are JSON messages; binary frames are audio.

import { parseAudioFrame } from "./protocol.js";

const PING_EVERY_MS = 20000;
const PONG_TIMEOUT_MS = 10000;
const BACKOFF_MS = [500, 1000, 2000, 4000, 8000];

export class Connection {
  // urlFor(): the ws:// URL (with ?api_key= when there is a key).
  // handlers: onState(state, detail), onMessage(msg), onAudio(header, samples), onLost(reason)
  constructor(urlFor, handlers) {
    this.urlFor = urlFor;
    this.h = handlers;
    this.ws = null;
    this.ready = null; // the server's `ready` message while connected
    this.state = "idle";
    this.attempt = 0;
    this.reconnectTimer = null;
    this.reconnectAt = 0;
    this.pingTimer = null;
    this.pongDeadline = null;
    this.authFailed = false;
    this.waiters = [];
  }

  setState(state, detail = {}) {
    this.state = state;
    this.h.onState?.(state, detail);
  }

  // Resolves with the `ready` message once connected; opens the socket if needed.
  ensureOpen() {
    if (this.ready && this.ws && this.ws.readyState === WebSocket.OPEN) return Promise.resolve(this.ready);
    return new Promise((resolve, reject) => {
      this.waiters.push({ resolve, reject });
      if (!this.ws) this.connect();
    });
  }

  connect() {
    clearTimeout(this.reconnectTimer);
    this.reconnectTimer = null;
    if (this.ws) return;
    this.authFailed = false;
    this.setState(this.attempt ? "reconnecting" : "connecting", { attempt: this.attempt });
    let ws;
    try {
      ws = new WebSocket(this.urlFor());
    } catch (err) {
      this.failWaiters(err);
      this.scheduleReconnect();
      return;
    }
    ws.binaryType = "arraybuffer";
    this.ws = ws;
    ws.onmessage = (ev) => this.onFrame(ev.data);
    ws.onclose = (ev) => this.onClose(ev.code, ev.reason);
    ws.onerror = () => {}; // a close event always follows
  }

  onFrame(data) {
    if (typeof data !== "string") {
      let frame;
      try {
        frame = parseAudioFrame(data);
      } catch (err) {
        console.warn("Chorus: unreadable audio frame", err);
        return;
      }
      this.h.onAudio?.(frame.header, frame.samples);
      return;
    }
    let msg;
    try {
      msg = JSON.parse(data);
    } catch {
      console.warn("Chorus: unreadable server message");
      return;
    }
    if (msg.type === "ready") {
      this.ready = msg;
      this.attempt = 0;
      this.setState("open", { ready: msg });
      this.startHeartbeat();
      const waiters = this.waiters.splice(0);
      for (const w of waiters) w.resolve(msg);
      return;
    }
    if (msg.type === "pong") {
      clearTimeout(this.pongDeadline);
      this.pongDeadline = null;
      return;
    }
    if (msg.type === "error" && msg.code === "unauthorized") this.authFailed = true;
    this.h.onMessage?.(msg);
  }

  send(payload) {
    if (!this.ws || this.ws.readyState !== WebSocket.OPEN) throw new Error("not connected");
    this.ws.send(typeof payload === "string" ? payload : JSON.stringify(payload));
  }

  startHeartbeat() {
    clearInterval(this.pingTimer);
    this.pingTimer = setInterval(() => {
      if (!this.ws || this.ws.readyState !== WebSocket.OPEN || this.pongDeadline) return;
      try {
        this.ws.send('{"type":"ping"}');
      } catch {
        return;
      }
      this.pongDeadline = setTimeout(() => this.lose("no answer to ping"), PONG_TIMEOUT_MS);
    }, PING_EVERY_MS);
  }

  stopHeartbeat() {
    clearInterval(this.pingTimer);
    clearTimeout(this.pongDeadline);
    this.pingTimer = null;
    this.pongDeadline = null;
  }

  // Give up on the current socket at once (it may take long to close by itself).
  lose(reason) {
    const ws = this.ws;
    if (!ws) return;
    ws.onclose = ws.onmessage = null;
    try {
      ws.close(4000, reason);
    } catch {
      /* already closing */
    }
    this.onClose(1006, reason);
  }

  onClose(code, reason) {
    const wasOpen = !!this.ready;
    this.ws = null;
    this.ready = null;
    this.stopHeartbeat();
    const auth = this.authFailed || code === 1008;
    this.failWaiters(new Error(auth ? "unauthorized" : "connection failed"));
    if (wasOpen) this.h.onLost?.(reason || `connection closed (${code})`);
    if (auth) {
      this.setState("unauthorized", { code });
      return;
    }
    this.scheduleReconnect();
  }

  failWaiters(err) {
    const waiters = this.waiters.splice(0);
    for (const w of waiters) w.reject(err);
  }

  scheduleReconnect() {
    if (this.reconnectTimer) return;
    const delay = BACKOFF_MS[Math.min(this.attempt, BACKOFF_MS.length - 1)];
    this.attempt += 1;
    this.reconnectAt = Date.now() + delay;
    this.setState("lost", { delay, at: this.reconnectAt, attempt: this.attempt });
    this.reconnectTimer = setTimeout(() => {
      this.reconnectTimer = null;
      this.connect();
    }, delay);
  }

  // Reconnect right away (a button, a new API key, the browser coming back online).
  reconnectNow() {
    clearTimeout(this.reconnectTimer);
    this.reconnectTimer = null;
    if (this.ws) {
      this.ws.onclose = this.ws.onmessage = null;
      try {
        this.ws.close(1000, "reconnecting");
      } catch {
        /* ignore */
      }
      const wasOpen = !!this.ready;
      this.ws = null;
      this.ready = null;
      this.stopHeartbeat();
      if (wasOpen) this.h.onLost?.("reconnecting");
    }
    this.connect();
  }
}
