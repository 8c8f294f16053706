// A waveform that fills in as chunks arrive, with the played part highlighted.

export class Waveform {
  constructor(canvas) {
    this.canvas = canvas;
    this.peaks = []; // [min, max] per block of `block` samples, in -1..1
    this.block = 240; // 10 ms at 24 kHz
    this.acc = { n: 0, lo: 1, hi: -1 };
    this.total = 0; // samples received
    this.expected = 0; // samples expected (from `accepted`), for a stable x scale
    this.playhead = null;
    this.raf = 0;
    this.resize = this.resize.bind(this);
    if (typeof ResizeObserver !== "undefined") {
      this.observer = new ResizeObserver(this.resize);
      this.observer.observe(canvas);
    }
    this.resize();
  }

  setRate(sampleRate) {
    this.block = Math.max(1, Math.round(sampleRate / 100));
  }

  expect(samples) {
    this.expected = Math.max(0, Math.round(samples));
    this.draw();
  }

  add(samples) {
    const scale = samples instanceof Int16Array ? 1 / 32768 : 1;
    let { n, lo, hi } = this.acc;
    for (let i = 0; i < samples.length; i++) {
      const v = samples[i] * scale;
      if (v < lo) lo = v;
      if (v > hi) hi = v;
      if (++n === this.block) {
        this.peaks.push([lo, hi]);
        n = 0;
        lo = 1;
        hi = -1;
      }
    }
    this.acc = { n, lo, hi };
    this.total += samples.length;
    this.draw();
  }

  finish() {
    if (this.acc.n > 0) this.peaks.push([this.acc.lo, this.acc.hi]);
    this.acc = { n: 0, lo: 1, hi: -1 };
    this.expected = this.total;
    this.draw();
  }

  resize() {
    const dpr = window.devicePixelRatio || 1;
    const w = Math.max(1, Math.round(this.canvas.clientWidth * dpr));
    const h = Math.max(1, Math.round(this.canvas.clientHeight * dpr));
    if (this.canvas.width !== w || this.canvas.height !== h) {
      this.canvas.width = w;
      this.canvas.height = h;
    }
    this.draw();
  }

  // Follow a player's position until it stops.
  follow(positionFn) {
    cancelAnimationFrame(this.raf);
    const tick = () => {
      const pos = positionFn();
      this.playhead = pos;
      this.draw();
      if (pos !== null) this.raf = requestAnimationFrame(tick);
    };
    this.raf = requestAnimationFrame(tick);
  }

  draw() {
    const c = this.canvas;
    const g = c.getContext("2d");
    if (!g) return;
    const { width: w, height: h } = c;
    const style = getComputedStyle(c);
    const base = style.getPropertyValue("--wave").trim() || "#a5a0e8";
    const played = style.getPropertyValue("--wave-played").trim() || "#4f46e5";
    const grid = style.getPropertyValue("--wave-grid").trim() || "#e5e7eb";
    g.clearRect(0, 0, w, h);
    g.fillStyle = grid;
    g.fillRect(0, Math.floor(h / 2), w, Math.max(1, Math.round(h / 72)));
    const span = Math.max(this.expected, this.total, 1) / this.block;
    if (this.peaks.length === 0) return;
    const barW = Math.max(1, w / span);
    const step = Math.max(1, Math.floor(span / w)); // peaks per pixel column
    const playedBlocks = this.playhead === null ? -1 : this.playhead / this.block;
    const mid = h / 2;
    // Scale to the loudest peak so quiet audio still shows its shape.
    if (this.scaledUpTo !== this.peaks.length) {
      let peak = 0.05;
      for (const [lo, hi] of this.peaks) peak = Math.max(peak, -lo, hi);
      this.gain = 1 / peak;
      this.scaledUpTo = this.peaks.length;
    }
    const gain = this.gain;
    for (let i = 0; i < this.peaks.length; i += step) {
      let lo = 1;
      let hi = -1;
      for (let j = i; j < Math.min(i + step, this.peaks.length); j++) {
        lo = Math.min(lo, this.peaks[j][0]);
        hi = Math.max(hi, this.peaks[j][1]);
      }
      const x = (i / span) * w;
      const top = mid - Math.max(hi * gain, 0.02) * mid * 0.92;
      const bottom = mid - Math.min(lo * gain, -0.02) * mid * 0.92;
      g.fillStyle = i < playedBlocks ? played : base;
      g.fillRect(x, top, Math.max(1, barW * step - (barW * step > 3 ? 1 : 0)), bottom - top);
    }
    if (this.playhead !== null) {
      g.fillStyle = played;
      g.fillRect((playedBlocks / span) * w, 0, Math.max(1, window.devicePixelRatio || 1), h);
    }
  }

  destroy() {
    cancelAnimationFrame(this.raf);
    this.observer?.disconnect();
  }
}
