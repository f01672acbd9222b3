#!/usr/bin/env bash
# Build the milvus-cdc images without a Docker daemon, with buildah (Debian 12: apt-get install
# buildah), as README "Operating the daemon" > "Docker" describes:
#
#   bash scripts/build-image.sh                    # milvus-cdc:local (backfill: PySpark + JRE 17)
#                                                  # and milvus-cdc:slim (--target slim)
#   BASE=debootstrap bash scripts/build-image.sh   # do not try Docker Hub
#
# The base is python:3.11-slim-bookworm from Docker Hub when it can be pulled; otherwise (BASE=
# debootstrap, or the pull fails) a Debian 12 root made by debootstrap from the Debian mirror
# (python3 3.11, python3-venv, ca-certificates), committed as localhost/milvus-cdc-base:bookworm
# and passed as --build-arg PYTHON_IMAGE. The build itself needs the Debian mirror (the JRE) and
# PyPI (the wheels, pyspark's source archive). Run as root. Environment:
#   BASE=auto|hub|debootstrap  (default auto)      TAG=milvus-cdc (image name)
#   TARGETS="full slim"        (what to build)     MIRROR=http://deb.debian.org/debian
#   WORKDIR=/tmp/milvus-cdc-image (debootstrap's root)
#   CA_BUNDLE=/etc/ssl/certs/ca-certificates.crt (given to pip as the build secret pip-ca; "" none)
#   CHECK=1: then run the images with podman (milvus-cdc --help, java -version, import pyspark,
#     serve until /readyz answers, the image's health check, SIGTERM exits 0; the slim image has
#     neither Java nor pyspark). PODMAN="podman --runtime runc" and PODMAN_RUN_ARGS="--ulimit
#     nofile=20000:20000 --ulimit nproc=32768:32768" were needed on our machines (crun refuses
#     cgroup v1 hybrid mode; podman's default rlimits are above what the host allows).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

BASE="${BASE:-auto}"
TAG="${TAG:-milvus-cdc}"
TARGETS="${TARGETS:-full slim}"
MIRROR="${MIRROR:-http://deb.debian.org/debian}"
WORKDIR="${WORKDIR:-/tmp/milvus-cdc-image}"
CA_BUNDLE="${CA_BUNDLE-/etc/ssl/certs/ca-certificates.crt}"
HUB_IMAGE=docker.io/library/python:3.11-slim-bookworm
LOCAL_BASE=localhost/milvus-cdc-base:bookworm

need() {
    command -v "$1" >/dev/null 2>&1 || { apt-get update && apt-get install -y "$2"; }
}
need buildah buildah

debootstrap_base() {
    if buildah inspect --type image "$LOCAL_BASE" >/dev/null 2>&1; then
        echo "base: $LOCAL_BASE (made earlier; buildah rmi it to make it again)"
        return
    fi
    need debootstrap debootstrap
    local root="$WORKDIR/rootfs" container mount
    rm -rf "$root"
    mkdir -p "$WORKDIR"
    debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates \
        bookworm "$root" "$MIRROR"
    cat > "$root/etc/apt/sources.list" <<EOF
deb $MIRROR bookworm main
deb $MIRROR bookworm-updates main
deb http://deb.debian.org/debian-security bookworm-security main
EOF
    chroot "$root" apt-get clean
    rm -rf "$root"/var/lib/apt/lists/* "$root"/var/cache/apt/*.bin "$root"/var/log/*.log
    container=$(buildah from scratch)
    mount=$(buildah mount "$container")
    tar -C "$root" --numeric-owner -c . | tar -C "$mount" --numeric-owner -x
    buildah umount "$container"
    buildah config --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
        --env LANG=C.UTF-8 --cmd /bin/bash "$container"
    buildah commit --rm "$container" "$LOCAL_BASE"
    rm -rf "$root"
    echo "base: $LOCAL_BASE (debootstrap of Debian 12 from $MIRROR)"
}

python_image=""
case "$BASE" in
    hub) buildah pull "$HUB_IMAGE" && python_image="$HUB_IMAGE" ;;
    auto) if timeout 120 buildah pull "$HUB_IMAGE"; then python_image="$HUB_IMAGE"; fi ;;
    debootstrap) ;;
    *) echo "BASE must be auto, hub or debootstrap" >&2; exit 2 ;;
esac
if [ -z "$python_image" ]; then
    debootstrap_base
    python_image="$LOCAL_BASE"
fi

# pip trusts this bundle in the build stages (a TLS-intercepting proxy's CA, as on our machines)
secret=()
if [ -s "$CA_BUNDLE" ]; then
    secret=(--secret "id=pip-ca,src=$CA_BUNDLE")
fi

for target in $TARGETS; do
    case "$target" in
        full) name="$TAG:local" ;;
        *) name="$TAG:$target" ;;
    esac
    # chroot isolation on the host's network: no daemon, nested namespaces or CNI needed;
    # Docker's image format, as the OCI one has no HEALTHCHECK
    buildah bud --format docker --isolation chroot --network host --layers "${secret[@]}" \
        --build-arg "PYTHON_IMAGE=$python_image" --target "$target" -t "$name" -f Dockerfile .
    echo "built $name from $python_image: $(buildah images --format '{{.Size}}' "$name")"
done

[ "${CHECK:-0}" = 1 ] || exit 0
need podman podman
PODMAN="${PODMAN:-podman}"
read -r -a run_args <<< "${PODMAN_RUN_ARGS:-}"
run() { $PODMAN run --rm --no-healthcheck "${run_args[@]}" "$@"; }
full="$TAG:local"
set -x
run "$full" --help
run --entrypoint java "$full" -version
run --entrypoint sh "$full" -c 'echo "JAVA_HOME=$JAVA_HOME"; "$JAVA_HOME/bin/java" -version 2>&1 | head -1'
run --entrypoint python3 "$full" -c "import pyspark; print('pyspark', pyspark.__version__)"
run --entrypoint python3 "$full" -c "
from pyspark.sql import SparkSession
spark = SparkSession.builder.master('local[2]').config('spark.ui.enabled', 'false').getOrCreate()
print('spark job sum', spark.sparkContext.parallelize(range(1000), 4).sum())
spark.stop()"
name="milvus-cdc-check-$$"
$PODMAN run -d --name "$name" "${run_args[@]}" "$full"
trap '$PODMAN rm -f -v "$name" >/dev/null 2>&1 || true' EXIT
for _ in $(seq 1 60); do
    $PODMAN exec "$name" python3 -c "import urllib.request as u; u.urlopen('http://127.0.0.1:8444/readyz', timeout=2)" \
        2>/dev/null && break
    sleep 1
done
$PODMAN exec "$name" python3 -c "import urllib.request as u; print(u.urlopen('http://127.0.0.1:8444/readyz').read().decode())"
$PODMAN healthcheck run "$name"
$PODMAN stop -t 45 "$name"
[ "$($PODMAN inspect "$name" --format '{{.State.ExitCode}}')" = 0 ]
if [[ " $TARGETS " == *" slim "* ]]; then
    run --entrypoint sh "$TAG:slim" -c 'milvus-cdc --help >/dev/null && ! command -v java && ! python3 -c "import pyspark" 2>/dev/null'
fi
echo "checks passed"
