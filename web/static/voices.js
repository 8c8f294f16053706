// The HTTP API (/v1/voices, /v1/audio/speech), and a microphone recorder that makes WAV clips.

import { audioContext, encodeWav } from "./audio.js";
import { toInt16 } from "./protocol.js";

export class ApiError extends Error {
  // field: the request field at fault, when the server names one ("name", "text", "audio")
  constructor(status, code, message, field = null) {
    super(message);
    this.status = status;
    this.code = code;
    this.field = field;
  }
}

export async function apiError(res) {
  let code = `http_${res.status}`;
  let message = `${res.status} ${res.statusText}`.trim();
  let field = null;
  try {
    const body = await res.json();
    if (body && body.error) {
      code = body.error.code || code;
      message = body.error.message || message;
      field = typeof body.error.field === "string" ? body.error.field : null;
    } else if (body && body.detail) {
      message = String(body.detail);
    }
  } catch {
    /* not JSON */
  }
  return new ApiError(res.status, code, message, field);
}

const KEPT_STORE = "chorus.keptVoices";
const MAX_KEPT_REMEMBERED = 50;

export class VoicesApi {
  // headers(): extra request headers (the API key as a Bearer token, when there is one)
  constructor(headers) {
    this.headers = headers;
  }

  // The library as `GET /v1/voices` lists it, and the voices this browser kept (`keep_voice`):
  // a server without API keys lists kept voices to nobody (their ids are their owners' only
  // key), so the page remembers the ids it was given and asks for each; one gone (expired,
  // deleted) is forgotten.
  async list() {
    const res = await fetch("/v1/voices", { headers: this.headers(), cache: "no-store" });
    if (!res.ok) throw await apiError(res);
    const body = await res.json();
    const voices = Array.isArray(body) ? body : body.voices || body.data || [];
    const listed = new Set(voices.map((v) => v.id));
    for (const id of this.keptIds()) {
      if (listed.has(id)) continue;
      const one = await fetch(`/v1/voices/${encodeURIComponent(id)}`, { headers: this.headers(), cache: "no-store" });
      if (one.ok) voices.push(await one.json());
      else if (one.status === 404) this.forget(id);
    }
    return voices.slice().sort((a, b) => String(a.created_at || "").localeCompare(String(b.created_at || "")));
  }

  keptIds() {
    try {
      const ids = JSON.parse(localStorage.getItem(KEPT_STORE) || "[]");
      return Array.isArray(ids) ? ids.filter((id) => typeof id === "string") : [];
    } catch {
      return [];
    }
  }

  // A voice this browser kept: listed from now on, until it is gone.
  remember(id) {
    this.storeKept([...this.keptIds().filter((k) => k !== id), id].slice(-MAX_KEPT_REMEMBERED));
  }

  forget(id) {
    this.storeKept(this.keptIds().filter((k) => k !== id));
  }

  storeKept(ids) {
    try {
      localStorage.setItem(KEPT_STORE, JSON.stringify(ids));
    } catch {
      /* storage unavailable: this page's kept voices are not remembered */
    }
  }

  // `/v1/audio/speech` with a JSON body (text); resolves with the audio as a Blob.
  async speech(json) {
    const res = await fetch("/v1/audio/speech", {
      method: "POST",
      body: json,
      headers: { "Content-Type": "application/json", ...this.headers() },
    });
    if (!res.ok) throw await apiError(res);
    return res.blob();
  }

  async create({ file, filename, text, name }) {
    const form = new FormData();
    form.append("audio", file, filename || file.name || "clip.wav");
    if (text) form.append("text", text); // without one, a server with ASR transcribes the clip
    if (name) form.append("name", name);
    const res = await fetch("/v1/voices", { method: "POST", body: form, headers: this.headers() });
    if (!res.ok) throw await apiError(res);
    return res.json();
  }

  async remove(id) {
    const res = await fetch(`/v1/voices/${encodeURIComponent(id)}`, { method: "DELETE", headers: this.headers() });
    if (!res.ok && res.status !== 404) throw await apiError(res);
    this.forget(id);
  }
}

const MAX_RECORD_S = 30;
let workletLoaded = null;

// Records the microphone into a WAV blob. onLevel(rms 0..1, seconds) is called as it goes.
export class Recorder {
  constructor(onLevel) {
    this.onLevel = onLevel;
    this.blocks = [];
    this.stream = null;
    this.node = null;
    this.source = null;
    this.samples = 0;
  }

  async start() {
    if (!navigator.mediaDevices?.getUserMedia) throw new Error("This browser cannot record audio here.");
    const ctx = audioContext();
    this.rate = ctx.sampleRate;
    workletLoaded = workletLoaded || ctx.audioWorklet.addModule("/static/recorder-worklet.js");
    await workletLoaded;
    this.stream = await navigator.mediaDevices.getUserMedia({
      audio: { channelCount: 1, echoCancellation: true, noiseSuppression: true },
    });
    this.source = ctx.createMediaStreamSource(this.stream);
    this.node = new AudioWorkletNode(ctx, "chorus-recorder");
    this.mute = ctx.createGain();
    this.mute.gain.value = 0;
    this.source.connect(this.node).connect(this.mute).connect(ctx.destination);
    this.done = new Promise((resolve) => {
      this.node.port.onmessage = (ev) => {
        if (ev.data === "flushed") {
          resolve();
          return;
        }
        this.blocks.push(ev.data);
        this.samples += ev.data.length;
        let sum = 0;
        for (let i = 0; i < ev.data.length; i++) sum += ev.data[i] * ev.data[i];
        const seconds = this.samples / this.rate;
        this.onLevel?.(Math.sqrt(sum / Math.max(1, ev.data.length)), seconds);
        if (seconds >= MAX_RECORD_S) this.onLimit?.();
      };
    });
  }

  async stop() {
    if (!this.node) return null;
    this.node.port.postMessage("flush");
    await Promise.race([this.done, new Promise((r) => setTimeout(r, 500))]);
    this.source.disconnect();
    this.node.disconnect();
    this.mute.disconnect();
    for (const track of this.stream.getTracks()) track.stop();
    this.node = null;
    const all = new Float32Array(this.samples);
    let off = 0;
    for (const b of this.blocks) {
      all.set(b, off);
      off += b.length;
    }
    return { blob: encodeWav(toInt16(all), this.rate), seconds: this.samples / this.rate };
  }
}
