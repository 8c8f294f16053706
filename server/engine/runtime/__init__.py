"""The engine's runtime: the thread that steps, the processes and pool around it, and the hand-offs
(commands in, decoded audio out)."""
