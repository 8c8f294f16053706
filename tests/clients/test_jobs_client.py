"""`client.jobs` against a real `chorus serve` (tiny checkpoint, CPU): items, one long text and a
JSONL batch each submitted, followed to the end (progress callbacks, `watch()`), their items and
zip downloaded and read back (stdlib `wave` and `zipfile`); cancel; a job that fails; the
server's refusals and the client's own checks as typed errors."""

from __future__ import annotations

import asyncio
import io
import json
import wave
import zipfile

import httpx
import pytest
from chorus_client import (
    BadMessageError,
    ChorusClient,
    ChorusError,
    InvalidRequestError,
    ItemNotReadyError,
    Job,
    JobFailedError,
    JobItem,
    JobNotFoundError,
    RequestTimeoutError,
    SynthesisOptions,
    VoiceNotFoundError,
)
from chorus_client.jobs import job_path

from tests.clients.conftest import speech_like_wav

FAST = SynthesisOptions(num_step=4, seed=9)
CHAPTER = ("The rain had not stopped for three days. Mara watched it from the window of the old station. "
           "She counted the trains that did not come.\n\n"
           "On the fourth morning the sky cleared. She packed her bag and walked down to the platform, "
           "where a single carriage was waiting.")


def run(coro):
    return asyncio.run(coro)


def wav_frames(data: bytes) -> tuple[int, int]:
    with wave.open(io.BytesIO(data)) as w:
        return w.getnframes(), w.getframerate()


def long_job_items(n: int = 40) -> list[JobItem]:
    """Enough work at the full step count to be still running a moment after submission."""
    return [JobItem(f"Item {k}. " + CHAPTER, voice="alloy") for k in range(n)]


def test_items_run_to_the_end_with_progress_and_download(chorus_url, tmp_path):
    async def go():
        async with ChorusClient(chorus_url) as client:
            job = await client.jobs.submit([JobItem("First item.", voice="alloy", options=FAST),
                                            {"input": "Second item.", "voice": "echo", "num_step": 4},
                                            JobItem("Third item, as flac.", voice="alloy", response_format="flac",
                                                    options=FAST)],
                                           response_format="wav")
            seen: list[Job] = []
            done = await client.jobs.wait(job.id, poll_s=0.2, on_progress=seen.append)
            first = await client.jobs.item(job.id, 0)
            third = await client.jobs.item(job.id, 2)
            archive = await client.jobs.archive(job.id, tmp_path / "all.zip")
            listed = await client.jobs.items(job.id)
            page = await client.jobs.items(job.id, offset=2, limit=5)
            return job, seen, done, first, third, archive, listed, page

    job, seen, done, first, third, archive, listed, page = run(go())
    assert [(s.n, s.status, s.ready, s.format) for s in listed] == [(0, "done", True, "wav"), (1, "done", True, "wav"),
                                                                 (2, "done", True, "flac")]
    assert listed[0].audio_seconds == pytest.approx(first.seconds, abs=0.01)
    assert [s.n for s in page] == [2]
    assert job.id.startswith("job-") and job.status == "queued" and not job.finished
    assert done.status == "completed" and done.finished and done.items_done == done.items_total == 3
    assert done.fraction == 1.0 and done.eta_seconds == 0 and done.audio_seconds > 0
    # each change once, items done never going back, the last one the end
    assert seen[-1] == done and [s.items_done for s in seen] == sorted(s.items_done for s in seen)
    frames, rate = wav_frames(first.data)
    assert first.media_type == "audio/wav" and first.filename == "0000.wav" and rate == 24000
    assert first.seconds == pytest.approx(frames / rate, abs=0.05)
    assert third.media_type == "audio/flac" and third.data[:4] == b"fLaC"  # its own format over the job's
    assert archive.items == archive.items_total == 3 and archive.path.stat().st_size == archive.bytes
    with zipfile.ZipFile(archive.path) as z:
        assert z.namelist() == ["0000.wav", "0001.wav", "0002.flac"]
        assert z.read("0000.wav") == first.data
    assert not (tmp_path / "all.zip.part").exists()


def test_one_long_text_is_cut_into_items_and_watched(chorus_url):
    async def go():
        async with ChorusClient(chorus_url) as client:
            job = await client.jobs.submit_text(CHAPTER, response_format="wav", options=FAST)
            snapshots = [s async for s in client.jobs.watch(job.id, poll_s=0.2)]
            return snapshots

    snapshots = run(go())
    end = snapshots[-1]
    assert end.status == "completed" and end.items_total >= 2  # no voice: the first sentence or two alone
    assert all(not s.finished for s in snapshots[:-1])
    assert len({(s.status, s.items_done) for s in snapshots}) == len(snapshots)  # only changes


