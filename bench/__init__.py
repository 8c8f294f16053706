"""GPU benchmarks: `chorus bench` (see bench/README.md)."""


def main(argv: list[str] | None = None) -> int:
    from bench.cli import main as bench_main

    return bench_main(argv)
