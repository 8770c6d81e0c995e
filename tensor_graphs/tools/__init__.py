"""Tools run by hand on top of the whole package: the generated docs pages (docs/ops.md from
the op table, ``python -m tensor_graphs.tools.opdocs``; docs/kernels.md from the kernel
registry, ``python -m tensor_graphs.tools.kerneldocs``). They import ``tensor_graphs`` whole,
so they sit in the top layer (docs/ARCHITECTURE.md, "Layers")."""