def test_a_jsonl_batch_in_any_form(chorus_url, tmp_path):
    lines = [{"input": "A plain line.", "voice": "alloy", "num_step": 4},
             {"custom_id": "x1", "method": "POST", "url": "/v1/audio/speech",
              "body": {"input": "An OpenAI batch line.", "voice": "echo", "num_step": 4}}]
    path = tmp_path / "batch.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))

    async def go():
        async with ChorusClient(chorus_url) as client:
            from_dicts = await client.jobs.submit_jsonl(lines, response_format="wav")
            from_file = await client.jobs.submit_jsonl(path)
            a = await client.jobs.wait(from_dicts.id, poll_s=0.2)
            b = await client.jobs.wait(from_file.id, poll_s=0.2)
            return a, b, await client.jobs.item(a.id, 1), await client.jobs.item(b.id, 1)

    a, b, wav_item, mp3_item = run(go())
    assert a.items_total == b.items_total == 2 and a.status == b.status == "completed"
    assert wav_item.media_type == "audio/wav" and mp3_item.media_type == "audio/mpeg"  # the job's default: mp3


def test_cancel_and_an_item_not_ready(chorus_url):
    async def go():
        async with ChorusClient(chorus_url) as client:
            job = await client.jobs.submit(long_job_items())
            with pytest.raises(ItemNotReadyError) as not_ready:
                await client.jobs.item(job.id, 39)
            cancelled = await client.jobs.cancel(job.id)
            waited = await client.jobs.wait(job.id, poll_s=0.2)  # a cancelled job is an end, not an error
            states = await client.jobs.items(job.id)
            return not_ready.value, cancelled, waited, states

    not_ready, cancelled, waited, states = run(go())
    assert len(states) == 40 and states[39].status == "cancelled" and not states[39].ready
    assert sum(s.ready for s in states) == waited.items_done
    assert not_ready.status == 409 and not_ready.retry_after_ms and not_ready.retry_after_ms > 0
    assert cancelled.status == "cancelled" and waited.status == "cancelled"
    assert waited.items_done < waited.items_total


def test_a_failed_job_raises_with_the_items_typed_error(chorus_url):
    """A voice deleted after submission fails the item that needs it, and so the job."""

    async def go():
        async with ChorusClient(chorus_url) as client:
            voice = await client.upload_voice(speech_like_wav(), "A short test clip.", name="doomed-voice")
            job = await client.jobs.submit([JobItem(f"Line {k}. " + CHAPTER, voice=voice.id) for k in range(40)])
            await client.delete_voice(voice.id)
            with pytest.raises(JobFailedError) as failed:
                await client.jobs.wait(job.id, poll_s=0.2, timeout=120)
            return failed.value

    failed = run(go())
    assert failed.job.status == "failed" and isinstance(failed.error, VoiceNotFoundError)
    assert isinstance(failed.item, int) and failed.code == "job_failed"


def test_refusals_and_the_clients_own_checks_are_typed(chorus_url):
    async def go():
        async with ChorusClient(chorus_url) as client:
            errors = {}
            for name, call in {
                "missing": client.jobs.get("job-" + "0" * 32),
                "voice": client.jobs.submit([JobItem("Fine.", voice="alloy"), JobItem("Who?", voice="nobody-here")]),
                "empty": client.jobs.submit([]),
                "jsonl": client.jobs.submit_jsonl(b'{"input": "ok"}\n{not json\n'),
                "path": client.jobs.get(".."),
                "item": client.jobs.item("job-x", -1),
                "items": client.jobs.items("job-x", limit=0),
            }.items():
                try:
                    await call
                except ChorusError as exc:  # each a typed error, none raw
                    errors[name] = exc
            slow = await client.jobs.submit(long_job_items())
            try:
                await client.jobs.wait(slow.id, poll_s=0.1, timeout=0.3)
            except RequestTimeoutError as exc:
                errors["timeout"] = exc
            still = await client.jobs.get(slow.id)
            await client.jobs.cancel(slow.id)
            return errors, still

    errors, still = run(go())
    assert sorted(errors) == ["empty", "item", "items", "jsonl", "missing", "path", "timeout", "voice"]
    assert isinstance(errors["missing"], JobNotFoundError) and errors["missing"].status == 404
    assert isinstance(errors["voice"], VoiceNotFoundError) and errors["voice"].field == "items[1].voice"
    assert isinstance(errors["empty"], InvalidRequestError) and errors["empty"].field == "items"
    assert isinstance(errors["jsonl"], BadMessageError) and "line 2" in errors["jsonl"].message
    assert isinstance(errors["path"], InvalidRequestError) and errors["path"].field == "job_id"
    assert isinstance(errors["item"], InvalidRequestError) and errors["item"].field == "item"
    assert isinstance(errors["items"], InvalidRequestError) and errors["items"].field == "limit"
    assert isinstance(errors["timeout"], RequestTimeoutError) and "goes on" in errors["timeout"].message
    assert not still.finished  # waiting gave up; the job did not


def test_job_ids_stay_inside_their_route():
    assert job_path("job-1") == "/v1/jobs/job-1"
    assert job_path("../voices", "/archive") == "/v1/jobs/..%2Fvoices/archive"
    assert httpx.URL("http://h" + job_path("a/b")).raw_path == b"/v1/jobs/a%2Fb"
