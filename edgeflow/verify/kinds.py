"""What each output is (class scores, probabilities, values, an embedding, a raw detector
head) and the agreement figure that means something for it.

An output not declared in `evaluation.outputs` is judged by its shape: [batch, C > 1] is a
class vector; one value per sample within [0, 1] (in the source) is a probability, decided at
0.5; anything else is values, compared by SQNR and relative error only. A figure is computed
only where it means something: top-1 agreement over the last axis of a segmentation map, or of
a one-element output, is not one.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from edgeflow.core.errors import EdgeflowError
from edgeflow.schema.sections import (
    ClassesOutput,
    DetectionChecks,
    DetectionsOutput,
    EmbeddingOutput,
    OutputSpec,
    ProbabilityOutput,
    ValuesOutput,
)


@dataclass(frozen=True)
class BoxMatching:
    """How a raw detector head's candidates are matched: the input image's (height, width)
    and the recipe's verify.detections tolerances."""

    image_size: tuple[int, int]
    checks: DetectionChecks


def judged(reference: np.ndarray, declared: OutputSpec | None) -> tuple[OutputSpec, str]:
    """(the output's kind, "declared" or "shape"): the recipe's declaration, else the shape's."""
    if declared is not None:
        return declared, "declared"
    per_sample = reference.shape[1:]
    if len(per_sample) == 1 and per_sample[0] > 1:
        return ClassesOutput(kind="classes"), "shape"
    one_value = int(np.prod(per_sample)) == 1 and reference.size > 0
    if one_value and reference.min() >= 0 and reference.max() <= 1:
        return ProbabilityOutput(kind="probability"), "shape"
    return ValuesOutput(kind="values"), "shape"


def agreement(
    name: str,
    spec: OutputSpec,
    ref: np.ndarray,
    out: np.ndarray,
    boxes: BoxMatching | None = None,
) -> dict[str, Any]:
    """The kind's own figures for one output, over the samples where the artifact is finite."""
    if isinstance(spec, ClassesOutput):
        return _classes(name, spec, ref, out)
    if isinstance(spec, ProbabilityOutput):
        return _probability(spec, ref, out)
    if isinstance(spec, EmbeddingOutput):
        return _embedding(name, spec, ref, out)
    if isinstance(spec, DetectionsOutput):
        if boxes is None:
            raise ValueError("a detections output needs the image size and tolerances")
        return _detections(name, spec, ref, out, boxes)
    return {}


def sqnr_db(ref: np.ndarray, out: np.ndarray) -> float:
    """10 * log10(sum ref^2 / sum (ref - out)^2): inf when exact, -inf when the source is all
    zero and the artifact is not."""
    ref64, out64 = ref.astype(np.float64), out.astype(np.float64)
    return power_db(float(np.sum(ref64**2)), float(np.sum((ref64 - out64) ** 2)))


def power_db(signal: float, noise: float) -> float:
    """10 * log10(signal / noise) of summed powers: inf when noise is 0, -inf when signal is
    (or the noise overflowed to inf), NaN when either is NaN."""
    if math.isnan(signal) or math.isnan(noise):
        return float("nan")
    if noise == 0.0:
        return float("inf")
    ratio = signal / noise
    return 10.0 * math.log10(ratio) if ratio > 0 else float("-inf")


def _where(name: str, key: str) -> str:
    return f"evaluation.outputs.{name}.{key}"


def _classes(name: str, spec: ClassesOutput, ref: np.ndarray, out: np.ndarray) -> dict[str, Any]:
    """`ref` and `out` batch-first; spec.axis is counted in the model's own layout."""
    native = spec.axis if spec.axis >= 0 else ref.ndim + spec.axis
    if native == spec.batch_axis:
        raise EdgeflowError(
            f"{_where(name, 'axis')}: classes over axis {spec.axis}, the batch axis of output "
            f"'{name}' (batch_axis: {spec.batch_axis}, {ref.ndim} axes)",
            "set axis to the axis the classes are on",
        )
    moved = spec.batch_first(spec.axis, ref.ndim) if 0 <= native < ref.ndim else None
    axis = -1 if moved is None else moved  # in the batch-first arrays
    if not 0 < axis < ref.ndim or ref.shape[axis] < 2:
        size = ref.shape[axis] if 0 < axis < ref.ndim else None
        raise EdgeflowError(
            f"{_where(name, 'kind')}: classes over axis {spec.axis}, but output '{name}' has "
            f"shape {list(ref.shape[1:])} per sample"
            + (f" ({size} value on that axis: no class to pick)" if size == 1 else ""),
            "declare kind: probability for one score per sample, kind: values for a "
            "regression output, or set axis to the class axis",
        )
    picked_ref, picked_out = ref.argmax(axis), out.argmax(axis)  # [N, positions...]
    same = picked_ref == picked_out
    positions = int(np.prod(same.shape[1:]))
    classes = int(ref.shape[axis])
    found: dict[str, Any] = {
        "axis": spec.axis,
        "classes": classes,
        "positions": positions,
        "top1": float(same.mean()) if same.size else None,
        **confusion(picked_ref.ravel(), picked_out.ravel(), classes),
    }
    if positions > 1 or spec.ctc_blank is not None:
        whole = same.reshape(len(same), -1).all(axis=1)
        if spec.ctc_blank is not None:
            if same.ndim != 2:
                raise EdgeflowError(
                    f"{_where(name, 'ctc_blank')}: CTC decoding needs one position axis "
                    f"([batch, T, C]); output '{name}' has {list(ref.shape[1:])} per sample",
                    "remove ctc_blank, or declare the output of a sequence recogniser",
                )
            if spec.ctc_blank >= ref.shape[axis]:
                raise EdgeflowError(
                    f"{_where(name, 'ctc_blank')}: class {spec.ctc_blank} does not exist "
                    f"(output '{name}' has {ref.shape[axis]} classes)",
                    "set ctc_blank to the blank class's index, usually 0 or the last",
                )
            whole = np.array(
                [
                    _ctc(a, spec.ctc_blank) == _ctc(b, spec.ctc_blank)
                    for a, b in zip(picked_ref, picked_out, strict=True)
                ],
                dtype=bool,
            )
            found["ctc_blank"] = spec.ctc_blank
        found["sequence"] = float(whole.mean()) if whole.size else None
        found["sequences_matched"] = int(whole.sum())
        found["sequences"] = int(whole.size)
    return found


