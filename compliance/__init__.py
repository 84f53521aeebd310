"""Checking MLPerf logs, packaging submission trees, summarising scores."""
