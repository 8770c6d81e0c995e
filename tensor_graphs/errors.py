"""The exception tree. Every error tensor_graphs raises on bad input is a TensorGraphsError,
and its message names the op or leaf, the shapes involved, and what to do about it."""


class TensorGraphsError(Exception):
    """Base class of every error tensor_graphs raises on purpose."""


class ShapeError(TensorGraphsError, ValueError):
    """Shapes that do not fit an op, or a feed whose shape disagrees with its leaf."""


class DTypeError(TensorGraphsError, TypeError):
    """A dtype an op does not accept, or a feed of the wrong kind (int for a float leaf...)."""


class ArgumentError(TensorGraphsError, ValueError):
    """An argument or attribute value an op does not accept (an unknown mode, a bad name...)."""


class SignatureError(ArgumentError, TypeError):
    """An op called with arguments its signature does not take (``tg.clamp(x, -1.0, 1.0)``:
    attributes are keyword-only): names the op, its signature, what was passed and, where
    plain, the call to write. A TypeError too, as Python's own error for a bad call is."""


class FeedError(TensorGraphsError, KeyError):
    """A missing or unknown feed name, or two leaves that share a name."""

    def __str__(self) -> str:  # KeyError would repr() the message
        return str(self.args[0]) if self.args else ""


class DecompositionError(TensorGraphsError):
    """A composite op whose decomposition fails or uses the op itself."""


class StateError(TensorGraphsError):
    """A state whose version chain forks, or an update that does not fit the state."""


class EvaluationError(TensorGraphsError):
    """The reference interpreter could not compute a node (e.g. a gather index out of range)."""


class SerializationError(TensorGraphsError):
    """A graph file that is not a tensor_graphs file, or of an unknown version."""


class PlanFileError(SerializationError):
    """A plan lock file that cannot be replayed as saved: unreadable, not of the schema, or
    pinning a decision that no longer holds (a kernel edited or gone, an error above the
    tolerance asked for, another graph or device). Refused, never silently re-planned."""


class KernelConstraintError(TensorGraphsError, ValueError):
    """A kernel called with inputs outside its constraints (dtype, rank, layout, shape)."""


class CCompileError(TensorGraphsError, RuntimeError):
    """The C compiler failed on a kernel's source; the message carries the compiler's output."""

    def __init__(self, message: str, output: str = "", command: tuple = ()):
        super().__init__(message)
        self.output = output
        self.command = tuple(command)


class KernelVerificationError(TensorGraphsError):
    """A kernel whose outputs disagree with the float64 reference beyond its tolerance."""


class DeviceError(TensorGraphsError, ValueError):
    """An unknown or unavailable device."""


class GPUFaultError(DeviceError):
    """The GPU met one of CUDA's sticky errors (a kernel's device-side assert, an illegal
    memory access): the process's GPU context is unusable from then on, so it stops the work
    instead of being filed as the failure of whichever kernel was running (every later one
    would fail alike). ``devices.gpu_fault`` makes it."""


class DatabaseError(TensorGraphsError):
    """A measurement database that cannot be used: corrupt, another application's, newer, or
    read-only when asked to record; the message names the file and what to do."""


class ClusterError(TensorGraphsError):
    """A Ray cluster ``tg profile --ray`` cannot use: the ``ray`` extra missing, an address
    nobody answers at, no node advertising the hardware the work needs, or a node whose
    hardware is not what it advertises; the message names the address or node and the fix."""


class NoPathError(TensorGraphsError):
    """No way to compute a node within the tolerance (or at all): names the node and the most
    accurate kernel there is."""


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


class PassError(TensorGraphsError):
    """A compile pass handed on a graph, plan, memory plan or program that breaks an invariant
    the passes after it rely on (checked under ``TG_DEBUG=2``): a bug in the pass the message
    names."""


class UntrustedPathError(TensorGraphsError, PermissionError):
    """A file or folder tensor_graphs would load code or plans from that another local user
    could have written (owned by someone else, or writable by group or others)."""
