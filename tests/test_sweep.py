"""The sweep summary: Pareto marks over verified builds, per recipe."""

from __future__ import annotations

from edgeflow.report.sweep import latency_key, mark_pareto, render, row


def metrics(accuracy: float, p50: float, size: int, arena: int | None = None) -> dict:
    found = {
        "verified": True,
        "accuracy": {"artifact": accuracy},
        "agreement": {"top1": 1.0, "min_sqnr_db": 28.7},
        "latency_ms": {"p50": p50},
        "size_bytes": size,
    }
    if arena is not None:
        found["arena_bytes"] = arena
    return found


def test_pareto_marks_the_builds_nothing_beats() -> None:
    rows = mark_pareto(
        [
            row("cnn", "float", metrics(0.99, 1.0, 60_000)),
            row("cnn", "int8", metrics(0.99, 0.5, 20_000)),  # beats float everywhere
            row("cnn", "int8-slow-small", metrics(0.98, 2.0, 18_000)),  # smallest: kept
            row("cnn", "broken", None, "precheck failed"),
            row("other", "float", metrics(0.5, 9.0, 90_000)),  # alone in its recipe
        ]
    )
    marks = {(r["recipe"], r["build"]): r["pareto"] for r in rows}
    assert marks == {
        ("cnn", "float"): False,
        ("cnn", "int8"): True,
        ("cnn", "int8-slow-small"): True,
        ("cnn", "broken"): False,
        ("other", "float"): True,
    }
    table = render(rows)
    assert "| cnn | int8 | verified | 0.9900 | 1.0000 | 28.7 | 0.500 |  | 20,000 |  | * |" in table
    assert "- cnn/broken: precheck failed" in table


def test_arena_counts_only_when_every_build_has_one() -> None:
    rows = mark_pareto(
        [
            row("cnn", "micro", metrics(0.99, 1.0, 20_000, arena=9_000)),
            row("cnn", "micro-small-arena", metrics(0.99, 1.0, 20_000, arena=6_000)),
        ]
    )
    assert [r["pareto"] for r in rows] == [False, True]
    mixed = mark_pareto(
        [
            row("cnn", "a", metrics(0.99, 1.0, 20_000, arena=9_000)),
            row("cnn", "b", metrics(0.99, 1.0, 20_000)),
        ]
    )
    assert [r["pareto"] for r in mixed] == [True, True]  # equal on what both have


def test_npu_builds_rank_by_the_estimated_npu_time_not_the_host_time() -> None:
    """Every accelerator runs the same pre-Vela model on this machine's CPU: its host p50 would
    rank them by noise. Where every build has an NPU estimate, that is the latency ranked."""

    def npu(p50: float, estimated_ms: float) -> dict:
        return {**metrics(0.99, p50, 20_000), "npu": {"latency_ms": estimated_ms}}

    rows = mark_pareto(
        [
            row("cnn", "ethos_u-int8", npu(0.30, 0.038)),  # slower host run, faster NPU
            row("cnn", "ethos_u.ethos-u85-256-int8", npu(0.29, 0.009)),
        ]
    )
    assert latency_key(rows) == "npu_latency_ms"
    assert [r["pareto"] for r in rows] == [False, True]
    assert "| 0.290 | 0.0090 | 20,000 |" in render(rows)
    mixed = [*rows, row("cnn", "tflite_micro-int8", metrics(0.99, 0.31, 20_000))]
    assert latency_key(mixed) == "latency_p50_ms"  # not comparable: the host time it is
