"""The pipeline side: the API client (api), request-with-wait (request) and the hop lines it
reports (hops); never runs inside the daemon."""
