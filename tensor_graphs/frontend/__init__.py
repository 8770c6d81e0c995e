"""Frontends: other frameworks' programs as tensor graphs (``tg.from_torch``)."""

from tensor_graphs.frontend.aten import ATEN, UnsupportedOpError  # noqa: F401
from tensor_graphs.frontend.torch_export import (  # noqa: F401
    TorchProgram,
    from_torch,
    import_exported,
)

__all__ = ["ATEN", "TorchProgram", "UnsupportedOpError", "from_torch", "import_exported"]
