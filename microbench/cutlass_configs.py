"""The CUTLASS GEMM configurations `microbench.cutlass_gemm` sweeps, what each is tried at, the
C++ source each becomes, and the summary of a sweep (pure logic: no GPU, no compiler).

Every configuration computes D (m x n) = X (m x k) @ W (n x k)^T in bf16 with fp32 accumulation
through one of CUTLASS 3's sm90 warp-specialised kernels (TMA loads, WGMMA), built from
`microbench/cutlass/gemm.cuh` (its header comment says what each knob does).
"""

from __future__ import annotations

from dataclasses import dataclass

HIDDEN, QKV, ATTN_OUT, INTER, LAYERS = 1024, 4096, 2048, 3072, 28
# projection: (weight rows n, inner dimension k)
PROJECTIONS = {"qkv": (QKV, HIDDEN), "o": (HIDDEN, ATTN_OUT), "gate_up": (2 * INTER, HIDDEN), "down": (HIDDEN, INTER)}
ROWS = (135, 535, 1088)  # a fast-start chunk, a lone line, two lines
GO_ROWS = (135, 535)  # the go: every projection at least as fast as the engine's cuBLAS path here
NARROW = ("o", "down")  # the projections the engine splits along k (server/engine/kernels/split_k.py)
SPLITS_BY_ROWS = ((192, 4), (1024, 2))  # the engine's split_k.SPLITS_BY_ROWS, copied (no server import)

COMMON_MMA_N = (8, 16, 32, 64, 96, 128, 192, 256)  # WGMMA widths CuTe selects without extended shapes
SCHEDULES = {0: "pingpong", 1: "cooperative", 2: "streamk", 3: "basic"}
EPILOGUES = {0: "tma", 1: "direct"}


@dataclass(frozen=True)
class Config:
    """One kernel: `swap` computes C^T = W X^T (the weights as the MMA's M side); (tm, tn, tk)
    is the CTA tile of the problem as CUTLASS sees it (after the swap: tm weight rows, tn tokens);
    (cm, cn) the cluster; `schedule` a key of SCHEDULES; `epilogue` a key of EPILOGUES;
    `partials`: fp32 (splits, m, n) output, one k slice a batch, as the engine's split O/down."""

    swap: bool
    tm: int
    tn: int
    tk: int = 64
    schedule: int = 0
    cm: int = 1
    cn: int = 1
    epilogue: int = 0
    partials: bool = False

    @property
    def name(self) -> str:
        parts = ["sw" if self.swap else "nt", f"{self.tm}x{self.tn}x{self.tk}", SCHEDULES[self.schedule]]
        if (self.cm, self.cn) != (1, 1):
            parts.append(f"c{self.cm}x{self.cn}")
        if self.epilogue:
            parts.append(EPILOGUES[self.epilogue])
        if self.partials:
            parts.append("partials")
        return "_".join(parts)

    def check(self) -> None:
        """Raise ValueError where CUTLASS's sm90 builders would reject the configuration."""
        if self.schedule not in SCHEDULES or self.epilogue not in EPILOGUES:
            raise ValueError(f"{self}: unknown schedule or epilogue")
        if self.schedule in (1, 2) and self.tm % 128:
            raise ValueError(f"{self.name}: cooperative kernels split a tile's M over two warp groups (128 rows)")
        if self.schedule in (0, 3) and self.tm != 64:
            raise ValueError(f"{self.name}: ping-pong and basic kernels here take 64-row tiles")
        if self.tn % 16 or not 16 <= self.tn <= 256 or self.tk not in (64, 128):
            raise ValueError(f"{self.name}: a tile N of 16..256 in steps of 16, k tile 64 or 128")
        if self.partials and self.schedule == 2:
            raise ValueError(f"{self.name}: stream-K reduces its own splits")

    def splits(self, projection: str, rows: int) -> tuple[int, ...]:
        """The k splits it is timed with: fp32 partials in 2 or 4 for the narrow projections,
        never more than the engine splits that step into (so the add + norm after it reads no
        more), and in 2 for QKV and gate-up (for the record only: nothing after them sums
        partials today, so they never count in the go); stream-K unsplit (its own heuristic)
        and split-K in 2 and 4; otherwise 1."""
        if self.partials:
            if projection not in NARROW:
                return (2,)
            return tuple(s for s in (2, 4) if s <= engine_splits(rows))
        if self.schedule == 2:
            return (1, 2, 4)
        return (1,)

    def source(self) -> str:
        """The .cu file that instantiates it behind `<name>_run` and `<name>_workspace`. A tile N
        outside WGMMA's common widths (72, 136, 144, ...) needs CuTe's extended shapes: without
        them its builder quietly falls back to 8- or 16-wide instructions."""
        self.check()
        args = ", ".join(str(a).lower() for a in (self.swap, self.tm, self.tn, self.tk, self.cm, self.cn,
                                                  self.schedule, self.epilogue, self.partials))
        extended = "" if self.tn in COMMON_MMA_N else "#define CUTE_SM90_EXTENDED_MMA_SHAPES_ENABLED\n"
        return f'{extended}#include "gemm.cuh"\nCHORUS_CUTLASS_GEMM({self.name}, {args})\n'


def engine_splits(rows: int) -> int:
    """The k slices the engine splits O and down into at `rows` (1: unsplit)."""
    for most_rows, splits in SPLITS_BY_ROWS:
        if rows <= most_rows:
            return splits
    return 1


def _swap(tm, tn, **kw):
    return Config(True, tm, tn, **kw)


