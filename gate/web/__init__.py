"""aiohttp app factories and thin handlers."""
