"""The IR: dtypes, symbolic shapes, hash-consed nodes, the op table and the reference
interpreter."""

# Import the API first, whatever module of the IR is asked for: node.py binds it for the fluent
# methods, and composites registered while it loads already call those methods.
from tensor_graphs.ir import api  # noqa: F401
