"""Scheduling: which utterances run in the next step, within the budget, by policy; never touches a
model."""
