"""Checks across recipe sections and the resolved target, run even when other sections fail.

Each check reads the sections it needs (those that validated) and returns (dotted key,
message, hint) for every problem; the loader locates them. A check whose sections did not
validate is skipped: their own problems are reported instead.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from edgeflow.targets.profile import TargetProfile
from edgeflow.targets.registry import offering
from edgeflow.verify.judge import PER_OUTPUT, thresholds

Found = tuple[str, str, str]
Sections = Mapping[str, Any]  # section name -> its validated model (those a check declares)


def calibration_for_int8(s: Sections, profile: TargetProfile | None) -> list[Found]:
    if "quantization" not in s or "calibration" not in s:
        return []
    q = s["quantization"]
    if q.mode == "int8" and q.method != "qat" and s["calibration"] is None:
        return [
            (
                "quantization.mode",
                "int8 quantization needs a calibration dataset",
                "add calibration: {dataset: ..., split: ..., samples: 256}",
            )
        ]
    return []


def thresholds_fit_the_metric(s: Sections, profile: TargetProfile | None) -> list[Found]:
    if "evaluation" not in s or "verify" not in s:
        return []
    metric, verify = s["evaluation"].metric, s["verify"]
    if metric == "top1":
        return []
    refused = ["max_accuracy_drop"]  # needs labels
    if metric == "detections":
        refused += ["max_abs_diff", "max_relative_diff", "min_top1_agreement", "min_sqnr_db"]
        refused += ["min_decision_agreement", "min_sequence_agreement", "min_cosine_similarity"]
    hint = (
        "detections are checked by verify.detections (box_atol, score_atol, min_match_rate); "
        "remove this key"
        if metric == "detections"
        else "accuracy needs labels (metric: top1); use max_relative_diff, max_abs_diff or "
        "min_top1_agreement, or remove this key"
    )
    return [
        (f"verify.{key}", f"does not apply to evaluation.metric: {metric}", hint)
        for key in refused
        if key in verify.model_fields_set and getattr(verify, key) is not None
    ]


DEFAULT_NAME = re.compile(r"output(_\d+)?")
# The per-output thresholds and the declared kind each needs: the judge's own table.
THRESHOLD_KINDS = {key: kinds[0] for key, kinds, _, _ in PER_OUTPUT}


def outputs_are_the_models(s: Sections, profile: TargetProfile | None) -> list[Found]:
    """evaluation.outputs names outputs the model has (where the recipe can tell which) and
    does not come with the padded detections form, which is compared as a whole."""
    from edgeflow.core.suggest import did_you_mean

    if "evaluation" not in s or not s["evaluation"].outputs:
        return []
    evaluation = s["evaluation"]
    if evaluation.metric == "detections":
        return [
            (
                "evaluation.outputs",
                "does not apply to evaluation.metric: detections (the boxes, scores, labels, "
                "valid form is matched as a whole)",
                "remove evaluation.outputs; for a raw detector head use metric: agreement and "
                "declare the head's output {kind: detections, ...}",
            )
        ]
    source = s.get("source")
    if source is None:
        return []
    found = []
    for name in evaluation.outputs:
        if source.outputs is not None and name not in source.outputs:
            hint = did_you_mean(name, source.outputs) or "use a name from source.outputs"
            found.append((f"evaluation.outputs.{name}", f"source.outputs has no '{name}'", hint))
        elif (
            source.outputs is None and source.kind == "pytorch" and not DEFAULT_NAME.fullmatch(name)
        ):
            found.append(
                (
                    f"evaluation.outputs.{name}",
                    f"the exported outputs are named output, output_0, output_1, ... (no "
                    f"source.outputs), not '{name}'",
                    "name the model's outputs in source.outputs, or use the exported name",
                )
            )
    return found


def thresholds_fit_the_kinds(s: Sections, profile: TargetProfile | None) -> list[Found]:
    """A per-output threshold that no declared output can give (every output of source.outputs
    is declared, none of the kind it reads): refused here, not a figure that means nothing."""
    if "evaluation" not in s or "verify" not in s or s.get("source") is None:
        return []
    declared, named = s["evaluation"].outputs, s["source"].outputs
    if not named or any(name not in declared for name in named):
        return []  # some output is judged by its shape at verify: the report says
    kinds = {declared[name].kind for name in named}
    found = []
    for key, kind in THRESHOLD_KINDS.items():
        if getattr(s["verify"], key) is not None and kind not in kinds:
            listed = ", ".join(f"{name}: {declared[name].kind}" for name in named)
            found.append(
                (
                    f"verify.{key}",
                    f"measures {kind} outputs, and evaluation.outputs declares none ({listed})",
                    f"remove verify.{key}; verify.min_sqnr_db holds for every output",
                )
            )
    return found


def quantization_fits_the_target(s: Sections, profile: TargetProfile | None) -> list[Found]:
    if profile is None or "quantization" not in s:
        return []
    q, found = s["quantization"], []
    if q.mode not in profile.quantization:
        why = profile.family.refused_modes.get(q.mode)
        found.append(
            (
                "quantization.mode",
                f"target '{profile.name}' does not support mode '{q.mode}'"
                + (f": {why}" if why else ""),
                "choose one: "
                + " or ".join(f"quantization.mode={m}" for m in profile.quantization),
            )
        )
    family = profile.family
    if q.mode == "int8_weights" and q.reduce_range is True and family.quantizes_itself:
        found.append(
            (
                "quantization.reduce_range",
                f"7-bit weights are onnxruntime's; {family.converter} stores 8-bit ones for "
                f"target '{profile.name}'",
                "remove quantization.reduce_range (or set it to auto)",
            )
        )
    if q.method == "qat" and not family.qat:
        qat = offering(lambda b: b.qat)
        found.append(
            (
                "quantization.method",
                f"target '{profile.name}' cannot take a QAT model's own scales: its converter "
                f"({family.converter}) calibrates again and cannot carry Q/DQ scales into a "
                f"{family.artifact} file",
                f"use {' or '.join(qat)}, which run the exported Q/DQ as it is",
            )
        )
    if q.mode == "int8":
        found += _calibration_method(s, q, profile)
    if q.activations == "int16" and (q.mode != "int8" or not family.int16_activations):
        sixteen = offering(lambda b: b.int16_activations)
        found.append(
            (
                "quantization.activations",
                f"int16 activations need quantization.mode int8 and a target whose runtime "
                f"has 16x8 kernels ({', '.join(sixteen)}); got mode {q.mode}, target "
                f"{profile.name}",
                f"set quantization.activations: int8, or choose {' or '.join(sixteen)}",
            )
        )
    return found


def _calibration_method(s: Sections, q: Any, profile: TargetProfile) -> list[Found]:
    """The methods the target's family calibrates with (Backend.calibration): the TFLite
    family minmax, percentile or mse (edgeflow's own ranges, for int8 activations through
    ONNX); onnxruntime's calibrators minmax, entropy or percentile."""
    from edgeflow.schema.source import conversion_path

    key, method, family = "quantization.method", q.method, profile.family
    if method == "qat":
        return []
    if method not in family.calibration:
        why = f"target '{profile.name}' calibrates with {_either(family.calibration)}, not {method}"
        if method == "mse":
            why += (
                f" (mse ranges are set for {', '.join(offering(lambda b: 'mse' in b.calibration))})"
            )
        return [(key, why, "set quantization.method: percentile")]
    source, convert = s.get("source"), s.get("convert")
    via = convert.via if convert is not None else None
    native = source is not None and conversion_path(source.kind, via, family.tensorflow_native, q)
    if method in ("percentile", "mse") and q.activations == "int16":
        why = f"{method} ranges are set for int8 activations; 16x8 takes min/max"
        return [(key, why, "set quantization.method: minmax")]
    if method in ("percentile", "mse") and native == "tensorflow_native":
        why = f"{method} ranges are set on the ONNX path; TensorFlow's own converter takes min/max"
        return [(key, why, "set convert.via: onnx")]
    return []


