"""The shared verification of generated kernels (profiler/shared_verify.py) is scoped and keyed
by the verifier: a profiling compile shares its database's outcomes only while it runs, a
candidate's build never holds the module-wide lock of ``generated.realize`` (a hook may wait
minutes for another process), and an outcome filed before the checks changed is not reused."""

from __future__ import annotations

import secrets
import threading

import numpy as np
import pytest

import tensor_graphs as tg
from tensor_graphs.kernels import generated
from tensor_graphs.numerics import relative_error
from tensor_graphs.profiler import shared_verify

needs_c = pytest.mark.skipif(not tg.kernels.c.available(), reason="no C compiler")


def _chain(salt: float):
    """An elementwise chain whose generated kernels no other test builds (``salt`` is in
    their source, so in their names)."""
    x = tg.input("x", (8, 32))
    y = tg.tanh(x * salt + 0.1)
    return tg.sigmoid(y * 0.9 + 0.05) * y


def _generated_steps(prog) -> list:
    return [s for s in prog.plan.steps if getattr(s.kernel, "generated", False)]


@needs_c
def test_a_later_compile_does_not_share_an_earlier_profiles_database(tmp_path, monkeypatch):
    """After a profiling compile on a file, a compile on a private database in the same
    process builds its generated kernels through no database's outcomes (the hook stayed set
    before, and every later kernel of the process went through the first file's cache)."""
    monkeypatch.setenv("TG_CACHE_DIR", str(tmp_path / "cache"))
    filed = []
    real_filed = shared_verify._filed

    def spy(key, make):
        filed.append(key)
        return real_filed(key, make)

    monkeypatch.setattr(shared_verify, "_filed", spy)
    salt = 1.0 + secrets.randbelow(10**6) / 1e7
    first = tg.compile(_chain(salt), db=str(tmp_path / "db.sqlite"), profile="missing")
    assert _generated_steps(first), "the profiled plan picked no generated kernel"
    assert filed, "the profiling compile shared no verification"
    filed.clear()
    y = _chain(salt + 0.5)
    second = tg.compile(y, db=":memory:")
    assert _generated_steps(second), "the second plan picked no generated kernel"
    assert filed == []  # built and verified here, no outcome read or filed
    assert generated._sharing.get() is None
    x = np.random.default_rng(0).standard_normal((8, 32)).astype(np.float32)
    assert relative_error(second(x=x), tg.evaluate(y, {"x": x}, dtype="float64")) <= 1e-5


def _fake(name: str, build, draft=None) -> generated.Candidate:
    node = tg.input(f"v_{name}", (2,))
    return generated.Candidate(generator="fake", root=node, covers=(node,), inputs=(),
                               name=name, source_hash=name, tolerance=1e-6, summary="fake",
                               build=build, draft=draft)


def test_a_hook_waiting_does_not_stall_other_threads_realize():
    """While one candidate's sharing hook waits (for another process's verification),
    another thread realizes another candidate; a third realizing the first one waits for it
    and gets the same kernel, built once."""
    tag = secrets.token_hex(6)
    release, entered = threading.Event(), threading.Event()
    builds = []

    def hook(cand):
        entered.set()
        assert release.wait(30)
        builds.append(cand.name)
        return f"kernel {cand.name}"

    slow = _fake(f"slow_{tag}", build=lambda: "unused", draft=lambda: "unused")
    quick = _fake(f"quick_{tag}", build=lambda: f"kernel quick_{tag}")
    got = {}

    def realize_slow(label):
        with generated.sharing(hook):
            got[label] = generated.realize(slow)

    try:
        first = threading.Thread(target=realize_slow, args=("first",))
        first.start()
        assert entered.wait(30)
        other = threading.Thread(target=lambda: got.update(quick=generated.realize(quick)))
        other.start()
        other.join(10)
        assert not other.is_alive(), "realize of another candidate waited for the hook"
        assert got["quick"] == f"kernel quick_{tag}"
        again = threading.Thread(target=realize_slow, args=("again",))
        again.start()
        again.join(0.3)
        assert again.is_alive()  # the same candidate: waits for the first build
        release.set()
        first.join(30)
        again.join(30)
        assert got["first"] == got["again"] == f"kernel slow_{tag}"
        assert builds == [slow.name]
    finally:
        release.set()
        for name in (slow.name, quick.name):
            generated._built.pop(name, None)
            generated.refused.pop(name, None)


