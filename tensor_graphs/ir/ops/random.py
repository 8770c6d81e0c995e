"""Randomness as a pure function: Philox-4x32-10 bits, dropout, and the generator handle.

Why counter-based: the random bits of element ``i`` are a function of (seed, step, stream, i)
alone (Philox-4x32-10, Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC 2011;
the generator of cuRAND, JAX's ``rbg`` and torch's CUDA dropout), so the numpy reference, the
C kernel and any other kernel give the same bits, bit for bit, in any order and on any number
of threads, and a kernel is verified exactly against the reference like any other. Nothing is
drawn on the host: the seed and the step live in a ``tg.state`` that the program advances in
place (``Rng.advance``), so two steps draw different masks and a run from the same seed draws
them again.

The mapping (fixed: masks saved or compared across versions depend on it):

- key   ``(k0, k1)`` = the seed's low and high 32 bits (the state's first int64, two's complement);
- counter ``(c0, c1, c2, c3)`` = ``(i // 4, stream, step & 0xffffffff, step >> 32)``;
- element ``i`` takes output word ``i % 4`` of its block (row-major order over the shape).

``stream`` is a node attribute: each dropout site of a graph gets its own (``Rng`` hands them
out in build order), so two sites never share a mask and the same model built twice draws the
same ones. A block index needs 32 bits: one call draws at most 2**34 elements.
"""

from __future__ import annotations

import math

import numpy as np

from tensor_graphs.errors import ArgumentError, DTypeError, ShapeError
from tensor_graphs.ir import builder as tg
from tensor_graphs.ir import dtypes
from tensor_graphs.ir.composite import composite
from tensor_graphs.ir.node import ATOMIC, Node, Op
from tensor_graphs.ir.ops import register
from tensor_graphs.ir.ops.names import DROPOUT, RANDOM_BITS, STATE
from tensor_graphs.ir.shapes import as_shape, format_shape, is_static, numel

__all__ = ["Rng", "dropout", "random_bits", "rng", "rng_states"]

KEY_SHAPE = (2,)  # [seed, step], int64
MAX_ELEMENTS = 1 << 34  # 2**32 blocks of four words
MAX_STREAM = 1 << 32
# Philox-4x32's multipliers and Weyl key increments (Random123, philox.h)
PHILOX_M = (0xD2511F53, 0xCD9E8D57)
PHILOX_W = (0x9E3779B9, 0xBB67AE85)
ROUNDS = 10
_MASK = 0xFFFFFFFF


# ---------------------------------------------------------------------------- the generator
def philox4x32(counter, key, rounds: int = ROUNDS) -> tuple[np.ndarray, ...]:
    """Philox-4x32-``rounds`` of four uint32 counter words (arrays, broadcast together) under
    a key of two words: the four output words, as uint64 arrays holding 32-bit values."""
    c0, c1, c2, c3 = (np.asarray(c, np.uint64) & np.uint64(_MASK) for c in counter)
    k0, k1 = (int(k) & _MASK for k in key)
    m0, m1 = np.uint64(PHILOX_M[0]), np.uint64(PHILOX_M[1])
    shift, mask = np.uint64(32), np.uint64(_MASK)
    for _ in range(rounds):
        p0, p1 = c0 * m0, c2 * m1  # exact: both factors < 2**32
        c0, c1, c2, c3 = ((p1 >> shift) ^ c1 ^ np.uint64(k0), p1 & mask,
                          (p0 >> shift) ^ c3 ^ np.uint64(k1), p0 & mask)
        k0, k1 = (k0 + PHILOX_W[0]) & _MASK, (k1 + PHILOX_W[1]) & _MASK
    return c0, c1, c2, c3


