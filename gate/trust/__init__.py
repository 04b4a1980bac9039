"""What others verify offline: Ed25519 key files (keys) and execution permits (permit)."""
