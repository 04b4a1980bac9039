"""The gate's rules: create, decide (quorum, skip veto, adjust revisions, delegation), expire,
cancel."""
