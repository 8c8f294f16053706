"""`python -m server ...` is the same program as `chorus ...`."""

from server.cli.main import main

if __name__ == "__main__":
    raise SystemExit(main())