def native_quantization(s: Sections, profile: TargetProfile | None) -> list[Found]:
    """What TensorFlow's own converter does not do, asked of a recipe that names it
    (convert.via: native): the fallback search and float outputs run on the ONNX path's
    files; a native build would ignore them. Left unset, such a recipe takes the ONNX path."""
    from edgeflow.schema.source import conversion_path, onnx_only_settings

    source, convert, q = s.get("source"), s.get("convert"), s.get("quantization")
    if profile is None or source is None or q is None:
        return []
    via = convert.via if convert is not None else None
    native = profile.family.tensorflow_native
    if conversion_path(source.kind, via, native, q) != "tensorflow_native":
        return []
    return [
        (
            key,
            "applies on the ONNX path; TensorFlow's own converter (convert.via: native) has none",
            "set convert.via: onnx",
        )
        for key in onnx_only_settings(q)
        if key != "quantization.method"  # method_fits_the_target says why
    ]


def fallback_has_a_budget(s: Sections, profile: TargetProfile | None) -> list[Found]:
    """quantization.fallback: auto needs a target that builds mixed files and a threshold
    the search can measure (edgeflow.verify.judge: the int8 thresholds on the outputs)."""
    if "quantization" not in s or s["quantization"].fallback == "none":
        return []
    found = []
    if profile is not None and not profile.family.fallback:
        found.append(
            (
                "quantization.fallback",
                f"target '{profile.name}' cannot keep layers float in an int8 build",
                "remove quantization.fallback, or choose one of "
                + ", ".join(offering(lambda b: b.fallback)),
            )
        )
    measurable = "evaluation" in s and "verify" in s
    labelled = measurable and s["evaluation"].metric == "top1"
    if measurable and not thresholds(s["verify"], "int8").quality(labelled):
        found.append(
            (
                "quantization.fallback",
                "fallback needs a budget: no threshold on the outputs is set for int8 builds "
                "(verify.min_sqnr_db is null, and none of max_relative_diff, max_abs_diff, "
                "min_top1_agreement, min_decision_agreement, min_sequence_agreement, "
                "min_cosine_similarity, task_metric is set)",
                "set verify.by_mode.int8.min_sqnr_db or verify.min_top1_agreement",
            )
        )
    return found


