// Copies microphone input to the main thread in blocks (for the voice recorder).
class ChorusRecorder extends AudioWorkletProcessor {
  constructor() {
    super();
    this.block = new Float32Array(4096);
    this.n = 0;
    this.port.onmessage = (ev) => {
      if (ev.data === "flush") {
        this.port.postMessage(this.block.slice(0, this.n));
        this.n = 0;
        this.port.postMessage("flushed");
      }
    };
  }

  process(inputs) {
    const channel = inputs[0] && inputs[0][0];
    if (channel) {
      for (let i = 0; i < channel.length; i++) {
        this.block[this.n++] = channel[i];
        if (this.n === this.block.length) {
          this.port.postMessage(this.block);
          this.block = new Float32Array(4096);
          this.n = 0;
        }
      }
    }
    return true;
  }
}

registerProcessor("chorus-recorder", ChorusRecorder);
