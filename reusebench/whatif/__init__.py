"""What each launch option would win on a trace, predicted by the reuse model before any restart, then verified by a replay."""
