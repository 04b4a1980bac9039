"""What only ``hitl-gate serve`` runs: the one composition root (app), listeners and signals
(serve), SIGHUP reload (reload), the dispatcher's loop (dispatch) and its one outbox sender
(delivery) with a channel per outbox (approval_dispatch, followups, question_sender,
question_notices), the only outbound HTTP (relay_http), the one scheduler of everything timed
(timers), systemd notify (sdnotify), and on PostgreSQL the gate's part among the gates on the
database (cluster: heartbeat, the timers' lease, the change feed)."""