def board_of_the_target(s: Sections, profile: TargetProfile | None) -> list[Found]:
    from edgeflow.core.suggest import did_you_mean

    if profile is None or "precheck" not in s:
        return []
    board = s["precheck"].board
    if board is None or board in profile.boards:
        return []
    hint = did_you_mean(board, list(profile.boards)) or "this target defines no boards"
    return [("precheck.board", f"target '{profile.name}' has no board '{board}'", hint)]


def onnx_source_reads(s: Sections, profile: TargetProfile | None) -> list[Found]:
    """An ONNX source parses, its graph is well formed, its initializers hold their data and
    its weights fit in memory (nothing of it runs; its external data files are only stat'ed)."""
    from edgeflow.core.onnxfile import hint_for, onnx_problems

    source = s.get("source")
    if source is None or source.kind != "onnx":
        return []
    file, problems = source.model.name, onnx_problems(source.model)
    return [
        ("source.model", f"{file} is not a readable ONNX model: {p}", hint_for([p]))
        for p in problems
    ]


def weights_are_a_checkpoint(s: Sections, profile: TargetProfile | None) -> list[Found]:
    """A PyTorch source's weights file is a torch.save checkpoint, by its first bytes."""
    from edgeflow.checkpoint import WEIGHTS_HINT, checkpoint_problem

    source = s.get("source")
    if source is None or source.kind != "pytorch" or source.weights is None:
        return []
    problem = checkpoint_problem(source.weights)
    return [("source.weights", f"{source.weights.name} {problem}", WEIGHTS_HINT)] if problem else []


def inputs_fit_the_model(s: Sections, profile: TargetProfile | None) -> list[Found]:
    """An ONNX source's declared inputs against its graph's: names, dtypes, ranks, and the
    sizes of its fixed dims (its -1, 0 and symbolic dims take the recipe's)."""
    from edgeflow.core.onnxfile import onnx_problems
    from edgeflow.core.onnxgraph import graph_inputs
    from edgeflow.core.suggest import did_you_mean
    from edgeflow.schema.signatures import SHAPE_HINT, shape_clash

    source = s.get("source")
    if source is None or source.kind != "onnx" or onnx_problems(source.model):
        return []  # an unreadable model: onnx_source_reads says why
    # an input that is also an initializer (a weight, in an IR-3 file) may be fed too
    required = graph_inputs(source.model)
    model = {**graph_inputs(source.model, overridable=True), **required}
    file, found = source.model.name, []
    for i, spec in enumerate(source.inputs):
        key = f"source.inputs[{i}]"
        if spec.name not in model:
            hint = did_you_mean(spec.name, list(model)) or "name the inputs after the model's"
            found.append((f"{key}.name", f"{file} has no input '{spec.name}'", hint))
            continue
        dtype, dims = model[spec.name]
        if dtype != spec.dtype:
            found.append(
                (
                    f"{key}.dtype",
                    f"'{spec.name}' is {dtype} in {file}, the recipe has {spec.dtype}",
                    f"set dtype: {dtype}",
                )
            )
        clash = shape_clash(dims, spec)
        if clash:
            found.append((f"{key}.shape", f"'{spec.name}': {clash} in {file}", SHAPE_HINT))
    declared = {spec.name for spec in source.inputs}
    for name, (dtype, dims) in required.items():
        if name not in declared:
            found.append(
                (
                    "source.inputs",
                    f"{file} has input '{name}' ({dtype} {dims}) that source.inputs does not "
                    "declare",
                    f"add {{name: {name}, shape: [...], dtype: {dtype}}} (value: ... binds a "
                    "constant)",
                )
            )
    return found


