// The Dialogue tab: a script of lines, each with a voice (`GET /v1/voices`: built-in and yours)
// and its text, sent as one `dialogue` request (the client's `dialogue()`). Its result is a card
// in Results like any other (`DialogueJob`, a `Job`: the same player, waveform, WAV and
// captions), which also lists the lines and marks the one being heard, placed by the audio
// frames' `line` and `offset_samples` against the playback clock.

import { $, announce, el } from "./dom.js";
import { Job } from "./jobs.js";
import { fillVoicePicker } from "./library.js";
import { charCount } from "./protocol.js";

const DEFAULT_MAX_LINES = 100; // the server's --max-dialogue-lines default, when it does not say
const STARTER = [
  { voice: "alloy", text: "Welcome back to the show. Today we are talking about streaming speech." },
  { voice: "echo", text: "Thanks for having me! It is good to be here." },
];
const LINE_ERROR = /^lines\[(\d+)\](?:\.(.+))?$/;

// ------------------------------------------------------------------------------------ the card

export class DialogueJob extends Job {
  // lines: [{voice, label, text}] as sent (label: the voice's name as the picker shows it)
  constructor(id, seq, summary, hooks, lines) {
    super(id, seq, summary, hooks);
    this.el.dataset.kind = "dialogue";
    this.lineCount = lines.length;
    this.current = -1; // the line whose `line` frame came last (progress frames are its)
    this.speaking = null;
    this.raf = null;
    // where each line's audio sits in the dialogue's (samples), from its frames
    this.spans = lines.map(() => ({ start: Infinity, end: 0 }));
    this.$.article.setAttribute("aria-label", `Dialogue ${seq}`);
    this.$.progress.setAttribute("aria-label", `Progress of dialogue ${seq}`);
    this.script = el("ol", { className: "dialogue-script", "aria-label": `The lines of dialogue ${seq}` },
      ...lines.map((line, k) => el("li", { className: "script-line pending", "data-line": k },
        el("span", { className: "script-voice", text: line.label }),
        el("span", { className: "script-text", text: line.text }))));
    this.$.meta.after(this.script);
    this.el.dataset.speaking = "none";
  }

  lineEl(k) {
    return this.script.children[k] || null;
  }

  // `line`: line `k` starts here; its progress and audio follow.
  onLine(msg) {
    if (!this.active) return;
    this.current = msg.line;
    const span = this.spans[msg.line];
    if (span) span.start = Math.min(span.start, msg.offset_samples);
    this.lineEl(msg.line)?.classList.remove("pending");
    if (this.state === "sending" || this.state === "queued" || this.state === "connecting") this.setState("running");
    this.setProgress(this.current / this.lineCount, this.progressText());
  }

  // A dialogue's progress frames are its current line's (they come after its `line` frame).
  onProgress(msg) {
    if (this.state === "queued" || this.state === "sending") this.setState("running");
    this.lastStep = msg;
    const line = Math.max(0, this.current);
    this.setProgress((line + (msg.fraction ?? 0)) / this.lineCount, this.progressText());
  }

  progressText() {
    const pct = `${Math.round(this.fraction * 100)}%`;
    if (this.current < 0) return pct;
    return `${pct} · line ${this.current + 1} of ${this.lineCount}`;
  }

  onAudio(header, samples) {
    if (!this.active) return;
    const k = header.line;
    const span = typeof k === "number" && k >= 0 ? this.spans[k] : null;
    if (span && samples.length) {
      const start = typeof header.offset_samples === "number" ? header.offset_samples : this.samples;
      span.start = Math.min(span.start, start);
      span.end = Math.max(span.end, start + samples.length);
    }
    super.onAudio(header, samples);
  }

  onDone(msg) {
    super.onDone(msg);
    const seconds = (this.samples / this.sampleRate).toFixed(2);
    this.$.progressText.textContent = `${this.lineCount} line${this.lineCount === 1 ? "" : "s"} · ${seconds} s of audio`;
  }

