"""The pipeline side: the API client (api) and request-with-wait (request); never runs inside the
daemon."""
