"""rig's Celery side: the app, thin tasks, the per-card runner, the dispatcher and beat jobs."""
