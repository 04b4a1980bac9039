"""The audit trail: hash chain and receipts (chain), typed entry payloads (entries), the approval
records checked against the log (records), and verifying a database (verify)."""
