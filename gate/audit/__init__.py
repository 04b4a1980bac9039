"""The audit trail: hash chain (chain, verified in parallel runs by segments), receipts and
chain heads held outside it (receipts), the export line format (export), typed entry payloads
(entries), every request's records checked against the log by one engine (records, with the
comparisons every kind shares in record_checks and each kind's table and own checks in
approval_kind and question_kind), the one check of a database (verify), what else it is given
(inputs) and what the CLI says of its report (report)."""
