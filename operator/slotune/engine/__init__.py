"""Knowledge of inference engines (vLLM) as plain data."""
