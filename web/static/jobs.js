// One synthesis request as a card: progress, live playback, waveform, timings, download.

import { StreamPlayer, encodeWav, stats } from "./audio.js";
import { toInt16 } from "./protocol.js";
import { Waveform } from "./waveform.js";

const STATE_TEXT = {
  connecting: "Connecting…",
  sending: "Sending…",
  queued: "Queued",
  running: "Generating",
  streaming: "Streaming",
  done: "Done",
  cancelling: "Cancelling…",
  cancelled: "Cancelled",
  error: "Failed",
};

const fmtMs = (ms) => (ms >= 1000 ? `${(ms / 1000).toFixed(2)} s` : `${Math.round(ms)} ms`);

export class Job {
  // summary: {title, meta}; hooks: {cancel(job), remove(job), announce(text)}
  constructor(id, seq, summary, hooks) {
    this.id = id;
    this.seq = seq;
    this.hooks = hooks;
    this.state = "connecting";
    this.chunks = [];
    this.samples = 0;
    this.sampleRate = 24000;
    this.expectedChunks = 0;
    this.player = null;
    this.replay = null;
    this.blobUrl = null;
    this.autoplay = true;
    this.startedAt = performance.now();
    this.firstAudioAt = null;

    const tpl = document.getElementById("job-template");
    this.el = tpl.content.firstElementChild.cloneNode(true);
    this.el.dataset.jobId = id;
    const q = (sel) => this.el.querySelector(sel);
    this.$ = {
      article: q("article"),
      title: q(".job-title"),
      state: q(".job-state"),
      meta: q(".job-meta"),
      progress: q(".progress"),
      bar: q(".progress-bar"),
      progressText: q(".job-progress-text"),
      canvas: q(".wave"),
      timings: q(".timings"),
      error: q(".job-error"),
      play: q(".job-play"),
      download: q(".job-download"),
      cancel: q(".job-cancel"),
      remove: q(".job-remove"),
    };
    this.$.title.textContent = `#${seq} · ${summary.title}`;
    this.$.title.title = summary.fullText || summary.title;
    this.$.article.setAttribute("aria-label", `Request ${seq}`);
    this.$.meta.textContent = summary.meta;
    this.$.progress.setAttribute("aria-label", `Progress of request ${seq}`);
    this.$.play.setAttribute("aria-label", `Play request ${seq}`);
    this.$.cancel.setAttribute("aria-label", `Cancel request ${seq}`);
    this.$.remove.setAttribute("aria-label", `Remove request ${seq}`);
    this.$.download.setAttribute("aria-label", `Download request ${seq} as WAV`);
    this.$.cancel.addEventListener("click", () => this.hooks.cancel(this));
    this.$.remove.addEventListener("click", () => this.hooks.remove(this));
    this.$.play.addEventListener("click", () => this.togglePlay());
    this.setState("connecting");
  }

  mount(list) {
    list.prepend(this.el);
    this.wave = new Waveform(this.$.canvas);
  }

  get active() {
    return !["done", "cancelled", "error"].includes(this.state);
  }

  setState(state) {
    this.state = state;
    this.el.dataset.state = state;
    this.el.dataset.audio = this.samples > 0 ? "yes" : "no";
    this.$.state.textContent = STATE_TEXT[state] || state;
    const ended = !this.active;
    this.$.cancel.hidden = ended;
    this.$.cancel.disabled = state === "cancelling";
    this.$.remove.hidden = !ended;
  }

  setProgress(fraction, text) {
    const pct = Math.max(0, Math.min(100, fraction * 100));
    this.$.bar.style.width = `${pct}%`;
    this.$.progress.setAttribute("aria-valuenow", String(Math.round(pct)));
    this.el.dataset.progress = pct.toFixed(1);
    if (text !== undefined) this.$.progressText.textContent = text;
  }

  onAccepted(msg) {
    this.expectedChunks = msg.chunks || 0;
    if (Array.isArray(msg.target_seconds)) {
      const seconds = msg.target_seconds.reduce((a, b) => a + b, 0);
      this.wave.expect(seconds * this.sampleRate);
    }
    if (this.state === "sending" || this.state === "connecting") this.setState("queued");
    const n = this.expectedChunks;
    this.$.progressText.textContent = n > 1 ? `Queued · ${n} chunks` : "Queued";
  }

  onProgress(msg) {
    if (this.state === "queued" || this.state === "sending") this.setState("running");
    const n = this.expectedChunks;
    const chunkText = n > 1 ? `chunk ${msg.chunk + 1} of ${n} · ` : "";
    this.setProgress(msg.fraction ?? 0, `${chunkText}step ${msg.step} of ${msg.num_steps}`);
  }