def test_sharing_is_this_blocks_and_threads_only():
    """``generated.sharing`` sets the hook for the block, restores the one before, and other
    threads never see it."""
    def outer(c):
        return None

    def inner(c):
        return None

    seen = []
    with generated.sharing(outer):
        with generated.sharing(inner):
            assert generated._sharing.get() is inner
            t = threading.Thread(target=lambda: seen.append(generated._sharing.get()))
            t.start()
            t.join()
        assert generated._sharing.get() is outer
    assert generated._sharing.get() is None
    assert seen == [None]


@needs_c
def test_a_changed_verifier_files_outcomes_afresh(elementwise_candidate, monkeypatch):
    """An outcome is keyed by the verifier's digest: a "passed" filed before the checks
    changed is not read after, so the candidate is built and checked again (not handed out
    as its unchecked draft)."""
    cand, db, scope, hw = elementwise_candidate(3.0)
    before = shared_verify.candidate_key(cand, hw, scope)
    kernel = next(k for k in tg.kernels.registry.all()
                  if shared_verify.kernel_key(k, hw, scope) is not None)
    registered = shared_verify.kernel_key(kernel, hw, scope)
    shared_verify._filed(before, lambda: {"reason": None, "tolerance": 1e-6})  # as before
    monkeypatch.setattr(shared_verify, "verifier_digest", lambda: "a check added since")
    after = shared_verify.candidate_key(cand, hw, scope)
    assert after is not None and after != before
    assert shared_verify.kernel_key(kernel, hw, scope) not in (None, registered)
    built = []
    real_build = cand.build
    object.__setattr__(cand, "build", lambda: built.append(1) or real_build())
    try:
        with shared_verify.sharing(db, {"cpu": hw}):
            generated.realize(cand)
        assert built == [1]  # verified here, not read from the outcome filed before
    finally:
        generated._built.pop(cand.name, None)
        generated.refused.pop(cand.name, None)


def test_the_verifier_digest_reads_every_source_it_names(tmp_path, monkeypatch):
    """Every entry of ``VERIFIER_SOURCES`` exists (a renamed module would silently drop out
    of the key), and editing one changes the digest."""
    root = shared_verify.Path(shared_verify.__file__).resolve().parents[1]
    for entry in shared_verify.VERIFIER_SOURCES:
        path = root / entry
        assert path.is_file() or any(path.glob("*.py")), entry
    check = tmp_path / "check.py"
    check.write_text("CASES = ('tail',)\n")
    monkeypatch.setattr(shared_verify, "VERIFIER_SOURCES", (str(check),))
    digest = shared_verify.verifier_digest.__wrapped__
    old = digest()
    check.write_text("CASES = ('tail', 'new')\n")
    assert digest() != old


def test_every_registered_kernel_has_the_same_key_in_a_fresh_interpreter():
    """An outcome is shared under a key every process computes alike: a kernel whose
    description held an address (a function it closes over or its pattern names, a
    function giving its verification cases) had none, so it was verified by each process
    for itself (all 118 Triton kernels, the quantized C GEMMs)."""
    import json
    import subprocess
    import sys

    from tensor_graphs.db.hardware import current

    code = """
import json
from tensor_graphs.db.hardware import current
from tensor_graphs.kernels import registry
from tensor_graphs.profiler import shared_verify
hw = current("cpu")
print(json.dumps({k.name: shared_verify.kernel_key(k, hw, "a scope") for k in registry.all()}))
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True)
    theirs = json.loads(done.stdout.strip().splitlines()[-1])
    hw = current("cpu")
    ours = {k.name: shared_verify.kernel_key(k, hw, "a scope") for k in tg.kernels.registry.all()
            if k.name in theirs}  # (tests register kernels of their own)
    assert len(ours) > 400
    assert [name for name, key in ours.items() if key is None] == []
    assert {name for name in ours if ours[name] != theirs[name]} == set()
    assert len(set(ours.values())) == len(ours)
