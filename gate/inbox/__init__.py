"""The inbox (``hitl-gate inbox``): a separate program, a hitl/v0 relay that keeps
what is waiting for approvers in its own SQLite file and shows it to them in a browser: its
config (config), what it reads from a dispatch (items), storage (schema, its tables and
migrations; db, its queries; shortlived, the sign-in challenges, tries and bulk batches every
replica shares: the only modules here that speak SQL), the relay endpoint
(relay), the process (serve), the state its handlers share (state), its signed calls to the
gate (gate_client), the pages (pages, render, jsonview, words, headers, templates, static),
quorum progress (progress), bulk approval (bulk, its results page bulk_results), question
answers (answers) and mail to approvers (mail). An untrusted peer of the gate: it uses
gate.protocol, never gate.core, gate.store, gate.daemon or gate.web."""
