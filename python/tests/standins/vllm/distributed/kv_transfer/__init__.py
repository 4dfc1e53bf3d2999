"""Stand-in package (empty, as in ENGINES.md §4)."""
