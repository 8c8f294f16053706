"""Seeded request mixes for the benchmark scenarios of docs/performance.md.

Every request pins its length with `duration` (the reference's own knob, also Chorus's), so
the reference and Chorus synthesise exactly the same number of frames per request, and the
audio seconds of a mix are known before anything runs. Text length follows the duration at a
speaking rate of about 2.6 words per second, so prefixes are realistic too.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

FRAME_RATE = 25
WORDS = (
    "the a of and to in is was that for on with as it his by at from her this but they be not "
    "are had have one all were we when there can an which their said if do will each about how up "
    "out them then she many some so these would other into has more time two like him see could no "
    "make than first been its who now people my made over did down only way find use may water long "
    "little very after words called just where most know get through back much before go good new "
    "write our used me man too any day same right look think also around another came come work "
    "three word must because does part even place well such here take why things help put years "
    "different away again off went old number great tell men say small every found still between "
    "name should home big give air line set own under read last never us left end along while might "
    "next sound below saw something thought both few those always looked show large often together "
    "asked house world going want school important until form food keep children feet land side "
    "without boy once animals life enough took sometimes four head above kind began almost live page "
    "got earth need far hand high year mother light parts country father let night following picture"
).split()


@dataclass(frozen=True)
class RequestSpec:
    request_id: str
    text: str
    seconds: float  # pinned duration: frames = int(seconds * 25)
    clone: bool = False
    guidance_scale: float = 2.0
    num_step: int = 32

    @property
    def frames(self) -> int:
        return max(1, int(self.seconds * FRAME_RATE))


def make_text(rng: random.Random, seconds: float, words_per_second: float = 2.6) -> str:
    """Sentences of common words, about `seconds` long when spoken."""
    n = max(2, round(seconds * words_per_second))
    words = [rng.choice(WORDS) for _ in range(n)]
    out, sentence = [], []
    for i, w in enumerate(words):
        sentence.append(w)
        if len(sentence) >= rng.randint(6, 14) or i == n - 1:
            s = " ".join(sentence)
            out.append(s[0].upper() + s[1:] + ".")
            sentence = []
    return " ".join(out)


def _frame_seconds(rng: random.Random, lo: float, hi: float) -> float:
    # k frames and half of one more, so int(seconds * 25), as the reference sizes a
    # canvas, is exactly k whatever the float rounding
    return (rng.randint(round(lo * FRAME_RATE), round(hi * FRAME_RATE) - 1) + 0.5) / FRAME_RATE


def plain_mix(n: int = 256, seed: int = 0, lo: float = 2.0, hi: float = 25.0) -> list[RequestSpec]:
    """n requests of lo..hi seconds (uniform), default knobs, no reference voice."""
    rng = random.Random(seed)
    specs = []
    for i in range(n):
        seconds = _frame_seconds(rng, lo, hi)
        specs.append(RequestSpec(f"r{i:04d}", make_text(rng, seconds), seconds))
    return specs


def mixed_knobs_mix(n: int = 256, seed: int = 0, lo: float = 2.0, hi: float = 25.0) -> list[RequestSpec]:
    """The plain mix's lengths and texts, with knobs: 50% cloning a 5 s reference voice,
    25% guidance 0, 25% 16 steps (a seeded shuffle decides who gets what)."""
    base = plain_mix(n, seed, lo, hi)
    rng = random.Random(seed + 1)
    order = list(range(n))
    rng.shuffle(order)
    clone = set(order[: n // 2])
    rng.shuffle(order)
    no_cfg = set(order[: n // 4])
    few_steps = set(order[n // 4 : n // 2])
    return [
        RequestSpec(s.request_id, s.text, s.seconds, clone=i in clone,
                    guidance_scale=0.0 if i in no_cfg else 2.0, num_step=16 if i in few_steps else 32)
        for i, s in enumerate(base)
    ]


def long_paragraph(seed: int = 0, seconds: float = 60.0) -> str:
    """A paragraph of about `seconds` of speech (long text: chunked by the engine)."""
    return make_text(random.Random(seed + 7), seconds)


def audio_seconds(specs: list[RequestSpec]) -> float:
    return sum(s.frames for s in specs) / FRAME_RATE


def poisson_arrivals(rate_per_s: float, duration_s: float, seed: int = 0) -> list[float]:
    """Arrival offsets (seconds) of a Poisson process over [0, duration_s)."""
    rng = random.Random(seed)
    t, out = 0.0, []
    while True:
        t += rng.expovariate(rate_per_s)
        if t >= duration_s:
            return out
        out.append(t)
