"""The scored English set (`docs/normalization_set.toml`) through the normaliser's worker
processes, as a request's text goes: `normalize_text: true` (the default normaliser, NeMo's for
English) reads exactly as many items right as docs/normalization.md says it measured, and
`"reference"` exactly as many as the reference's did. A change to either count (a regression,
or an improvement the table does not show yet) fails here."""

from __future__ import annotations

import asyncio

import pytest

from bench.normalization import is_exact, load_set
from server.text import normalize, normalize_nemo
from server.text.normalize_workers import NormalizerWorkers

# the exact-match counts docs/normalization.md gives for the set
MEASURED = {True: 72, "reference": 54}

pytestmark = pytest.mark.skipif(not (normalize.available() and normalize_nemo.available()),
                                reason="the tn extra (WeTextProcessing, nemo-text-processing) is not installed")


def test_the_set_reads_as_measured_in_the_workers():
    items = load_set()
    workers = NormalizerWorkers(2)

    async def read(choice) -> list[str]:
        return list(await asyncio.gather(*(workers.normalize(item.written, "en", choice=choice) for item in items)))

    async def both() -> dict:
        return {choice: await read(choice) for choice in MEASURED}

    try:
        outputs = asyncio.run(both())
    finally:
        workers.close()
    for choice, measured in MEASURED.items():
        missed = [(item.written, out) for item, out in zip(items, outputs[choice], strict=True)
                  if not is_exact(out, item)]
        assert len(items) - len(missed) == measured, (choice, missed)
    assert MEASURED[True] > MEASURED["reference"]  # why true is NeMo's for English
