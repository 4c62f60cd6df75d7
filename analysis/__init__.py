"""bradley: analysis."""
