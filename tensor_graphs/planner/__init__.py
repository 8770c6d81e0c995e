"""The planner: every way to run a graph, and the cheapest within tolerance (see search.py)."""
