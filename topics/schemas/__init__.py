"""JSON Schema files of the wire records (package data; ``topics.schema(name)`` loads one)."""
