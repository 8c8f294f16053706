// The page's Chorus client, with the Python client's names (`chorus_client`, docs/clients.md):
// `client.synthesize(text, fields)`, `client.stream(fields)` (`append`, `flush`, `close`,
// `cancel`) and `client.dialogue(lines, fields)`, `client.connect()` resolving with the
// server's `ready`. A request's events are named after the protocol's frames: `accepted`,
// `progress`, `audio` (header, samples), `words`, `segment`, `line` (a dialogue's, before each
// line's audio), `done`, `cancelled`, `error`; a connection lost under a request is an
// `error` whose code is `connection_lost`, as the Python client's `ConnectionLostError`.
// Unlike the Python client, audio already on the wire after `cancel()` is still handed over:
// the page shows how much a cancelled request made.

import { Connection } from "./connection.js";
import { exactJson } from "./protocol.js";

const ENDS = new Set(["done", "cancelled", "error"]);

// An error of the client's own (could not connect, could not send), coded as the protocol's.
export class ChorusError extends Error {
  constructor(code, message, requestId = null) {
    super(message);
    this.code = code;
    this.request_id = requestId;
  }
}

class Request {
  constructor(client, frame) {
    this.client = client;
    this.frame = frame; // the request frame, as sent
    this.id = frame.id;
    this.handlers = {};
    this.sent = false;
    this.ended = false;
  }

  // One handler per event; returns the request, so handlers chain.
  on(event, handler) {
    this.handlers[event] = handler;
    return this;
  }

  emit(event, ...args) {
    this.handlers[event]?.(...args);
  }

  // Send the request, opening the connection first if needed. Rejects with a `ChorusError`
  // (`unauthorized`, `connection_lost`) when it cannot; a request cancelled meanwhile is not sent.
  async start() {
    if (this.sent || this.ended) return;
    await this.client.connect();
    if (this.sent || this.ended) return;
    this.client.requests.set(this.id, this);
    try {
      this.client.send(this.frame);
    } catch (err) {
      this.finish();
      throw err;
    }
    this.sent = true;
  }

  // Stop the request: the server ends it at its next step with `cancelled`. False when there
  // is nothing to stop on the server (never sent, already over, or the connection is gone).
  cancel() {
    if (this.ended) return false;
    if (!this.sent) {
      this.ended = true;
      return false;
    }
    try {
      this.client.send({ type: "cancel", id: this.id });
      return true;
    } catch {
      this.finish();
      return false;
    }
  }

  finish() {
    this.ended = true;
    if (this.client.requests.get(this.id) === this) this.client.requests.delete(this.id);
  }
}

// One `synthesize` request.
export class Synthesis extends Request {}

// A script of several speakers (`dialogue`): a `line` event before each line's audio, whose
// frames carry `line` (-1: the pause after a line) and `offset_samples`; then `done`.
export class Dialogue extends Request {}

// Text streamed in (`stream_open`): `append()` text as it is written, `flush()` to speak what
// is buffered now, `close()` when no more text comes, `cancel()` to stop. Each throws a
// `ChorusError` (`connection_lost`) when the socket is gone; after the stream ended they do
// nothing.
export class TextStream extends Request {
  constructor(client, frame) {
    super(client, frame);
    this.inputClosed = false;
  }

  append(text) {
    this.sendOwn({ type: "stream_append", id: this.id, text });
  }

  flush() {
    this.sendOwn({ type: "stream_flush", id: this.id });
  }

  close() {
    if (this.inputClosed) return;
    this.inputClosed = true;
    this.sendOwn({ type: "stream_close", id: this.id });
  }

  sendOwn(frame) {
    if (this.ended || !this.sent) return;
    this.client.send(frame);
  }
}

export class ChorusClient {
  // urlFor(): the WebSocket URL (with ?api_key= when there is a key). handlers:
  // onState(state, detail) as the connection opens, is lost, reconnects; onError(msg) for an
  // error frame no request of this client owns.
  constructor(urlFor, { onState, onError } = {}) {
    this.requests = new Map(); // id -> Request in flight
    this.onError = onError;
    this.seq = 0; // ids for requests given none
    this.connection = new Connection(urlFor, {
      onState,
      onMessage: (msg) => this.route(msg),
      onAudio: (header, samples) => this.requests.get(header.id)?.emit("audio", header, samples),
      onLost: (reason) => this.lost(reason),
    });
  }

  // The server's `ready` while connected, else null.
  get ready() {
    return this.connection.ready;
  }

  get state() {
    return this.connection.state;
  }

  // Open the WebSocket now (otherwise the first request does); resolves with `ready`.
  async connect() {
    try {
      return await this.connection.ensureOpen();
    } catch (err) {
      const code = err.message === "unauthorized" ? "unauthorized" : "connection_lost";
      throw new ChorusError(code, code === "unauthorized" ? "the server refused the API key" : err.message);
    }
  }

  // Drop the current socket (if any) and connect again at once.
  reconnectNow() {
    this.connection.reconnectNow();
  }

  // One utterance; `fields` are the protocol's (`voice`, `options`, ...), `request_id` its id.
  synthesize(text, { request_id, ...fields } = {}) {
    return new Synthesis(this, { type: "synthesize", id: request_id ?? `r${++this.seq}`, text, ...fields });
  }

  // A text stream; `fields` as `synthesize`'s, `text` the text it opens with.
  stream({ request_id, ...fields } = {}) {
    return new TextStream(this, { type: "stream_open", id: request_id ?? `s${++this.seq}`, ...fields });
  }

  // A dialogue: `lines` of `{voice, text, instruct?, options?}`; `fields` the dialogue's
  // (`pause_ms`, `language`, `options`, `timestamps`, `progress`, `encoding`), `request_id` its id.
  dialogue(lines, { request_id, ...fields } = {}) {
    return new Dialogue(this, { type: "dialogue", id: request_id ?? `d${++this.seq}`, lines, ...fields });
  }

  send(frame) {
    try {
      this.connection.send(exactJson(frame));
    } catch (err) {
      throw new ChorusError("connection_lost", err.message, frame.id ?? null);
    }
  }

  route(msg) {
    const request = msg.id != null ? this.requests.get(msg.id) : undefined;
    if (!request) {
      if (msg.type === "error") this.onError?.(msg);
      return; // a frame of a request already over, or a newer type
    }
    if (ENDS.has(msg.type)) request.finish();
    request.emit(msg.type, msg);
  }

  // The socket closed under the requests in flight: each ends with `connection_lost`.
  lost(reason) {
    const requests = [...this.requests.values()];
    this.requests.clear();
    for (const request of requests) {
      request.ended = true;
      request.emit("error", { type: "error", id: request.id, code: "connection_lost", message: reason });
    }
  }
}
