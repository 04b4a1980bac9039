"""The lifecycle every kind of request shares: the table a kind plugs in with (kind), the
write transactions create, cancel, expire and dispatch result (lifecycle_tx), get, wait, list
and wake-ups (service), the fields every create body has (fields)."""