def _plain(tm, tn, **kw):
    return Config(False, tm, tn, **kw)


PP, COOP, SK, BASIC = 0, 1, 2, 3
CONFIGS: tuple[Config, ...] = (
    # swap-AB: the weights fill the MMA's M side; 144 tokens take a fast-start chunk in one tile
    # and a lone line's 535 rows in four
    _swap(64, 144), _swap(64, 144, partials=True), _swap(64, 144, tk=128), _swap(64, 144, schedule=BASIC),
    _swap(64, 144, epilogue=1), _swap(64, 144, schedule=BASIC, epilogue=1, partials=True),
    _swap(64, 64), _swap(64, 64, partials=True), _swap(64, 128), _swap(64, 192),
    _swap(128, 144, schedule=COOP), _swap(128, 192, schedule=COOP),
    # the tokens as M, 64- and 128-row tiles
    _plain(64, 128), _plain(64, 256), _plain(64, 128, schedule=BASIC), _plain(64, 128, cm=2),
    _plain(64, 256, cm=2), _plain(64, 128, partials=True), _plain(64, 64, partials=True),
    _plain(128, 128, schedule=COOP), _plain(128, 256, schedule=COOP), _plain(128, 256, schedule=COOP, cm=2),
    _plain(128, 128, schedule=SK), _plain(128, 256, schedule=SK), _plain(128, 128, schedule=COOP, partials=True),
    # clusters that multicast the activations (the operand every CTA reads) instead of the
    # weights: swapped, CTAs of one cluster differ in weight rows (cm); plain, in weight columns (cn)
    _swap(128, 192, schedule=COOP, cm=2), _swap(64, 192, cm=2), _swap(64, 64, cm=2, partials=True),
    _plain(64, 128, schedule=BASIC, cn=2), _plain(64, 128, cn=2), _plain(64, 256, cn=2),
    _plain(128, 256, schedule=COOP, cn=2), _plain(64, 128, cn=2, partials=True),
    _plain(64, 128, schedule=BASIC, partials=True),
    # cuBLAS's own decompositions at these shapes (its nvjet kernels' names: swap-AB, a token tile
    # sized so that about 128 CTAs run, clusters of 2 or 4), rebuilt in CUTLASS; its 72- and
    # 136-token tiles become 80 and 144 (CUTLASS's sm90 mainloop takes N in multiples of 16)
    _swap(64, 80, cm=2), _swap(64, 80, cn=2), _swap(64, 80),
    _swap(64, 80, cm=2, epilogue=1, partials=True), _swap(64, 144, cm=2, epilogue=1, partials=True),
    _swap(64, 144, cm=4), _swap(128, 144, schedule=COOP, cm=2),
)


def by_name() -> dict[str, Config]:
    return {c.name: c for c in CONFIGS}


def eligible(projection: str, rows: int, record: dict) -> bool:
    """Whether a timed CUTLASS record competes in the go: bf16 output always; fp32 partials
    only for a narrow projection where the engine splits at least as many ways."""
    if not record.get("ok"):
        return False
    if record["partials"]:
        return projection in NARROW and record["splits"] <= engine_splits(rows)
    return True


def summarise(records: list[dict], baselines: list[dict]) -> dict:
    """Per projection and row count: the engine's cuBLAS path (F.linear; for O and down at a
    split step, the split strided-batched GEMM), the best eligible CUTLASS record, their ratio
    (reference / CUTLASS: above 1 is faster), and the go (every projection >= 1.0 at GO_ROWS)."""
    table = []
    for base in baselines:
        proj, rows = base["projection"], base["rows"]
        ref = base["engine_us"]
        mine = [r for r in records if r["projection"] == proj and r["rows"] == rows and eligible(proj, rows, r)]
        best = min(mine, key=lambda r: r["us"]) if mine else None
        entry = {"projection": proj, "rows": rows, "engine_path": base["engine_path"], "engine_us": ref,
                 "f_linear_us": base["f_linear_us"],
                 "best": None if best is None else {k: best[k] for k in ("config", "splits", "us")},
                 "ratio": None if best is None else round(ref / best["us"], 3)}
        table.append(entry)
    go_rows = [e for e in table if e["rows"] in GO_ROWS]
    go = bool(go_rows) and all(e["ratio"] is not None and e["ratio"] >= 1.0 for e in go_rows)
    return {"table": table, "go": go}


def report(doc: dict) -> str:
    """A sweep's result as a Markdown table: each projection and row count, the engine's path
    against the best CUTLASS kernel (the confirmation's medians where it ran), and the go."""
    import statistics

    confirmed = {(c["projection"], c["rows"]): c for c in doc.get("confirm", [])}
    lines = ["| projection | rows | engine path | engine us | best CUTLASS (splits) | CUTLASS us | ratio |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for e in doc["summary"]["table"]:
        c = confirmed.get((e["projection"], e["rows"]))
        if c:
            ref, mine = statistics.median(c["engine_us"]), statistics.median(c["cutlass_us"])
        else:
            ref, mine = e["engine_us"], (e["best"] or {}).get("us")
        best = e["best"]
        lines.append(f"| {e['projection']} | {e['rows']} | {e['engine_path']} | {ref:.2f} | "
                     + (f"{best['config']} ({best['splits']}) | {mine:.2f} | {ref / mine:.3f}x |" if best
                        else "none | - | - |"))
    go = doc.get("confirm_go", doc["summary"]["go"])
    lines.append(f"\ngo (every projection >= 1.0x at {', '.join(map(str, GO_ROWS))} rows): {'yes' if go else 'no'}")
    return "\n".join(lines)
