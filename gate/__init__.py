"""hitl-gate: a human between an automated pipeline and a real-world action."""

__version__ = "0.1.0"
