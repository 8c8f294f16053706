"""Connection-level protection under the ASGI app: how many sockets, how long a request may
take to arrive, how long a peer may stall what we send, and how many request-body bytes
the server holds at once. uvicorn does none of these by itself (its `limit_concurrency`
answers 503 only after accepting the socket and reading whole headers, and nothing bounds
the first request's headers or any body)."""
