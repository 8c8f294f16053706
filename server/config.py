"""Server settings: one typed object built from the command line and the environment."""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

from server import envs


@dataclass
class EngineSettings:
    """What the engine needs to know; no web concepts here."""

    device: str = "cpu"
    dtype: str = "float32"
    max_batch_size: int = 16
    max_packed_tokens: int = 24576
    # audio one request may plan (refused up front: invalid_request), and all accepted requests
    # together (beyond it: busy); defaults documented in README.md and docs/protocol.md "Limits"
    max_audio_seconds: float | None = 1800.0
    max_audio_seconds_inflight: float | None = 14400.0
    attention: str = "auto"  # auto | torch | flashinfer
    # each device's engine in its own process: None = when there are several devices
    engine_processes: bool | None = None
    # deadline: least slack first (first chunks before chunks far ahead of playback, whole
    # files fill what is left); fifo: first come first served
    scheduling: str = "deadline"
    # deadline: while urgent chunks run, a step holds at most this many packed tokens (more only
    # when the urgent chunks alone need more): small steps are fast ones
    urgent_step_tokens: int = 2048
    # deadline: refuse (busy) a new line or stream turn when the realtime work held would need
    # twice what the engine can do (scheduling/headroom.py); off unless `--realtime-admission on`
    realtime_admission: bool = False
    # with the admission on, a new line or stream turn whose first audio the engine could not give
    # within this many ms, on the steps it would share, is refused too (scheduling/first_audio.py)
    realtime_promise_ms: float = 250.0
    # steps up to this many packed tokens replay CUDA graphs captured at start (0: none)
    graph_max_tokens: int = 8192
    quantize: str | None = None  # None (the checkpoint's dtype) | "fp8" (Hopper: projections in FP8)


@dataclass
class StreamLimits:
    """Limits of one text stream (`stream_open`); defaults in docs/protocol.md "Limits"."""

    idle_seconds: float = 30.0  # no stream_open/append/flush this long before stream_close: stream_idle
    max_buffered_chars: int = 5000  # text received and not yet sent to the engine: stream_too_long
    max_segments_inflight: int = 4  # segments synthesising at once; later ones wait (buffered)
    max_seconds: float = 900.0  # from stream_open to done: stream_too_long
    # audio the stream's segments together may plan (--max-audio-seconds): stream_too_long
    max_audio_seconds: float | None = 1800.0


