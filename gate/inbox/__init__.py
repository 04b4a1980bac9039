"""The inbox (issue 17, ``hitl-gate inbox``): a separate program, a hitl/v0 relay that shows
approvers their approvals and questions in a browser (pages, render, templates, static). An
untrusted peer: gate.protocol, never the gate's core, store, daemon or web."""
