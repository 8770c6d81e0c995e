"""Rewriting: canonical form and digests, the pattern language and rule tables,
simplification, equivalent graphs, and repeated-block discovery."""

from tensor_graphs.rewrite.canonical import (  # noqa: F401
    canonical_hash,
    canonicalize,
    digests,
    structural_hash,
)
from tensor_graphs.rewrite.pattern import RewriteError, Rule, RuleTable, apply  # noqa: F401