  // ---- which line is heard: the player's position against the lines' spans

  feedPlayer() {
    super.feedPlayer();
    this.followLines();
  }

  startPlayback() {
    super.startPlayback();
    this.followLines();
  }

  stopPlayback() {
    super.stopPlayback();
    this.markSpeaking(null);
  }

  followLines() {
    if (this.raf) return;
    const tick = () => {
      this.raf = null;
      const pos = this.player && !this.player.stopped ? this.player.position() : null;
      let now = null;
      if (pos !== null && pos !== undefined) {
        now = this.spans.findIndex((s) => pos >= s.start && pos < s.end);
        if (now < 0) now = null; // a pause
        for (let k = 0; k < this.spans.length; k++) {
          if (pos >= this.spans[k].end && this.spans[k].end > 0) this.lineEl(k)?.classList.add("heard");
        }
      }
      this.markSpeaking(now);
      if (this.player && !this.player.stopped && (this.player.playing || this.active)) this.raf = requestAnimationFrame(tick);
    };
    this.raf = requestAnimationFrame(tick);
  }

  markSpeaking(k) {
    if (k === this.speaking) return;
    if (this.speaking !== null) {
      const before = this.lineEl(this.speaking);
      before?.classList.remove("speaking");
      before?.removeAttribute("aria-current");
    }
    this.speaking = k;
    this.el.dataset.speaking = k === null ? "none" : String(k);
    if (k !== null) {
      const now = this.lineEl(k);
      now?.classList.add("speaking");
      now?.setAttribute("aria-current", "true");
      now?.classList.remove("heard");
    }
  }

  dispose() {
    if (this.raf) cancelAnimationFrame(this.raf);
    super.dispose();
  }
}

// ------------------------------------------------------------------------------------ the form

export class DialoguePanel {
  // hooks: {limits(): the server's limits, start(lines, fields, summary): sends the dialogue and
  // makes its card (returns the card)}
  constructor(hooks) {
    this.hooks = hooks;
    this.voices = []; // from GET /v1/voices: [{id, name, builtin}]
    this.uid = 0;
    this.list = $("dialogue-lines");
    $("dialogue-add").addEventListener("click", () => this.addLine(this.nextVoice(), "", { focus: true }));
    $("dialogue-form").addEventListener("submit", (ev) => {
      ev.preventDefault();
      this.play();
    });
    for (const id of ["dialogue-pause", "dialogue-steps", "dialogue-language"]) {
      $(id).addEventListener("input", () => this.clearError(id));
    }
    for (const line of STARTER) this.addLine(line.voice, line.text);
    this.update();
  }

  get lines() {
    return [...this.list.children];
  }

  maxLines() {
    return this.hooks.limits().max_dialogue_lines || DEFAULT_MAX_LINES;
  }

  // The script's text together (--max-dialogue-chars; each line is held to --max-text-chars).
  maxChars() {
    return this.hooks.limits().max_dialogue_chars || this.hooks.limits().max_text_chars;
  }

  // The voice list changed (the library loaded, a voice was added or deleted).
  setVoices(voices) {
    this.voices = voices;
    for (const li of this.lines) fillVoicePicker(li.querySelector("select"), voices);
  }

  // A new line speaks in the voice of the line two above it (two speakers take turns).
  nextVoice() {
    const lines = this.lines;
    const pick = lines.length >= 2 ? lines[lines.length - 2] : lines[lines.length - 1];
    return pick ? pick.querySelector("select").dataset.want ?? "" : "";
  }

