"""PostgreSQL for the gate's store and the inbox alike: a psycopg connection offering what
their SQLite statements use of sqlite3's (connection: each statement translated once,
errors raised as sqlite3's classes), where a database is and how to connect to it (target),
and a schema derived from SQLite's migrated DDL, migrated once under an advisory lock
(migrate). Standard library only; psycopg is imported lazily, when connecting."""
