"""evaluation.outputs.<name>.kind: embedding: a vector compared by its cosine similarity with
the source's, per sample, and by retrieval over declared pairs of samples; the threshold
verify.min_cosine_similarity; every mistake located."""

from __future__ import annotations

import numpy as np
import pytest

from edgeflow.core.errors import EdgeflowError
from edgeflow.recipe import load_recipe
from edgeflow.report.markdown import kind_figures
from edgeflow.schema.sections import EmbeddingOutput, Verify
from edgeflow.verify.compare import compare_outputs
from edgeflow.verify.judge import build_checks, thresholds
from tests.recipe.test_errors import problems
from tests.recipe.test_outputs import with_outputs


def _compared(ref: np.ndarray, out: np.ndarray, spec: EmbeddingOutput) -> dict:
    return compare_outputs([ref], [out], ["embedding"], {"embedding": spec})


def test_the_cosine_per_sample_is_the_angle_between_the_two_vectors() -> None:
    """An artifact vector off its source by an orthogonal part of 0.1 of its length: cosine
    1 / sqrt(1.01) = 0.99504, on every sample; one sample off by 1.0: 0.70711."""
    ref = np.zeros((4, 8), np.float32)
    ref[np.arange(4), np.arange(4)] = [1.0, 2.0, 3.0, 4.0]
    out = ref.copy()
    out[np.arange(4), np.arange(4) + 4] = [0.1, 0.2, 0.3, 4.0]
    found = _compared(ref, out, EmbeddingOutput(kind="embedding"))["outputs"][0]
    assert found["kind"] == "embedding" and found["positions"] == 1
    assert found["cosine_min"] == pytest.approx(1 / np.sqrt(2), abs=1e-6)
    assert found["cosine_mean"] == pytest.approx((3 / np.sqrt(1.01) + 1 / np.sqrt(2)) / 4)
    words = kind_figures(found)
    assert words == ["cosine similarity 0.7071 (lowest), 0.9231 (mean)"]


def test_token_embeddings_are_compared_per_position_and_averaged_per_sample() -> None:
    rng = np.random.default_rng(0)
    ref = rng.standard_normal((3, 5, 16)).astype(np.float32)  # [batch, tokens, width]
    found = _compared(ref, -ref, EmbeddingOutput(kind="embedding"))["outputs"][0]
    assert found["positions"] == 5 and found["cosine_min"] == pytest.approx(-1.0)


def test_retrieval_ranks_each_match_among_the_other_samples_on_both_sides() -> None:
    """Samples 0/1 and 2/3 are near pairs in the source; the artifact moves sample 1 next to
    sample 2, so query 0's match drops to rank 2 and query 2's to rank 2 as well."""
    ref = np.array([[1, 0.0], [0.96, 0.28], [0, 1], [0.28, 0.96], [-1, 0]], np.float32)
    out = ref.copy()
    out[1] = [0.2, 0.98]
    spec = EmbeddingOutput(kind="embedding", pairs=[(0, 1), (2, 3)])
    retrieval = _compared(ref, out, spec)["outputs"][0]["retrieval"]
    assert retrieval == {
        "pairs": 2,
        "candidates": 4,
        "recall_at_1_source": 1.0,
        "recall_at_1_artifact": 0.0,
        "mean_rank_source": 1.0,
        "mean_rank_artifact": 2.0,
        "rank_kept": 0.0,
    }


def test_pairs_that_do_not_fit_the_output_are_clear_errors() -> None:
    ref = np.ones((3, 4), np.float32)
    with pytest.raises(EdgeflowError, match=r"pairs: pair \[0, 5\] names a sample past the 3"):
        _compared(ref, ref, EmbeddingOutput(kind="embedding", pairs=[(0, 5)]))
    tokens = np.ones((3, 2, 4), np.float32)
    with pytest.raises(EdgeflowError, match="retrieval compares one embedding per sample"):
        _compared(tokens, tokens, EmbeddingOutput(kind="embedding", pairs=[(0, 1)]))


def test_retrieval_is_not_measured_where_the_artifact_gives_nan_and_says_so() -> None:
    ref = np.eye(4, dtype=np.float32)
    out = ref.copy()
    out[2, 0] = np.nan
    spec = EmbeddingOutput(kind="embedding", pairs=[(0, 1)])
    found = _compared(ref, out, spec)["outputs"][0]
    assert "retrieval" not in found and found["non_finite_samples"] == 1
    assert found["retrieval_skipped"].startswith("not measured: the artifact outputs NaN or Inf")
    assert kind_figures(found)[-1].startswith("retrieval not measured")


