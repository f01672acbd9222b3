"""meta"""

from replicator.meta.base import CatalogReader
from replicator.meta.catalog import (
    AliasMeta,
    CollectionMeta,
    SourceCatalog,
    is_streaming_source,
)

__all__ = ["AliasMeta", "CatalogReader", "CollectionMeta", "SourceCatalog", "is_streaming_source"]
