"""The live verdict: whether a serving deployment meets its SLO now, from Prometheus
(`oncall`)."""
