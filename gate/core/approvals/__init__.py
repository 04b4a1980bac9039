"""What only approvals have: the create request, decide (quorum, skip veto, adjust), the
rules, delegation, follow-ups, policies, approver signatures."""
