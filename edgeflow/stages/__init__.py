"""The stages, one module each; pipelines/*.yaml put them in order per source kind."""

from __future__ import annotations

from edgeflow.stages import (
    bisect,
    convert,
    diff,
    export,
    html,
    ingest,
    jax_export,
    jax_load,
    load,
    optimize,
    precheck,
    quantize,
    report,
    rewrite,
    rewrite_onnx,
    rewrite_target,
    tf_convert,
    tf_export,
    tf_load,
    verify,
)
from edgeflow.stages.base import Stage

STAGES: dict[str, Stage] = {
    module.STAGE.name: module.STAGE
    for module in (
        load,
        ingest,
        tf_load,
        tf_export,
        tf_convert,
        jax_load,
        jax_export,
        rewrite,
        export,
        rewrite_onnx,
        rewrite_target,
        precheck,
        optimize,
        quantize,
        convert,
        verify,
        report,
        html,
        diff,
        bisect,
    )
}
