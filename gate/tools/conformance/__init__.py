"""``hitl-gate verify``: conformance test of a live relay against an ephemeral gate (SPEC §6)."""
