"""bradley: service."""
