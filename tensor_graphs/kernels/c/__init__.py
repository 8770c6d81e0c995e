"""The C backend: kernels written in C, compiled with the system compiler on first use.

``build.py`` compiles and caches libraries (``load_library``; also used by the generated-C
code generator); ``lib.py`` loads this folder's own ``*.c`` files lazily; ``unary.py``,
``norms.py``, ``matmul.py``, ``gemm.py``, ``attention.py``, ``gather.py``, ``pointwise.py``
(a decode's mask and position steps), ``concat.py``, ``scatter.py`` (scatter-add of
rows: an embedding's gradient), ``strided_matmul.py``, ``reduce_sum.py`` and ``bool_cast.py``
(a backward pass's products of views, sums and mask cast) register the kernels (``c_<what>``).
Importing registers them and compiles nothing: a missing or failing compiler shows up as
``available() is False`` and as a failed ``where`` constraint on every C kernel, so the
planner uses other backends.
"""

from tensor_graphs.errors import CCompileError  # noqa: F401
from tensor_graphs.kernels.c import (  # noqa: F401  (register the kernels)
    attention,
    bool_cast,
    concat,
    gather,
    gemm,
    matmul,
    norms,
    pointwise,
    quant,
    random,
    reduce_sum,
    scatter,
    strided_matmul,
    unary,
)
from tensor_graphs.kernels.c.build import (  # noqa: F401
    available,
    load_library,
    unavailable_reason,
)
from tensor_graphs.kernels.c.codegen import (  # noqa: F401,E402  (generated C, on demand)
    elementwise_region,
    emit_c,
    fuse_elementwise,
)