def datasets_fit_the_inputs(s: Sections, profile: TargetProfile | None) -> list[Found]:
    """A .npz / .npy dataset's file kind and arrays (their headers) against the fed inputs:
    every axis but the batch axis of the declared shape (datasets from code are checked when
    loaded)."""
    from pathlib import Path

    from edgeflow.schema.sections import data_inputs

    source = s.get("source")
    if source is None:
        return []
    fed, found = data_inputs(source.inputs, source.state), []
    for section in ("calibration", "evaluation"):
        spec = s.get(section)
        if spec is None or not isinstance(spec.dataset, Path):
            continue
        # numpy reads the headers: imported only for a dataset file (a cached run needs none)
        from edgeflow.core.filekinds import file_problem
        from edgeflow.data import FILE_HINT, SHAPE_HINT, array_shapes, shape_mismatch

        problem = file_problem(spec.dataset)
        if problem:
            found.append((f"{section}.dataset", f"{spec.dataset.name} {problem}", FILE_HINT))
            continue
        shapes = array_shapes(spec.dataset)
        if "__single__" in shapes and len(fed) == 1:
            shapes = {fed[0].name: shapes["__single__"]}
        if not shapes or "__single__" in shapes:
            continue  # unreadable, or a .npy for several inputs: loading it says so
        for tensor in fed:
            if tensor.name not in shapes:
                found.append(
                    (
                        f"{section}.dataset",
                        f"{spec.dataset.name} has no array named '{tensor.name}' "
                        f"(has: {', '.join(shapes) or 'nothing'})",
                        "name the dataset's arrays after the recipe's source.inputs",
                    )
                )
                continue
            mismatch = shape_mismatch(shapes[tensor.name], tensor, bool(source.state))
            if mismatch:
                found.append((f"{section}.dataset", f"{spec.dataset.name}: {mismatch}", SHAPE_HINT))
    return found


def paths_fit_the_source(s: Sections, profile: TargetProfile | None) -> list[Found]:
    """What runs for this source: convert.via only for tensorflow sources, and native only to
    the TFLite family; ast/fx rules only for PyTorch code; onnx rules, export and state only
    where an ONNX graph is made."""
    from edgeflow.schema.source import conversion_path

    source = s.get("source")
    if source is None:
        return []
    kind, found = source.kind, []
    convert = s.get("convert")
    via = convert.via if convert is not None else None
    if via is not None and kind != "tensorflow":
        found.append(
            (
                "convert.via",
                f"convert.via picks the path of a tensorflow source; this is a {kind} source",
                "remove convert.via",
            )
        )
    native_elsewhere = profile is not None and not profile.family.tensorflow_native
    if kind == "tensorflow" and via == "native" and native_elsewhere:
        assert profile is not None
        natives = offering(lambda b: b.tensorflow_native)
        found.append(
            (
                "convert.via",
                f"TensorFlow's TFLite converter builds for {', '.join(natives)}; "
                f"target '{profile.name}' is {profile.backend}",
                "set convert.via: onnx (tf2onnx, then the ONNX pipeline), or leave it unset",
            )
        )
    native = profile is not None and conversion_path(
        kind, via, profile.family.tensorflow_native, s.get("quantization")
    ).endswith("native")
    for i, spec in enumerate(s.get("rewrites") or ()):
        level, name = spec.rule.level, spec.rule.name
        if level in ("ast", "fx") and kind != "pytorch":
            found.append(
                (
                    f"rewrites[{i}]",
                    f"'{name}' is an {level} rule: it rewrites PyTorch code before export, and "
                    f"this is a {kind} source",
                    "remove it; onnx.* rules rewrite the ONNX graph every source reaches",
                )
            )
        elif level == "onnx" and native:
            found.append(
                (
                    f"rewrites[{i}]",
                    f"'{name}' rewrites the ONNX graph, and this build converts the TensorFlow "
                    "model with TensorFlow's own TFLite converter: there is no ONNX graph",
                    "set convert.via: onnx (tf2onnx, then the ONNX pipeline with its rules), "
                    "or remove the rule",
                )
            )
    export = s.get("export")
    if export is not None and kind == "pytorch":
        from edgeflow.schema.sections import exporter_opset_problem

        problem = exporter_opset_problem(export)
        if problem:
            found.append(("export.opset", *problem))
    # the opsets each framework's exporter writes: tf2onnx 1.17.0 up to 18, jax2onnx 0.17.1
    # from 18 (its ReduceMean has the opset-18 form at every opset)
    span = {"tensorflow": (13, 18), "jax": (18, 23)}.get(kind)
    if export is not None and span is not None and not native:
        low, high = span
        if not low <= export.opset <= high:
            exporter = "tf2onnx" if kind == "tensorflow" else "jax2onnx"
            found.append(
                (
                    "export.opset",
                    f"{exporter} writes opsets {low} to {high} here, not {export.opset}",
                    f"set export.opset between {low} and {high}",
                )
            )
    if export is not None:
        if kind != "pytorch" and "exporter" in export.model_fields_set:
            found.append(
                (
                    "export.exporter",
                    f"export.exporter picks PyTorch's ONNX exporter; this is a {kind} source",
                    "remove it (a tensorflow source is exported by tf2onnx, a jax one by jax2onnx)",
                )
            )
        if (native or kind == "onnx") and "opset" in export.model_fields_set:
            what = "the model is ONNX already" if kind == "onnx" else "no ONNX is written"
            found.append(
                (
                    "export.opset",
                    f"export.opset is the opset of the exported ONNX graph, and {what}",
                    "remove it" + ("" if kind == "onnx" else ", or set convert.via: onnx"),
                )
            )
    if native and source.state:
        found.append(
            (
                "source.state",
                "a stateful TensorFlow model is streamed through the ONNX path only (its "
                "calibration follows the state in the ONNX model)",
                "set convert.via: onnx",
            )
        )
    return found


