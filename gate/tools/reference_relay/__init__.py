"""The reference relay (``hitl-gate relay``): the HTTP receiver and its signed sending
(relay), run by server, its approvals and questions desks (approvals; questions,
question_prompt), what it knows of each approval (state), the terminal it asks on (terminal)
and what it shows (view, question_view); with --approver-key the approver's key that signs
each decision (approver_key)."""
