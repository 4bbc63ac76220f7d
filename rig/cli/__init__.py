"""rig's command line: a thin shell over rig.client."""
