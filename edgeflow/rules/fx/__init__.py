"""fx.* rules. RULES lists every built-in rule of this level, in catalogue order."""

from __future__ import annotations

from edgeflow.rules.base import FxRule
from edgeflow.rules.fx.activation import ReplaceActivation
from edgeflow.rules.fx.batchnorm import RemoveBatchnorm
from edgeflow.rules.fx.dropout import RemoveDropout
from edgeflow.rules.fx.fuse import FuseConvBn
from edgeflow.rules.fx.pattern import ReplacePattern
from edgeflow.rules.fx.wrap import WrapLeaf

# wrap_leaf first: it decides how the module is traced, which the other rules then rewrite.
RULES: tuple[type[FxRule], ...] = (
    WrapLeaf,
    FuseConvBn,
    RemoveBatchnorm,
    RemoveDropout,
    ReplaceActivation,
    ReplacePattern,
)