  addLine(voice, text, { focus = false } = {}) {
    if (this.lines.length >= this.maxLines()) return;
    const uid = ++this.uid;
    const select = el("select", { id: `dialogue-voice-${uid}`, className: "dialogue-voice",
                                  "aria-describedby": `dialogue-line-error-${uid}` });
    select.dataset.want = voice || "";
    select.addEventListener("change", () => {
      select.dataset.want = select.value;
      this.clearLineError(li);
    });
    const textarea = el("textarea", { id: `dialogue-text-${uid}`, className: "dialogue-text", rows: 2,
                                      placeholder: "What this speaker says…",
                                      "aria-describedby": `dialogue-line-error-${uid}` });
    textarea.value = text;
    textarea.addEventListener("input", () => {
      this.clearLineError(li);
      this.update();
    });
    textarea.addEventListener("keydown", (ev) => {
      if (ev.key === "Enter" && (ev.ctrlKey || ev.metaKey)) {
        ev.preventDefault();
        $("dialogue-form").requestSubmit();
      }
    });
    const remove = el("button", { type: "button", className: "icon-button danger-quiet dialogue-remove", title: "Remove" });
    remove.innerHTML = '<svg viewBox="0 0 24 24" aria-hidden="true" focusable="false"><path d="M6.4 5 5 6.4 10.6 12 5 17.6 6.4 19l5.6-5.6 5.6 5.6 1.4-1.4-5.6-5.6L19 6.4 17.6 5 12 10.6z"/></svg>';
    remove.addEventListener("click", () => this.removeLine(li));
    const li = el("li", { className: "dialogue-line", "data-uid": uid },
      el("div", { className: "dialogue-line-head" },
        el("span", { className: "dialogue-line-n", "aria-hidden": "true" }),
        el("label", { className: "visually-hidden dialogue-voice-label", for: select.id }),
        select,
        remove),
      el("label", { className: "visually-hidden dialogue-text-label", for: textarea.id }),
      textarea,
      el("p", { className: "field-error", id: `dialogue-line-error-${uid}`, hidden: true }));
    fillVoicePicker(select, this.voices);
    this.list.append(li);
    this.update();
    if (focus) textarea.focus();
  }

  removeLine(li) {
    if (this.lines.length <= 1) return;
    const next = li.nextElementSibling || li.previousElementSibling;
    li.remove();
    this.update();
    next?.querySelector("textarea")?.focus();
    announce("Line removed.");
  }

  // Numbers, labels, the remove buttons and the character count, after any change.
  update() {
    const lines = this.lines;
    lines.forEach((li, k) => {
      li.querySelector(".dialogue-line-n").textContent = String(k + 1);
      li.querySelector(".dialogue-voice-label").textContent = `Voice of line ${k + 1}`;
      li.querySelector(".dialogue-text-label").textContent = `Text of line ${k + 1}`;
      const remove = li.querySelector(".dialogue-remove");
      remove.disabled = lines.length <= 1;
      remove.setAttribute("aria-label", `Remove line ${k + 1}`);
    });
    $("dialogue-add").disabled = lines.length >= this.maxLines();
    const n = lines.reduce((sum, li) => sum + charCount(li.querySelector("textarea").value), 0);
    const max = this.maxChars();
    const count = $("dialogue-count");
    count.textContent = `${n.toLocaleString()} / ${max.toLocaleString()}`;
    count.classList.toggle("over", n > max);
    count.classList.toggle("near", n <= max && n > max * 0.9);
  }

  // ---- errors beside their controls

  showLineError(li, message, control = "text") {
    const error = li.querySelector(".field-error");
    error.textContent = message;
    error.hidden = false;
    li.querySelector(control === "voice" ? "select" : "textarea").setAttribute("aria-invalid", "true");
  }

  clearLineError(li) {
    const error = li.querySelector(".field-error");
    error.hidden = true;
    error.textContent = "";
    for (const c of li.querySelectorAll("select, textarea")) c.removeAttribute("aria-invalid");
  }

  showError(id, message) {
    const error = $(`${id}-error`);
    error.textContent = message;
    error.hidden = false;
    if (id !== "dialogue") $(id).setAttribute("aria-invalid", "true");
  }

  clearError(id) {
    $(`${id}-error`).hidden = true;
    $(id).removeAttribute("aria-invalid");
  }

