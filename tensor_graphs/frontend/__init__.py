"""Frontends: other frameworks' programs as tensor graphs (``tg.from_torch``,
``tg.from_onnx``). The torch names load torch on first use, so importing the ONNX importer
(``frontend.onnx_import``) needs no torch."""

_TORCH = {
    "ATEN": "tensor_graphs.frontend.aten",
    "UnsupportedOpError": "tensor_graphs.frontend.aten",
    "TorchProgram": "tensor_graphs.frontend.torch_export",
    "from_torch": "tensor_graphs.frontend.torch_export",
    "import_exported": "tensor_graphs.frontend.torch_export",
}


def __getattr__(name: str):
    if name in _TORCH:
        import importlib

        return getattr(importlib.import_module(_TORCH[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["ATEN", "TorchProgram", "UnsupportedOpError", "from_torch", "import_exported"]
