// Live mode: the text is streamed to the server as it is typed (the client's `stream()`:
// `append`, `flush`, `close`) and each sentence is heard as soon as it is complete; the sentence being heard is highlighted, placed by the `segment` frames'
// `offset_samples` against the playback clock. When the stream ends, what was heard stays as a
// result card (replay, WAV, captions from the segments' timings): `hooks.onFinished`.

import { StreamPlayer, audioContext } from "./audio.js";
import { $, announce, el } from "./dom.js";
import { toInt16 } from "./protocol.js";

const SEND_EVERY_MS = 200; // typed text goes out at most this often
const PAUSE_FLUSH_MS = 1200; // a pause this long speaks what is buffered
const READING_WPM = 180; // pasted text is fed in at this pace

export class LiveSession {
  // hooks: {client, nextId(), request(): {fields: {voice, reference, instruct, language,
  // options}, label} or null (it showed why), onError(msg, live), stopOthers(),
  // onFinished({chunks, sampleRate, cues, text, label, done})}
  constructor(hooks) {
    this.hooks = hooks;
    this.id = null;
    this.stream = null; // the client's TextStream while live
    this.state = "off"; // off | opening | open | closing
    this.sent = 0; // characters of the text box already sent
    this.flushed = true;
    this.sendTimer = null;
    this.pauseTimer = null;
    this.feed = null; // the rest of a paste being typed in
    this.player = null;
    this.segments = new Map(); // segment -> {start, samples, span}
    this.wpm = READING_WPM;
    this.box = $("live-text");
    this.wire();
  }

  wire() {
    $("live-start").addEventListener("click", () => this.start());
    $("live-stop").addEventListener("click", () => this.close());
    this.box.addEventListener("beforeinput", (ev) => this.guardSent(ev));
    this.box.addEventListener("input", (ev) => this.onInput(ev));
    this.box.addEventListener("paste", (ev) => {
      ev.preventDefault();
      this.paste(ev.clipboardData?.getData("text") || "");
    });
  }

  setState(state, text) {
    this.state = state;
    $("live-field").dataset.live = state;
    $("live-state").textContent = text;
    const on = state === "opening" || state === "open";
    $("live-start").hidden = on || state === "closing";
    $("live-stop").hidden = !on;
  }

  async start() {
    if (this.state !== "off") return;
    const picked = this.hooks.request();
    if (!picked) return;
    const request = picked.fields;
    this.recording = { chunks: [], words: [], sampleRate: 24000, label: picked.label };
    $("live-error").hidden = true;
    this.box.removeAttribute("aria-invalid");
    audioContext(); // inside the click: playback may start later
    this.hooks.stopOthers();
    this.id = this.hooks.nextId("live");
    this.segments.clear();
    $("live-transcript").replaceChildren();
    this.player?.stop();
    this.player = new StreamPlayer(this.id);
    this.setState("opening", "Connecting…");
    try {
      await this.hooks.client.connect();
      // Text typed before Start is spoken too: it opens the stream.
      const text = this.box.value;
      this.sent = text.length;
      this.flushed = !text.trim();
      const fields = { ...request, request_id: this.id, encoding: "pcm_s16le", progress: false, timestamps: "word" };
      if (text.trim()) fields.text = text;
      this.stream = this.listen(this.hooks.client.stream(fields));
      await this.stream.start();
    } catch {
      this.end("Could not reach the server; try again once connected.");
      return;
    }
    this.setState("open", "Listening to your typing");
    this.box.focus();
    this.schedulePause();
  }

  // Text already sent is fixed: edits that would change it are refused.
  guardSent(ev) {
    if (this.state !== "open" && this.state !== "opening") return;
    const start = this.box.selectionStart;
    const end = this.box.selectionEnd;
    const backward = ev.inputType.startsWith("delete") && ev.inputType.includes("Backward") && start === end;
    if (start < this.sent || (backward && start <= this.sent)) ev.preventDefault();
  }

  onInput(ev) {
    if (this.state !== "open") return;
    if (ev.inputType === "insertLineBreak") {
      this.flush();
      return;
    }
    if (!this.sendTimer) this.sendTimer = setTimeout(() => this.sendTyped(), SEND_EVERY_MS);
    this.schedulePause();
  }

  sendTyped() {
    clearTimeout(this.sendTimer);
    this.sendTimer = null;
    if (this.state !== "open") return;
    const piece = this.box.value.slice(this.sent);
    if (!piece) return;
    this.send(() => this.stream.append(piece));
    this.sent += piece.length;
    this.flushed = false;
  }

  schedulePause() {
    clearTimeout(this.pauseTimer);
    this.pauseTimer = setTimeout(() => this.flush(), PAUSE_FLUSH_MS);
  }

  // Speak what is buffered now (a pause, or Enter).
  flush() {
    clearTimeout(this.pauseTimer);
    this.sendTyped();
    if (this.state !== "open" || this.flushed) return;
    this.send(() => this.stream.flush());
    this.flushed = true;
  }

  // Pasted text is typed in word by word at a reading pace, as someone reading it out would.
  paste(text) {
    if (!text) return;
    if (this.state !== "open") {
      this.box.setRangeText(text, this.box.selectionStart, this.box.selectionEnd, "end");
      return;
    }
    const words = (this.feed ? this.feed.words : []).concat(text.match(/\S+\s*/g) || []);
    if (this.feed) {
      this.feed.words = words;
      return;
    }
    this.feed = { words, timer: null };
    const step = () => {
      if (!this.feed || this.state !== "open") {
        this.feed = null;
        return;
      }
      const word = this.feed.words.shift();
      this.box.setRangeText(word, this.box.value.length, this.box.value.length, "end");
      this.box.dispatchEvent(new InputEvent("input", { inputType: "insertText", data: word }));
      if (this.feed.words.length) this.feed.timer = setTimeout(step, 60000 / this.wpm);
      else this.feed = null;
    };
    step();
  }

