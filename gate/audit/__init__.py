"""The audit trail: hash chain (chain, verified in parallel runs by segments), receipts and
chain heads held outside it (receipts), the export line format (export), typed entry payloads
(entries), the approval records checked against the log (records, with its comparisons in
record_checks), the one check of a database (verify), what else it is given (inputs) and what
the CLI says of its report (report)."""
