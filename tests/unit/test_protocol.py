"""Wire messages: every client frame parses to a typed message or an error naming its field."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings, strategies as st

from server.wire import messages as p
from server.wire.speech_body import parse_speech_request


def synth(**fields) -> str:
    return json.dumps({"type": "synthesize", "id": "r1", "text": "Hello.", **fields})


def error_of(frame: str | bytes) -> p.ProtocolError:
    with pytest.raises(p.ProtocolError) as info:
        p.parse_client_message(frame)
    return info.value


def test_full_example_from_the_protocol_parses_with_defaults():
    frame = json.dumps({
        "type": "synthesize", "id": "r1", "text": "Hello there. How are you?", "voice": None, "reference": None,
        "instruct": None, "language": None, "encoding": "pcm_s16le", "stream": "sentence", "progress": True,
        "options": {"num_step": 32, "guidance_scale": 2.0, "t_shift": 0.1, "layer_penalty_factor": 5.0,
                    "position_temperature": 5.0, "class_temperature": 0.0, "denoise": True, "speed": None,
                    "duration": None, "seed": None, "postprocess": True, "chunk_seconds": 15.0,
                    "chunk_threshold": 30.0},
    })
    msg = p.parse_client_message(frame)
    assert isinstance(msg, p.Synthesize)
    assert msg.stream_mode == "chunk" and msg.options == p.Options()
    minimal = p.parse_client_message(synth())
    assert minimal.options == p.Options() and minimal.encoding == "pcm_s16le" and minimal.progress is True
    assert p.parse_client_message(synth(stream="whole")).stream_mode == "whole"


def test_cancel_and_ping():
    assert p.parse_client_message('{"type":"cancel","id":"r1"}') == p.Cancel("r1")
    assert isinstance(p.parse_client_message('{"type":"ping"}'), p.Ping)


@pytest.mark.parametrize("frame, request_id, message", [
    ("not json", None, "not valid JSON"),
    ("[1, 2]", None, "JSON object"),
    ('{"id": "r1"}', "r1", "type: required"),
    ('{"type": "pong"}', None, "type: unknown message type 'pong'"),
    ('{"type": 3}', None, "type: unknown message type 3"),
    ('{"type": "cancle", "id": "r2"}', "r2", "type: unknown message type 'cancle' (did you mean 'cancel'?)"),
])
def test_bad_message_names_its_frame_id_when_it_had_one(frame, request_id, message):
    err = error_of(frame)
    assert (err.code, err.request_id) == ("bad_message", request_id)
    assert message in err.message


@pytest.mark.parametrize("fields, message", [
    ({"options": {"num_step": 0}}, "options.num_step: must be an integer 1..64"),
    ({"options": {"num_step": 65}}, "options.num_step: must be an integer 1..64"),
    ({"options": {"num_step": 3.5}}, "options.num_step: expected `int`, got `float`"),
    ({"options": {"guidance_scale": 10.5}}, "options.guidance_scale: must be 0..10"),
    ({"options": {"t_shift": 0}}, "options.t_shift: must be 0.001..1"),
    ({"options": {"layer_penalty_factor": -1}}, "options.layer_penalty_factor: must be 0..10000"),
    ({"options": {"position_temperature": -0.1}}, "options.position_temperature: must be 0 or 0.001..10000"),
    ({"options": {"class_temperature": -1}}, "options.class_temperature: must be 0 or 0.001..10000"),
    ({"options": {"speed": 5}}, "options.speed: must be 0.25..4"),
    ({"options": {"duration": 0}}, "options.duration: must be 0.1..36000 seconds"),
    ({"options": {"seed": 2**64}}, "options.seed: must be a 64-bit integer"),
    ({"options": {"seed": -(2**63) - 1}}, "options.seed: must be a 64-bit integer"),
    ({"options": {"chunk_seconds": 0}}, "options.chunk_seconds: must be 1..3600 seconds"),
    ({"options": {"chunk_threshold": -1}}, "options.chunk_threshold: must be 0..36000 seconds"),
    ({"options": {"denoise": "yes"}}, "options.denoise: expected `bool`, got `str`"),
    ({"options": {"num_steps": 8}}, "options.num_steps: unknown field"),
    ({"options": {"num_step": None}}, "options.num_step: must not be null"),
    ({"options": [1]}, "options: expected `object`, got `array`"),
    ({"encoding": "mp3"}, "encoding: must be one of pcm_s16le, f32le, mulaw, alaw, opus"),
    ({"sample_rate": 11025}, "sample_rate: must be one of 8000, 16000, 22050, 24000, 44100, 48000"),
    ({"encoding": "opus", "sample_rate": 44100}, "sample_rate: with opus, must be 8000, 16000, 24000, 48000"),
    ({"stream": "fast"}, "stream: must be chunk or whole"),
    ({"progress": 1}, "progress: expected `bool`, got `int`"),
    ({"speaker": "x"}, "speaker: unknown field"),
    ({"text": "   "}, "text: must not be empty"),
    ({"text": 5}, "text: expected `str`, got `int`"),
    ({"voice": "v", "reference": {"audio": "AAAA", "text": "hi"}}, "reference: voice and reference are exclusive"),
    ({"reference": {"text": "hi"}}, "reference.audio: required"),
    ({"reference": {"audio": "AAAA", "lang": "en"}}, "reference.lang: unknown field"),
])
def test_invalid_request_names_the_field(fields, message):
    err = error_of(synth(**fields))
    assert (err.code, err.request_id) == ("invalid_request", "r1")
    assert err.message.startswith(message), err.message


def test_missing_text_and_bad_ids():
    err = error_of('{"type": "synthesize", "id": "r1"}')
    assert (err.code, err.request_id, err.message) == ("invalid_request", "r1", "text: required")
    err = error_of(json.dumps({"type": "synthesize", "id": "a b", "text": "x"}))
    assert err.code == "invalid_request" and err.message.startswith("id: must be 1-64 characters")
    err = error_of(json.dumps({"type": "synthesize", "id": "x" * 65, "text": "x"}))
    assert err.message.startswith("id: ")
    err = error_of(json.dumps({"type": "synthesize", "id": 7, "text": "x"}))
    assert (err.request_id, err.message) == (None, "id: expected `str`, got `int`")
    err = error_of('{"type": "cancel"}')
    assert (err.code, err.message) == ("invalid_request", "id: required")


def test_non_finite_numbers_are_refused():
    # JSON has no NaN/Infinity literals; a huge exponent is refused as malformed JSON
    assert error_of(synth(options={}).replace("{}", '{"duration": 1e999}')).code == "bad_message"


@settings(max_examples=200, deadline=None)
@given(st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False)
                    | st.text(max_size=8),
                    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=6), children,
                                                                                        max_size=4),
                    max_leaves=12),
       st.sampled_from(["synthesize", "cancel", "ping", "nope", None]))
def test_any_json_gets_a_message_or_a_coded_error(body, kind):
    frame = {"type": kind, "value": body} if kind else body
    if isinstance(body, dict) and kind:
        frame = {**body, "type": kind}
    try:
        msg = p.parse_client_message(json.dumps(frame))
    except p.ProtocolError as exc:
        assert exc.code in p.ERROR_CODES and exc.message
        assert exc.request_id is None or isinstance(exc.request_id, str)
    else:
        assert isinstance(msg, (p.Synthesize, p.Cancel, p.Ping))


def test_server_messages_match_the_protocol_text():
    ready = json.loads(p.encode(p.Ready(model="m", sample_rate=24000,
                                        limits=p.Limits(5000, 16, max_audio_seconds=1800.0))))
    assert ready == {"type": "ready", "protocol": 1, "model": "m", "sample_rate": 24000,
                     "encodings": ["pcm_s16le", "f32le", "mulaw", "alaw", "opus"],
                     "sample_rates": [8000, 16000, 22050, 24000, 44100, 48000],
                     "limits": {"max_text_chars": 5000, "max_inflight": 16, "max_num_step": 64,
                                "max_audio_seconds": 1800.0, "max_dialogue_lines": 100,
                                "max_dialogue_chars": 20000}}
    done = json.loads(p.encode(p.Done("r1", 2, 3.2, p.Timings(1.0, 80.0, 140.0))))
    assert done == {"type": "done", "id": "r1", "chunks": 2, "audio_seconds": 3.2,
                    "timings": {"queue_ms": 1.0, "first_audio_ms": 80.0, "total_ms": 140.0}}
    assert json.loads(p.encode(p.ErrorMsg(None, "bad_message", "x"))) == {
        "type": "error", "id": None, "code": "bad_message", "message": "x"}


def test_audio_frame_layout():
    header = p.AudioHeader("r1", 0, False, 24000, "pcm_s16le", 3)
    frame = p.audio_frame(header, b"\x01\x00\x02\x00\x03\x00")
    n = int.from_bytes(frame[:4], "big")
    assert json.loads(frame[4:4 + n]) == {"type": "audio", "id": "r1", "chunk": 0, "final": False,
                                          "sample_rate": 24000, "encoding": "pcm_s16le", "samples": 3}
    assert frame[4 + n:] == b"\x01\x00\x02\x00\x03\x00"
    assert p.split_audio_frame(frame)[1] == b"\x01\x00\x02\x00\x03\x00"


def test_speech_request():
    req = parse_speech_request(b'{"model": "tts-1", "input": "Hi.", "voice": "alloy", "num_step": 8, "seed": 3}')
    assert req.response_format == "mp3" and req.options().num_step == 8 and req.options().seed == 3
    for body, message in [
        (b'{"input": ""}', "input: must not be empty"),
        (b'{"model": "x"}', "input: required"),
        (b'{"input": "x", "response_format": "ogg"}', "response_format: must be mp3, opus, aac, flac, wav or pcm"),
        (b'{"input": "x", "speed": 9}', "speed: must be 0.25..4"),
        (b'{"input": "x", "num_step": 0}', "num_step: must be an integer 1..64"),
        (b'{"input": "x", "stream_format": "events"}', "stream_format: must be audio or sse"),
        (b'{"input": "x", "voice": {"name": "v"}}', "voice.name: unknown field"),
        (b'{"input": "x", "extra": 1}', "extra: unknown field"),
        (b'{"input": "x", "seed": 99999999999999999999999}', "seed: must be a 64-bit integer"),
    ]:
        with pytest.raises(p.ProtocolError) as info:
            parse_speech_request(body)
        assert info.value.code == "invalid_request" and info.value.message.startswith(message), body
    with pytest.raises(p.ProtocolError) as info:
        parse_speech_request(b"{nope")
    assert info.value.code == "bad_message"
