"""The whole schema as reviewed SQL; migrations applied in order, versioned by PRAGMA
user_version."""

from __future__ import annotations

# Each migration is a list of statements run in one transaction; index i brings
# the database from user_version i to i + 1. Never edit a shipped migration.
MIGRATIONS: list[list[str]] = [
    [
        """
        CREATE TABLE approvals (
            approval_id     TEXT PRIMARY KEY,
            run_id          TEXT NOT NULL,
            pipeline        TEXT NOT NULL,
            step            TEXT NOT NULL,
            risk            TEXT NOT NULL,
            content_type    TEXT NOT NULL,
            quorum_required INTEGER NOT NULL CHECK (quorum_required >= 1),
            scope           TEXT NOT NULL,  -- JSON [[operator_id, identity], ...], frozen
            budget          TEXT,           -- JSON budget context sent to the relay, or NULL
            spend           REAL,
            revision        INTEGER NOT NULL DEFAULT 1,
            state           TEXT NOT NULL CHECK (state IN ('pending', 'resolved')),
            outcome         TEXT CHECK (outcome IN
                                ('approved', 'adjusted', 'skipped', 'timeout', 'cancelled')),
            created_at      INTEGER NOT NULL,  -- unix ms, UTC
            expires_at      INTEGER NOT NULL,
            resolved_at     INTEGER,
            idempotency_key TEXT UNIQUE,
            request_hash    TEXT NOT NULL,
            receipt         TEXT,              -- JSON receipt of the resolution audit entry
            CHECK ((state = 'pending') = (outcome IS NULL))
        )
        """,
        "CREATE INDEX approvals_pending_expiry ON approvals (expires_at) WHERE state = 'pending'",
        "CREATE INDEX approvals_state ON approvals (state, approval_id)",
        """
        CREATE TABLE revisions (
            approval_id  TEXT NOT NULL REFERENCES approvals (approval_id),
            revision     INTEGER NOT NULL,
            body         TEXT NOT NULL,
            payload_hash TEXT NOT NULL,
            nonce        TEXT NOT NULL UNIQUE,
            created_at   INTEGER NOT NULL,
            created_by   INTEGER,  -- operator id whose adjust made it; NULL for revision 1
            PRIMARY KEY (approval_id, revision)
        )
        """,
        """
        CREATE TABLE decisions (
            decision_id  INTEGER PRIMARY KEY,
            approval_id  TEXT NOT NULL REFERENCES approvals (approval_id),
            revision     INTEGER NOT NULL,
            operator_id  INTEGER NOT NULL,
            identity     TEXT NOT NULL,  -- as the relay sent it
            display      TEXT,
            channel      TEXT,
            decision     TEXT NOT NULL CHECK (decision IN ('approve', 'skip', 'adjust')),
            payload_hash TEXT NOT NULL,
            adjust_text  TEXT,
            decided_at   TEXT NOT NULL,  -- as the relay sent it
            recorded_at  INTEGER NOT NULL,
            UNIQUE (approval_id, revision, operator_id)
        )
        """,
        """
        CREATE TABLE outbox (
            approval_id     TEXT NOT NULL REFERENCES approvals (approval_id),
            revision        INTEGER NOT NULL,
            attempts        INTEGER NOT NULL DEFAULT 0,
            next_attempt_at INTEGER NOT NULL,
            delivered_at    INTEGER,
            last_error      TEXT,
            PRIMARY KEY (approval_id, revision)
        )
        """,
        "CREATE INDEX outbox_due ON outbox (next_attempt_at) WHERE delivered_at IS NULL",
        """
        CREATE TABLE audit_log (
            seq         INTEGER PRIMARY KEY,
            approval_id TEXT,
            kind        TEXT NOT NULL,
            entry       TEXT NOT NULL,  -- canonical JSON of the entry
            prev_hash   TEXT NOT NULL,
            entry_hash  TEXT NOT NULL,
            receipt     TEXT NOT NULL
        )
        """,
    ],
    # 2: signed audit entries, execution permits, the requester of an approval (no self-approval)
    [
        # key_id: "ed25519:" + 16 hex; signature: hex Ed25519 signature of entry_hash (ASCII)
        "ALTER TABLE audit_log ADD COLUMN key_id TEXT",
        "ALTER TABLE audit_log ADD COLUMN signature TEXT",
        # the requesting operator (configured identity and id), NULL when none was named
        "ALTER TABLE approvals ADD COLUMN requested_by TEXT",
        "ALTER TABLE approvals ADD COLUMN requested_by_id INTEGER",
        # the step's allow_self_approval, frozen at creation like scope and quorum
        "ALTER TABLE approvals ADD COLUMN allow_self_approval INTEGER NOT NULL DEFAULT 0",
        # compact JWS execution permit; set only for approved/adjusted with a signing key
        "ALTER TABLE approvals ADD COLUMN permit TEXT",
    ],
    # 3: an approval's ``created`` audit entry found by approval_id, so every approval object
    # carries that entry's receipt (``created_receipt``) without a scan of the whole log
    [
        "CREATE INDEX audit_log_created ON audit_log (approval_id) WHERE kind = 'created'",
    ],
    # 4: a decision's reason and principal (delegation); an approval's follow-up
    # plan (reminders, escalation levels), frozen at creation like its scope, and where it
    # stands; the sends that are not a revision's first dispatch (reminders, escalations,
    # resolution notices), each its own row so a level or reminder is queued exactly once
    [
        "ALTER TABLE decisions ADD COLUMN reason TEXT",
        "ALTER TABLE decisions ADD COLUMN on_behalf_of INTEGER",  # the principal's operator id
        # JSON {"remind_after_ms", "remind_every_ms", "levels": [[after_ms, [[id, identity]...]]]}
        "ALTER TABLE approvals ADD COLUMN followups TEXT",
        "ALTER TABLE approvals ADD COLUMN reminders_sent INTEGER NOT NULL DEFAULT 0",
        "ALTER TABLE approvals ADD COLUMN escalation_level INTEGER NOT NULL DEFAULT 0",
        "ALTER TABLE approvals ADD COLUMN next_followup_at INTEGER",  # unix ms, or NULL
        "CREATE INDEX approvals_followup_due ON approvals (next_followup_at)"
        " WHERE state = 'pending' AND next_followup_at IS NOT NULL",
        """
        CREATE TABLE followup_outbox (
            approval_id     TEXT NOT NULL REFERENCES approvals (approval_id),
            kind            TEXT NOT NULL CHECK (kind IN ('reminder', 'escalation', 'notice')),
            n               INTEGER NOT NULL,  -- reminder count, escalation level; 1 for notice
            revision        INTEGER NOT NULL,
            attempts        INTEGER NOT NULL DEFAULT 0,
            next_attempt_at INTEGER NOT NULL,
            give_up_at      INTEGER NOT NULL,  -- unix ms: not delivered by then = failed
            delivered_at    INTEGER,
            failed_at       INTEGER,
            last_error      TEXT,
            PRIMARY KEY (approval_id, kind, n)
        )
        """,
        "CREATE INDEX followup_outbox_due ON followup_outbox (next_attempt_at)"
        " WHERE delivered_at IS NULL AND failed_at IS NULL",
    ],
    # 5: questions: a pipeline asks a person for a typed answer. Their own tables
    # (no approval code path reads them), ids from the same ULID generator as approvals
    [
        """
        CREATE TABLE questions (
            question_id       TEXT PRIMARY KEY,
            run_id            TEXT NOT NULL,
            pipeline          TEXT NOT NULL,
            step              TEXT NOT NULL,
            risk              TEXT NOT NULL,
            scope             TEXT NOT NULL,  -- JSON [[operator_id, identity], ...], frozen
            version           INTEGER NOT NULL DEFAULT 1,
            state             TEXT NOT NULL CHECK (state IN ('pending', 'resolved')),
            outcome           TEXT CHECK (outcome IN ('answered', 'timeout', 'cancelled')),
            created_at        INTEGER NOT NULL,  -- unix ms, UTC
            expires_at        INTEGER NOT NULL,
            resolved_at       INTEGER,
            idempotency_key   TEXT UNIQUE,
            request_body_hash TEXT NOT NULL,     -- idempotency compare of the create body
            requested_by      TEXT,
            requested_by_id   INTEGER,
            answer            TEXT,     -- canonical JSON of the winning answer's value
            answered_by       INTEGER,  -- operator id
            answer_identity   TEXT,     -- as the relay sent it
            answer_display    TEXT,
            answer_channel    TEXT,
            answer_version    INTEGER,
            answered_at       TEXT,     -- the relay's decided_at, as sent
            answer_recorded_at INTEGER, -- unix ms, the gate's clock
            receipt           TEXT,     -- JSON receipt of the question_resolved entry
            answer_salt       TEXT NOT NULL,  -- 16 random bytes, hex: salts value_hash
                                              -- (never in the log or the API)
            CHECK ((state = 'pending') = (outcome IS NULL))
        )
        """,
        "CREATE INDEX questions_pending_expiry ON questions (expires_at) WHERE state = 'pending'",
        "CREATE INDEX questions_state ON questions (state, question_id)",
        """
        CREATE TABLE question_versions (
            question_id  TEXT NOT NULL REFERENCES questions (question_id),
            version      INTEGER NOT NULL,
            question     TEXT NOT NULL,  -- JSON of the normalized question, in the order
                                         -- given (a form's fields); hashed canonical
            request_hash TEXT NOT NULL,
            nonce        TEXT NOT NULL UNIQUE,
            created_at   INTEGER NOT NULL,
            PRIMARY KEY (question_id, version)
        )
        """,
        """
        CREATE TABLE question_outbox (
            question_id     TEXT NOT NULL REFERENCES questions (question_id),
            version         INTEGER NOT NULL,
            attempts        INTEGER NOT NULL DEFAULT 0,
            next_attempt_at INTEGER NOT NULL,
            delivered_at    INTEGER,
            last_error      TEXT,
            PRIMARY KEY (question_id, version)
        )
        """,
        "CREATE INDEX question_outbox_due ON question_outbox (next_attempt_at)"
        " WHERE delivered_at IS NULL",
        # a question's resolution notice (with relay.notices): one per question, queued in
        # the resolving transaction, retried like followup_outbox's notices for an hour
        """
        CREATE TABLE question_notices (
            question_id     TEXT PRIMARY KEY REFERENCES questions (question_id),
            version         INTEGER NOT NULL,  -- the question's final version
            attempts        INTEGER NOT NULL DEFAULT 0,
            next_attempt_at INTEGER NOT NULL,  -- unix ms
            give_up_at      INTEGER NOT NULL,  -- unix ms: not delivered by then = failed
            delivered_at    INTEGER,
            failed_at       INTEGER,
            last_error      TEXT
        )
        """,
        "CREATE INDEX question_notices_due ON question_notices (next_attempt_at)"
        " WHERE delivered_at IS NULL AND failed_at IS NULL",
        # a question's audit entries carry its question_id in audit_log.approval_id (one id
        # space: ULIDs never collide); its question_created entry found without a scan
        "CREATE INDEX audit_log_question_created ON audit_log (approval_id)"
        " WHERE kind = 'question_created'",
    ],
    # 6: approvers' own credentials (Ed25519 keys now, passkeys next), owned by
    # the gate and enrolled through the admin API; the credential that signed a decision
    [
        """
        CREATE TABLE approver_credentials (
            credential_id TEXT PRIMARY KEY,  -- base64url, no padding
            operator_id   INTEGER NOT NULL,
            type          TEXT NOT NULL CHECK (type IN ('ed25519', 'webauthn')),
            public_key    TEXT NOT NULL,  -- base64url: raw 32 bytes (ed25519), COSE (webauthn)
            sign_count    INTEGER NOT NULL DEFAULT 0,  -- webauthn's last signature counter
            label         TEXT,
            created_at    INTEGER NOT NULL,  -- unix ms
            revoked_at    INTEGER            -- unix ms, NULL while in force
        )
        """,
        "CREATE INDEX approver_credentials_operator ON approver_credentials (operator_id)",
        "ALTER TABLE decisions ADD COLUMN credential_id TEXT",  # NULL: unsigned
    ],
    # 7: one-time invites to enrol a passkey (the token itself is never stored,
    # only its SHA-256), and the step's approver_signature frozen when the approval is
    # created (NULL: created before this migration, the config in force decides)
    [
        """
        CREATE TABLE approver_invites (
            invite_hash   TEXT PRIMARY KEY,  -- SHA-256 hex of the invite token
            operator_id   INTEGER NOT NULL,
            label         TEXT,              -- the label the enrolled credential gets
            challenge     TEXT NOT NULL,     -- base64url: the registration challenge
            created_at    INTEGER NOT NULL,  -- unix ms
            expires_at    INTEGER NOT NULL,  -- unix ms
            used_at       INTEGER,           -- unix ms, NULL while unused
            credential_id TEXT               -- the credential enrolled with it
        )
        """,
        "ALTER TABLE approvals ADD COLUMN approver_signature TEXT",
    ],
    # 8: a batch's one passkey assertion decides each of its items: the SHA-256
    # (hex, ``assertion_sha256``) of the batch assertion that set sign_count, so that very
    # assertion is accepted again at the same counter (NULL: set by a single decision)
    [
        "ALTER TABLE approver_credentials ADD COLUMN counter_assertion TEXT",
    ],
]

SCHEMA_VERSION = len(MIGRATIONS)
