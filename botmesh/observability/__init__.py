"""What operators see of a running worker and gateway: Prometheus metrics (``metrics``) and
the worker's health server (``http``)."""
