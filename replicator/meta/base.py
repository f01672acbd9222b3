"""What the engine asks of a source's metadata, whichever Milvus generation wrote it.

:class:`replicator.meta.catalog.SourceCatalog` reads both layouts (2.3-2.5 and 2.6 keep the same
keys; 2.6 adds fields, see its docstring); a test double or another store implements the same
four calls.
"""

from __future__ import annotations

from typing import Protocol

from replicator.meta.catalog import AliasMeta, CollectionMeta


class CatalogReader(Protocol):
    """The four metadata calls the engine makes of a source."""

    def databases(self) -> dict[int, str]:
        """Database names by id (the default database, id 1, always included)."""

    def collections(self) -> dict[int, CollectionMeta]:
        """Every collection the source knows, dropped ones included (``meta.dropped``)."""

    def collection(self, collection_id: int) -> CollectionMeta | None: ...

    def aliases(self) -> list[AliasMeta]:
        """The aliases in effect."""
