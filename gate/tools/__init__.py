"""Separate programs: the reference relay, doctor and the relay conformance test (conformance).
Relays here are untrusted peers: they may use gate.protocol but never gate.core or gate.store."""
