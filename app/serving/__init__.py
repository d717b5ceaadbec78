"""Serving (S): what nodes exist for. Client API keys today; deployments and the relay next."""
