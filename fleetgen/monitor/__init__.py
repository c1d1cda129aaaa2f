"""Floor 6, the top: what an operator watches (the status view, Prometheus metrics)."""
