"""rig's gateway: the API on a Unix socket for users without Redis credentials (server.py)."""
