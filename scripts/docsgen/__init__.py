"""The generated pages of the documentation site (docs/reference/, the catalogue of messages in
docs/troubleshooting.md): each is rendered from the code by a module here, never written by hand.
``python scripts/gen_docs.py`` writes them; ``--check`` fails when one is stale."""
