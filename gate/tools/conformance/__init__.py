"""``hitl-gate verify``: conformance test of a live relay against an ephemeral gate (SPEC §6):
the run (runner), the judges (checks), with --notices the resolution-notice checks (notices),
with --questions the question run and gate probes (questions) and the judges of an answer
(question_checks)."""
