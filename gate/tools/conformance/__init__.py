"""``hitl-gate verify``: conformance test of a live relay against an ephemeral gate (SPEC §6):
the run (runner), the judges (checks) and, with --notices, the resolution-notice checks
(notices)."""