def bits_reference(key: np.ndarray, n: int, stream: int) -> np.ndarray:
    """The n random 32-bit words of (key = [seed, step], stream), element order, as int64."""
    seed, step = (int(v) & 0xFFFFFFFFFFFFFFFF for v in np.asarray(key, np.int64).reshape(-1))
    blocks = np.arange(-(-n // 4), dtype=np.uint64)
    words = philox4x32((blocks, stream, step & _MASK, step >> 32), (seed & _MASK, seed >> 32))
    return np.stack(words, axis=-1).reshape(-1)[:n].astype(np.int64)


def _check_key(op: str, key: Node) -> None:
    if key.dtype != dtypes.int64 or key.ndim != 1 or key.shape[0] != 2:
        raise DTypeError(f"{op}: the key must be an int64 tensor of shape (2,) holding [seed, "
                         f"step] (tg.rng(...).state), got {format_shape(key.shape)} "
                         f"{key.dtype.name}")


def _check_stream(op: str, stream) -> None:
    if isinstance(stream, bool) or not isinstance(stream, int) or not 0 <= stream < MAX_STREAM:
        raise ArgumentError(f"{op}: stream must be an int in [0, 2**32), got {stream!r}")


def _bits_infer(inputs, attrs):
    (key,) = inputs
    _check_key(RANDOM_BITS, key)
    _check_stream(RANDOM_BITS, attrs["stream"])
    shape = as_shape(attrs["shape"])
    if is_static(shape) and numel(shape) > MAX_ELEMENTS:
        raise ShapeError(f"random_bits: {format_shape(shape)} has {numel(shape)} elements; one "
                         f"call draws at most 2**34 (split the tensor)")
    return shape, dtypes.int64


def _bits_ref(arrays, attrs):
    shape = tuple(attrs["shape"])
    n = math.prod(shape)
    if n > MAX_ELEMENTS:
        raise ShapeError(f"random_bits: {n} elements; one call draws at most 2**34")
    return bits_reference(arrays[0], n, attrs["stream"]).reshape(shape)


_RANDOM_BITS_OP = register(Op(
    RANDOM_BITS, ATOMIC, "Philox-4x32-10 words in [0, 2**32) as int64: element i is word i % 4 "
    "of the block with counter (i // 4, stream, step) under key seed; key = [seed, step]",
    params=("key",), attr_defaults={"shape": (), "stream": 0},
    infer=_bits_infer, reference=_bits_ref))


def random_bits(key: Node, shape, stream: int = 0) -> Node:
    """Random 32-bit words (int64 in [0, 2**32)) of ``shape``, a pure function of the key's
    [seed, step], ``stream`` and each element's row-major index."""
    key = tg.as_node(key)
    return Node.make(_RANDOM_BITS_OP, (key,), {"shape": as_shape(shape), "stream": stream})


# ---------------------------------------------------------------------------- dropout
def threshold(p: float) -> int:
    """The 32-bit word below which an element is dropped: P(drop) = threshold / 2**32, within
    2**-33 of p, and compared as integers so every backend draws the same mask."""
    return min(int(round(float(p) * 2.0 ** 32)), 1 << 32)


def scale(p: float) -> float:
    """1 / (1 - p), torch's scaling of the kept elements (0 when nothing is kept)."""
    return 0.0 if p >= 1.0 else 1.0 / (1.0 - float(p))


def _dropout_example():
    return (tg.input("x", (2, 5)), tg.state("rng", KEY_SHAPE, "int64"))


@composite(example=_dropout_example, name=DROPOUT)
def dropout_op(x, key, *, p=0.5, stream=0):
    """Inverted dropout: x / (1 - p) where the element's Philox word is at least p * 2**32,
    else 0; key = [seed, step] (a tg.rng's state)."""
    if not x.dtype.is_float:
        raise DTypeError(f"dropout: x must be a float tensor, got {x.dtype.name}")
    if not 0.0 <= float(p) <= 1.0:
        raise ArgumentError(f"dropout: p must be in [0, 1], got {p}")
    bits = random_bits(key, x.shape, stream)
    dropped = tg.less(bits, tg.constant(threshold(p), dtypes.int64))
    return tg.where(dropped, tg.constant(0.0, x.dtype), tg.mul(x, scale(p)))


# ---------------------------------------------------------------------------- the handle
class Rng:
    """A generator for a graph: the state leaf its dropouts read (``[seed, step]``, int64) and
    the streams it hands to dropout sites in build order.

    The state is advanced by ``advance()``, a ``state_update`` the program runs in place each
    call (``tg.Trainer`` adds it), so nothing is drawn or counted on the host; ``init(seed)``
    is the value to bind (``prog.bind(**rng.init(0))``).
    """

    def __init__(self, seed: int = 0, name: str = "rng"):
        _check_seed(seed)
        self.seed = int(seed)
        self.state = tg.state(name, KEY_SHAPE, dtypes.int64)
        self._next = 0

    @property
    def name(self) -> str:
        return self.state.name

    def stream(self) -> int:
        """The next dropout site's stream."""
        out = self._next
        self._next += 1
        return out

    def advance(self) -> Node:
        """The state's next version, step + 1: return it from the program (an output), so
        each call draws new masks."""
        return advance(self.state)

    def init(self, seed: int | None = None) -> dict[str, np.ndarray]:
        """The state's starting value ``{name: [seed, 0]}``, for ``bind``."""
        return {self.name: initial(self.seed if seed is None else seed)}

    def __repr__(self) -> str:
        return f"tg.rng(seed={self.seed}, name={self.name!r})"


def rng(seed: int = 0, name: str = "rng") -> Rng:
    """A counter-based generator (Philox-4x32-10) for ``tg.dropout``: the seed and the step
    live in the ``tg.state`` named ``name``, so masks are reproducible from the seed and drawn
    on the device."""
    return Rng(seed, name)


def _check_seed(seed) -> None:
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) \
            or not -(1 << 63) <= int(seed) < (1 << 64):
        raise ArgumentError(f"rng: the seed must be an int that fits 64 bits, got {seed!r}")


def initial(seed: int) -> np.ndarray:
    """[seed, 0] as the state's int64 value (a seed >= 2**63 is kept by its bits)."""
    _check_seed(seed)
    return np.array([int(seed) & 0xFFFFFFFFFFFFFFFF, 0], np.uint64).view(np.int64)


def advance(state: Node) -> Node:
    """The version of a generator state with its step one further (written in place)."""
    step = tg.constant(np.array([0, 1], np.int64))
    return tg.state_update(state, tg.add(state, step), 0, 0)


def rng_states(outputs) -> list[Node]:
    """The generator states that the graph's random ops read (state leaves, in graph order):
    what a training step must advance once per call."""
    from tensor_graphs.ir.graph import nodes

    found: dict[Node, None] = {}
    for n in nodes(outputs):
        if n.op.name == DROPOUT:
            found.setdefault(n.inputs[1])
        elif n.op.name == RANDOM_BITS:
            found.setdefault(n.inputs[0])
    return [s for s in found if s.op.name == STATE]


def check_sites(outputs) -> None:
    """Refuse two dropout sites of a forward graph that draw one stream of one generator
    state: they would share their masks (two ``tg.rng`` of one name each start at stream 0).
    Called on a forward only: a backward's dropout reuses its forward's stream on purpose."""
    from tensor_graphs.ir.graph import nodes

    seen: dict[tuple, Node] = {}
    for n in nodes(outputs):
        if n.op.name != DROPOUT:
            continue
        site = (n.inputs[1], n.attrs["stream"])
        if site in seen and seen[site] is not n:
            raise ArgumentError(
                f"dropout: two sites ({seen[site].inputs[0]!r} and {n.inputs[0]!r}) draw stream "
                f"{site[1]} of the generator state {site[0]!r}, so their masks would be the "
                "same; make one tg.rng per model and pass it to every dropout (or give each "
                "generator its own name)")
        seen[site] = n


def dropout(x, p: float = 0.5, rng: Rng | Node | None = None, *, training: bool = True,
            stream: int | None = None) -> Node:
    """torch's ``F.dropout``: in training, each element is zeroed with probability ``p`` and
    the others scaled by 1 / (1 - p); ``p = 0`` and ``training=False`` give ``x`` itself,
    ``p = 1`` zeros. The mask comes from ``rng`` (a ``tg.rng``, which gives this site the next
    stream, or its state node with ``stream=``) and is the same on every backend."""
    x = tg.as_node(x)
    if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0.0 <= float(p) <= 1.0:
        raise ArgumentError(f"dropout: p must be a number in [0, 1], got {p!r}")
    if not x.dtype.is_float:
        raise DTypeError(f"dropout: x must be a float tensor, got {format_shape(x.shape)} "
                         f"{x.dtype.name}")
    if not training:
        return x
    if rng is None:
        raise ArgumentError(f"dropout: training needs a generator, e.g. rng = tg.rng(seed) "
                            f"once per model and tg.dropout(x, {p}, rng) (or training=False)")
    if isinstance(rng, Rng):
        key = rng.state
        site = rng.stream() if stream is None else stream
    elif isinstance(rng, Node):
        if stream is None:
            raise ArgumentError("dropout: with a key node, give stream= (a tg.rng hands streams "
                                "out itself)")
        key, site = rng, stream
    else:
        raise ArgumentError(f"dropout: rng must be a tg.rng(...) or its state node, got "
                            f"{type(rng).__name__}")
    _check_key(DROPOUT, key)
    _check_stream(DROPOUT, site)
    if float(p) == 0.0:
        return x
    if float(p) == 1.0:
        return tg.expand(tg.constant(0.0, x.dtype), x.shape)
    return dropout_op(x, key, p=float(p), stream=site)
