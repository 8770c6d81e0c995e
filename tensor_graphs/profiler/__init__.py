"""The profiler: measure kernels (measure.py) and fill what a plan misses (missing.py), for
``tg.compile(..., profile="missing")`` below the compiler. ``tg profile``'s walk over a graph's
kernels and paths, which runs whole programs, is ``commands/walk.py``."""
