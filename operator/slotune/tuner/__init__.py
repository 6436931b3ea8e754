"""The tuner: find the engine configuration with the highest capacity within every SLO target.

Shared by the operator (`slotune.study`) and `slotune tune --local` (`slotune.local`); only the
runtime differs. `space` turns the spec into Optuna distributions, `records` persists trials so
a study can be rebuilt after a restart, `sampling` wraps Optuna (capacity as the objective,
feasibility as a constraint, seeding), `loop` plans and runs trials and picks the confirmed
winner, `perfmodel` predicts capacity from the engine's ceilings, and `landscape` replays
recorded capacities. Measuring one engine is `slotune.measure`'s.
"""
