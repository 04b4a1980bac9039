"""The lifecycle every kind of request shares: the fields every create
body has, and (as it grows) create, get, wait, list, cancel, revise, expire, resolve."""
