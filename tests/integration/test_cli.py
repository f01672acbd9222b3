"""``milvus-cdc task ...`` and ``milvus-cdc check`` run as commands against a running daemon and
real services (etcd, the Kafka mock, Milvus Lite)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest
import yaml
from harness.daemon import REPO_ROOT
from harness.services import free_port
from harness.task_bodies import create_body

pytestmark = pytest.mark.integration

SECRET = "Cli-Pa55-never-printed"


def cli(*args, env=None, timeout=90):
    environ = {k: v for k, v in os.environ.items() if not k.upper().startswith("CDC_")}
    environ.update(PYTHONPATH=str(REPO_ROOT), no_proxy="127.0.0.1,localhost", **(env or {}))
    return subprocess.run(
        [sys.executable, "-m", "server", *args],
        capture_output=True,
        text=True,
        env=environ,
        timeout=timeout,
        check=False,
    )


def ok(*args, **kwargs):
    done = cli(*args, **kwargs)
    assert done.returncode == 0, (done.stdout, done.stderr)
    return done.stdout


@pytest.fixture
def daemon(daemon_factory):
    return daemon_factory().start()


def test_task_commands(daemon, milvus_lite_service):
    url = daemon.cli_args
    empty = ok("task", "list", *url)
    assert empty.split() == ["TASK", "STATE", "OWNER", "LAG_S", "ROWS/S", "ROWS", "TARGET",
                             "COLLECTIONS", "REASON"]  # fmt: skip

    created = ok(
        "task", "create", *url,
        "--target", milvus_lite_service.uri,
        "--collection", "orders",
        "--collection", "sales.*",
        "--task-id", "cli-1",
        "--username", "root",
        "--password-env", "CLI_PW",
        env={"CLI_PW": SECRET},
    )  # fmt: skip
    assert created.splitlines()[1].split()[:2] == ["cli-1", "Running"]

    listed = json.loads(ok("task", "list", *url, "--json"))
    (task,) = listed["tasks"]
    assert task["task_id"] == "cli-1"
    assert task["db_collections"] == {
        "default": [{"name": "orders", "use_start_position": False}],
        "sales": [{"name": "*", "use_start_position": False}],
    }
    assert task["milvus_connect_param"]["username"] == "root"

    shown = ok("task", "get", "cli-1", *url)
    facts = dict(line.split(None, 1) for line in shown.splitlines()[:2])
    assert facts == {"task": "cli-1", "state": "Running"}
    assert "default.orders,sales.*" in shown and milvus_lite_service.uri in shown

    paused = ok("task", "pause", "cli-1", *url)
    assert paused.splitlines()[1].split()[:2] == ["cli-1", "Paused"]
    again = cli("task", "pause", "cli-1", *url)
    assert again.returncode == 1
    assert again.stderr.strip() == "milvus-cdc: 409 Conflict: task cli-1 is already Paused"
    resumed = json.loads(ok("task", "resume", "cli-1", *url, "--json"))
    assert resumed["task"]["state"] == "Running"
    # the daemon alone is the fleet, and runs the task
    fleet = ok("task", "fleet", *url).splitlines()
    assert fleet[0].split() == ["DAEMON", "ADDRESS", "TASKS"]
    assert fleet[1].split()[1:] == [f"127.0.0.1:{daemon.port}", "1", "(this", "one)"]
    assert ok("task", "list", *url).splitlines()[1].split()[2] == fleet[1].split()[0]
    detail = json.loads(ok("task", "get", "cli-1", *url, "--json"))
    assert detail["task"]["state"] == "Running" and isinstance(detail["positions"], list)

    assert ok("task", "delete", "cli-1", *url).strip() == "task cli-1 deleted"
    gone = cli("task", "get", "cli-1", *url)
    assert gone.returncode == 1 and gone.stderr.startswith("milvus-cdc: 404 Not Found")
    # the address comes from the configuration when no --url is given
    assert json.loads(
        ok("task", "list", "--config", str(daemon.config_path), "--token", daemon.token, "--json")
    ) == {"tasks": []}
    everything = " ".join([created, shown, paused, again.stderr, json.dumps(listed)])
    assert SECRET not in everything
    daemon.stop()
    assert SECRET not in daemon.log_text()


def test_task_create_from_a_body_file_and_refusals(daemon, milvus_lite_service, tmp_path):
    url = daemon.cli_args
    body = tmp_path / "task.json"
    body.write_text(json.dumps(create_body(milvus_lite_service, collections=("a", "b"))))
    created = json.loads(ok("task", "create", *url, "--body", str(body), "--no-start", "--json"))
    assert created["task"]["state"] == "Initial"
    assert [c["name"] for c in created["task"]["collection_infos"]] == ["a", "b"]
    invalid = cli("task", "create", *url, "--target", "not a uri")
    assert invalid.returncode == 1 and "400 Bad Request" in invalid.stderr
    assert "milvus_connect_param.uri" in invalid.stderr
    missing_env = cli("task", "create", *url, "--target", "http://h:1", "--password-env", "NOPE")
    assert missing_env.returncode == 1 and "NOPE is not set" in missing_env.stderr
    unreachable = cli("task", "list", "--url", f"http://127.0.0.1:{free_port()}", "--timeout", "5")
    assert unreachable.returncode == 1 and "cannot reach the daemon" in unreachable.stderr


def write_config(tmp_path, **config):
    path = tmp_path / f"check-{len(list(tmp_path.glob('check-*')))}.yaml"
    path.write_text(yaml.safe_dump({"metaStoreConfig": {"sqlitePath": str(tmp_path / "m.db")},
                                    **config}))  # fmt: skip
    return str(path)


def test_check_reports_versions_of_what_answers(
    tmp_path, etcd_service, kafka_mock, milvus_lite_service
):
    config = write_config(
        tmp_path,
        sourceConfig={"etcd": {"address": [etcd_service.endpoint]}, "etcdRootPath": "no-source",
                      "kafka": {"address": kafka_mock.bootstrap}, "dmlChannelNum": 2},
    )  # fmt: skip
    done = cli("check", "--config", config, "--target", milvus_lite_service.uri, "--json")
    assert done.returncode == 0, (done.stdout, done.stderr)
    results = {r["check"]: r for r in json.loads(done.stdout)}
    assert set(results) == {"metastore", "source etcd", "source queue", "target"}
    assert all(r["ok"] for r in results.values()), results
    assert results["source etcd"]["version"].startswith("etcd 3.")
    assert results["source etcd"]["detail"] == "0 collection(s) under no-source/meta"
    assert "1 broker(s)" in results["source queue"]["detail"]
    assert results["target"]["version"].startswith("milvus ")
    assert results["target"]["target"] == milvus_lite_service.uri
    table = ok("check", "--config", config, "--target", milvus_lite_service.uri)
    assert [line.split()[0] for line in table.splitlines()] == [
        "CHECK", "metastore", "source", "source", "target"
    ]  # fmt: skip


def test_check_fails_fast_and_names_what_did_not_answer(tmp_path):
    config = write_config(
        tmp_path,
        sourceConfig={"etcd": {"address": [f"http://127.0.0.1:{free_port()}"]},
                      "kafka": {"address": f"127.0.0.1:{free_port()}"}},
    )  # fmt: skip
    closed = f"http://127.0.0.1:{free_port()}"
    started = time.monotonic()
    done = cli("check", "--config", config, "--target", closed, "--timeout", "2", "--json")
    assert time.monotonic() - started < 30
    assert done.returncode == 1, done.stderr
    results = {r["check"]: r for r in json.loads(done.stdout)}
    assert results["metastore"]["ok"]  # nothing there yet: the daemon creates it
    assert not results["source etcd"]["ok"] and results["source etcd"]["detail"]
    assert (
        not results["source queue"]["ok"] and "kafka 127.0.0.1" in results["source queue"]["detail"]
    )
    assert not results["target"]["ok"] and "not reachable" in results["target"]["detail"]
    table = cli("check", "--config", config, "--target", closed, "--timeout", "2").stdout
    assert table.count("FAILED") == 3


def test_check_a_stored_tasks_target_and_a_rocksmq_source(daemon, milvus_lite_service, tmp_path):
    from rocksdict import Rdict

    body = create_body(milvus_lite_service, task_id="chk-1")
    body["milvus_connect_param"].update(username="root", password=SECRET)
    assert daemon.request("POST", "/v1/tasks", body)[0] == 201
    rocks = tmp_path / "rocksmq"
    Rdict(str(rocks)).close()  # a real RocksDB directory
    config = dict(daemon.config)
    config["sourceConfig"] = {**config["sourceConfig"], "mqType": "rocksmq",
                              "rocksmq": {"path": str(rocks)}}  # fmt: skip
    path = tmp_path / "with-rocksmq.yaml"
    path.write_text(yaml.safe_dump(config))
    done = cli("check", "--config", str(path), "--task", "chk-1", "--task", "nope", "--json")
    results = {r["check"]: r for r in json.loads(done.stdout)}
    assert results["metastore"]["ok"]
    assert results["metastore"]["detail"] == "1 task(s); one daemon per database file"
    assert results["source queue"]["ok"] and "RocksDB directory present" in done.stdout
    assert results["target of task chk-1"]["ok"]
    assert results["target of task chk-1"]["version"].startswith("milvus ")
    assert results["target of task nope"] == {
        "check": "target of task nope", "target": "", "ok": False, "version": "",
        "detail": "no such task in the metastore",
    }  # fmt: skip
    assert done.returncode == 1
    assert SECRET not in done.stdout + done.stderr
    config["sourceConfig"]["rocksmq"]["path"] = str(tmp_path)
    path.write_text(yaml.safe_dump(config))
    not_rocks = json.loads(cli("check", "--config", str(path), "--json").stdout)
    assert [r["ok"] for r in not_rocks if r["check"] == "source queue"] == [False]


def test_config_show_is_merged_and_redacted(tmp_path):
    config = write_config(tmp_path, sourceConfig={"etcd": {"enableAuth": True, "password": SECRET}})
    shown = json.loads(ok("config", "show", "--config", config, env={"CDC_MAXTASKNUM": "7"}))
    assert shown["maxTaskNum"] == 7  # the environment over the file
    assert shown["sourceConfig"]["etcd"]["password"] == "******"
    assert shown["scheduler"]["retry"]["initialBackoffSeconds"] == 10
    assert SECRET not in json.dumps(shown)


def test_a_kafka_target_from_the_cli_listed_and_checked(daemon, kafka_mock, tmp_path):
    url = daemon.cli_args
    created = ok(
        "task", "create", *url,
        "--kafka-target", f"{kafka_mock.bootstrap}/cli-events",
        "--collection", "orders",
        "--task-id", "kafka-1",
        "--no-start",
    )  # fmt: skip
    assert "kafka-1" in created
    listed = ok("task", "list", *url)
    assert f"kafka://{kafka_mock.bootstrap}/cli-events" in listed
    task = json.loads(ok("task", "get", "kafka-1", *url, "--json"))["task"]
    assert task["kafka_connect_param"]["topic"] == "cli-events"
    assert "milvus_connect_param" not in task
    refused = cli("task", "backfill", "kafka-1", *url)
    assert refused.returncode == 1 and "a Kafka target takes no backfill" in refused.stderr
    unreachable = cli(
        "task", "create", *url, "--kafka-target", f"127.0.0.1:{free_port()}/t", "--no-start",
        "--connect-timeout", "2",
    )  # fmt: skip
    assert unreachable.returncode == 1 and "brokers do not answer" in unreachable.stderr
    path = tmp_path / "check.yaml"
    path.write_text(yaml.safe_dump(daemon.config))
    done = cli("check", "--config", str(path), "--task", "kafka-1", "--json", "--timeout", "5")
    result = {r["check"]: r for r in json.loads(done.stdout)}["target of task kafka-1"]
    assert result["ok"] and result["version"] == "kafka", result
    assert result["target"] == f"kafka://{kafka_mock.bootstrap}/cli-events"
