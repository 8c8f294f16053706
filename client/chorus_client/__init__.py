"""Python client for the Chorus text-to-speech server: `ChorusClient` (WebSocket streaming,
dialogues, the voice library and long-form jobs), typed events and errors. Framework plugins live in
`chorus_client.pipecat` and `chorus_client.livekit` (extras `pipecat`, `livekit`)."""

from .client import ChorusClient, split_url
from .errors import (
    BadMessageError,
    BadResponseError,
    BufferFullError,
    BusyError,
    ChorusError,
    ConflictError,
    ConnectionLostError,
    DuplicateIdError,
    HandshakeError,
    InternalError,
    InvalidRequestError,
    ProtocolError,
    RequestTimeoutError,
    StreamIdleError,
    StreamTooLongError,
    TextTooLongError,
    TooManyRequestsError,
    UnauthorizedError,
    VoiceNotFoundError,
)
from .events import Accepted, AudioChunk, Cancelled, Done, Event, Line, Progress, Ready, Segment, Words, WordTiming
from .jobs import (
    ItemNotReadyError,
    Job,
    JobArchive,
    JobAudio,
    JobFailedError,
    JobItem,
    JobItemState,
    JobNotFoundError,
    JobsAPI,
)
from .requests import Dialogue, Result, Synthesis, TextStream
from .retry import BusyRetry
from .voices import Voice
from .wire import DialogueLine, Reference, SynthesisOptions

__version__ = "0.1.0"

__all__ = [
    "Accepted", "AudioChunk", "BadMessageError", "BadResponseError", "BufferFullError", "BusyError", "BusyRetry",
    "Cancelled", "ChorusClient", "ChorusError", "ConflictError", "ConnectionLostError", "Dialogue", "DialogueLine",
    "Done", "DuplicateIdError", "Event", "HandshakeError", "InternalError", "InvalidRequestError", "ItemNotReadyError",
    "Job", "JobArchive", "JobAudio", "JobFailedError", "JobItem", "JobItemState", "JobNotFoundError", "JobsAPI",
    "Line", "Progress", "ProtocolError", "Ready",
    "Reference", "RequestTimeoutError", "Result", "Segment", "StreamIdleError", "StreamTooLongError", "Synthesis",
    "SynthesisOptions", "TextStream", "TextTooLongError", "TooManyRequestsError", "UnauthorizedError", "Voice",
    "VoiceNotFoundError", "WordTiming", "Words", "split_url",
]