  // No more text: what is buffered is spoken, then `done`.
  close() {
    if (this.state !== "open") return;
    if (this.feed) {
      clearTimeout(this.feed.timer);
      this.feed = null;
    }
    clearTimeout(this.pauseTimer);
    this.sendTyped();
    this.send(() => this.stream.close());
    this.setState("closing", "Speaking the rest…");
  }

  send(call) {
    try {
      call();
    } catch {
      this.end("The connection closed; the live stream ended.");
    }
  }

  // ---- from the server: the stream's events (a stream this session has left is not heard)

  listen(stream) {
    const mine = (handler) => (...args) => {
      if (this.stream === stream) handler(...args);
    };
    return stream
      .on("segment", mine((msg) => this.onSegment(msg)))
      .on("words", mine((msg) => { // the captions of the result card, word by word
        if (this.recording) for (const w of msg.words) this.recording.words.push({ text: w.text, start: w.start_samples, end: w.end_samples });
      }))
      .on("audio", mine((header, samples) => this.onAudio(header, samples)))
      .on("done", mine((msg) => {
        this.end(null, false, msg);
        announce("Live stream finished.");
      }))
      .on("cancelled", mine((msg) => this.end(null, false, { type: "done", id: msg.id })))
      .on("error", mine((msg) => {
        if (msg.code === "connection_lost") {
          this.end("The connection was lost; the live stream ended.");
          return;
        }
        this.hooks.onError(msg, this);
        this.end(msg.code === "stream_idle" ? "The stream ended after a long pause; press Start live to go on." : null, true);
      }));
  }

  onAudio(header, samples) {
    if (!this.player) return;
    const pcm = toInt16(samples);
    // Frames come in order, so the player's sample count is the stream's offset.
    const start = typeof header.offset_samples === "number" ? header.offset_samples : this.player.samples;
    if (typeof header.segment === "number") {
      const seg = this.segment(header.segment);
      seg.start = Math.min(seg.start, start);
      seg.end = Math.max(seg.end, start + pcm.length);
    }
    this.player.push(pcm, header.sample_rate || 24000);
    if (this.recording) {
      this.recording.chunks.push(pcm);
      this.recording.sampleRate = header.sample_rate || 24000;
    }
    this.follow();
  }

  onSegment(msg) {
    const seg = this.segment(msg.segment);
    seg.start = msg.offset_samples;
    seg.end = msg.offset_samples + msg.samples;
    seg.span.textContent = `${msg.text} `;
    seg.span.classList.remove("pending");
    seg.known = true;
    this.follow();
  }

  segment(k) {
    let seg = this.segments.get(k);
    if (!seg) {
      const span = el("span", { className: "live-segment pending", "data-segment": k, text: "… " });
      seg = { start: Infinity, end: 0, span, known: false };
      this.segments.set(k, seg);
      const after = [...$("live-transcript").children].find((s) => Number(s.dataset.segment) > k);
      $("live-transcript").insertBefore(span, after || null);
    }
    return seg;
  }

  // Highlight the segment whose samples are being heard, frame by frame while audio plays.
  follow() {
    if (this.raf) return;
    const tick = () => {
      this.raf = null;
      const pos = this.player?.position();
      for (const seg of this.segments.values()) {
        // Highlighted once its `segment` frame has said what it speaks.
        const now = seg.known && pos !== null && pos !== undefined && pos >= seg.start && pos < seg.end;
        seg.span.classList.toggle("speaking", now);
        if (now) seg.span.setAttribute("aria-current", "true");
        else seg.span.removeAttribute("aria-current");
        if (pos !== null && pos !== undefined && pos >= seg.end) seg.span.classList.add("heard");
      }
      if (this.player?.playing) this.raf = requestAnimationFrame(tick);
    };
    this.raf = requestAnimationFrame(tick);
  }

  // The stream is over (done, error, or the connection went).
  end(message, failed = Boolean(message), done = null) {
    this.keepResult(done || { type: "done", id: this.id });
    clearTimeout(this.sendTimer);
    clearTimeout(this.pauseTimer);
    this.sendTimer = null;
    if (this.feed) clearTimeout(this.feed.timer);
    this.feed = null;
    if (message) {
      $("live-error").textContent = message;
      $("live-error").hidden = false;
    }
    this.sent = 0;
    this.id = null;
    this.stream = null;
    this.setState("off", failed ? "Stopped" : "Finished");
  }

  // What was heard, as a finished result: its audio and the segments' text and timings.
  keepResult(done) {
    const rec = this.recording;
    this.recording = null;
    if (!rec || !rec.chunks.length) return;
    const sentences = [...this.segments.values()]
      .filter((seg) => seg.known)
      .map((seg) => ({ text: seg.span.textContent, start: seg.start, end: seg.end }));
    const text = sentences.map((c) => c.text.trim()).join(" ") || this.box.value.trim();
    // captions: word by word where the server sent timings, else sentence by sentence
    const cues = rec.words.length ? rec.words : sentences;
    this.hooks.onFinished({ ...rec, cues, segments: sentences.length, text, done });
  }
}
