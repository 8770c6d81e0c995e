"""docs/kernels.md is generated from the kernel registry and must not go stale."""

from __future__ import annotations

import pytest

from tensor_graphs.tools import kerneldocs as docs


def _backends_complete() -> bool:
    """The committed page lists the torch kernels; without torch they are not registered."""
    from tensor_graphs.kernels import torch as torch_backend

    return torch_backend.available()


def test_kernels_md_is_up_to_date():
    assert docs.DOCS_PATH.exists(), f"docs/kernels.md is missing; run `{docs.COMMAND}`"
    if not _backends_complete():
        pytest.skip("torch is not installed: its kernels are missing from the registry")
    assert docs.DOCS_PATH.read_text(encoding="utf-8") == docs.render(), \
        f"docs/kernels.md is stale (the kernel registry changed); run `{docs.COMMAND}`"


def test_coverage_table_lists_every_op_and_the_seed_example():
    from tensor_graphs.ir.ops import OPS

    text = docs.render()
    for name, op in OPS.items():
        if op.kind == "atomic" or (op.kind == "composite"
                                   and op.decompose.__module__.startswith("tensor_graphs.")):
            assert f"| `{name}` | {op.kind} |" in text
    row = next(line for line in text.splitlines() if line.startswith("| `tanh` |"))
    assert "`numpy_tanh`" in row and "`numpy_exact_tanh` 1e-07" in row


def test_check_mode_reports_stale_files(tmp_path, capsys):
    target = tmp_path / "kernels.md"
    assert docs.main(["--check", "--output", str(target)]) == 1
    assert docs.COMMAND in capsys.readouterr().err
    assert docs.main(["--output", str(target)]) == 0
    assert docs.main(["--check", "--output", str(target)]) == 0


def _gpu_section(text: str) -> str:
    _, found, section = text.partition("\n## GPU kernels\n")
    assert found, f"docs/kernels.md has no GPU kernels section; run `{docs.COMMAND}`"
    return section


def test_gpu_section_names_every_matmul_template_kernel():
    """Every name ``matmul.register`` gives (epilogue x config), in the committed page: it
    goes stale when a tuple changes even where no GPU registers them."""
    from tensor_graphs.kernels.triton.templates import matmul

    section = _gpu_section(docs.DOCS_PATH.read_text(encoding="utf-8"))
    names = [f"triton_{e.label}_{c.label}" for e in matmul.EPILOGUES for c in matmul.configs(e)
             if c in matmul.CONFIGS]
    assert len(names) == len(set(names))
    missing = [n for n in names if f"`{n}`" not in section]
    assert not missing, f"docs/kernels.md lacks {missing}; run `{docs.COMMAND}`"
    for c in matmul.CONFIGS:
        row = next(line for line in section.splitlines() if line.startswith(f"| `{c.label}` |"))
        assert f"| {c.warps} | {c.stages} | {c.precision} |" in row
        assert f"| {c.block_m} x {c.block_n} x {c.block_k} |" in row


def test_gpu_section_is_the_same_everywhere_and_imports_neither_torch_nor_triton():
    """The page is a pure function of the code: the same with and without the simulated GPU,
    rendered without importing torch or triton (``import tensor_graphs`` imports torch only
    to ask a GPU build of it whether CUDA is usable)."""
    import os
    import subprocess
    import sys

    script = ("import sys\nimport tensor_graphs\nbefore = set(sys.modules)\n"
              "from tensor_graphs.tools import kerneldocs\ntext = kerneldocs.render()\n"
              "new = {m.partition('.')[0] for m in set(sys.modules) - before}\n"
              "assert not {'torch', 'triton'} & new, f'rendering imported {new}'\n"
              "sys.stdout.write(text)\n")
    pages = []
    for simulated in ("0", "1"):
        env = dict(os.environ, TG_SIMULATED_CUDA=simulated, OMP_NUM_THREADS="2")
        env.pop("TRITON_INTERPRET", None)
        done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                              text=True, timeout=300)
        assert done.returncode == 0, done.stderr
        pages.append(done.stdout)
    assert pages[0] == pages[1]
    assert _gpu_section(pages[0]) == _gpu_section(docs.render())


def test_gpu_section_names_what_a_gpu_registers():
    """Where a GPU (real or simulated) registers the kernels, the section names exactly those;
    anywhere, the torch labels it reads from the sources are the CPU kernels torch registers."""
    from tensor_graphs.kernels import registry
    from tensor_graphs.kernels import triton as tr
    from tensor_graphs.kernels.copy import placement
    from tensor_graphs.kernels.torch import cuda_available

    cuda, labels = docs.torch_cuda_kernels()
    if _backends_complete():
        cpu = {k.name for k in registry.all() if k.backend == "torch" and k.device == "cpu"
               and (k.fn.__module__ or "").startswith("tensor_graphs.")}
        assert {f"torch_{label}" for label, _ in labels} == cpu
    if not cuda_available():
        pytest.skip("no GPU, real or simulated: nothing on one is registered here")
    generated = tuple(f"{p}_" for p in docs._generated_prefixes().values())  # noqa: SLF001
    registered = {k.name for k in registry.all() if set(placement(k)) != {"cpu"}
                  and (getattr(k.fn, "__module__", "") or "").startswith("tensor_graphs.")
                  and not k.name.startswith(generated)}  # kept by a test that built one
    listed = set(cuda) | {n for n, *_ in docs.gpu_copies()}
    if tr.usable():
        listed |= {n for *_, n in docs.matmul_kernels()} | {n for *_, n in
                                                             docs.attention_kernels()}
        listed |= {n for _, n in docs.rope_kernels()} | {n for _, n in docs.gather_kernels()}
        listed |= {n for _, n in docs.argmax_kernels()}
    assert registered == listed
