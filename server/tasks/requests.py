"""Request bodies of ``POST /cdc``: the Go milvus-cdc's field names, validated strictly.

Pydantic checks shapes and types (unknown fields and wrong types are errors); ``validate_create``
checks what needs the daemon's settings (name lengths, the source's channel prefix, files).
Go clients send empty structs and ``null`` for fields they do not use, so those are accepted.
"""

from __future__ import annotations

from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError, field_validator

from replicator.config.settings import describe_validation_error
from replicator.pipeline.selection import WILDCARD
from server.errors import BadRequestError

MAX_CONNECT_TIMEOUT = 300


class _Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)


class DialConfig(_Strict):
    server_name: str = ""
    server_pem_path: str = ""
    ca_pem_path: str = ""
    client_pem_path: str = ""
    client_key_path: str = ""


class MilvusConnectParam(_Strict):
    host: str = ""
    port: int = Field(default=0, ge=0, le=65535)
    uri: str = ""
    username: str = ""
    password: SecretStr = SecretStr("")
    token: SecretStr = SecretStr("")
    enable_tls: bool = False
    dial_config: DialConfig | None = None
    connect_timeout: int = Field(default=0, ge=0, le=MAX_CONNECT_TIMEOUT)
    channel_num: int = Field(default=0, ge=0)
    ignore_partition: bool = False


class CredentialsUpdate(_Strict):
    """ours: new credentials for a task's target Milvus, given at ``resume`` (a password or
    token rotated, certificates moved): these keys replace the stored ones, the rest of its
    ``milvus_connect_param`` (its address) stays."""

    username: str = ""
    password: SecretStr = SecretStr("")
    token: SecretStr = SecretStr("")
    dial_config: DialConfig | None = None


class KafkaSasl(_Strict):
    username: str = ""
    password: SecretStr = SecretStr("")
    mechanisms: str = ""  # the Go tool's spelling
    mechanism: str = ""
    security_protocol: str = ""


# the most processes one task's channels may run in (kafka_connect_param.processes)
MAX_PROCESSES = 64


class KafkaConnectParam(_Strict):
    address: str = ""
    topic: str = ""
    enable_sasl: bool = False
    sasl: KafkaSasl | None = None
    # ours: DDL events to a topic of their own (needed when ``topic`` has placeholders)
    ddl_topic: str = ""
    # ours: where the task's committed positions live (compacted; shared by tasks)
    positions_topic: str = ""
    connect_timeout: int = Field(default=0, ge=0, le=MAX_CONNECT_TIMEOUT)
    # ours: the largest event sent; a larger one stops the task with a reason
    max_event_bytes: int = Field(default=0, ge=0)
    # ours: the processes the task's channels run in (groups of channels, each with its own
    # transactional producer); 1: the daemon's own; 0: the daemon's kafkaTargetProcesses
    processes: int = Field(default=0, ge=0, le=MAX_PROCESSES)


class CollectionInfo(_Strict):
    name: str
    positions: dict[str, str] | None = None
    use_start_position: bool = False


class ChannelInfo(_Strict):
    name: str = ""
    position: str = ""


class ExtraInfo(_Strict):
    enable_user_role: bool = False


class BufferConfig(_Strict):
    period: int = Field(default=0, ge=0)
    size: int = Field(default=0, ge=0)


class NameMapping(_Strict):
    source_db: str
    target_db: str
    collection_mapping: dict[str, str] | None = None


class BackfillOption(_Strict):
    """ours: copy the rows the source already holds (on Spark), then stream from there."""

    collections: list[str] = Field(default_factory=lambda: [WILDCARD])


class VerifyOption(_Strict):
    """ours: verify the task on a schedule (docs/guides/verify.md)."""

    # the names of the daemon's verify settings (cdc.yaml), as issue 13 asks
    intervalHours: float = Field(gt=0)  # noqa: N815
    sampleFraction: float | None = Field(default=None, gt=0, le=1)  # noqa: N815


class CreateRequest(_Strict):
    milvus_connect_param: MilvusConnectParam | None = None
    kafka_connect_param: KafkaConnectParam | None = None
    collection_infos: list[CollectionInfo] | None = None
    db_collections: dict[str, list[CollectionInfo]] | None = None
    rpc_channel_info: ChannelInfo | None = None
    extra_info: ExtraInfo | None = None
    buffer_config: BufferConfig | None = None
    name_mapping: list[NameMapping] | None = None
    disable_auto_start: bool = False
    task_id: str = ""
    positions: dict[str, str] | None = None
    # ours; absent or null: no backfill (the Go tool's behaviour)
    backfill: BackfillOption | None = None
    # ours; absent or null: the daemon's verify.intervalHours
    verify: VerifyOption | None = None
    # ours (docs/concepts/disaster-recovery.md): the source read, one of the configuration's
    # clusters (absent, null or "sourceConfig": sourceConfig), and a named cluster as the target
    # in place of milvus_connect_param
    source_cluster: str | None = None
    target_cluster: str | None = None
    # ours: where a new task starts reading: "creation" (its collections' creation while the
    # WAL holds it, the Go tool's behaviour) or "end" (only writes made after the create; a
    # switchover's reverse task starts so)
    start_at: Literal["creation", "end"] = "creation"


class TaskIdRequest(_Strict):
    task_id: str

    @field_validator("task_id")
    @classmethod
    def _task_id(cls, value: str) -> str:
        if not value:
            raise ValueError("task_id is empty")
        return value


class ResumeRequest(TaskIdRequest):
    # ours (a Go client sends task_id alone): the target's new credentials
    milvus_connect_param: CredentialsUpdate | None = None


class ResumeBody(_Strict):
    """``POST /v1/tasks/{task_id}/resume``'s body, when there is one."""

    milvus_connect_param: CredentialsUpdate | None = None


class DeleteRequest(TaskIdRequest):
    ignore_not_found: bool = False


class BackfillRequest(TaskIdRequest):
    collections: list[str] = Field(default_factory=lambda: [WILDCARD])


class VerifyRequest(TaskIdRequest):
    collections: list[str] = Field(default_factory=lambda: [WILDCARD])
    repair: bool = False


class ListRequest(_Strict):
    pass


M = TypeVar("M", bound=BaseModel)


def parse_model(model: type[M], data: Any, where: str = "request_data") -> M:
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise BadRequestError(f"{where}: must be a JSON object")
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise BadRequestError(describe_validation_error(exc, where)) from exc
