"""OutOfMemory (to move into tensor_graphs.errors and export as tg.OutOfMemory)."""

from tensor_graphs.errors import TensorGraphsError


class OutOfMemory(TensorGraphsError):  # noqa: N818  (tg.OutOfMemory, as the issue names it)
    """A planned program needs more bytes on a device than it has free: raised before any
    kernel runs. Attributes: ``device``, ``required``, ``available``, ``largest`` (the
    largest tensors on that device, as ``Tensor`` records)."""

    def __init__(self, message: str, device: str = "", required: int = 0, available: int = 0,
                 largest: tuple = ()):
        super().__init__(message)
        self.device = device
        self.required = required
        self.available = available
        self.largest = tuple(largest)
