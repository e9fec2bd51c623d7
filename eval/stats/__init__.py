"""Statistics of evaluations and comparisons: power (minimum detectable difference)."""
