"""The deployment files are valid: the Dockerfile, the systemd unit (``systemd-analyze verify``
where it exists), the compose stack and its Prometheus and Grafana provisioning. No Docker
engine runs here, so they are parsed and checked against the daemon's own settings."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import yaml

from replicator.config.settings import load_settings

REPO = Path(__file__).resolve().parents[2]
DEPLOYMENT = REPO / "deployment"
COMPOSE = DEPLOYMENT / "compose" / "docker-compose.yml"
UNIT = DEPLOYMENT / "systemd" / "milvus-cdc.service"
DEFAULTS = load_settings(None, {})
# the daemon exits by drainTimeoutSeconds + 5 (server/daemon.py); stop timeouts must exceed it
DRAIN_BOUND = DEFAULTS.drainTimeoutSeconds + 5

INSTRUCTIONS = {
    "FROM", "RUN", "CMD", "LABEL", "EXPOSE", "ENV", "ADD", "COPY", "ENTRYPOINT", "VOLUME",
    "USER", "WORKDIR", "ARG", "ONBUILD", "STOPSIGNAL", "HEALTHCHECK", "SHELL",
}  # fmt: skip


# --- Dockerfile ----------------------------------------------------------------------------------
def dockerfile_instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) per logical line: continuations joined, comments dropped."""
    result, pending = [], ""
    for line in text.splitlines():
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        if stripped.endswith("\\"):
            pending += stripped[:-1] + " "
            continue
        logical = pending + stripped
        pending = ""
        keyword, _, args = logical.partition(" ")
        result.append((keyword.upper(), args.strip()))
    assert not pending, "the Dockerfile ends inside a continuation"
    return result


def stages(instructions):
    current: list[tuple[str, str]] = []
    found = []
    for keyword, args in instructions:
        if keyword == "FROM":
            current = []
            found.append((args, current))
        else:
            current.append((keyword, args))
    return found


def exec_form(args: str) -> list[str]:
    value = json.loads(args)
    assert isinstance(value, list) and all(isinstance(v, str) for v in value), args
    return value


def stage_named(built, name: str) -> list[tuple[str, str]]:
    return next(body for header, body in built if header.endswith(f" AS {name}"))


def test_dockerfile_is_multi_stage_non_root_exec_form_with_a_health_check():
    instructions = dockerfile_instructions((REPO / "Dockerfile").read_text())
    assert {k for k, _ in instructions} <= INSTRUCTIONS
    args = dict(a.split("=", 1) for k, a in instructions if k == "ARG" and "=" in a)
    base = args["PYTHON_IMAGE"]
    assert re.fullmatch(r"python:3\.11(\.\d+)?-slim(-bookworm)?", base), base
    built = stages(instructions)
    # two build stages (without and with the backfill extra), the shared runtime, then the slim
    # image and, last (the default target), the one with Spark and Java
    assert [f for f, _ in built] == [
        "${PYTHON_IMAGE} AS build",
        "build AS build-backfill",
        "${PYTHON_IMAGE} AS runtime",
        "runtime AS slim",
        "runtime AS full",
    ]
    runtime = stage_named(built, "runtime")
    shared = dict(runtime)
    for name in ("slim", "full"):
        body = stage_named(built, name)
        user = dict(body)["USER"].split(":")[0]
        assert user not in ("root", "0") and int(user) >= 1000
        # the image gets the built environment, not the sources or a compiler
        assert not any(k == "RUN" and "pip install" in a for k, a in body)
        assert body[-1][0] == "USER", "USER last: the image's own RUN steps run as root"

    assert exec_form(shared["ENTRYPOINT"]) == ["milvus-cdc"]
    assert exec_form(shared["CMD"]) == ["serve"]
    assert shared["STOPSIGNAL"] == "SIGTERM"
    options, _, command = shared["HEALTHCHECK"].partition("CMD ")
    assert "--interval=" in options and "--timeout=" in options
    probe = exec_form(command)
    # python3: the interpreter's name in python:3.11-slim and in a plain Debian 12 base alike
    assert probe[0] == "python3" and f":{DEFAULTS.host_port[1]}/readyz" in probe[-1]
    compile(probe[-1], "healthcheck", "exec")  # the probe is valid Python
    assert shared["EXPOSE"] == str(DEFAULTS.host_port[1])
    assert not any(k == "RUN" and "pip install" in a for k, a in runtime)
    config_copy = next(a for k, a in runtime if k == "COPY" and a.startswith("configs/"))
    assert f"CDC_CONFIG={config_copy.split()[1]}" in shared["ENV"]
    assert "MALLOC_ARENA_MAX=2" in shared["ENV"]  # bench/results/backlog.md
    # every file copied from the build context exists and is not excluded by .dockerignore
    ignored = (REPO / ".dockerignore").read_text().split()
    for keyword, argument in instructions:
        if keyword == "COPY" and not argument.startswith("--from"):
            *sources, _ = argument.split()
            for source in sources:
                assert (REPO / source).exists(), source
                assert source.split("/")[0] not in ignored, source
    assert "tests" in ignored and ".git" in ignored
    # the entry point is the package's console script
    assert 'milvus-cdc = "server.cli:entrypoint"' in (REPO / "pyproject.toml").read_text()


