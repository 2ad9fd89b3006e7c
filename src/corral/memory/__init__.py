"""corral.memory: what agents did, kept for later runs to learn from.

``EpisodicMemory`` is a bounded, thread-safe log of ``Episode`` records, queried newest first
by task type, agent or outcome.
"""

from corral.memory._episodic import Episode, EpisodicMemory

__all__ = ["Episode", "EpisodicMemory"]
