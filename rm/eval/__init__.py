"""How well a reward model orders responses: pairs files and the model's own validation split
(pairs.py), and the public leaderboards' files scored by their rules (leaderboards.py, benchmarks.py)."""