def test_default_image_can_backfill_and_the_slim_one_has_no_spark():
    """The default target (the last stage) installs the backfill extra and a headless Java 17
    with JAVA_HOME set; `--target slim` has neither."""
    instructions = dockerfile_instructions((REPO / "Dockerfile").read_text())
    built = stages(instructions)
    assert built[-1][0].endswith(" AS full")  # docker build without --target builds this one
    pyproject = (REPO / "pyproject.toml").read_text()
    assert re.search(r'^backfill = \["pyspark[^"]*"\]', pyproject, re.M)

    installs = " ".join(a for k, a in stage_named(built, "build") if k == "RUN")
    assert "pip install" in installs and "backfill" not in installs and "pyspark" not in installs
    installs = " ".join(a for k, a in stage_named(built, "build-backfill") if k == "RUN")
    assert "'.[backfill]'" in installs

    full = stage_named(built, "full")
    assert ("COPY", "--from=build-backfill /opt/milvus-cdc /opt/milvus-cdc") in full
    runs = " ".join(a for k, a in full if k == "RUN")
    assert "apt-get install" in runs and "openjdk-17-jre-headless" in runs
    java_home = dict(full)["ENV"]
    assert java_home == "JAVA_HOME=/usr/lib/jvm/java-17", java_home
    assert "/usr/lib/jvm/java-17" in runs  # the link JAVA_HOME names, whatever the architecture

    slim = stage_named(built, "slim")
    assert ("COPY", "--from=build /opt/milvus-cdc /opt/milvus-cdc") in slim
    assert not any(k == "RUN" for k, _ in slim)
    assert "JAVA_HOME" not in " ".join(a for k, a in stage_named(built, "runtime") if k == "ENV")


