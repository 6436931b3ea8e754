"""The tuner: find the engine configuration with the highest capacity within every SLO target.

Shared by the operator and `slotune tune --local`; only the runtime differs. `space` turns the
spec into Optuna distributions, `records` persists trials so a study can be rebuilt after a
restart, `study` wraps Optuna (capacity as the objective, feasibility as a constraint, seeding),
`loop` plans and runs trials and picks the confirmed winner, and `measure` drives one engine
through the capacity search of `slotune.capacity`.
"""
