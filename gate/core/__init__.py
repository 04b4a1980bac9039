"""The gate's rules, by kind of request (requests: the shared lifecycle; approvals;
questions), with approver credentials, passkey invites and the write transactions (commands:
the base of the typed commands, each beside its body; transactions: the writer's state)."""
