"""corral.agent: a small tool-using agent loop that honours budgets, cancellation and middleware."""
