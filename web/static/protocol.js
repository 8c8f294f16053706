// The Chorus wire protocol (version 1), as the page speaks it: request building,
// binary audio frames, and which control a server error belongs to.

export const PROTOCOL_VERSION = 1;

// Defaults and ranges of every option come from the server's one options table, in the
// page's boot JSON (`options`); here only how the page shows each one.
const TABLE = (() => {
  try {
    return JSON.parse(document.getElementById("chorus-boot").textContent).options || {};
  } catch {
    return {};
  }
})();
const fromTable = (k) => {
  const t = TABLE[k.name] || {};
  return { ...k, def: t.default ?? null, min: t.min ?? undefined, max: t.max ?? undefined, range: t.range };
};

// `kind`: int | float | bool | seed; `nullable` options are sent only when set.
export const KNOBS = [
  { name: "num_step", label: "Diffusion steps", kind: "int", step: 1, help: "More steps: better audio, slower." },
  { name: "guidance_scale", label: "Guidance scale", kind: "float", step: 0.1, help: "Classifier-free guidance strength." },
  { name: "t_shift", label: "Time shift (t_shift)", kind: "float", step: 0.01, help: "Shifts the unmasking schedule." },
  { name: "layer_penalty_factor", label: "Layer penalty", kind: "float", step: 0.5,
    help: "Favours unmasking lower codebook layers first." },
  { name: "position_temperature", label: "Position temperature", kind: "float", step: 0.5,
    help: "Randomness of which positions unmask." },
  { name: "class_temperature", label: "Token temperature", kind: "float", step: 0.1,
    help: "0 picks the most likely token (deterministic)." },
  { name: "seed", label: "Seed", kind: "seed", nullable: true, help: "Blank: a new random seed each time." },
  { name: "chunk_seconds", label: "Chunk length (s)", kind: "float", step: 1,
    help: "Target audio length of each streamed text chunk." },
  { name: "chunk_threshold", label: "Chunking threshold (s)", kind: "float", step: 1,
    help: "Text estimated longer than this is split; 0 always splits." },
  { name: "denoise", label: "Denoise", kind: "bool", help: "Ask the model for clean audio." },
  { name: "postprocess", label: "Post-process", kind: "bool", help: "Trim silences and normalise loudness." },
].map(fromTable);

// Pacing: natural, a speed factor, or a fixed duration (sent as `speed` or `duration`).
export const PACING = {
  speed: { ...fromTable({ name: "speed", label: "Speed", step: 0.05 }), def: 1.0 },
  duration: { ...fromTable({ name: "duration", label: "Duration (s)", step: 0.1 }), def: 5.0 },
};

export const ID_RE = /^[A-Za-z0-9_.-]{1,64}$/;

// Count characters as the server does (Unicode code points, like Python's len()).
export function charCount(text) {
  let n = 0;
  for (const _ of text) n++;
  return n;
}

// JSON for a `synthesize` frame. `seed` may be a 64-bit integer, which JSON numbers in
// JavaScript cannot hold exactly, so its digits are spliced into the JSON text verbatim.
export function synthesizeFrame(request) {
  const options = { ...(request.options || {}) };
  let seedDigits = null;
  if (typeof options.seed === "string" && /^-?\d+$/.test(options.seed)) {
    seedDigits = options.seed;
    options.seed = "\u0000seed\u0000";
  }
  let json = JSON.stringify({ type: "synthesize", ...request, options });
  if (seedDigits !== null) json = json.replace('"\\u0000seed\\u0000"', seedDigits);
  return json;
}

// A binary audio frame: 4-byte big-endian header length N, N bytes of JSON, the samples.
export function parseAudioFrame(buffer) {
  if (buffer.byteLength < 4) throw new Error("audio frame too short");
  const n = new DataView(buffer).getUint32(0, false);
  if (4 + n > buffer.byteLength) throw new Error("audio frame header overruns the frame");
  const header = JSON.parse(new TextDecoder().decode(new Uint8Array(buffer, 4, n)));
  const body = buffer.slice(4 + n); // copy: typed arrays need aligned offsets
  let samples;
  if (header.encoding === "f32le") {
    samples = new Float32Array(body, 0, Math.floor(body.byteLength / 4));
  } else {
    samples = new Int16Array(body, 0, Math.floor(body.byteLength / 2));
  }
  return { header, samples };
}

export function toFloat32(samples) {
  if (samples instanceof Float32Array) return samples;
  const out = new Float32Array(samples.length);
  for (let i = 0; i < samples.length; i++) out[i] = samples[i] / 32768;
  return out;
}

export function toInt16(samples) {
  if (samples instanceof Int16Array) return samples;
  const out = new Int16Array(samples.length);
  for (let i = 0; i < samples.length; i++) {
    const v = Math.max(-1, Math.min(1, samples[i]));
    out[i] = v < 0 ? Math.round(v * 32768) : Math.round(v * 32767);
  }
  return out;
}

// Which control a server error is about: a knob name, or one of
// "text", "voice", "instruct", "language", "form" (the Generate button); null when no
// control caused it (the engine failed), so it shows on the request's card alone.
export function errorTarget(error) {
  const code = error.code || "";
  const message = String(error.message || "");
  if (code === "internal") return null;
  if (code === "text_too_long") return "text";
  if (code === "voice_not_found") return "voice";
  if (code === "too_many_requests" || code === "busy" || code === "bad_message" || code === "duplicate_id") {
    return "form";
  }
  const knobNames = new Set([...KNOBS.map((k) => k.name), "speed", "duration"]);
  let m = /options\.([a-z_]+)/.exec(message);
  if (m && knobNames.has(m[1])) return m[1];
  m = /^\s*([a-z_]+)\b/.exec(message);
  if (m) {
    const field = m[1];
    if (field === "text") return "text";
    if (field === "voice" || field === "reference") return "voice";
    if (field === "instruct") return "instruct";
    if (field === "language") return "language";
    if (knobNames.has(field)) return field;
  }
  if (/instruct/i.test(message)) return "instruct";
  if (/language/i.test(message)) return "language";
  if (/\bvoice\b|reference/i.test(message)) return "voice";
  return "form";
}
