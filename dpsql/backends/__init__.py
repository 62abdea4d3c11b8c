"""Engines that run a plan: the rewrite to bounded SQL, bounded copies, and DuckDB."""
