"""A config's fingerprint: the hash several gates on one database compare, so a replica
running different rules is seen (``config_divergent``)."""

from __future__ import annotations

import hashlib
import json
from typing import Any

from gate.config.model import Config

# what may differ from one replica to the next without changing a rule: where it listens,
# where its storage is (the same database, reached by another name), the file it came from
PER_REPLICA: dict[str, Any] = {
    "source": True,
    "storage": True,
    "api": {"listen"},
    "relay": {"callback_addr"},
}


def config_hash(config: Config) -> str:
    """SHA-256 (hex) of ``config``'s validated values, as canonical JSON (sorted keys), less
    what is per replica (``PER_REPLICA``). Secrets are not in it (the config names their
    variables only), so two replicas with the same file and different secrets hash alike."""
    values = config.model_dump(mode="json", exclude=PER_REPLICA)
    text = json.dumps(values, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(text.encode()).hexdigest()
