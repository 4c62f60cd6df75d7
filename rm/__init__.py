"""bradley: rm."""
