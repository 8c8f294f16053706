"""The engine: one per device, packing every admitted utterance's diffusion step into one ragged
forward. Rooms, in import order: runtime, planning, model, scheduling, kernels
(docs/architecture.md, "The engine in rooms")."""
