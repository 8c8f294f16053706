"""The instruction mapper through a real server and the real `openai` client: accents and
gender said in prose are used, and the ignored-instructions header names only the rest."""

from __future__ import annotations

import openai


def test_prose_accent_and_gender_reach_the_model(chorus_server):
    client = openai.OpenAI(base_url=chorus_server.url + "/v1", api_key="unused", max_retries=0)
    response = client.audio.speech.with_raw_response.create(
        model="gpt-4o-mini-tts", voice="onyx", input="Hello there.", response_format="wav",
        instructions="Speak like an elderly British woman, in a whisper.", extra_body={"num_step": 4, "seed": 5})
    assert response.headers["x-chorus-instructions"] == "elderly, british accent, female, whisper"
    assert "x-chorus-ignored-instructions" not in response.headers
    mixed = client.audio.speech.with_raw_response.create(
        model="tts-1", voice="onyx", input="Hi.", response_format="wav",
        instructions="An old Japanese man with a cheerful smile.", extra_body={"num_step": 4, "seed": 5})
    assert mixed.headers["x-chorus-instructions"] == "elderly, japanese accent, male"
    assert mixed.headers["x-chorus-ignored-instructions"] == "cheerful smile"
