"""Rewriting: canonical form and digests, the pattern language and rule tables,
simplification, equivalent graphs, and repeated-block discovery."""

from tensor_graphs.rewrite.blocks import BlockGroup, BlockInstance, find_repeated_blocks  # noqa: F401
from tensor_graphs.rewrite.canonical import (  # noqa: F401
    canonical_hash,
    canonicalize,
    digests,
    structural_hash,
)
from tensor_graphs.rewrite.enumerate import equivalents  # noqa: F401,E402
from tensor_graphs.rewrite.pattern import RewriteError, Rule, RuleTable, apply  # noqa: F401
from tensor_graphs.rewrite.simplify import (  # noqa: F401,E402  (the function shadows the module)
    pm_algebra,
    pm_cast,
    pm_fold,
    pm_marks,
    pm_movement,
    pm_simplify,
    simplify,
)