def test_min_cosine_similarity_holds_per_embedding_output() -> None:
    ref = np.eye(4, dtype=np.float32)
    out = ref + 0.5 * np.roll(ref, 1, axis=1)  # cosine 1 / sqrt(1.25) = 0.894 everywhere
    found = _compared(ref, out, EmbeddingOutput(kind="embedding"))
    checks = build_checks(
        thresholds(Verify(min_cosine_similarity=0.95, min_sqnr_db=None), "int8"),
        found,
        None,
        1.0,
        1,
    )
    (check,) = [c for c in checks if c["metric"] == "verify.min_cosine_similarity"]
    assert not check["passed"] and check["value"] == pytest.approx(0.8944, abs=1e-4)
    assert check["message"].startswith(
        "verify.min_cosine_similarity: output 'embedding': 0.894427 is below the threshold 0.95"
    )


def test_the_recipe_locates_bad_pairs_and_a_threshold_with_no_embedding(write_recipe) -> None:
    text = with_outputs("{logits: {kind: embedding, pairs: [[0, 1], [2, 2]]}}")
    [problem] = problems(write_recipe(text))
    assert ": evaluation.outputs.logits.pairs[1]: pair 1 (2, 2): a pair is two different" in (
        problem
    )
    loaded = load_recipe(write_recipe(with_outputs("{logits: {kind: embedding, pairs: [[0, 1]]}}")))
    assert loaded.recipe.evaluation.outputs["logits"] == EmbeddingOutput(
        kind="embedding", pairs=[(0, 1)]
    )
    declared = "{logits: {kind: values}, speech: {kind: probability}}"
    values = with_outputs(declared, metric=", metric: agreement")
    [refused] = problems(write_recipe(values + "verify: {min_cosine_similarity: 0.99}\n"))
    assert (
        "verify.min_cosine_similarity: measures embedding outputs, and evaluation.outputs "
        "declares none (logits: values, speech: probability)"
    ) in refused


ENCODER = '''
import torch
from torch import nn


class Encoder(nn.Module):
    """[B, 32] features -> a unit-length embedding [B, 16]."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.net = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 16))

    def forward(self, x):
        e = self.net(x)
        return e / e.norm(dim=-1, keepdim=True)
'''


@pytest.mark.slow
def test_an_int8_encoder_is_judged_by_cosine_and_retrieval(tmp_path, write_recipe) -> None:
    """An encoder built for onnxruntime_micro in int8: 24 samples, each odd one a near copy of
    the one before (the pairs); verify reports the cosine per sample and the retrieval, and
    holds the cosine to its threshold; report.md and metrics.json carry both."""
    from edgeflow.engine.cache import Cache
    from edgeflow.engine.runner import run_build

    (tmp_path / "encoder.py").write_text(ENCODER)
    rng = np.random.default_rng(0)
    base = rng.standard_normal((12, 32)).astype(np.float32)
    near = base + 0.05 * rng.standard_normal(base.shape).astype(np.float32)
    x = np.stack([base, near], axis=1).reshape(24, 32)
    np.savez(tmp_path / "data.npz", x=x)
    pairs = [[2 * k, 2 * k + 1] for k in range(12)]
    recipe = write_recipe(
        f"""
        source:
          kind: pytorch
          model: encoder.py:Encoder
          inputs: [{{name: x, shape: [1, 32]}}]
          outputs: [embedding]
        calibration: {{dataset: data.npz}}
        evaluation:
          dataset: data.npz
          metric: agreement
          outputs: {{embedding: {{kind: embedding, pairs: {pairs}}}}}
        quantization: {{mode: int8}}
        target: onnxruntime_micro
        verify: {{min_cosine_similarity: 0.99, latency_runs: 2, warmup_runs: 0}}
        """
    )
    result = run_build(load_recipe(recipe), Cache(tmp_path / "cache"), tmp_path / "b", print)
    figures = result.metrics["agreement"]["outputs"]["embedding"]
    assert 0.99 <= figures["cosine_min"] <= figures["cosine_mean"] < 1.0
    assert figures["retrieval"]["pairs"] == 12 and figures["retrieval"]["candidates"] == 23
    assert figures["retrieval"]["recall_at_1_source"] == 1.0
    assert figures["retrieval"]["recall_at_1_artifact"] == 1.0
    assert result.failed_checks == []
    report = (result.build_dir / "report.md").read_text()
    assert "cosine similarity 0.99" in report and "match retrieved first 1.0000" in report