@dataclass
class ServerConfig:
    model: str | None = None
    host: str = "127.0.0.1"
    port: int = 8000
    api_key: str | None = None
    api_keys_file: Path | None = None  # more keys, one a line: each key owns its kept voices
    voices_dir: Path = field(default_factory=lambda: Path("voices"))
    voices_db: str | None = None  # postgresql://... : a voice library shared by replicas
    asr_model: str | None = None
    aligner: str | None = None  # a CTC checkpoint folder: "aligned" word timestamps
    # ---- limits (defaults documented in README.md and docs/protocol.md "Limits") ----
    max_queue: int = 256  # accepted requests not yet ended, server-wide; beyond: busy / 503
    max_text_chars: int = 5000
    max_spoken_chars: int | None = None  # after the lexicon and normalisation; None: 4 x max_text_chars
    max_dialogue_lines: int = 100  # lines of one dialogue
    max_dialogue_chars: int = 20_000  # one dialogue's text, all its lines together
    max_instructions_chars: int = 4096  # `instructions` of /v1/audio/speech (free text, mapped to items)
    max_inflight_per_connection: int = 16
    max_frame_bytes: int = 16 * 1024 * 1024  # one WebSocket frame; over it: close 1009
    max_reference_bytes: int = 16 * 1024 * 1024  # one reference audio file (upload or base64)
    max_reference_seconds: float = 60.0
    max_references_bytes: int = 64 * 1024 * 1024  # one-shot references (base64) being prepared, server-wide
    max_voice_encodes: int | None = None  # reference clips encoded at once, server-wide; None: 2 per engine
    normalize_workers: int = 2  # processes running `normalize_text`'s grammars (started at first use)
    normalize_seconds: float = 30.0  # CPU seconds the workers may spend on one text
    max_pronunciations: int = 2000  # lexicon entries, all voices together
    max_voices: int = 1000  # voices in the library
    max_voices_bytes: int = 256 * 1024 * 1024  # stored voice data, all voices together
    kept_voice_ttl: float = 86400.0  # seconds a `keep_voice` voice stays usable
    max_kept_voices: int = 1000  # kept voices at most, all owners (the biggest owner's oldest make room)
    max_kept_voices_per_owner: int = 100  # one owner's kept voices (its oldest make room)
    voice_cache_seconds: float = 2.0  # a cached library voice is checked against the library this often
    idle_timeout: float = 300.0  # s without a frame or a request in flight: close (0: never)
    drain_seconds: float = 30.0  # on SIGTERM/SIGINT: time in-flight requests get to finish
    stream: StreamLimits = field(default_factory=StreamLimits)
    # ---- jobs (`POST /v1/jobs`; docs/protocol.md "Jobs") ----
    jobs_dir: Path | None = None  # SQLite jobs and their audio; None: `jobs/` in the voices folder
    job_concurrency: int = 8  # items one server speaks at once, behind interactive requests
    job_lease_seconds: float = 30.0  # a claimed item's lease (renewed while it runs)
    job_retention_hours: float = 24.0  # finished jobs and their audio are kept this long
    job_item_chars: int = 600  # a long text's items at most (and at most max_text_chars)
    max_job_items: int = 10_000
    max_job_chars: int = 500_000  # all of a job's text
    max_job_audio_seconds: float = 36_000.0  # all of a job's audio, as estimated at submission
    max_job_bytes: int = 4 * 1024 * 1024  # a `POST /v1/jobs` body
    max_active_jobs: int = 100  # jobs not yet finished, one caller's (an API key, or a client address)
    # ---- connections (server.net) ----
    max_connections: int | None = None  # open sockets; None: 4096, always below the fd limit
    max_connections_per_client: int | None = None  # one peer address; None: a quarter of max_connections
    header_timeout: float = 10.0  # s for a request's headers to arrive; beyond: 408 and close
    body_timeout: float = 60.0  # s for a request's body to arrive after its headers
    send_timeout: float = 30.0  # s a peer may take none of what is sent (also closing): then dropped
    max_bodies_bytes: int = 128 * 1024 * 1024  # request bodies held at once, server-wide; beyond: 503
    max_bodies_bytes_per_client: int | None = None  # one peer address; None: a quarter of the above
    max_outbox_bytes: int = 32 * 1024 * 1024  # frames queued for one WebSocket not yet sent
    # ---- access ----
    # WebSocket and browser Origins allowed besides the server's own; "*" allows any
    allowed_origins: tuple[str, ...] = ()
    # host names (the Host header) served besides localhost, IP addresses and --host;
    # "*.example.com" matches subdomains, "*" any (see server.api.auth: DNS rebinding)
    allowed_hosts: tuple[str, ...] = ()
    page_embeds_key: bool = False  # put the API key in the demo page (private deployments only)
    engine: EngineSettings = field(default_factory=EngineSettings)
    # set at boot: True when serving the auto-made random demo checkpoint
    demo_model: bool = False
    model_name: str = ""

    @cached_property
    def api_keys(self) -> tuple[str, ...]:
        """Every accepted key: `--api-key` and the lines of `--api-keys-file` (read at start)."""
        keys = [self.api_key] if self.api_key else []
        if self.api_keys_file is not None:
            for line in self.api_keys_file.read_text(encoding="utf-8").splitlines():
                if line.strip() and not line.lstrip().startswith("#"):
                    keys.append(line.strip())
        return tuple(keys)

    @property
    def page_api_key(self) -> str | None:
        """The key the demo page embeds: only with `page_embeds_key`."""
        return self.api_key if self.page_embeds_key and self.api_key else None

    @property
    def spoken_chars(self) -> int:
        """The text as spoken (after the lexicon and normalisation) at most."""
        return self.max_spoken_chars or 4 * self.max_text_chars

    @property
    def jobs_folder(self) -> Path:
        """Where the embedded job store keeps its index and audio (inside the voices folder by
        default, so the image's one volume holds both)."""
        return self.jobs_dir if self.jobs_dir is not None else self.voices_dir / "jobs"

    @property
    def served_hosts(self) -> tuple[str, ...]:
        """The host names the Host header may carry: `--allowed-hosts` plus the bound name."""
        return (*self.allowed_hosts, self.host.lower().strip("[]"))

    @property
    def max_body_bytes(self) -> int:
        """An HTTP request body: a reference upload plus room for its form fields."""
        return self.max_reference_bytes + 1024 * 1024

    @property
    def bodies_bytes_per_client(self) -> int:
        """One client address's share of the body budget: as set, else a quarter of it; never
        less than one largest body, nor more than the whole budget."""
        share = self.max_bodies_bytes_per_client or self.max_bodies_bytes // 4
        return min(self.max_bodies_bytes, max(share, self.max_body_bytes))

    @classmethod
    def from_env(cls) -> ServerConfig:
        cfg = cls()
        cfg.model = envs.CHORUS_MODEL
        cfg.api_key = envs.CHORUS_API_KEY
        if keys_file := envs.CHORUS_API_KEYS_FILE:
            cfg.api_keys_file = Path(keys_file)
        if voices := envs.CHORUS_VOICES_DIR:
            cfg.voices_dir = Path(voices)
        cfg.voices_db = envs.CHORUS_VOICES_DB
        if origins := envs.CHORUS_ALLOWED_ORIGINS:
            cfg.allowed_origins = parse_origins(origins)
        if hosts := envs.CHORUS_ALLOWED_HOSTS:
            cfg.allowed_hosts = parse_hosts(hosts)
        cfg.page_embeds_key = envs.CHORUS_PAGE_EMBEDS_KEY
        return cfg


def parse_origins(text: str) -> tuple[str, ...]:
    """`https://a.example, http://localhost:3000` -> normalised origins (`*`: any)."""
    return tuple(o.strip().rstrip("/").lower() for o in text.split(",") if o.strip())


def parse_hosts(text: str) -> tuple[str, ...]:
    """`api.example.com, *.internal` -> lower-case host names (`*`: any)."""
    return tuple(h.strip().lower().rstrip(".") for h in text.split(",") if h.strip())
