"""OutOfMemory lives in tensor_graphs.errors with the other errors (tg.OutOfMemory)."""

from tensor_graphs.errors import OutOfMemory  # noqa: F401
