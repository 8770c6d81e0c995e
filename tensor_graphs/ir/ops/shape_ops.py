"""Shape composites and helpers: triu/tril, tile, split/chunk/stack."""

__all__: list[str] = []
