"""The client's `Voice` carries every field a real server's `/v1/voices` items do: `builtin`
(OpenAI's names, made by the server), `kept` and `expires_at` (a request's `keep_voice`; with
no API keys a kept voice is not listed, its id is what grants it, so it is fetched by id)."""

from __future__ import annotations

import asyncio
import time

import httpx
from chorus_client import ChorusClient, SynthesisOptions

FAST = SynthesisOptions(num_step=4, seed=3)


def test_voice_has_the_fields_the_server_sends(chorus_url, reference_wav):
    async def go():
        async with ChorusClient(chorus_url) as client:
            uploaded = await client.upload_voice(reference_wav, "A short test clip.", name="fields-test-voice")
            spoken = await client.synthesize("Keep this speaker.", keep_voice=True, options=FAST).collect()
            kept_id = spoken.done.voice_id
            try:
                listed = {v.id: v for v in await client.list_voices()}
                kept = await client.voices.get(kept_id)
                raw = httpx.get(f"{chorus_url}/v1/voices").json()
                items = raw.get("voices", raw.get("data")) if isinstance(raw, dict) else raw
                items.append(httpx.get(f"{chorus_url}/v1/voices/{kept_id}").json())
            finally:
                await client.delete_voice(uploaded.id)
                await client.delete_voice(kept_id)
            return uploaded, kept_id, listed, kept, items

    uploaded, kept_id, listed, kept, items = asyncio.run(go())
    sent = set().union(*(item.keys() for item in items))
    assert {"builtin", "kept", "expires_at"} <= sent  # what the server sends, the client has
    for name in sent:
        assert all(hasattr(voice, name) for voice in [*listed.values(), kept]), name

    builtins = [v for v in listed.values() if v.builtin]
    assert builtins and "alloy" in {v.id for v in builtins}
    assert all(not v.kept and v.expires_at is None for v in builtins)
    assert listed[uploaded.id].builtin is False and listed[uploaded.id].kept is False
    assert listed[uploaded.id].expires_at is None
    assert kept.id == kept_id and kept.kept is True and kept.builtin is False
    assert isinstance(kept.expires_at, int) and kept.expires_at > time.time()
