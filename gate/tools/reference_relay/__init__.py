"""The reference relay (``hitl-gate relay``): the HTTP receiver and decision sender (relay), what
it knows of each approval (state), the terminal it asks on (terminal) and what it shows (view)."""
