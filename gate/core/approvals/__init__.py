"""What only approvals have: their kind (kind) and service (service), the create request
(create), decide (decide_tx: quorum, skip veto, adjust) with its rules, delegation, resolution
(resolve_tx), follow-ups, policies and approver signatures."""
