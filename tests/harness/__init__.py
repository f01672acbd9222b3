"""Test harness: real services (etcd, MariaDB, Milvus Lite) on free loopback ports."""
