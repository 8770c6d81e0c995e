"""Running plans: CompiledGraph (runtime/program.py)."""
