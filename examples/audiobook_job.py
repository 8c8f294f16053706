"""A chapter of an audiobook as one Chorus job with `chorus-client`: submitted at once, made in the
background, followed with a progress bar, downloaded as a zip of its parts.

    pip install ./client                  # from a Chorus checkout
    python examples/audiobook_job.py http://127.0.0.1:8000 --out chapter.zip

`client.jobs.submit_text()` sends the whole chapter (`POST /v1/jobs`); the server cuts it into
items at paragraphs and sentences and makes them behind any live requests, so a running
audiobook never slows a voice agent down. `client.jobs.wait()` polls the job (`GET /v1/jobs/{id}`)
and calls back on every change; `client.jobs.archive()` writes the zip (`0000.mp3`, `0001.mp3`,
... in reading order). The job lives on the server, not in this program: stop it (Ctrl+C) and the
job goes on; `--job ID` picks it up again, and `--cancel` cancels it instead.

`--text FILE` reads the chapter from a text file (blank lines between paragraphs). With no
`--voice`, the server picks one voice for the first sentences and keeps it for the whole chapter.
"""

from __future__ import annotations

import argparse
import asyncio
import zipfile
from pathlib import Path

from chorus_client import ChorusClient, Job, SynthesisOptions

CHAPTER = """Chapter One. The Station

The rain had not stopped for three days. Mara watched it from the window of the old station,
counting the trains that did not come, and wondering whether the line had been closed without
anyone thinking to tell her.

On the fourth morning the sky cleared. She packed her bag, locked the door behind her and walked
down to the platform. A single carriage was waiting there, its windows fogged, its engine humming
as if it had been waiting for her all along.

The conductor took her ticket without a word. Outside, the valley slid past, green and silver
after the rain, and for the first time in a long while Mara let herself wonder where she was going.
"""


def show(job: Job) -> None:
    """One line of progress, rewritten in place."""
    width = 30
    filled = round(width * job.fraction)
    left = f", about {job.eta_seconds:.0f} s left" if job.eta_seconds and not job.finished else ""
    print(f"\r[{'#' * filled}{'.' * (width - filled)}] {job.items_done}/{job.items_total} items, "
          f"{job.audio_seconds:.1f} s of audio{left} ({job.status})", end="", flush=True)


async def narrate(url: str, out: Path, text: str, voice: str | None, fmt: str, num_step: int | None,
                  job_id: str | None, cancel: bool) -> None:
    async with ChorusClient(url) as client:  # api_key=... (or $CHORUS_API_KEY) if the server has one
        if job_id is None:
            options = SynthesisOptions(num_step=num_step) if num_step else None
            job = await client.jobs.submit_text(text, voice=voice, response_format=fmt, options=options)
            print(f"submitted {job.id} ({len(text)} characters)")
            job_id = job.id
        if cancel:
            job = await client.jobs.cancel(job_id)
            print(f"cancelled {job_id}: {job.items_done} of {job.items_total} items were done")
            return
        job = await client.jobs.wait(job_id, poll_s=0.5, on_progress=show)
        print()
        if job.status != "completed":
            print(f"the job was {job.status}; the zip holds the items done before")
        archive = await client.jobs.archive(job_id, out)
    print(f"saved {archive.path}: {archive.items} of {archive.items_total} parts, {archive.bytes / 1024:.0f} KB, "
          f"{job.audio_seconds:.1f} s of audio")
    with zipfile.ZipFile(archive.path) as z:
        for info in z.infolist():
            print(f"  {info.filename}  {info.file_size / 1024:7.1f} KB")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("url", help="the Chorus server, e.g. http://127.0.0.1:8000")
    parser.add_argument("--out", default="chapter.zip", help="where the zip of the parts goes")
    parser.add_argument("--text", type=Path, help="a text file with the chapter (default: a short one built in)")
    parser.add_argument("--voice", default=None, help="a built-in voice (alloy, ...) or a library voice's id or name")
    parser.add_argument("--format", default="mp3", choices=["mp3", "wav", "flac", "opus", "aac", "pcm"])
    parser.add_argument("--num-step", type=int, default=None, help="diffusion steps (default: the server's)")
    parser.add_argument("--job", default=None, help="follow a job submitted before instead of a new one")
    parser.add_argument("--cancel", action="store_true", help="cancel the job (with --job) instead of waiting")
    args = parser.parse_args()
    if args.cancel and not args.job:
        parser.error("--cancel needs --job ID")
    text = args.text.read_text() if args.text else CHAPTER
    asyncio.run(narrate(args.url, Path(args.out), text, args.voice, args.format, args.num_step, args.job,
                        args.cancel))


if __name__ == "__main__":
    main()
