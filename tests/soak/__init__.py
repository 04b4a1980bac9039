"""Crash-safety soak of the real daemon: ``python -m tests.soak.soak --help``."""
