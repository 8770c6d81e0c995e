"""The measurement database: kernel timings per hardware key, in SQLite (see store.py)."""

from tensor_graphs.db.hardware import Hardware, current
from tensor_graphs.db.store import (
    SCHEMA_VERSION,
    Database,
    Measurement,
    default_path,
    open_db,
    signature_text,
)

__all__ = ["SCHEMA_VERSION", "Database", "Hardware", "Measurement", "current", "default_path",
           "open_db", "signature_text"]
