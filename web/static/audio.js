// Web Audio playback: chunks are scheduled back to back on one AudioContext, so a stream
// plays gaplessly from its first chunk. Also WAV encoding for downloads and recordings.

import { toFloat32 } from "./protocol.js";

// Scheduling lead for the first chunk (and after an underrun), in seconds.
const LEAD_S = 0.06;

// What the audio graph has been given; read by the browser tests.
export const stats = { samplesScheduled: 0, chunks: 0, byJob: {} };
window.chorusAudioStats = stats;

let context = null;

// The shared AudioContext; call it first from a user gesture so that it may start.
export function audioContext() {
  if (!context) {
    const Ctx = window.AudioContext || window.webkitAudioContext;
    context = new Ctx({ latencyHint: "interactive" });
  }
  if (context.state === "suspended") context.resume().catch(() => {});
  return context;
}

export class StreamPlayer {
  constructor(jobId) {
    this.jobId = jobId;
    this.ctx = audioContext();
    this.gain = this.ctx.createGain();
    this.gain.connect(this.ctx.destination);
    this.nextTime = 0;
    this.sources = new Set();
    this.segments = []; // {t0, first, n, rate}: sample `first` plays at context time t0
    this.stopped = false;
    this.samples = 0;
    stats.byJob[jobId] = stats.byJob[jobId] || { samples: 0, chunks: 0 };
  }

  // Schedule one chunk right after the previous one.
  push(samples, sampleRate) {
    if (this.stopped || samples.length === 0) return;
    const data = toFloat32(samples);
    const buffer = this.ctx.createBuffer(1, data.length, sampleRate);
    buffer.copyToChannel(data, 0);
    const source = this.ctx.createBufferSource();
    source.buffer = buffer;
    source.connect(this.gain);
    const t0 = Math.max(this.nextTime, this.ctx.currentTime + LEAD_S);
    source.start(t0);
    source.onended = () => {
      this.sources.delete(source);
      if (this.sources.size === 0) this.onIdle?.();
    };
    this.sources.add(source);
    this.segments.push({ t0, first: this.samples, n: data.length, rate: sampleRate });
    this.samples += data.length;
    this.nextTime = t0 + buffer.duration;
    stats.samplesScheduled += data.length;
    stats.chunks += 1;
    stats.byJob[this.jobId].samples += data.length;
    stats.byJob[this.jobId].chunks += 1;
  }

  // The sample now being heard, or null when nothing is playing.
  position() {
    if (this.stopped || this.sources.size === 0) return null;
    const now = this.ctx.currentTime;
    let pos = 0;
    for (const s of this.segments) {
      if (now < s.t0) break;
      pos = s.first + Math.min(s.n, Math.floor((now - s.t0) * s.rate));
    }
    return pos;
  }

  get playing() {
    return !this.stopped && this.sources.size > 0;
  }

  stop() {
    this.stopped = true;
    for (const s of this.sources) {
      s.onended = null;
      try {
        s.stop();
      } catch {
        /* not started */
      }
    }
    this.sources.clear();
    this.gain.disconnect();
    this.onIdle?.();
  }
}

// A 16-bit PCM mono WAV file.
export function encodeWav(int16, sampleRate) {
  const bytes = int16.length * 2;
  const buf = new ArrayBuffer(44 + bytes);
  const v = new DataView(buf);
  const ascii = (off, s) => {
    for (let i = 0; i < s.length; i++) v.setUint8(off + i, s.charCodeAt(i));
  };
  ascii(0, "RIFF");
  v.setUint32(4, 36 + bytes, true);
  ascii(8, "WAVE");
  ascii(12, "fmt ");
  v.setUint32(16, 16, true);
  v.setUint16(20, 1, true); // PCM
  v.setUint16(22, 1, true); // mono
  v.setUint32(24, sampleRate, true);
  v.setUint32(28, sampleRate * 2, true);
  v.setUint16(32, 2, true);
  v.setUint16(34, 16, true);
  ascii(36, "data");
  v.setUint32(40, bytes, true);
  new Int16Array(buf, 44).set(int16);
  return new Blob([buf], { type: "audio/wav" });
}
