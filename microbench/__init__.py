"""Kernel micro-benchmarks for engine kernel work (see microbench/README.md); not part of the product."""
