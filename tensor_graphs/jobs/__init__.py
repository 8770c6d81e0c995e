"""The main job, ``tg run``: real models end to end (import, plan, profile, run, report).

Each model module knows one model and how to load it offline; ``cli.py`` is the command.
The compiler and the importer know no model: everything model-specific lives here.
"""