# Up to this many classes the report gets the whole source x artifact confusion matrix;
# beyond, the agreement per source class only (a 1000x1000 matrix is no picture).
CONFUSION_MAX_CLASSES = 32


def confusion(source: np.ndarray, artifact: np.ndarray, classes: int) -> dict[str, Any]:
    """Which class the artifact picked for each class the source model picked: per source
    class, how often it was picked and how often the artifact agreed; with few classes, the
    whole matrix (rows: source class, columns: artifact class)."""
    counts = np.bincount(source, minlength=classes)
    agreed = np.bincount(source[source == artifact], minlength=classes)
    found: dict[str, Any] = {"per_class": {"picked": counts.tolist(), "agreed": agreed.tolist()}}
    if classes <= CONFUSION_MAX_CLASSES:
        matrix = np.zeros((classes, classes), dtype=np.int64)
        np.add.at(matrix, (source, artifact), 1)
        found["confusion"] = matrix.tolist()
    return found


def _ctc(path: np.ndarray, blank: int) -> tuple[int, ...]:
    """A greedy CTC decode: repeats collapsed, then the blank removed."""
    kept = [int(c) for i, c in enumerate(path) if i == 0 or c != path[i - 1]]
    return tuple(c for c in kept if c != blank)


def _embedding(
    name: str, spec: EmbeddingOutput, ref: np.ndarray, out: np.ndarray
) -> dict[str, Any]:
    """Cosine similarity of the artifact's vectors with the source's (per sample: the mean
    over its positions, for a [batch, T, D] output); with `pairs`, retrieval among the
    samples by each side's own embeddings."""
    native = spec.axis if spec.axis >= 0 else ref.ndim + spec.axis
    moved = spec.batch_first(spec.axis, ref.ndim) if 0 <= native < ref.ndim else None
    if moved is None or not 0 < moved < ref.ndim:
        raise EdgeflowError(
            f"{_where(name, 'axis')}: an embedding over axis {spec.axis}, but output '{name}' "
            f"has shape {list(ref.shape[1:])} per sample",
            "set axis to the embedding's axis (-1, the last, is the default)",
        )
    source = _unit(np.moveaxis(ref, moved, -1).reshape(len(ref), -1, ref.shape[moved]))
    artifact = _unit(np.moveaxis(out, moved, -1).reshape(len(out), -1, out.shape[moved]))
    cosine = np.sum(source * artifact, axis=-1)  # [N, positions]
    both_zero = ~source.any(-1) & ~artifact.any(-1)
    per_sample = np.where(both_zero, 1.0, cosine).mean(axis=1)
    found: dict[str, Any] = {
        "cosine_min": float(per_sample.min()) if per_sample.size else None,
        "cosine_mean": float(per_sample.mean()) if per_sample.size else None,
        "positions": int(cosine.shape[1]),
    }
    if spec.pairs:
        found["retrieval"] = _retrieval(name, spec.pairs, source, artifact)
    return found


def _unit(vectors: np.ndarray) -> np.ndarray:
    """Each vector over the last axis scaled to length 1 (a zero vector stays zero)."""
    vectors = vectors.astype(np.float64)
    norms = np.linalg.norm(vectors, axis=-1, keepdims=True)
    return np.divide(vectors, norms, out=np.zeros_like(vectors), where=norms > 0)


