"""The reuse model: what llama-server should re-process (``expectation``) and whether reused output equals
output computed without reuse (``verification``)."""
