"""The ``tg`` subcommands built on the whole package (``tg db``, ``tg profile``, ``tg paths``,
``tg explain``) and what only they run: the profile walk and the machine's calibration, which
compile and time whole programs and so sit above the compiler (see docs/ARCHITECTURE.md,
"Layers")."""
