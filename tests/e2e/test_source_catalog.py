"""The source catalog read from a real Milvus 2.3.5's etcd: databases, collections with their
schemas and settings, partitions, aliases; one collection read alone equals its entry in the
whole catalog."""

from __future__ import annotations

import uuid

import pytest
from pymilvus import DataType, MilvusClient

from replicator.config.connections import EtcdSettings
from replicator.config.stores import etcd_client_for
from replicator.meta.catalog import SourceCatalog
from tests.e2e.test_replication import source_database

pytestmark = pytest.mark.e2e


def test_catalog_reads_what_the_source_made(milvus_source, etcd_service):
    tag = uuid.uuid4().hex[:6]
    db, name, alias = f"cat_{tag}", f"books_{tag}", f"shelf_{tag}"
    client = source_database(milvus_source.uri, db)
    etcd = etcd_client_for(EtcdSettings(address=[etcd_service.endpoint]))
    try:
        schema = MilvusClient.create_schema(
            auto_id=False, enable_dynamic_field=True, description="shelved"
        )
        schema.add_field("isbn", DataType.VARCHAR, is_primary=True, max_length=20)
        schema.add_field("vec", DataType.FLOAT_VECTOR, dim=4)
        client.create_collection(name, schema=schema, num_shards=2, consistency_level="Session")
        client.create_partition(name, "fiction")
        client.create_alias(name, alias)

        catalog = SourceCatalog(etcd, milvus_source.etcd_root_path)
        everything = catalog.collections()
        (meta,) = [m for m in everything.values() if m.name == name]
        assert meta.db_name == db and not meta.dropped
        assert meta.shards == 2 and len(meta.pchannels) == 2 and len(meta.vchannels) == 2
        assert meta.consistency_level == 1  # Session
        assert meta.schema.description == "shelved" and meta.schema.enable_dynamic_field
        user_fields = {f.name: f for f in meta.schema.fields if f.fieldID >= 100}
        assert user_fields["isbn"].is_primary_key
        assert {kv.key: kv.value for kv in user_fields["vec"].type_params}["dim"] == "4"
        assert set(meta.partitions.values()) == {"_default", "fiction"}
        assert set(meta.start_positions) == set(meta.pchannels)
        assert catalog.collection(meta.collection_id) == meta
        assert catalog.collection(-1) is None
        (found,) = [a for a in catalog.aliases() if a.name == alias]
        assert (found.collection_id, found.db_id) == (meta.collection_id, meta.db_id)
        assert catalog.databases()[meta.db_id] == db

        client.drop_alias(alias)
        client.drop_collection(name)
        assert alias not in {a.name for a in catalog.aliases()}
        gone = catalog.collection(meta.collection_id)
        assert gone is None or gone.dropped
    finally:
        client.close()
        etcd.close()
