"""slotune: deploy vLLM on Kubernetes and tune its engine until latency SLOs hold."""
