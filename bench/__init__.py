"""The benchmark suite: `chorus bench` (`bench.cli`) and the load, agents, soak and pool
benchmarks (see bench/README.md). Runs from a checkout; not installed with the package."""
