"""What only ``hitl-gate serve`` runs: the one composition root (app), listeners and signals
(serve), SIGHUP reload (reload), the dispatch outbox (dispatch) and the follow-up sends it drains
too (followups), the expiry scheduler (expiry), systemd notify (sdnotify)."""
