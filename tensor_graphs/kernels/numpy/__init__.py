"""The numpy backend: always available, the fallback of every plan.

- ``atomic.py``: ``numpy_<op>`` for every atomic op, at the op's own dtype semantics;
- ``composite.py``: ``numpy_<op>`` for the common composites (activations, softmax family,
  norms, linear, embedding, attention, rotary embedding, conv2d, ...), written in numpy;
- ``exact.py``: ``numpy_exact_<op>`` for every op: the float64 reference, rounded once
  (tolerance 1e-7), so every tolerance >= 1e-7 on float32 outputs has a path;
- ``selection.py``: ``numpy_argsort`` and ``numpy_scatter``, and the verification cases of
  the selection and scatter family;
- ``pointwise.py``: the special functions, integer division and bit and of the pointwise
  families, and their rounding and classification composites in one numpy call.
"""

from tensor_graphs.kernels.numpy import (  # noqa: F401
    atomic,
    composite,
    exact,
    pointwise,
    random,
    selection,
)
