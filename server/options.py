"""The one table of per-request generation options: name, type, default, range, and why.

Everything else is derived from `KNOBS`: the wire `Options` Struct (`server/wire/messages.py`), the
engine's `GenerationOptions` and its re-check (`server/engine/planning/request.py`), the demo page's
knobs (the page's boot JSON), the table in docs/protocol.md (`tests/integration/test_options_table.py`
checks it). Standard library only: the engine (no web imports) and the web layer (no torch)
both import it.

Every range is one the arithmetic survives with margin, not only what the reference accepts:
the scores of a step are float32, and a knob that turns them into inf or NaN would poison
the step it shares with other requests.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal

Kind = Literal["int", "float", "bool", "seed"]
SEED_MIN, SEED_MAX = -(2**63), 2**64 - 1  # "any 64-bit integer", signed or unsigned


@dataclass(frozen=True)
class Knob:
    """One option. `low`/`high` bound it (inclusive); `zero_off`: 0 is also accepted
    (the feature is off), below `low`; `nullable`: null means "not set"; `choices`: strings
    accepted besides the kind's values (a bool that has a third setting)."""

    name: str
    kind: Kind
    default: Any
    low: float | None = None
    high: float | None = None
    zero_off: bool = False
    nullable: bool = False
    choices: tuple[str, ...] = ()
    unit: str = ""
    why: str = ""

    @property
    def python_type(self) -> Any:
        base = {"int": int, "float": float, "bool": bool, "seed": int}[self.kind]
        if self.choices:
            base = base | Literal[self.choices]
        return base | None if self.nullable else base

    @property
    def range_text(self) -> str:
        """`1..64`, `0 or 0.001..10000`, `true or false`, for messages, docs and the page."""
        if self.kind == "bool":
            return " or ".join(["true, false" if self.choices else "true or false",
                                *(f'"{choice}"' for choice in self.choices)])
        if self.kind == "seed":
            return "any 64-bit integer"
        text = f"{_num(self.low)}..{_num(self.high)}"
        if self.unit:
            text += f" {self.unit}"
        if self.zero_off:
            text = f"0 or {text}"
        return text

    @property
    def rule(self) -> str:
        """What an error says after `field: `."""
        if self.kind == "seed":
            return "must be a 64-bit integer" + (" or null" if self.nullable else "")
        what = "an integer " if self.kind == "int" else ""
        return f"must be {what}{self.range_text}" + (" or null" if self.nullable else "")

    def problem(self, value: Any) -> str | None:
        """None when `value` is acceptable, else the rule it breaks (types are the caller's)."""
        if value is None:
            return None if self.nullable else "must not be null"
        if isinstance(value, str) and value in self.choices:
            return None
        if self.kind == "bool":
            return None if isinstance(value, bool) else self.rule
        if self.kind == "seed":
            return None if isinstance(value, int) and SEED_MIN <= value <= SEED_MAX else self.rule
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return self.rule
        if isinstance(value, float) and not math.isfinite(value):
            return "must be a finite number"
        if self.zero_off and value == 0:
            return None
        return None if self.low <= value <= self.high else self.rule

    def as_json(self) -> dict[str, Any]:
        """The page's view: default, the smallest and largest accepted values, the range."""
        low = 0 if self.zero_off else self.low
        out = {"kind": self.kind, "default": self.default, "min": low, "max": self.high,
               "nullable": self.nullable, "range": self.range_text}
        return {**out, "choices": list(self.choices)} if self.choices else out


def _num(x: float | None) -> str:
    return "" if x is None else (str(int(x)) if float(x).is_integer() else repr(x))


KNOBS: tuple[Knob, ...] = (
    Knob("num_step", "int", 32, 1, 64,
         why="diffusion steps; 64 bounds the work one request may ask of every step"),
    Knob("guidance_scale", "float", 2.0, 0, 10,
         why="CFG mix cond + s*(cond - uncond) of log-probs: finite for any s this size"),
    Knob("t_shift", "float", 0.1, 0.001, 1,
         why="the schedule t*s / (1 + (s-1)*t) in float32: below ~1e-6 its last step divides "
             "by 0 (inf tokens to reveal); 0.001 keeps a 1000x margin"),
    Knob("layer_penalty_factor", "float", 5.0, 0, 10_000,
         why="scores subtract 7x this, then divide by position_temperature (>= 0.001): "
             "7e7 at most, far from float32's 3.4e38 (>= ~1e38 overflows: inf - inf = NaN)"),
    Knob("position_temperature", "float", 5.0, 0.001, 10_000, zero_off=True,
         why="scores are divided by it: a denormal turns every score into -inf; 0 means "
             "no position noise (no division)"),
    Knob("class_temperature", "float", 0.0, 0.001, 10_000, zero_off=True,
         why="log-probs are divided by it before Gumbel sampling: the same bound; 0 is greedy"),
    Knob("denoise", "bool", True),
    Knob("speed", "float", None, 0.25, 4, nullable=True,
         why="the reference's range for a speaking rate"),
    Knob("duration", "float", None, 0.1, 36_000, nullable=True, unit="seconds",
         why="fixes the length (overrides speed): at least a few frames, at most 10 hours, "
             "so every length the plan computes is a small integer (--max-audio-seconds "
             "is the real cap)"),
    Knob("seed", "seed", None, nullable=True),
    Knob("postprocess", "bool", True),
    Knob("chunk_seconds", "float", 15.0, 1, 3_600, unit="seconds",
         why="target length of a text chunk: below 1 s a chunk is a few characters and one "
             "text makes thousands of chunks"),
    Knob("chunk_threshold", "float", 30.0, 0, 36_000, unit="seconds",
         why="text estimated longer than this is chunked (0: always); bounded so the plan's "
             "frame counts stay integers"),
    Knob("normalize_text", "bool", False, choices=("reference",),
         why="numbers, dates, currency and symbols read as words before synthesis: true, the "
             "best normaliser measured for the language (NeMo's for English); \"reference\", "
             "the reference's generate(normalize_text=True), for parity; applied to the text by "
             "the server, not by the engine (off by default, as in the reference; on for the "
             "OpenAI endpoint)"),
    Knob("first_chunk_seconds", "float", None, 0.5, 60, nullable=True, unit="seconds",
         why="fast start: the first chunk ends at a sentence or clause boundary about this "
             "much audio into the text (null: off, the reference's chunking); below 0.5 s a "
             "chunk is a word or two"),
)
BY_NAME: dict[str, Knob] = {knob.name: knob for knob in KNOBS}
NAMES: tuple[str, ...] = tuple(BY_NAME)
DEFAULTS: dict[str, Any] = {knob.name: knob.default for knob in KNOBS}
MAX_NUM_STEP = int(BY_NAME["num_step"].high)


def first_problem(values: dict[str, Any] | Any) -> tuple[str, str] | None:
    """(name, rule broken) of the first option out of range, or None; `values` is a mapping
    or any object with the options as attributes."""
    get = values.get if isinstance(values, dict) else lambda name, _=None: getattr(values, name)
    for knob in KNOBS:
        problem = knob.problem(get(knob.name, knob.default))
        if problem is not None:
            return knob.name, problem
    return None


def table_json() -> dict[str, dict[str, Any]]:
    """Every option's default and range, for the page's boot JSON."""
    return {knob.name: knob.as_json() for knob in KNOBS}

