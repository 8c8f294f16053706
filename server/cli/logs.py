"""Log lines that machines can read: the message, then `key=value` for every extra.

Handlers log with `extra={"request_id": ...}`; this formatter appends those fields, so
one request can be followed through the log by its id (`grep request_id=c3/r1`).
"""

from __future__ import annotations

import logging
import sys

_STANDARD = set(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {"message", "asctime"}


def _value(value: object) -> str:
    text = f"{value:.3f}".rstrip("0").rstrip(".") if isinstance(value, float) else str(value)
    return f'"{text}"' if (" " in text or not text) else text


class KeyValueFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        extras = [f"{k}={_value(v)}" for k, v in record.__dict__.items() if k not in _STANDARD and v is not None]
        if not extras:
            return line
        head, sep, tail = line.partition("\n")  # keep tracebacks below the fields
        return f"{head} {' '.join(extras)}{sep}{tail}"


def configure(level: str) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(KeyValueFormatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logging.basicConfig(level=level.upper(), handlers=[handler], force=True)
    for noisy in ("transformers", "huggingface_hub", "urllib3", "httpx"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
