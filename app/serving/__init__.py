"""Serving (S): what nodes exist for. Client API keys and deployments today; the relay next."""
