"""Kernels: attention backends, Triton kernels with their start-up checks, and the environment they
need. Nothing here knows about requests."""
