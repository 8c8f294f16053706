"""CuTe DSL kernels for `microbench.cute_build` (imports the DSL: nvidia-cutlass-dsl)."""
