"""Long-form jobs through a real server: items in several formats made and served one by one and
as a zip whose entries an independent decoder reads; one long text cut into items that keep the
first item's voice; JSONL (plain and OpenAI batch lines); cancel (queued items never run, the
running one stops); jobs seen only with the key that made them; and the caps and bad input, each
refused before anything is stored with a clear error naming its field."""

from __future__ import annotations

import io
import json
import sqlite3
import time
import zipfile

import av
import httpx
import numpy as np
import pytest
import soundfile as sf

from tests.support.chorus_client import metric_value
from tests.support.waiting import poll_until

FAST = {"num_step": 2, "normalize_text": False}
KEYS = ("job-key-a", "job-key-b")


@pytest.fixture(scope="module")
def server(start_inproc, tmp_path_factory):
    s = start_inproc(tmp_path_factory.mktemp("jobs"), "--job-concurrency", "2", "--max-job-items", "40",
                     "--max-text-chars", "300", "--max-job-chars", "3000", "--job-item-chars", "120",
                     "--max-job-bytes", "64K", "--max-job-audio-seconds", "600")
    yield s
    s.stop()


def _client(server, key: str | None = None) -> httpx.Client:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return httpx.Client(base_url=server.url, timeout=60, headers=headers)


def _wait(http: httpx.Client, job_id: str, timeout: float = 240.0) -> dict:
    """The job once it has finished."""
    deadline = time.monotonic() + timeout
    while True:
        view = http.get(f"/v1/jobs/{job_id}").json()
        if view["status"] in ("completed", "failed", "cancelled"):
            return view
        assert time.monotonic() < deadline, view
        time.sleep(0.2)


def _decode(data: bytes, fmt: str) -> np.ndarray:
    """Samples of an encoded item, read by a decoder of its own (libsndfile, or FFmpeg through PyAV)."""
    if fmt in ("wav", "flac"):
        samples, rate = sf.read(io.BytesIO(data), dtype="float32")
        assert rate == 24000
        return samples
    with av.open(io.BytesIO(data)) as container:
        return np.concatenate([frame.to_ndarray().reshape(-1) for frame in container.decode(audio=0)])


def _db(server) -> sqlite3.Connection:
    return sqlite3.connect(server.voices_dir / "jobs" / "jobs.sqlite3")


def test_items_in_several_formats_served_one_by_one_and_as_a_zip(server):
    formats = ["wav", "flac", "mp3", "opus"]
    items = [{"input": f"Item {k} of the job is spoken here.", "response_format": fmt, **FAST}
             for k, fmt in enumerate(formats)]
    with _client(server) as http:
        created = http.post("/v1/jobs", json={"items": items, "response_format": "wav"})
        assert created.status_code == 202, created.text
        assert created.json()["status"] == "queued"
        job_id = created.json()["id"]
        view = _wait(http, job_id)
        assert view["status"] == "completed", view
        assert view["items_total"] == view["items_done"] == 4 and view["attempts"] == 4
        assert view["audio_seconds"] > 0 and view["eta_seconds"] == 0
        seconds = 0.0
        for k, fmt in enumerate(formats):
            got = http.get(f"/v1/jobs/{job_id}/items/{k}")
            assert got.status_code == 200, got.text
            assert got.headers["content-type"].startswith({"wav": "audio/wav", "flac": "audio/flac",
                                                           "mp3": "audio/mpeg", "opus": "audio/ogg"}[fmt])
            assert len(_decode(got.content, fmt)) > 0
            seconds += float(got.headers["x-chorus-audio-seconds"])
        assert seconds == pytest.approx(view["audio_seconds"], abs=0.01)
        listed = http.get(f"/v1/jobs/{job_id}/items").json()
        assert listed["items_total"] == 4 and listed["offset"] == 0
        assert [(i["n"], i["status"], i["format"]) for i in listed["items"]] == [
            (k, "done", fmt) for k, fmt in enumerate(formats)]
        assert sum(i["audio_seconds"] for i in listed["items"]) == pytest.approx(view["audio_seconds"], abs=0.01)
        page = http.get(f"/v1/jobs/{job_id}/items", params={"offset": 1, "limit": 2}).json()
        assert [i["n"] for i in page["items"]] == [1, 2] and page["offset"] == 1
        assert http.get(f"/v1/jobs/{job_id}/items", params={"offset": 9}).json()["items"] == []
        for bad in ({"limit": 0}, {"limit": 1001}, {"offset": -1}, {"offset": "x"}):
            assert _error(http.get(f"/v1/jobs/{job_id}/items", params=bad), 400)["code"] == "invalid_request"
        assert _error(http.get("/v1/jobs/job-nosuch/items"), 404)["code"] == "invalid_request"
        archive = http.get(f"/v1/jobs/{job_id}/archive")
        assert archive.status_code == 200 and archive.headers["content-type"] == "application/zip"
        assert archive.headers["x-chorus-items"] == "4/4"
        with zipfile.ZipFile(io.BytesIO(archive.content)) as z:
            assert z.testzip() is None
            assert z.namelist() == [f"{k:04d}.{fmt}" for k, fmt in enumerate(formats)]
            for name, fmt in zip(z.namelist(), formats, strict=True):
                data = z.read(name)
                assert data == http.get(f"/v1/jobs/{job_id}/items/{int(name[:4])}").content
                assert len(_decode(data, fmt)) > 0
        assert http.get(f"/v1/jobs/{job_id}/items/4").status_code == 404
    assert metric_value(server.url, "chorus_job_items_total", outcome="done") >= 4
    poll_until(lambda: metric_value(server.url, "chorus_jobs", status="completed") >= 1, "chorus_jobs{completed}")


