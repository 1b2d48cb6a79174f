"""reusebench: how much of a long context llama-server really reuses, at what cost, and whether it is right."""

__version__ = "0.1.0"
