"""What a llama-server build does where builds differ: capabilities, their probes, and the cache by binary hash."""
