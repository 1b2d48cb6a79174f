"""The machine's state around a step: host memory and page cache, GPU samples and their summary, run spreads."""
