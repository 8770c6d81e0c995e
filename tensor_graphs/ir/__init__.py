"""The IR: dtypes, symbolic shapes, hash-consed nodes, the op table and the reference
interpreter."""
