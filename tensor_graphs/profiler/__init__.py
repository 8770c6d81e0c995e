"""The profiler: measure kernels (measure.py), fill what a plan misses (missing.py), and the
``tg profile`` walk over a graph's kernels and paths (walk.py)."""
