"""Judging SLOs: a target's attainment over requests with its interval (`attainment`), and the
histogram rule the live verdict reads from Prometheus (`histogram`)."""