  clearAll() {
    for (const li of this.lines) this.clearLineError(li);
    for (const id of ["dialogue-pause", "dialogue-steps", "dialogue-language"]) this.clearError(id);
    $("dialogue-error").hidden = true;
  }

  // A server error: beside the line (`lines[K].text`), setting (`pause_ms`) or the button.
  serverError(msg) {
    const field = typeof msg.field === "string" ? msg.field : "";
    const text = msg.message || msg.code || "The server reported an error.";
    const m = LINE_ERROR.exec(field) || /^line (\d+):/.exec(msg.message || "");
    const li = m ? this.lines[Number(m[1])] : null;
    if (li) {
      this.showLineError(li, text, (m[2] || "").startsWith("voice") ? "voice" : "text");
      return;
    }
    if ((!field || field === "voice") && msg.code === "voice_not_found") { // the line's voice, by its name
      const name = /'([^']+)'/.exec(text)?.[1];
      const bad = this.lines.find((l) => l.querySelector("select").value === name);
      if (bad) {
        this.showLineError(bad, text, "voice");
        return;
      }
    }
    const byField = { pause_ms: "dialogue-pause", language: "dialogue-language", "options.num_step": "dialogue-steps" };
    this.showError(byField[field] || "dialogue", text);
  }

  // ---- play

  play() {
    this.clearAll();
    const lines = [];
    let firstBad = null;
    for (const [k, li] of this.lines.entries()) {
      const text = li.querySelector("textarea").value;
      const select = li.querySelector("select");
      if (!text.trim()) {
        this.showLineError(li, `Line ${k + 1} has nothing to say: type its text or remove it.`);
        firstBad = firstBad || li.querySelector("textarea");
        continue;
      }
      const voice = select.value || null;
      const label = voice ? select.options[select.selectedIndex].text : "Automatic voice";
      lines.push({ voice, text, label });
    }
    if (firstBad) {
      firstBad.focus();
      return null;
    }
    const max = this.maxChars();
    const n = lines.reduce((sum, l) => sum + charCount(l.text), 0);
    if (n > max) {
      this.showError("dialogue", `The lines have ${n.toLocaleString()} characters together; this server takes at most ${max.toLocaleString()}.`);
      return null;
    }
    const fields = { pause_ms: 300, progress: true, timestamps: "word", encoding: "pcm_s16le" };
    const pause = $("dialogue-pause").value.trim();
    if (pause !== "") {
      const ms = Number(pause);
      if (!Number.isInteger(ms) || ms < 0 || ms > 10000) {
        this.showError("dialogue-pause", "A whole number of milliseconds, 0 to 10000.");
        $("dialogue-pause").focus();
        return null;
      }
      fields.pause_ms = ms;
    }
    const steps = $("dialogue-steps").value.trim();
    if (steps !== "") {
      const num = Number(steps);
      const most = this.hooks.limits().max_num_step || 64;
      if (!Number.isInteger(num) || num < 1 || num > most) {
        this.showError("dialogue-steps", `A whole number of steps, 1 to ${most}.`);
        $("dialogue-steps").focus();
        return null;
      }
      fields.options = { num_step: num };
    }
    const lang = $("dialogue-language");
    if (lang.value) fields.language = lang.value;
    const voices = [...new Set(lines.map((l) => l.label))];
    const summary = {
      title: `Dialogue · ${lines[0].text.trim().replace(/\s+/g, " ").slice(0, 70)}${lines[0].text.length > 70 ? "…" : ""}`,
      fullText: lines.map((l) => `${l.label}: ${l.text}`).join("\n"),
      meta: [`${lines.length} line${lines.length === 1 ? "" : "s"}`, voices.join(", "), `pause ${fields.pause_ms} ms`,
             lang.value ? lang.options[lang.selectedIndex].text : "auto language",
             ...(fields.options ? [`num_step ${fields.options.num_step}`] : [])].join(" · "),
    };
    return this.hooks.start(lines, fields, summary);
  }
}