def test_one_long_text_is_cut_into_items_that_keep_the_first_ones_voice(server):
    text = ("The first chapter opens here. It is short. " + "A sentence of the first paragraph goes on. " * 3
            + "\n\n" + "The second paragraph has words of its own, and more of them. " * 4)
    with _client(server) as http:
        created = http.post("/v1/jobs", json={"input": text, "response_format": "wav", **FAST})
        assert created.status_code == 202, created.text
        job_id = created.json()["id"]
        view = _wait(http, job_id)
    assert view["status"] == "completed", view
    with _db(server) as db:
        chained, voice = db.execute("SELECT chained, voice IS NOT NULL FROM jobs WHERE id = ?", (job_id,)).fetchone()
        works = [json.loads(w) for (w,) in db.execute("SELECT work FROM job_items WHERE job = ? ORDER BY n",
                                                      (job_id,))]
    assert chained == 1 and voice == 1  # the first item's voice, kept for the rest
    texts = [w["text"] for w in works]
    assert view["items_total"] == len(texts) > 2
    assert len(texts[0]) <= 160 and all(len(t) <= 120 for t in texts[1:])
    assert " ".join(" ".join(texts).split()) == " ".join(text.split())  # every word, in order, once


def test_jsonl_lines_and_openai_batch_lines(server):
    lines = [json.dumps({"input": "A plain line.", **FAST}),
             "",
             json.dumps({"custom_id": "b", "method": "POST", "url": "/v1/audio/speech",
                         "body": {"input": "A batch line.", "voice": "alloy", **FAST}})]
    with _client(server) as http:
        created = http.post("/v1/jobs?response_format=flac", content="\n".join(lines).encode(),
                            headers={"Content-Type": "application/jsonl"})
        assert created.status_code == 202, created.text
        view = _wait(http, created.json()["id"])
        assert view["status"] == "completed" and view["items_total"] == 2, view
        item = http.get(f"/v1/jobs/{view['id']}/items/1")
        assert item.headers["content-type"] == "audio/flac"


