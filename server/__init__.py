"""The daemon: HTTP API, settings, task supervisor, CLI."""
