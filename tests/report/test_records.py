"""The records stages write and read (edgeflow/core/records.py): validated on both sides,
metrics.json in its DVC shape and held to the committed schema, and a record from an older
edgeflow is made again, not read."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from edgeflow.cli import main
from edgeflow.core.errors import EdgeflowError
from edgeflow.core.records import (
    Metrics,
    ReportRecord,
    Section,
    VerifyRecord,
    metrics_schema,
    read_record,
    stale,
)
from edgeflow.engine.cache import ENTRY_FILE, file_manifest
from tests.conftest import REPO
from tests.report import DEMO


def test_the_committed_schema_is_the_models() -> None:
    committed = (REPO / "docs" / "metrics.schema.json").read_text(encoding="utf-8")
    assert committed == metrics_schema(), (
        "metrics.json's model changed: python -m edgeflow.core.records > docs/metrics.schema.json"
    )


@pytest.mark.parametrize("build", [DEMO, "tflite_micro-int8"])
def test_metrics_keep_their_shape(builds: Path, build: str) -> None:
    """What a build wrote reads back as the model and dumps to the same JSON: the keys DVC
    compares are the keys that were set, nulls included."""
    path = builds / "build" / "digits_cnn" / build / "metrics.json"
    written = json.loads(path.read_text())
    assert read_record("metrics", path).dump() == written
    assert written["accuracy"]["drop"] == pytest.approx(
        written["accuracy"]["source"] - written["accuracy"]["artifact"]
    )
    if build.startswith("tflite_micro"):
        assert written["arena_bytes"] > 1_000  # the runner's own figure, a declared key


def test_a_record_that_does_not_fit_is_named(builds: Path, tmp_path: Path) -> None:
    verify = json.loads((builds / "build" / "digits_cnn" / DEMO / "verify.json").read_text())
    VerifyRecord.model_validate(verify)
    verify["latency"] = verify.pop("latency_ms")  # a renamed key, as an older edgeflow's
    path = tmp_path / "verify.json"
    path.write_text(json.dumps(verify))
    with pytest.raises(EdgeflowError) as found:
        read_record("verify", path)
    assert "latency: Extra inputs are not permitted; latency_ms: Field required" in (
        found.value.message
    )
    assert "edgeflow run" in (found.value.hint or "")
    assert stale("verify", path) is not None
    with pytest.raises(ValueError, match="size_bytes"):
        Metrics.model_validate({"recipe": "r", "target": "t", "quantization": "none"})


def test_report_md_is_joined_from_its_record() -> None:
    record = ReportRecord(
        title="r -> t-none",
        intro="**VERIFIED**\n",
        sections=[Section(heading="Thresholds", body="none\n")],
    )
    assert record.markdown() == "# r -> t-none\n\n**VERIFIED**\n\n## Thresholds\n\nnone\n"


def test_a_cached_record_an_older_edgeflow_wrote_is_made_again(
    builds: Path, tmp_path: Path, shared_cache: Path, capsys
) -> None:
    """The verify stage's cached verify.json, edited as an older edgeflow would have written
    it: the next build finds the entry damaged, runs verify again and reads a sound record."""
    cache = tmp_path / "cache"
    shutil.copytree(shared_cache, cache, symlinks=True)
    entries = sorted((cache / "verify").glob("*/*/verify.json"))
    assert entries
    for path in entries:  # its own manifest sound: only the record is an older edgeflow's
        record = json.loads(path.read_text())
        record["latency"] = record.pop("latency_ms")
        path.write_text(json.dumps(record))
        manifest = json.loads((path.parent / ENTRY_FILE).read_text())
        manifest["files"]["verify.json"] = file_manifest(path.parent)["verify.json"]
        (path.parent / ENTRY_FILE).write_text(json.dumps(manifest))
    args = ["run", "recipe=digits_cnn", f"cache_dir={cache}", f"build_dir={tmp_path / 'b'}"]
    assert main([*args, "target=onnxruntime_micro", "quantization=int8"]) == 0
    out = capsys.readouterr()
    assert "verify         ran" in out.out
    assert "is not this edgeflow's verify record" in out.err
    assert "latency_ms: Field required" in out.err and "computed again" in out.err
    built = tmp_path / "b" / "digits_cnn" / DEMO / "verify.json"
    assert read_record("verify", built).latency_ms.runs > 0


def test_an_exact_outputs_sqnr_stays_infinite_through_a_record(tmp_path: Path) -> None:
    """JSON has no inf; edgeflow writes it as Infinity and a record read back keeps it (a
    JSON-mode dump would turn it into null, and a threshold would then fail as unmeasured)."""
    record = {
        "runtime": "onnxruntime_micro", "samples": 1, "metric": "agreement", "accuracy": None,
        "agreement": {"outputs": [{"index": 0, "sqnr_db": float("inf")}]},
        "latency_ms": None, "size_bytes": 1, "extra": {},
    }  # fmt: skip
    path = tmp_path / "verify.json"
    path.write_text(json.dumps(record))
    assert read_record("verify", path).dump()["agreement"]["outputs"][0]["sqnr_db"] == float("inf")
