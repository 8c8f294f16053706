"""Server frames only a stream sends (text streamed in): where each segment's audio lies."""

from __future__ import annotations

from msgspec import Struct

from server.wire.messages import AudioHeader, ProgressMsg


class StreamProgressMsg(ProgressMsg, tag="progress", tag_field="type"):
    """Progress of one segment of a stream (`chunk`, `fraction`: within that segment)."""

    segment: int


class StreamAudioHeader(AudioHeader, tag="audio", tag_field="type", kw_only=True):
    """A stream's audio: which segment, and where its first sample sits in the stream's audio."""

    segment: int
    offset_samples: int


class SegmentMsg(Struct, tag="segment", tag_field="type"):
    """After a segment's last audio frame: the text it spoke and where its audio lies."""

    id: str
    segment: int
    text: str
    offset_samples: int
    samples: int
