// The Chorus wire protocol (version 1), as the page speaks it: request frames as JSON text
// (64-bit seeds exact) and binary audio frames. client.js speaks it; the page's modules use
// the client.

export const PROTOCOL_VERSION = 1;

export const ID_RE = /^[A-Za-z0-9_.-]{1,64}$/;

// Count characters as the server does (Unicode code points, like Python's len()).
export function charCount(text) {
  let n = 0;
  for (const _ of text) n++;
  return n;
}

// JSON text in which a `seed` given as digits is written as a number: seeds may be 64-bit
// integers, which JavaScript numbers cannot hold exactly, so their digits go in verbatim.
export function exactJson(value) {
  const json = JSON.stringify(value, (key, v) =>
    key === "seed" && typeof v === "string" && /^-?\d+$/.test(v) ? `\u0000${v}\u0000` : v,
  );
  return json.replace(/"\\u0000(-?\d+)\\u0000"/g, "$1");
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
