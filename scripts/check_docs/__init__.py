"""The checks of scripts/check-docs, by concern."""
