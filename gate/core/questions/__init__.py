"""What only questions have: their kind (kind) and service (service), the create and revise
bodies (create), revise (revise_tx) and the answer checks (answer_tx)."""
