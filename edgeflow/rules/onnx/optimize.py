"""onnx.optimize: run named onnxoptimizer passes (fusions and eliminations)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any, ClassVar

from pydantic import AfterValidator

from edgeflow.core.onnxgraph import copy_model, op_counts, same_graph
from edgeflow.rules.base import OnnxRule, RewriteContext, RuleOptions, RuleResult, Site

if TYPE_CHECKING:
    import onnx


MAX_ROUNDS = 8


def _known_pass(name: str) -> str:
    """An onnxoptimizer pass name, or a located error with the closest valid one."""
    import onnxoptimizer

    from edgeflow.core.suggest import did_you_mean
    from edgeflow.schema.sections import user_error

    known = onnxoptimizer.get_available_passes()
    if name not in known:
        raise user_error(f"unknown onnxoptimizer pass '{name}'", did_you_mean(name, known))
    return name


class Optimize(OnnxRule):
    name = "onnx.optimize"
    description = "Run onnxoptimizer passes (default: its fuse-and-elimination set)."

    class Options(RuleOptions):
        """passes: onnxoptimizer pass names, run in order (None: its fuse-and-elimination
        passes); fixed_point: repeat them until nothing changes."""

        passes: list[Annotated[str, AfterValidator(_known_pass)]] | None = None
        fixed_point: bool = False

    example: ClassVar[tuple[str, str] | None] = (
        "Conv -> BatchNormalization -> Identity -> Relu",
        "Conv (BN folded into its weights) -> Relu",
    )

    def tolerance(self, opts: Any) -> float | None:
        fusing = opts.passes is None or any(p.startswith("fuse") for p in opts.passes)
        return 1e-4 if fusing else 1e-5

    def apply(
        self, model: onnx.ModelProto, opts: Options, ctx: RewriteContext
    ) -> RuleResult[onnx.ModelProto]:
        import onnxoptimizer

        from edgeflow.core.errors import EdgeflowError

        passes = opts.passes if opts.passes is not None else self.default_passes()
        out = copy_model(model)
        # One run of the passes can enable another (a fusion leaves arithmetic a second run
        # folds): repeat until the graph stops changing, so applying the rule twice is a no-op.
        converged = False
        for _ in range(MAX_ROUNDS):
            try:
                nxt = onnxoptimizer.optimize(out, passes, opts.fixed_point)
            except Exception as exc:  # onnxoptimizer raises plain RuntimeErrors from C++
                raise EdgeflowError(
                    f"onnxoptimizer failed: {exc}",
                    "drop the pass named in the message, or run onnx.simplify instead",
                ) from exc
            if same_graph(nxt, out):
                converged = True
                break
            out = nxt
        if same_graph(out, model):
            nothing = Site.not_applicable(f"{len(passes)} passes changed nothing")
            return RuleResult(copy_model(model), sites=[nothing])
        sites = graph_sites(model, out)
        if not converged:
            sites.append(Site.kept("", f"still changing after {MAX_ROUNDS} rounds of the passes"))
        return RuleResult(out, matches=_removed(model, out), sites=sites)

    @staticmethod
    def default_passes() -> list[str]:
        import onnxoptimizer

        return list(onnxoptimizer.get_fuse_and_elimination_passes())


def _removed(before: onnx.ModelProto, after: onnx.ModelProto) -> int:
    return max(0, sum(op_counts(before).values()) - sum(op_counts(after).values()))


def op_sites(before: onnx.ModelProto, after: onnx.ModelProto) -> list[Site]:
    """A changed site per op type whose node count changed ('BatchNormalization': 2 -> 0)."""
    a, b = op_counts(before), op_counts(after)
    return [
        Site.changed(op, f"{a[op]} -> {b[op]} nodes")
        for op in sorted(a.keys() | b.keys())
        if a[op] != b[op]
    ]


def graph_sites(before: onnx.ModelProto, after: onnx.ModelProto) -> list[Site]:
    """What a whole-graph pass changed: per op type, or the graph as a whole (rewired,
    constants folded) when no count changed."""
    total = sum(op_counts(after).values())
    return op_sites(before, after) or [Site.changed("", f"{total} nodes, none removed")]