@dataclass(frozen=True)
class Check:
    """A check across sections, with the sections it reads: the loader validates those on
    their own when the whole recipe does not (SECTIONS), and hands the check only them."""

    run: Callable[[Sections, TargetProfile | None], list[Found]]
    reads: tuple[str, ...]

    def __call__(self, sections: Sections, profile: TargetProfile | None) -> list[Found]:
        return self.run(Declared(sections, self), profile)


class Declared(Mapping[str, Any]):
    """The sections a check declared; reading another one is a bug in the check (it would be
    left out of SECTIONS, so not validated on its own)."""

    def __init__(self, sections: Sections, check: Check) -> None:
        self._sections, self._check = sections, check

    def _declared(self, key: str) -> str:
        if key not in self._check.reads:
            name = getattr(self._check.run, "__name__", "a check")
            raise AssertionError(f"{name} reads '{key}' without declaring it in CHECKS")
        return key

    def __getitem__(self, key: str) -> Any:
        return self._sections[self._declared(key)]

    def __contains__(self, key: object) -> bool:
        return isinstance(key, str) and self._declared(key) in self._sections

    def __iter__(self) -> Iterator[str]:
        return (k for k in self._check.reads if k in self._sections)

    def __len__(self) -> int:
        return sum(1 for _ in self)


CHECKS: tuple[Check, ...] = (
    Check(calibration_for_int8, ("quantization", "calibration")),
    Check(thresholds_fit_the_metric, ("evaluation", "verify")),
    Check(outputs_are_the_models, ("evaluation", "source")),
    Check(thresholds_fit_the_kinds, ("evaluation", "source", "verify")),
    Check(quantization_fits_the_target, ("quantization", "convert", "source")),
    Check(fallback_has_a_budget, ("quantization", "evaluation", "verify")),
    Check(native_quantization, ("quantization", "convert", "source")),
    Check(board_of_the_target, ("precheck",)),
    Check(onnx_source_reads, ("source",)),
    Check(weights_are_a_checkpoint, ("source",)),
    Check(inputs_fit_the_model, ("source",)),
    Check(datasets_fit_the_inputs, ("source", "calibration", "evaluation")),
    Check(paths_fit_the_source, ("source", "convert", "export", "quantization", "rewrites")),
)
# The sections the checks read, and the target (its profile): validated on their own when the
# whole recipe does not, so that the checks still run.
SECTIONS = tuple(dict.fromkeys(("target", *(k for c in CHECKS for k in c.reads))))


def _either(words: tuple[str, ...] | list[str]) -> str:
    """'a, b or c'."""
    return ", ".join(words[:-1]) + f" or {words[-1]}" if len(words) > 1 else "".join(words)
