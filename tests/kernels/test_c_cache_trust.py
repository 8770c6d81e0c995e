"""The C library cache is loaded as code, so a library another user could have written is never
dlopen'ed: cache folders are private (0700), untrusted ones are not used, and each cached file
is checked before it is loaded. A planted library's constructor writes a marker file."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import tempfile
import textwrap
import uuid
from pathlib import Path

import pytest

from tensor_graphs.kernels.c import build

pytestmark = pytest.mark.skipif(build.compiler() is None, reason="no C compiler")

ROOT = hasattr(os, "getuid") and os.getuid() == 0  # only root can give files away
OTHER_UID = 12345


def answer_source() -> str:
    return f"int tg_answer(void) {{ return 42; }} /* {uuid.uuid4()} */\n"


def plant(path: Path, marker: Path) -> None:
    """Compile, at ``path``, a library whose constructor writes ``marker`` (what an attacker
    who can compute the cache's file names would leave there)."""
    src = path.with_suffix(".planted.c")
    src.write_text(textwrap.dedent(f"""
        #include <stdio.h>
        __attribute__((constructor)) static void planted(void) {{
            FILE *f = fopen("{marker}", "w");
            if (f) {{ fputs("constructor ran", f); fclose(f); }}
        }}
        int tg_answer(void) {{ return 666; }}
    """))
    subprocess.run([build.compiler(), "-shared", "-fPIC", str(src), "-o", str(path)],
                   check=True, capture_output=True)
    src.unlink()


def give_away(path: Path) -> None:
    """Make ``path`` another user's (as root), else leave it writable by everyone."""
    if ROOT:
        os.chown(path, OTHER_UID, OTHER_UID)
    os.chmod(path, 0o777)


def test_a_library_planted_in_the_fallback_folder_is_never_loaded(tmp_path, child_env):
    # the case: the cache folder cannot be made (here: its parent is a file), and the
    # fallback <tmp>/tensor_graphs-<uid>/c was made first by another user, with a library under
    # the name this process would load
    configured = tmp_path / "not-a-folder"
    configured.write_text("")
    tmp = tmp_path / "tmp"
    planted_dir = tmp / f"tensor_graphs-{os.getuid()}" / "c"
    planted_dir.mkdir(parents=True)
    src = answer_source()
    marker = tmp_path / "constructor-ran"
    plant(planted_dir / f"answer-{build.cache_key(src)}.so", marker)
    for folder in (planted_dir, planted_dir.parent):
        give_away(folder)
    script = textwrap.dedent(f"""
        from tensor_graphs.kernels.c import build
        lib = build.load_library("answer", {src!r})
        print(lib.tg_answer(), build.cache_dir())
    """)
    env = dict(child_env, TG_CACHE_DIR=str(configured), TMPDIR=str(tmp))
    res = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                         text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    assert not marker.exists(), "the planted library was loaded"
    value, used = res.stdout.split()
    assert value == "42"
    used = Path(used)
    assert used.parent == tmp and used.name.startswith(f"tensor_graphs-{os.getuid()}-")
    assert not used.exists()  # the process's own folder is removed at exit
    assert f"not using the C library cache {configured / 'c'}" in res.stderr
    assert "Not a directory" in res.stderr
    assert f"; nor {planted_dir}: {planted_dir.parent} is " in res.stderr
    assert f"compiled into {used} for this process only" in res.stderr
    assert res.stderr.count(str(configured / "c")) == 1  # named once, not once per clause


def test_an_untrusted_cache_falls_back_to_a_private_folder(tmp_path, monkeypatch):
    monkeypatch.setenv("TG_CACHE_DIR", str(tmp_path / "cache"))
    (tmp_path / "cache" / "c").mkdir(parents=True)
    give_away(tmp_path / "cache" / "c")
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    with pytest.warns(UserWarning, match="not using the C library cache .*cache/c: it is "
                      "(owned by uid 12345|writable by group and others)"):
        folder = build.cache_dir()
    assert folder == tmp_path / "tmp" / f"tensor_graphs-{os.getuid()}" / "c"
    for level in (folder, folder.parent):
        assert stat.S_IMODE(level.stat().st_mode) == 0o700
    lib = build.load_library("answer", answer_source())
    assert lib.tg_answer() == 42 and Path(lib._tg_path).parent == folder


def test_cache_folders_and_libraries_are_private(tmp_path, monkeypatch):
    monkeypatch.setenv("TG_CACHE_DIR", str(tmp_path / "new"))
    old = os.umask(0)  # the compiler's output follows the umask: 0777 here
    try:
        lib = build.load_library("answer", answer_source())
    finally:
        os.umask(old)
    assert build.cache_dir() == tmp_path / "new" / "c"
    assert stat.S_IMODE((tmp_path / "new" / "c").stat().st_mode) == 0o700
    assert stat.S_IMODE(os.stat(lib._tg_path).st_mode) == 0o755


@pytest.mark.parametrize("how", ["writable by others", "owned by another user"])
def test_a_cached_library_others_could_write_is_compiled_over(tmp_path, monkeypatch, how):
    if how == "owned by another user" and not ROOT:
        pytest.skip("only root can give a file away")
    monkeypatch.setenv("TG_CACHE_DIR", str(tmp_path))
    src = answer_source()
    path = build.library_path("answer", src)
    marker = tmp_path / "constructor-ran"
    plant(path, marker)
    if how == "writable by others":
        os.chmod(path, 0o666)
    else:
        os.chown(path, OTHER_UID, OTHER_UID)
    compiled = build.stats["compiled"]
    with pytest.warns(UserWarning, match=f"refusing to load compiled C library {path}.*"
                      "Compiling it again in its place"):
        lib = build.load_library("answer", src)
    assert not marker.exists(), "the planted library was loaded"
    assert lib.tg_answer() == 42 and build.stats["compiled"] == compiled + 1
    st = path.stat()
    assert st.st_uid == os.getuid() and stat.S_IMODE(st.st_mode) == 0o755
