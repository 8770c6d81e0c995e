"""Every test process gets its own measurement database file, never the user's cache."""

import os
import tempfile

# as tensor_graphs.threads sets them, before any test module loads numpy or torch
os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", "4")
os.environ.setdefault("GOMP_SPINCOUNT", "1000")

os.environ.setdefault("TG_DB", os.path.join(tempfile.mkdtemp(prefix="tg-tests-"),
                                            "measurements.sqlite"))