def test_cancel_stops_the_running_item_and_the_queued_ones_never_run(server):
    items = [{"input": f"Number {k}: a sentence long enough to take a little while to say.", **FAST}
             for k in range(30)]
    with _client(server) as http:
        job_id = http.post("/v1/jobs", json={"items": items}).json()["id"]
        poll_until(lambda: http.get(f"/v1/jobs/{job_id}").json()["items_done"] >= 1, "an item done", 120)
        cancelled = http.delete(f"/v1/jobs/{job_id}")
        assert cancelled.status_code == 200, cancelled.text
        assert cancelled.json()["status"] == "cancelled"
        done = cancelled.json()["items_done"]
        assert done < 30
        time.sleep(2.0)  # what was in flight has stopped; nothing more is made
        view = http.get(f"/v1/jobs/{job_id}").json()
        assert view["status"] == "cancelled" and view["items_done"] == done
        with _db(server) as db:
            states = dict(db.execute("SELECT state, count(*) FROM job_items WHERE job = ? GROUP BY state", (job_id,)))
        assert states == {"done": done, "cancelled": 30 - done}
        assert http.get(f"/v1/jobs/{job_id}/items/29").status_code == 404  # never made
        again = http.delete(f"/v1/jobs/{job_id}")
        assert again.status_code == 200 and again.json()["items_done"] == done
        archive = http.get(f"/v1/jobs/{job_id}/archive")
        with zipfile.ZipFile(io.BytesIO(archive.content)) as z:
            assert len(z.namelist()) == done


def test_an_item_not_done_yet_is_409_with_retry_after(server):
    items = [{"input": f"Waiting item {k}, said at some length to take its time.", **FAST} for k in range(12)]
    with _client(server) as http:
        job_id = http.post("/v1/jobs", json={"items": items}).json()["id"]
        got = http.get(f"/v1/jobs/{job_id}/items/11")
        assert got.status_code == 409 and got.headers["retry-after"], got.text
        assert got.json()["error"]["message"].startswith("items[11]: not done yet")
        states = [i["status"] for i in http.get(f"/v1/jobs/{job_id}/items").json()["items"]]
        assert len(states) == 12 and states[11] in ("queued", "running"), states
        assert set(states) <= {"queued", "running", "done"}, states
        done = [i for i in http.get(f"/v1/jobs/{job_id}/items").json()["items"] if i["status"] == "done"]
        for item in done:  # what the list calls done is there to fetch
            assert http.get(f"/v1/jobs/{job_id}/items/{item['n']}").status_code == 200
        http.delete(f"/v1/jobs/{job_id}")
        after = {i["status"] for i in http.get(f"/v1/jobs/{job_id}/items").json()["items"]}
        assert "cancelled" in after and after <= {"cancelled", "done"}, after


def _error(response: httpx.Response, status: int) -> dict:
    assert response.status_code == status, response.text
    return response.json()["error"]


