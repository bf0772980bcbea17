"""The `llm` command line."""