def test_the_image_build_installs_the_dashboard_files(tmp_path):
    """The build stage's `pip install .`, on the files the Dockerfile copies (pip builds in an
    isolated environment with the build-system requirements, as in the image): the wheel must
    carry the dashboard's static files and the console script."""
    context = tmp_path / "context"
    context.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, context / name)
    for package in ("server", "replicator", "metastore"):
        shutil.copytree(
            REPO / package, context / package, ignore=shutil.ignore_patterns("__pycache__")
        )
    out = tmp_path / "wheels"
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q",
         "-w", str(out), str(context)],
        check=True, capture_output=True, timeout=240,
    )  # fmt: skip
    (wheel,) = out.glob("*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        entry_points = next(n for n in names if n.endswith("entry_points.txt"))
        assert "milvus-cdc = server.cli:entrypoint" in archive.read(entry_points).decode()
    page = (REPO / "server" / "http" / "dashboard" / "index.html").read_text()
    referenced = re.findall(r'(?:href|src)="/dashboard/([^"]+)"', page)
    assert referenced
    for name in ["index.html", *referenced]:
        assert f"server/http/dashboard/{name}" in names, name


# --- systemd -------------------------------------------------------------------------------------
def unit_sections(text: str) -> dict[str, list[tuple[str, str]]]:
    sections: dict[str, list[tuple[str, str]]] = {}
    current = None
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("["):
            current = sections.setdefault(line.strip("[]"), [])
            continue
        key, sep, value = line.partition("=")
        assert sep and current is not None, f"not key=value: {line}"
        current.append((key.strip(), value.strip()))
    return sections


def seconds(value: str) -> float:
    match = re.fullmatch(r"(\d+)(s|min)?", value)
    assert match, value
    return int(match[1]) * (60 if match[2] == "min" else 1)


def test_systemd_unit_restarts_and_waits_longer_than_the_drain():
    sections = unit_sections(UNIT.read_text())
    assert set(sections) == {"Unit", "Service", "Install"}
    service = dict(sections["Service"])
    environment = [v for k, v in sections["Service"] if k == "Environment"]
    assert service["Restart"] == "on-failure" and seconds(service["RestartSec"]) > 0
    assert service["KillSignal"] == "SIGTERM"
    assert seconds(service["TimeoutStopSec"]) > DRAIN_BOUND
    assert service["User"] not in ("root", "0")
    assert service["ExecStart"].split()[1:] == ["serve"]
    assert "RestartPreventExitStatus" in service  # a configuration error is not retried
    config_env = next(e for e in environment if e.startswith("CDC_CONFIG="))
    assert config_env.endswith("/cdc.yaml")
    assert "MALLOC_ARENA_MAX=2" in environment  # bench/results/backlog.md
    assert service["WorkingDirectory"] in service["ReadWritePaths"].split()
    assert dict(sections["Install"])["WantedBy"] == "multi-user.target"


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="no systemd-analyze here")
def test_systemd_analyze_verify_accepts_the_unit(tmp_path):
    # verify checks that ExecStart exists: point it at this machine's interpreter
    unit = tmp_path / "milvus-cdc.service"
    text = UNIT.read_text().replace("/usr/local/bin/milvus-cdc", sys.executable)
    unit.write_text(text)
    done = subprocess.run(
        ["systemd-analyze", "verify", str(unit)],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    complaints = [line for line in (done.stdout + done.stderr).splitlines() if unit.name in line]
    assert done.returncode == 0 and complaints == [], done.stdout + done.stderr


# --- docker compose ------------------------------------------------------------------------------
COMPOSE_ENV = {"MYSQL_ROOT_PASSWORD": "p@ss:w0rd", "CDC_ADMIN_TOKEN": "compose-admin-token-0123"}


def interpolate(node, env):
    """Compose's ${VAR}, ${VAR:-default} and ${VAR:?error} (and $$ for a dollar)."""
    if isinstance(node, dict):
        return {k: interpolate(v, env) for k, v in node.items()}
    if isinstance(node, list):
        return [interpolate(v, env) for v in node]
    if not isinstance(node, str):
        return node

    def replace(match: re.Match[str]) -> str:
        name, op, arg = match["name"], match["op"], match["arg"]
        if name in env and env[name] != "":
            return env[name]
        assert op != ":?", f"${{{name}}} is required: {arg}"
        return arg or ""

    pattern = r"\$\{(?P<name>\w+)(?:(?P<op>:-|:\?)(?P<arg>[^}]*))?\}"
    return re.sub(pattern, replace, node.replace("$$", "\0")).replace("\0", "$")


@pytest.fixture(scope="module")
def compose():
    return interpolate(yaml.safe_load(COMPOSE.read_text()), COMPOSE_ENV)


def test_compose_stack_has_the_services_and_they_hold_together(compose):
    services = compose["services"]
    assert {"etcd", "kafka", "mysql", "milvus-source", "milvus-target", "milvus-cdc"} <= set(
        services
    )
    host_ports = []
    for name, service in services.items():
        image = service.get("image", "")
        assert image or "build" in service, name
        if "build" not in service:
            assert ":" in image and not image.endswith(":latest"), f"{name}: pin {image}"
        for dependency in service.get("depends_on", {}):
            assert dependency in services, f"{name} depends on unknown {dependency}"
            condition = service["depends_on"]
            if isinstance(condition, dict) and condition[dependency].get("condition"):
                assert "healthcheck" in services[dependency], f"{dependency} has no health check"
        for volume in service.get("volumes", []):
            source = volume.split(":")[0]
            if source.startswith("."):
                assert (COMPOSE.parent / source).resolve().exists(), f"{name}: {source}"
            else:
                assert source in compose["volumes"], f"{name}: undeclared volume {source}"
        host_ports += [p.split(":")[0] for p in service.get("ports", [])]
        if "healthcheck" in service:
            assert service["healthcheck"]["test"][0] in ("CMD", "CMD-SHELL")
    assert len(host_ports) == len(set(host_ports))
    daemon = services["milvus-cdc"]
    build = COMPOSE.parent / daemon["build"]["context"]
    assert (build / daemon["build"]["dockerfile"]).is_file()
    # the image that can backfill: the Dockerfile's last (default) stage
    dockerfile = dockerfile_instructions((build / daemon["build"]["dockerfile"]).read_text())
    assert stages(dockerfile)[-1][0].endswith(f" AS {daemon['build']['target']}")
    grace = daemon["stop_grace_period"]
    assert grace.endswith("s") and int(grace[:-1]) > DRAIN_BOUND
    for state in ("milvus-source", "milvus-target"):
        assert services[state]["healthcheck"]["test"][-1].endswith(":9091/healthz")


def test_compose_daemon_environment_is_a_valid_configuration(compose):
    services = compose["services"]
    environment = {k: str(v) for k, v in services["milvus-cdc"]["environment"].items()}
    settings = load_settings(None, environment)  # unknown keys or bad values raise here
    assert settings.metaStoreConfig.storeType == "mysql"
    from metastore.sql_urls import mysql_url_from_source

    url = mysql_url_from_source(settings.metaStoreConfig.mysqlSourceUrl.get_secret_value())
    assert "@mysql:3306/" in str(url) and "milvus_cdc" in str(url)
    # published on 0.0.0.0: it needs a token, or it would listen on the container's loopback
    assert [t.role for t in settings.auth.tokens] == ["admin"]
    assert services["mysql"]["environment"]["MYSQL_DATABASE"] == "milvus_cdc"
    source = settings.sourceConfig
    assert source.mq_type == "kafka"
    assert source.kafka.address.split(":")[0] in services
    assert all(a.split("//")[1].split(":")[0] in services for a in source.etcd.address)
    # the daemon reads the channels the source Milvus writes
    milvus = services["milvus-source"]["environment"]
    assert milvus["MQ_TYPE"] == "kafka" and milvus["KAFKA_BROKERLIST"] == source.kafka.address
    assert milvus["ETCD_ROOTPATH"] == source.root_path
    assert milvus["COMMON_CHANNAMEPREFIX_CLUSTER"] == source.root_path
    assert services["milvus-target"]["environment"]["ETCD_ROOTPATH"] != source.root_path
    # a backfill reads the source Milvus's gRPC port
    assert source.milvus.uri == "http://milvus-source:19530"
    assert "19530:19530" in services["milvus-source"]["ports"]
    port = str(settings.host_port[1])
    assert f"{port}:{port}" in services["milvus-cdc"]["ports"]
    with pytest.raises(AssertionError, match="MYSQL_ROOT_PASSWORD"):
        interpolate(yaml.safe_load(COMPOSE.read_text()), {})  # no default password


def test_prometheus_scrapes_the_daemon_and_grafana_is_provisioned(compose):
    prometheus = yaml.safe_load((DEPLOYMENT / "prometheus" / "prometheus.yml").read_text())
    (job,) = prometheus["scrape_configs"]
    assert job["metrics_path"] == "/metrics"
    host, port = job["static_configs"][0]["targets"][0].split(":")
    assert host in compose["services"] and port == str(DEFAULTS.host_port[1])
    provisioning = DEPLOYMENT / "grafana" / "provisioning"
    datasource = yaml.safe_load((provisioning / "datasources" / "prometheus.yml").read_text())
    assert datasource["datasources"][0]["url"] == "http://prometheus:9090"
    provider = yaml.safe_load((provisioning / "dashboards" / "milvus-cdc.yml").read_text())
    folder = provider["providers"][0]["options"]["path"]
    mounts = [v.split(":") for v in compose["services"]["grafana"]["volumes"]]
    dashboard_mount = next(m for m in mounts if m[0].endswith("milvus-cdc.json"))
    assert dashboard_mount[1].startswith(folder + "/")
    assert (
        COMPOSE.parent / dashboard_mount[0]
    ).resolve() == DEPLOYMENT / "grafana" / "milvus-cdc.json"
