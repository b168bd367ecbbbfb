"""Research tools: the gradient noise scale, the performance model (and, later, the sweep runner)."""
