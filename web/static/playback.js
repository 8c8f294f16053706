// Which result is heard: by default one at a time, in the order their audio arrives. A
// result whose audio comes while another plays waits its turn; "play now" jumps the queue.

export class PlaybackQueue {
  constructor() {
    this.current = null; // the job being heard
    this.waiting = []; // jobs with audio, in turn order
    this.oneAtATime = true;
  }

  // A job's first audio has arrived: play it now or queue it.
  offer(job) {
    if (!this.oneAtATime) {
      job.startPlayback();
      return;
    }
    if (this.current && this.current !== job && this.current.isPlaying()) {
      if (!this.waiting.includes(job)) this.waiting.push(job);
      this.refresh();
      return;
    }
    this.begin(job);
  }

  // Play this job from its start, stopping whatever plays (the queue keeps its order).
  playNow(job) {
    if (this.oneAtATime && this.current && this.current !== job) this.current.stopPlayback();
    this.waiting = this.waiting.filter((j) => j !== job);
    this.begin(job);
  }

  // Stop this job's playback (a press on Stop); the next in line follows.
  stop(job) {
    job.stopPlayback();
    this.waiting = this.waiting.filter((j) => j !== job);
    if (this.current === job) this.advance();
    else this.refresh();
  }

  // A job's audio has all been heard (called by the job).
  ended(job) {
    if (this.current === job) this.advance();
  }

  // The job is going away (removed from the list).
  forget(job) {
    this.waiting = this.waiting.filter((j) => j !== job);
    if (this.current === job) {
      job.stopPlayback();
      this.advance();
    } else {
      this.refresh();
    }
  }

  // Stop everything (live mode takes the speakers); nothing waiting is lost.
  pause() {
    if (this.current) {
      this.current.stopPlayback();
      this.current = null;
    }
    this.refresh();
  }

  begin(job) {
    this.current = job;
    job.startPlayback();
    this.refresh();
  }

  advance() {
    this.current = null;
    const next = this.waiting.shift();
    if (next) this.begin(next);
    else this.refresh();
  }

  refresh() {
    this.waiting.forEach((job, i) => job.setQueued(i + 1));
    this.current?.setQueued(0);
  }
}
