// One synthesis request as a card: progress, playback (through the page's playback queue),
// waveform, timings, downloads.

import { StreamPlayer, encodeWav, stats } from "./audio.js";
import { cueList, toVtt } from "./captions.js";
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
const ordinal = (n) => (n === 1 ? "next" : `${n}th in line`.replace(/^2th/, "2nd").replace(/^3th/, "3rd"));

export class Job {
  // summary: {title, fullText, meta}; hooks: {cancel(job), remove(job), announce(text),
  // queue: PlaybackQueue, downloadMp3(job), useVoice(voiceId)}
  constructor(id, seq, summary, hooks) {
    this.id = id;
    this.seq = seq;
    this.hooks = hooks;
    this.state = "connecting";
    this.chunks = [];
    this.samples = 0;
    this.sampleRate = 24000;
    this.expectedChunks = 0;
    this.fraction = 0;
    this.player = null; // the playback now going (or last gone)
    this.plays = 0; // how many times playback started: the first is `id`, later ones `id:replay`
    this.pushed = 0; // chunks given to the current player
    this.blobUrl = null;
    this.firstAudioAt = null;
    this.mp3 = false; // whether the server can make this request again as MP3 over HTTP
    this.cues = []; // captions: {text, start, end} in samples (words, or a stream's segments)
    this.captionsUrl = null;

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
      queue: q(".job-queue"),
      download: q(".job-download"),
      captions: q(".job-captions"),
      cueBox: q(".job-cues"),
      mp3: q(".job-mp3"),
      cancel: q(".job-cancel"),
      kept: q(".job-kept"),
      remove: q(".job-remove"),
    };
    this.$.title.textContent = `#${seq} · ${summary.title}`;
    this.$.title.title = summary.fullText || summary.title;
    this.$.article.setAttribute("aria-label", `Request ${seq}`);
    this.$.meta.textContent = summary.meta;
    this.$.progress.setAttribute("aria-label", `Progress of request ${seq}`);
    this.$.cancel.setAttribute("aria-label", `Cancel request ${seq}`);
    this.$.remove.setAttribute("aria-label", `Remove request ${seq}`);
    this.$.download.setAttribute("aria-label", `Download request ${seq} as WAV`);
    this.$.mp3.setAttribute("aria-label", `Download request ${seq} as MP3`);
    this.$.cancel.addEventListener("click", () => this.hooks.cancel(this));
    this.$.remove.addEventListener("click", () => this.hooks.remove(this));
    this.$.play.addEventListener("click", () => this.onPlayButton());
    this.$.mp3.addEventListener("click", () => this.hooks.downloadMp3(this));
    this.setState("connecting");
    this.updatePlayButton();
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
    this.fraction = Math.max(this.fraction, Math.min(1, fraction)); // steps only ever add up
    const pct = this.fraction * 100;
    this.$.bar.style.width = `${pct}%`;
    this.$.progress.setAttribute("aria-valuenow", String(Math.round(pct)));
    this.el.dataset.progress = pct.toFixed(1);
    if (text !== undefined) this.$.progressText.textContent = text;
  }

  // The label says where the whole request stands: the share of all its steps done, and
  // how many of its chunks are ready (not whichever chunk reported last).
  progressText() {
    const pct = `${Math.round(this.fraction * 100)}%`;
    const n = this.expectedChunks;
    if (n > 1) return `${pct} · ${this.chunks.length} of ${n} chunks ready`;
    return this.lastStep ? `${pct} · step ${this.lastStep.step} of ${this.lastStep.num_steps}` : pct; // one chunk: its step is the request's
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
    this.lastStep = msg;
    this.fraction = Math.max(this.fraction, msg.fraction ?? 0);
    this.setProgress(this.fraction, this.progressText());
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
    if (this.state !== "cancelling") this.setState("streaming");
    this.wave.add(pcm);
    if (this.expectedChunks > 1) this.setProgress(this.fraction, this.progressText());
    if (this.firstAudioAt === null) {
      this.firstAudioAt = performance.now();
      this.hooks.queue.offer(this);
    } else if (this.player && !this.player.stopped) {
      this.feedPlayer();
    }
    this.updatePlayButton();
  }

  // A chunk's words (`timestamps: "word"`): the captions.
  onWords(msg) {
    for (const w of msg.words || []) this.cues.push({ text: w.text, start: w.start_samples, end: w.end_samples });
  }

  onDone(msg) {
    this.setState("done");
    const chunks = msg.chunks ?? this.chunks.length;
    this.setProgress(1, `${chunks} chunk${chunks === 1 ? "" : "s"} · ${(this.samples / this.sampleRate).toFixed(2)} s of audio`);
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
    if (msg.voice_id) {  // `keep_voice`: this result's speaker, kept by the server
      this.$.kept.querySelector(".job-kept-id").textContent = msg.voice_id;
      this.$.kept.querySelector(".job-use-voice").onclick = () => this.hooks.useVoice(msg.voice_id);
      this.$.kept.hidden = false;
    }
    this.finishAudio();
    this.hooks.announce(`Request ${this.seq} done: ${audioS.toFixed(1)} seconds of audio.`);
  }

  onCancelled() {
    this.setState("cancelled");
    this.$.progressText.textContent = this.samples
      ? `Cancelled after ${(this.samples / this.sampleRate).toFixed(2)} s of audio`
      : "Cancelled before any audio";
    this.finishAudio();
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
    this.finishAudio();
  }

  // No more audio will come: downloads appear; a playback already over hands on its turn.
  finishAudio() {
    this.wave.finish();
    this.makeDownload();
    this.updatePlayButton();
    if (this.player && !this.player.playing && this.pushed === this.chunks.length) this.hooks.queue.ended(this);
  }

  showError(message) {
    this.$.error.textContent = message;
    this.$.error.hidden = false;
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
    this.$.mp3.hidden = this.state !== "done" || !this.mp3; // the server makes it again from the request
    this.makeCaptions();
  }

  // Captions, when the result has timings (word timestamps, or a stream's segments).
  makeCaptions() {
    if (!this.cues.length) return;
    const cues = [...this.cues].sort((a, b) => a.start - b.start);
    if (this.captionsUrl) URL.revokeObjectURL(this.captionsUrl);
    this.captionsUrl = URL.createObjectURL(toVtt(cues, this.sampleRate));
    this.$.captions.href = this.captionsUrl;
    this.$.captions.download = `chorus-${this.seq}-${this.id}.vtt`;
    this.$.captions.setAttribute("aria-label", `Download the captions of request ${this.seq} (WebVTT)`);
    this.$.captions.hidden = false;
    this.$.cueBox.querySelector("ol")?.remove();
    this.$.cueBox.append(cueList(cues, this.sampleRate));
    this.$.cueBox.hidden = false;
  }

  // A result recorded elsewhere (a live stream): its audio, captions and end, as one finished card.
  fromRecording(chunks, sampleRate, cues, done) {
    this.sampleRate = sampleRate;
    this.wave.setRate(sampleRate);
    for (const pcm of chunks) {
      this.chunks.push(pcm);
      this.samples += pcm.length;
      this.wave.add(pcm);
    }
    this.cues = cues;
    this.firstAudioAt = performance.now();
    this.onDone(done);
  }

  // ---- playback (started and stopped by the PlaybackQueue)

  isPlaying() {
    return Boolean(this.player && !this.player.stopped && (this.player.playing || this.active));
  }

  startPlayback() {
    if (this.player) {
      this.player.onIdle = null;
      this.player.stop();
    }
    this.plays += 1;
    this.player = new StreamPlayer(this.plays === 1 ? this.id : `${this.id}:replay`);
    this.player.onIdle = () => this.onPlayerIdle();
    this.pushed = 0;
    if (!this.active && this.pcm) {
      this.player.push(this.pcm, this.sampleRate); // finished: all of it as one buffer
      this.pushed = this.chunks.length;
    } else {
      this.feedPlayer();
    }
    this.wave.follow(() => this.player?.position() ?? null);
    this.setQueued(0);
    if (this.plays === 1) this.hooks.announce(`Request ${this.seq}: audio is playing.`);
  }

  feedPlayer() {
    while (this.pushed < this.chunks.length) this.player.push(this.chunks[this.pushed++], this.sampleRate);
  }

  stopPlayback() {
    if (this.player && !this.player.stopped) {
      this.player.onIdle = null;
      this.player.stop();
    }
    this.wave.playhead = null;
    this.wave.draw();
    this.updatePlayButton();
  }

  onPlayerIdle() {
    this.updatePlayButton();
    // Idle between chunks of a request still streaming is an underrun, not the end.
    if (!this.active && this.pushed === this.chunks.length) this.hooks.queue.ended(this);
  }

  // 0: not waiting; N: N-th in line to be played.
  setQueued(n) {
    this.queuePos = n;
    this.el.dataset.playback = n > 0 ? "queued" : this.isPlaying() ? "playing" : "";
    this.$.queue.hidden = n === 0;
    this.$.queue.textContent = n > 0 ? `Plays ${ordinal(n)}` : "";
    this.updatePlayButton();
  }

  onPlayButton() {
    if (this.isPlaying()) this.hooks.queue.stop(this);
    else this.hooks.queue.playNow(this);
  }

  updatePlayButton() {
    const playing = this.isPlaying();
    const b = this.$.play;
    if (!this.queuePos) this.el.dataset.playback = playing ? "playing" : "";
    b.disabled = !playing && this.samples === 0;
    const word = playing ? "Stop" : this.queuePos ? "Play now" : "Play";
    b.textContent = word;
    b.setAttribute("aria-label", `${word} request ${this.seq}`);
    b.setAttribute("aria-pressed", playing ? "true" : "false");
  }

  dispose() {
    this.hooks.queue.forget(this);
    this.player?.stop();
    this.wave?.destroy();
    if (this.blobUrl) URL.revokeObjectURL(this.blobUrl);
    if (this.captionsUrl) URL.revokeObjectURL(this.captionsUrl);
    delete stats.byJob[this.id];
    delete stats.byJob[`${this.id}:replay`];
    this.el.remove();
  }
}
