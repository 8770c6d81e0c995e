"""Every test process gets its own measurement database file, never the user's cache."""

import os
import tempfile

os.environ.setdefault("TG_DB", os.path.join(tempfile.mkdtemp(prefix="tg-tests-"),
                                            "measurements.sqlite"))