def test_caps_and_bad_input_each_with_a_clear_error(server):
    speak = {"input": "Hello.", **FAST}
    with _client(server) as http:
        def post(body=None, **kwargs) -> httpx.Response:
            return http.post("/v1/jobs", json=body, **kwargs) if body is not None else http.post("/v1/jobs", **kwargs)

        assert _error(post({"items": []}), 422) == {
            "code": "invalid_request", "message": "items: 0 items; a job has 1..40 (--max-job-items)", "field": "items"}
        assert _error(post({"items": [speak] * 41}), 422)["field"] == "items"
        err = _error(post({"items": [speak, {"input": " \u200b "}]}), 422)
        assert err["field"] == "items[1].input" and "must not be empty" in err["message"]
        err = _error(post({"items": [speak, speak, {"input": "Hi.", "voice": "nobody-here"}]}), 404)
        assert err["code"] == "voice_not_found" and err["field"] == "items[2].voice"
        assert err["message"].startswith("items[2].voice: no voice 'nobody-here'")
        err = _error(post({"input": "A long text.", "voice": "nobody-here"}), 404)
        assert err["field"] == "voice"
        err = _error(post({"items": [{"input": "x" * 301}]}), 413)
        assert err["code"] == "text_too_long" and err["field"] == "items[0].input"
        err = _error(post({"items": [{"input": "y" * 250}] * 13}), 413)  # 3250 characters in all
        assert err["field"] == "items" and "--max-job-chars" in err["message"]
        err = _error(post({"items": [{"input": "Hi.", "duration": 100.0}] * 7}), 422)
        assert "--max-job-audio-seconds" in err["message"]
        err = _error(post({"items": [speak, {"input": "Hi.", "num_step": 99}]}), 422)
        assert err["field"] == "items[1].num_step"
        err = _error(post({"items": [{"input": "Hi.", "timestamps": "word"}]}), 422)
        assert err["field"] == "items[0].timestamps" and "not available in a job" in err["message"]
        err = _error(post({"items": [{"input": "Hi.", "speling": 1}]}), 422)
        assert err["field"] == "items[0].speling"
        assert _error(post({"items": [speak], "input": "both"}), 422)["field"] == "items"
        assert _error(post(content=b"{not json", headers={"Content-Type": "application/json"}), 400)["code"] == \
            "bad_message"
        assert _error(post(content=b"text", headers={"Content-Type": "text/plain"}), 415)["code"] == "invalid_request"
        jsonl = json.dumps(speak).encode() + b"\n{broken\n"
        err = _error(post(content=jsonl, headers={"Content-Type": "application/x-ndjson"}), 400)
        assert err["message"].startswith("line 2: not valid JSON") and err["field"] == "items[1]"
        big = (json.dumps(speak) + "\n").encode() * (10 * 1024 * 1024 // 40)  # a 10 MB JSONL
        assert len(big) > 10_000_000
        err = _error(post(content=big, headers={"Content-Type": "application/jsonl"}), 413)
        assert err["code"] == "text_too_long" and "--max-job-bytes" in err["message"]
        streamed = (b"x" * 1024 for _ in range(100))  # no Content-Length: counted as it arrives
        err = _error(post(content=streamed, headers={"Content-Type": "application/jsonl"}), 413)
        assert err["message"].startswith("the body is more than 65536 bytes")
        assert http.get("/healthz").status_code == 200
        missing = f"job-{'0' * 32}"
        assert _error(http.get(f"/v1/jobs/{missing}"), 404)["message"].startswith(f"no job '{missing}'")
        assert http.get("/v1/jobs/not-a-job").status_code == 404
        assert http.delete(f"/v1/jobs/{missing}").status_code == 404


def test_a_job_is_its_keys_alone_and_each_key_has_its_own_cap(start_inproc, tmp_path):
    keys = tmp_path / "keys.txt"
    keys.write_text("\n".join(KEYS) + "\n")
    keyed = start_inproc(tmp_path / "server", "--api-keys-file", str(keys), "--job-concurrency", "1",
                         "--max-active-jobs", "1")
    job = {"items": [{"input": "Mine, and said at some length so that it takes a while.", **FAST}] * 3}
    try:
        with _client(keyed, KEYS[0]) as a, _client(keyed, KEYS[1]) as b, _client(keyed) as nobody:
            job_id = a.post("/v1/jobs", json=job).json()["id"]
            err = _error(a.post("/v1/jobs", json=job), 429)
            assert err["code"] == "too_many_requests" and "--max-active-jobs 1" in err["message"]
            assert b.get(f"/v1/jobs/{job_id}").status_code == 404
            assert b.delete(f"/v1/jobs/{job_id}").status_code == 404
            assert b.get(f"/v1/jobs/{job_id}/archive").status_code == 404
            assert b.get(f"/v1/jobs/{job_id}/items").status_code == 404
            assert nobody.get(f"/v1/jobs/{job_id}").status_code == 401
            other = b.post("/v1/jobs", json=job)  # another key's cap is its own
            assert other.status_code == 202, other.text
            assert _wait(a, job_id)["status"] == "completed"
            assert a.post("/v1/jobs", json=job).status_code == 202  # room again once it finished
            assert _wait(b, other.json()["id"])["status"] == "completed"
    finally:
        keyed.stop()


def test_finished_jobs_and_their_audio_go_after_the_retention(start_inproc, tmp_path):
    brief = start_inproc(tmp_path / "server", "--job-retention-hours", "0.001")  # 3.6 s
    try:
        with _client(brief) as http:
            job_id = http.post("/v1/jobs", json={"items": [{"input": "Soon gone.", **FAST}]}).json()["id"]
            assert _wait(http, job_id)["status"] == "completed"
            audio = brief.voices_dir / "jobs" / "audio" / job_id
            assert audio.is_dir() and http.get(f"/v1/jobs/{job_id}/items/0").status_code == 200
            poll_until(lambda: http.get(f"/v1/jobs/{job_id}").status_code == 404, "the job removed", 30)
            assert not audio.exists()
    finally:
        brief.stop()