  onAudio(header, samples) {
    if (!this.active) return;
    if (header.sample_rate && header.sample_rate !== this.sampleRate) {
      this.sampleRate = header.sample_rate;
      this.wave.setRate(this.sampleRate);
    }
    const pcm = toInt16(samples);
    this.chunks.push(pcm);
    this.samples += pcm.length;
    if (this.firstAudioAt === null) {
      this.firstAudioAt = performance.now();
      this.hooks.announce(`Request ${this.seq}: audio is playing.`);
    }
    if (this.state !== "cancelling") this.setState("streaming");
    this.wave.add(pcm);
    if (this.autoplay) {
      if (!this.player) {
        this.player = new StreamPlayer(this.id);
        this.player.onIdle = () => this.updatePlayButton();
      }
      this.player.push(pcm, this.sampleRate);
      this.wave.follow(() => this.player.position());
    }
    this.updatePlayButton();
  }

  onDone(msg) {
    this.setState("done");
    this.setProgress(1, `${msg.chunks ?? this.chunks.length} chunk${(msg.chunks ?? this.chunks.length) === 1 ? "" : "s"} · ${(this.samples / this.sampleRate).toFixed(2)} s of audio`);
    this.wave.finish();
    const t = msg.timings || {};
    const audioS = msg.audio_seconds ?? this.samples / this.sampleRate;
    const rows = [
      ["Audio", `${audioS.toFixed(2)} s`],
      ["First audio", t.first_audio_ms != null ? fmtMs(t.first_audio_ms) : "–"],
      ["Queue", t.queue_ms != null ? fmtMs(t.queue_ms) : "–"],
      ["Total", t.total_ms != null ? fmtMs(t.total_ms) : "–"],
      ["RTF", t.total_ms != null && audioS > 0 ? `${(t.total_ms / 1000 / audioS).toFixed(3)}` : "–"],
    ];
    this.$.timings.replaceChildren(
      ...rows.map(([k, v]) => {
        const div = document.createElement("div");
        const dt = document.createElement("dt");
        const dd = document.createElement("dd");
        dt.textContent = k;
        if (k === "RTF") dt.title = "Real-time factor: compute time over audio length (below 1 is faster than real time)";
        dd.textContent = v;
        dd.dataset.timing = k.toLowerCase().replace(/[^a-z]+/g, "_");
        div.append(dt, dd);
        return div;
      }),
    );
    this.$.timings.hidden = false;
    this.makeDownload();
    this.updatePlayButton();
    this.hooks.announce(`Request ${this.seq} done: ${audioS.toFixed(1)} seconds of audio.`);
  }

  onCancelled() {
    this.setState("cancelled");
    this.$.progressText.textContent = this.samples
      ? `Cancelled after ${(this.samples / this.sampleRate).toFixed(2)} s of audio`
      : "Cancelled before any audio";
    this.wave.finish();
    if (this.samples > 0) this.makeDownload();
    this.updatePlayButton();
    this.hooks.announce(`Request ${this.seq} cancelled.`);
  }

  // What arrived before the failure keeps playing and can still be downloaded.
  onError(message) {
    this.setState("error");
    this.$.error.textContent = message;
    this.$.error.hidden = false;
    this.$.progressText.textContent = this.samples
      ? `Stopped after ${(this.samples / this.sampleRate).toFixed(2)} s of audio`
      : "";
    this.wave.finish();
    if (this.samples > 0) this.makeDownload();
    this.updatePlayButton();
  }

  makeDownload() {
    if (this.samples === 0) return;
    const all = new Int16Array(this.samples);
    let off = 0;
    for (const c of this.chunks) {
      all.set(c, off);
      off += c.length;
    }
    this.pcm = all;
    if (this.blobUrl) URL.revokeObjectURL(this.blobUrl);
    this.blobUrl = URL.createObjectURL(encodeWav(all, this.sampleRate));
    this.$.download.href = this.blobUrl;
    this.$.download.download = `chorus-${this.seq}-${this.id}.wav`;
    this.$.download.hidden = false;
  }

  currentPlayer() {
    if (this.replay && this.replay.playing) return this.replay;
    if (this.player && this.player.playing) return this.player;
    return null;
  }

  updatePlayButton() {
    const playing = this.currentPlayer();
    const b = this.$.play;
    b.disabled = !playing && (this.samples === 0 || this.active);
    b.textContent = playing ? "Stop" : "Play";
    b.setAttribute("aria-label", `${playing ? "Stop" : "Play"} request ${this.seq}`);
    b.setAttribute("aria-pressed", playing ? "true" : "false");
  }

  togglePlay() {
    const playing = this.currentPlayer();
    if (playing) {
      playing.stop();
      if (playing === this.player) this.autoplay = false;
      this.wave.playhead = null;
      this.wave.draw();
      this.updatePlayButton();
      return;
    }
    if (this.active || !this.pcm) return;
    this.replay = new StreamPlayer(`${this.id}:replay`);
    this.replay.onIdle = () => {
      this.updatePlayButton();
    };
    this.replay.push(this.pcm, this.sampleRate);
    this.wave.follow(() => this.replay.position());
    this.updatePlayButton();
  }

  dispose() {
    this.player?.stop();
    this.replay?.stop();
    this.wave?.destroy();
    if (this.blobUrl) URL.revokeObjectURL(this.blobUrl);
    delete stats.byJob[this.id];
    this.el.remove();
  }
}
