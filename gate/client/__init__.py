"""The pipeline side: the API client (api), request-with-wait for approvals and questions on
the SDK's loop (request) and the hop lines it reports (hops); never runs inside the daemon."""
