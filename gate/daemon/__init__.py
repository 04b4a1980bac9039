"""What only ``hitl-gate serve`` runs: listeners, signals and reload (serve), the dispatch outbox
(dispatch), the expiry scheduler (expiry), systemd notify (sdnotify)."""
