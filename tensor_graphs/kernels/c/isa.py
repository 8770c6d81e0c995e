"""The instruction path a C library takes, chosen at run time: one library built for every
x86 CPU probes which of its paths this CPU runs (``tg_*_isa_supported``), takes the widest,
and lets an environment variable force a narrower one (so the narrow paths are tested on a
CPU that has wider ones). One rule for every library with such paths (``quant_dyn``'s int8
GEMM, ``quant_lowp``'s float16/int4 GEMM)."""

from __future__ import annotations

import ctypes
import os

from tensor_graphs.errors import ArgumentError
from tensor_graphs.kernels.c import lib
from tensor_graphs.kernels.c.lib import I32


class InstructionPaths:
    """The paths ``paths`` (name -> the code the C side takes, widest first) of the library
    ``library``, probed by its C function ``probe``, forced by the variable ``env``; ``what``
    names the kernels in errors."""

    def __init__(self, library: str, probe: str, env: str, paths: dict[str, int], what: str):
        self.library, self.probe, self.env, self.paths, self.what = (library, probe, env,
                                                                     paths, what)
        self._chosen: dict[str, int] = {}

    def supported(self, name: str) -> bool:
        """Whether this CPU runs the path ``name``."""
        fn = lib.func(self.library, self.probe, I32)
        fn.restype = ctypes.c_int
        return bool(fn(self.paths[name]))

    def code(self) -> int:
        """The code of the path the kernels take now: the environment variable's (unset or
        "auto": the widest this CPU runs). Read at each call, decided once per value."""
        want = os.environ.get(self.env, "auto").strip().lower() or "auto"
        found = self._chosen.get(want)
        if found is not None:
            return found
        if want == "auto":
            found = next(code for name, code in self.paths.items() if self.supported(name))
        elif want not in self.paths:
            raise ArgumentError(f"{self.env}={want!r}: {self.what}'s paths are "
                                f"{', '.join(self.paths)} or auto (the widest this CPU runs)")
        elif not self.supported(want):
            best = next(name for name in self.paths if self.supported(name))
            raise ArgumentError(f"{self.env}={want}: this CPU does not run that path; its "
                                f"widest is {best} (unset {self.env} to use it)")
        else:
            found = self.paths[want]
        self._chosen[want] = found
        return found

    def name(self) -> str:
        """The name of the path the kernels take now."""
        code = self.code()
        return next(name for name, c in self.paths.items() if c == code)
