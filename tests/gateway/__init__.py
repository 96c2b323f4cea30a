"""The webhook gateway (``botmesh gateway``), the channel registry and the Slack webhook."""
