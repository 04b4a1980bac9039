"""``hitl-gate verify``: conformance test of a live relay against an ephemeral gate (SPEC §6):
the run (runner), the ephemeral gate's config (ephemeral), the callbacks it records
(callbacks), the approvals and gate probes (probes), the judges (checks), the report (report),
with --notices the resolution-notice checks (notices), with --questions the question run and
gate probes (questions) and the judges of an answer (question_checks), with
--approver-public-key the approver-signature checks (signatures)."""
