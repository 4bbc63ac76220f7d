"""rig's web page and the node's HTTP endpoint (/metrics, /, /api/overview): rig.web.server."""
