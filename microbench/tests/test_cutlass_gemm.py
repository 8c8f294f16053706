"""`python -m microbench.cutlass_gemm`: refused without CUDA; its configuration table, the source
each configuration becomes, the splits each is timed with, and the summary's go (CPU only)."""

from __future__ import annotations

import pytest
import torch

from microbench import cutlass_configs as cc, cutlass_gemm

pytestmark = pytest.mark.bench


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without CUDA")
def test_the_sweep_refuses_a_machine_without_cuda(tmp_path, capsys):
    assert cutlass_gemm.main(["--lib", str(tmp_path / "none.so"), "--out", str(tmp_path / "out.json")]) == 2
    assert "needs a CUDA GPU" in capsys.readouterr().err
    assert not (tmp_path / "out.json").exists()


def test_every_configuration_is_buildable_and_named_once():
    names = [c.name for c in cc.CONFIGS]
    assert len(names) == len(set(names))
    for c in cc.CONFIGS:
        c.check()
        src = c.source()
        assert f"CHORUS_CUTLASS_GEMM({c.name}, " in src and '#include "gemm.cuh"' in src
        # an 80- or 144-wide tile needs the extended WGMMA shapes, or it runs 8/16-wide instructions
        assert ("CUTE_SM90_EXTENDED_MMA_SHAPES_ENABLED" in src) == (c.tn not in cc.COMMON_MMA_N)
    # the sweep covers what the issue asks: both tile heights, both schedules, split/stream-K, swap-AB
    assert {c.tm for c in cc.CONFIGS if not c.swap} == {64, 128}
    assert {cc.SCHEDULES[c.schedule] for c in cc.CONFIGS} >= {"pingpong", "cooperative", "streamk"}
    assert any(c.swap for c in cc.CONFIGS) and any(c.partials for c in cc.CONFIGS)


def test_a_configuration_the_builders_would_reject_is_refused():
    with pytest.raises(ValueError):
        cc.Config(False, 64, 128, schedule=1).check()  # cooperative needs 128-row tiles
    with pytest.raises(ValueError):
        cc.Config(True, 64, 300).check()  # WGMMA N above 256
    with pytest.raises(ValueError):
        cc.Config(True, 64, 72).check()  # CUTLASS's sm90 mainloop takes N in multiples of 16
    with pytest.raises(ValueError):
        cc.Config(False, 128, 128, schedule=2, partials=True).check()


def test_splits_follow_the_engine():
    from server.engine.kernels import split_k

    assert cc.SPLITS_BY_ROWS == split_k.SPLITS_BY_ROWS
    assert [cc.engine_splits(m) for m in (135, 535, 1088)] == [4, 2, 1]
    part = cc.Config(True, 64, 144, partials=True)
    assert part.splits("o", 135) == (2, 4) and part.splits("down", 535) == (2,)
    assert part.splits("down", 1088) == () and part.splits("qkv", 135) == (2,)
    assert cc.Config(True, 128, 144, schedule=2).splits("qkv", 535) == (1, 2, 4)
    assert cc.Config(False, 64, 128).splits("gate_up", 135) == (1,)


def _base(proj, rows, us):
    return {"projection": proj, "rows": rows, "engine_path": "F.linear", "engine_us": us, "f_linear_us": us}


def _rec(proj, rows, us, config="a", splits=1, partials=False, ok=True):
    return {"projection": proj, "rows": rows, "config": config, "splits": splits, "partials": partials,
            "ok": ok, "us": us}


def test_the_summary_takes_the_fastest_eligible_kernel_and_reads_the_go():
    bases = [_base(p, m, 10.0) for p in cc.PROJECTIONS for m in cc.ROWS]
    recs = [_rec(p, m, 9.0) for p in cc.PROJECTIONS for m in cc.ROWS]
    s = cc.summarise(recs, bases)
    assert s["go"] and all(e["ratio"] == pytest.approx(10 / 9, abs=1e-3) for e in s["table"])
    # partials in more slices than the engine takes, a failed check, or a slower kernel do not count
    recs = [r for r in recs if (r["projection"], r["rows"]) != ("o", 535)]
    recs += [_rec("o", 535, 1.0, partials=True, splits=4), _rec("o", 535, 2.0, ok=False), _rec("o", 535, 11.0),
             _rec("qkv", 535, 1.0, partials=True, splits=2)]
    s = cc.summarise(recs, bases)
    o535 = next(e for e in s["table"] if (e["projection"], e["rows"]) == ("o", 535))
    assert o535["best"]["us"] == 11.0 and not s["go"]
    qkv535 = next(e for e in s["table"] if (e["projection"], e["rows"]) == ("qkv", 535))
    assert qkv535["best"]["us"] == 9.0  # partials of a wide projection are for the record only
    # a miss only at 1088 rows leaves the go standing
    recs = [_rec(p, m, 12.0 if m == 1088 else 9.0) for p in cc.PROJECTIONS for m in cc.ROWS]
    assert cc.summarise(recs, bases)["go"]
    assert not cc.summarise([], bases)["go"]


def test_the_report_prefers_the_confirmation():
    bases = [_base(p, m, 10.0) for p in cc.PROJECTIONS for m in cc.ROWS]
    doc = {"summary": cc.summarise([_rec(p, m, 9.0) for p in cc.PROJECTIONS for m in cc.ROWS], bases),
           "confirm": [{"projection": "qkv", "rows": 135, "engine_us": [10, 10, 10], "cutlass_us": [11, 11, 12]}],
           "confirm_go": False}
    text = cc.report(doc)
    assert "| qkv | 135 | F.linear | 10.00 | a (1) | 11.00 | 0.909x |" in text
    assert "| o | 535 | F.linear | 10.00 | a (1) | 9.00 | 1.111x |" in text
    assert text.endswith("no")
