"""The gate's rules, by kind of request (requests: the shared lifecycle; approvals;
questions), with approver credentials, passkey invites and the write transactions' table."""
