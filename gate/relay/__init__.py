"""Relay-side I/O shared by the relays (the reference relay, the inbox) and the conformance
test: a signed POST from the gate read whole and opened (inbound), and a decision or answer
signed and delivered to the gate's callback with the one retry policy (delivery). Uses
gate.protocol only, never gate.core or gate.store."""
