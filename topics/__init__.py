"""The wire: topic catalog, record schemas, keying, provisioning, replay and redrive helpers."""
