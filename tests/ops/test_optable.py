"""The op table itself (tests/ops/optable.py): it covers every op, its oracles are independent
of tensor_graphs, and every row is well formed."""

import types

import pytest

from tensor_graphs.ir.ops import OPS
from tests.ops import optable as ot


def test_every_op_is_in_the_table_or_excluded():
    rowed = {r.op for r in ot.TABLE}
    missing = set(OPS) - rowed - set(ot.EXCLUDED)
    assert not missing, f"ops with no row in tests/ops/optable.py and no exclusion: {missing}"
    assert not rowed & set(ot.EXCLUDED), rowed & set(ot.EXCLUDED)
    assert set(ot.EXCLUDED) <= set(OPS), set(ot.EXCLUDED) - set(OPS)
    assert rowed <= set(OPS), rowed - set(OPS)
    assert all(reason.strip() for reason in ot.EXCLUDED.values())


def test_atomic_ops_are_rows_of_the_atomic_family_with_references():
    atomic = {name for name, op in OPS.items() if op.is_atomic and not op.is_leaf}
    assert atomic == {r.op for r in ot.rows("atomic")}
    for name in atomic:
        assert OPS[name].reference is not None


def _names_used(fn, seen=None) -> set[str]:
    """Every global name a function's code reads, followed into the optable functions it calls,
    its closures and its default arguments."""
    seen = set() if seen is None else seen
    if id(fn) in seen:
        return set()
    seen.add(id(fn))
    names: set[str] = set()
    if isinstance(fn, types.FunctionType):
        codes = [fn.__code__]
        while codes:
            code = codes.pop()
            names |= set(code.co_names)
            codes += [c for c in code.co_consts if isinstance(c, types.CodeType)]
        inner = [c.cell_contents for c in fn.__closure__ or ()] + list(fn.__defaults__ or ())
        inner += [fn.__globals__.get(n) for n in names if fn.__globals__ is vars(ot)]
        for f in inner:
            if isinstance(f, types.FunctionType) and f.__module__ == ot.__name__:
                names |= _names_used(f, seen)
    return names


@pytest.mark.parametrize("row", ot.TABLE, ids=[r.name for r in ot.TABLE])
def test_oracle_does_not_call_tensor_graphs(row):
    """An oracle that evaluated through tg would agree with tg by construction."""
    used = _names_used(row.oracle)
    assert not used & {"tg", "tensor_graphs", "evaluate", "OPS"}, used


def test_the_independence_check_sees_through_helpers():
    """The check above follows closures and helpers: a planted call is found."""
    def helper(x):
        return ot.tg.evaluate(x, {})

    helper.__module__ = ot.__name__
    assert "tg" in _names_used(ot._wrap(helper))


@pytest.mark.parametrize("row", ot.TABLE, ids=[r.name for r in ot.TABLE])
def test_row_is_well_formed(row):
    assert row.check in ot.CHECKS and row.family
    assert row.dtypes and set(row.dtypes) <= set(ot.ALL)
    assert set(row.torch_dtypes or ()) <= set(row.dtypes)
    if row.check == "float":
        assert set(row.dtypes) & set(ot.FLOATS) <= {"float64", "float32"}, row.dtypes
    for dtype in row.dtypes:
        specs = row.specs(dtype)
        assert specs, f"{row.name} has no case in {dtype}"
        for spec in specs:
            domain = spec.domain if spec.domain is not None else row.domain
            if not callable(domain):
                assert all(callable(d) or d in ot.DOMAINS for d in domain), domain
