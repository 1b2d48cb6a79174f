"""Advice from trial runs (``advice``) and agreement of the reuse model with measured runs (``agreement``)."""
