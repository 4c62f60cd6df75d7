"""bradley: annotation."""
