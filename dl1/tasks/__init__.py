"""Worker-side task functions: plain functions of arrays (picklable by reference), run by
Dask workers or in-process, split by concern (blocks, passes, columns, subproblems, Gram
matrices, spread subproblems, Frank-Wolfe). The numba kernels they call live in
:mod:`dl1.kernels`; nothing here knows about the coordinator."""
