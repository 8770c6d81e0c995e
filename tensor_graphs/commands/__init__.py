"""The ``tg`` subcommands built on the whole package: ``tg db`` (db.py), ``tg profile``,
``tg paths`` and ``tg explain`` (profile.py), and what only they run: the profile walk
(walk.py) and the machine's calibration (calibrate.py), which compile and time whole programs
and so sit above the compiler (see docs/ARCHITECTURE.md, "Layers")."""
