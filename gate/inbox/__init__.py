"""The inbox (``hitl-gate inbox``, issue 17): a separate program, a hitl/v0 relay that keeps
what is waiting for approvers in its own SQLite file: its config (config), what it reads from a
dispatch (items), storage (db, the only module here that speaks SQL), the relay endpoint
(relay), the process (serve) and its
signed calls to the gate (gate_client). An untrusted peer of the gate: it uses gate.protocol,
never gate.core or gate.store."""