def _retrieval(
    name: str, pairs: list[tuple[int, int]], source: np.ndarray, artifact: np.ndarray
) -> dict[str, Any]:
    """For each (query, match) pair, the match's rank among every other sample by cosine
    similarity to the query (1: retrieved first), from the source's and from the artifact's
    own embeddings; one vector per sample."""
    count = len(source)
    if source.shape[1] != 1:
        raise EdgeflowError(
            f"{_where(name, 'pairs')}: retrieval compares one embedding per sample; output "
            f"'{name}' has {source.shape[1]} per sample",
            "pool the embeddings in the model (a mean over the tokens), or remove pairs",
        )
    outside = [(q, m) for q, m in pairs if q >= count or m >= count]
    if outside:
        raise EdgeflowError(
            f"{_where(name, 'pairs')}: pair {list(outside[0])} names a sample past the "
            f"{count} evaluated",
            f"give sample indices below {count}, or evaluate more samples",
        )

    def ranks(vectors: np.ndarray) -> np.ndarray:
        flat = vectors[:, 0, :]
        found = []
        for query, match in pairs:
            similar = flat @ flat[query]
            similar[query] = -np.inf  # the query is not its own candidate
            found.append(1 + int(np.sum(similar > similar[match])))
        return np.array(found)

    by_source, by_artifact = ranks(source), ranks(artifact)
    return {
        "pairs": len(pairs),
        "candidates": count - 1,
        "recall_at_1_source": float(np.mean(by_source == 1)),
        "recall_at_1_artifact": float(np.mean(by_artifact == 1)),
        "mean_rank_source": float(by_source.mean()),
        "mean_rank_artifact": float(by_artifact.mean()),
        "rank_kept": float(np.mean(by_source == by_artifact)),
    }


def _probability(spec: ProbabilityOutput, ref: np.ndarray, out: np.ndarray) -> dict[str, Any]:
    same = (ref >= spec.threshold) == (out >= spec.threshold)
    per_sample = same.reshape(len(same), -1)
    return {
        "threshold": spec.threshold,
        "decision": float(same.mean()) if same.size else None,
        "decisions_per_sample": int(per_sample.shape[1]),
        "decision_flips": int((~same).sum()),
        "positive_rate": float((ref >= spec.threshold).mean()) if same.size else None,
    }


def head_to_detections(
    head: np.ndarray, spec: DetectionsOutput
) -> tuple[list[np.ndarray], np.ndarray, np.ndarray]:
    """The padded detections form of a raw head's candidates (those scoring at least the
    threshold), and its boxes and scores slices ([B, N, 4], [B, N, S]) for their own SQNR."""
    layout = spec.batch_first(spec.axis, head.ndim)  # the head is batch-first
    rows = np.moveaxis(head, 1, -1) if layout == 1 else head  # [B, N, F]
    boxes = rows[..., spec.boxes : spec.boxes + 4].astype(np.float32)
    scores = rows[..., spec.scores.start : spec.scores.stop].astype(np.float32)
    if spec.box_format == "cxcywh":
        centre, size = boxes[..., :2], boxes[..., 2:]
        boxes = np.concatenate([centre - size / 2, centre + size / 2], axis=-1)
    weighted = (
        scores * rows[..., spec.objectness : spec.objectness + 1]
        if (spec.objectness is not None)
        else scores
    )
    score = weighted.max(-1)
    form = [boxes, score, weighted.argmax(-1).astype(np.int64), score >= spec.score_threshold]
    return form, rows[..., spec.boxes : spec.boxes + 4], scores


def _layout_fits(name: str, spec: DetectionsOutput, ref: np.ndarray) -> None:
    layout = spec.batch_first(spec.axis, ref.ndim) if ref.ndim == 3 else None
    features = ref.shape[layout] if layout is not None else None
    needed = max(
        spec.boxes + 4,
        spec.scores.stop or spec.scores.start + 1,
        (spec.objectness or 0) + 1,
    )
    if features is None or features < needed:
        raise EdgeflowError(
            f"{_where(name, 'kind')}: a detector head [batch, N, features] (or [batch, features,"
            f" N] with axis: 1) with at least {needed} features on axis {spec.axis}; output "
            f"'{name}' has {list(ref.shape[1:])} per sample"
            + (f" (batch_axis: {spec.batch_axis})" if spec.batch_axis else ""),
            "set axis, boxes, scores and objectness to the head's layout",
        )


def _detections(
    name: str, spec: DetectionsOutput, ref: np.ndarray, out: np.ndarray, boxes: BoxMatching
) -> dict[str, Any]:
    from edgeflow.verify.detections import compare, from_arrays

    _layout_fits(name, spec, ref)
    ref_form, ref_boxes, ref_scores = head_to_detections(ref, spec)
    out_form, out_boxes, out_scores = head_to_detections(out, spec)
    slots = ref_form[0].shape[1]
    c = boxes.checks
    matched = compare(
        from_arrays(ref_form, slots),
        from_arrays(out_form, slots),
        boxes.image_size,
        c.box_atol,
        c.box_units,
        c.score_atol,
    )
    matched.pop("per_image")
    return {
        "score_threshold": spec.score_threshold,
        "detections": matched,
        "parts": {
            "boxes": {"sqnr_db": sqnr_db(ref_boxes, out_boxes)},
            "scores": {"sqnr_db": sqnr_db(ref_scores, out_scores)},
        },
    }
