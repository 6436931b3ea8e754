"""The tuner: find an engine configuration that meets every SLO in as few trials as possible.

Shared by the operator and `slotune tune --local`; only the runtime differs. `space` turns the
spec into Optuna distributions, `records` persists trials so a study can be rebuilt after a
restart, `study` wraps Optuna (SLOs as constraints, seeding, stopping), and `loop` runs trials.
"""
