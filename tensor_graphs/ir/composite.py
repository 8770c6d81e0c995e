"""Defining composite ops: a decorated Python function *is* the op's decomposition.

    @composite(example=lambda: (tg.input("x", (2, 5)),))
    def softmax(x, *, axis=-1):
        '''exp(x) / sum(exp(x)) along an axis, shifted by the max for stability.'''
        e = tg.exp(x - x.max(axis, keepdims=True))
        return e / e.sum(axis, keepdims=True)

Positional parameters are tensors (a default of None makes one optional), keyword-only
parameters are attributes. The decorator registers the op, returns its builder (``tg.softmax``)
and traces ``example`` once, so a decomposition that uses its own op, directly or through other
composites, raises at registration. Shape and dtype of a composite node come from tracing its
decomposition: the decomposition is the only definition.
"""

from __future__ import annotations

import functools
import inspect
import reprlib
from collections.abc import Callable

from tensor_graphs.errors import DecompositionError, SignatureError
from tensor_graphs.ir.builder import as_node
from tensor_graphs.ir.node import COMPOSITE, Node, Op
from tensor_graphs.ir.ops import register, unregister
from tensor_graphs.ir.shapes import normalize_axis


def composite(example: Callable[[], tuple | dict], name: str | None = None):
    def decorate(fn: Callable[..., Node]) -> Callable[..., Node]:
        sig = inspect.signature(fn)
        positional = [p for p in sig.parameters.values()
                      if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        keywords = [p for p in sig.parameters.values() if p.kind == p.KEYWORD_ONLY]
        op = Op(
            name=name or fn.__name__,
            kind=COMPOSITE,
            doc=inspect.cleandoc(fn.__doc__ or "").split("\n\n")[0].replace("\n", " "),
            params=tuple(p.name for p in positional),
            optional=tuple(p.name for p in positional if p.default is None),
            attr_defaults={p.name: p.default for p in keywords},
            decompose=fn,
        )

        @functools.wraps(fn)
        def build(*args, **kwargs) -> Node:
            try:
                bound = sig.bind(*args, **kwargs)
            except TypeError as e:
                raise _bad_call(op, sig, args, kwargs, e) from None
            bound.apply_defaults()
            values = bound.arguments
            if any(getattr(v, "is_pattern", False) for v in values.values()):
                return _pattern(op, values, set(kwargs))
            tensors = [values[p] for p in op.params]
            like = next((t.dtype for t in tensors if isinstance(t, Node)), None)
            nodes = [None if t is None else as_node(t, like) for t in tensors]
            attrs = {k: values[k] for k in op.attr_defaults}
            first = next((n for n in nodes if n is not None), None)
            if first is not None and "axis" in attrs:
                attrs["axis"] = _normalize_axis_attr(attrs["axis"], first.ndim, op.name)
            if op.optional:
                missing = [p for p, n in zip(op.params, nodes) if n is None
                           and p not in op.optional]
                if missing:
                    raise DecompositionError(f"{op.name}: tensor argument(s) {missing} missing")
                given = tuple(p for p, n in zip(op.params, nodes) if n is not None)
                if given != op.params:  # recorded only when an optional tensor is absent
                    attrs["args"] = given
            return Node.make(op, tuple(n for n in nodes if n is not None), attrs)

        register(op)
        try:
            sample = example()
            build(**sample) if isinstance(sample, dict) else build(*sample)
        except Exception:
            unregister(op.name)
            raise
        build.op = op
        return build

    return decorate


def _bad_call(op: Op, sig: inspect.Signature, args: tuple, kwargs: dict, error: TypeError
              ) -> SignatureError:
    """``sig.bind``'s bare ``TypeError: too many positional arguments`` named neither the op
    nor what was passed. Attributes are keyword-only (tensors are the positional parameters),
    so torch's positional ``clamp(x, -1.0, 1.0)`` is refused: the message names the op, its
    signature and the call, and when the extra positional values fit the attributes in order,
    writes the call with them as keywords (``tg.clamp(x, min=-1.0, max=1.0)``)."""
    name = f"tg.{op.name}"
    passed = ", ".join([*map(_shown, args), *(f"{k}={_shown(v)}" for k, v in kwargs.items())])
    message = f"{name}{sig}: {error}, in {name}({passed})"
    extra, attrs = args[len(op.params):], list(op.attr_defaults)
    if extra and len(extra) <= len(attrs) and not set(attrs[:len(extra)]) & set(kwargs):
        fixed = [*op.params, *(f"{k}={_shown(v)}" for k, v in zip(attrs, extra)),
                 *(f"{k}={_shown(v)}" for k, v in kwargs.items())]
        message += (f"; its attributes ({', '.join(attrs)}) are keyword-only, so write "
                    f"{name}({', '.join(fixed)})")
    return SignatureError(message)


def _shown(value) -> str:
    """An argument as an error message shows it: a node by its repr, an array by shape and
    dtype (not its elements), anything else by a repr cut short."""
    if isinstance(value, Node):
        return repr(value)
    if hasattr(value, "shape") and hasattr(value, "dtype"):
        return f"<{type(value).__name__} {tuple(value.shape)} {value.dtype}>"
    return reprlib.repr(value)


def _pattern(op: Op, values: dict, explicit: set[str]):
    """The pattern ``op(...)`` (tracing a kernel's reference graph). Attributes constrain the
    match — defaults too, so ``tg.gelu(x)`` means the erf form — except float parameters left
    at their default (eps, alpha...): those are the kernel's to read from the matched node.
    Absent optional tensors must be absent."""
    from tensor_graphs.ir.pattern import OpPat, as_pat

    given = tuple(p for p in op.params if values[p] is not None)
    attrs = {k: values[k] for k, default in op.attr_defaults.items()
             if k in explicit or not isinstance(default, float)}
    if op.optional and given != op.params:
        attrs["args"] = given
    return OpPat(op.name, tuple(as_pat(values[p]) for p in given), attrs)


def _normalize_axis_attr(axis, rank: int, op: str):
    """Attributes named ``axis`` are stored non-negative (tuples sorted) so equal ops hash equal."""
    if isinstance(axis, int) and not isinstance(axis, bool):
        return normalize_axis(axis, rank, op)
    if isinstance(axis, (tuple, list)):
        return tuple(sorted(normalize_axis(a, rank, op) for a in axis))
    return axis
