"""Measuring one engine: the capacity search and its fit (`capacity`, `crossing`), the load
generator (`loadgen`), the probe driver that runs a search against an engine (`probe`), and the
record of what it measured (`record`)."""
