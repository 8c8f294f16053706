"""The command line (`chorus ...`, `main`): `serve`'s flags and their table, boot checks,
the server's start and stop (`run`), logs, and `chorus serve` as a child process (`launcher`)."""
