#!/usr/bin/env bash
# containers/check.sh: build the image and run the compose cluster for real (podman), then sign the image.
#
# From the repository root, as root on a Debian/Ubuntu host (CI runs it from .ci/run):
#
#     containers/check.sh
#
# 1. installs what is missing (podman, podman-compose, runc, catatonit, netavark, debootstrap, ...) with apt;
# 2. takes paddlepaddle/paddle:2.6.2 as the base, or, when it cannot be pulled, builds a Debian bookworm base
#    with debootstrap from the Debian mirror apt uses (the image then gets the paddlepaddle wheel, from wheels
#    prepared on this machine: pip inside a build may not reach the package index);
# 3. builds containers/Dockerfile, and generates the compose file from the default config with the image's own
#    generator;
# 4. runs it: data prep, 2 servers + 2 workers, checkpoints on a shared volume, evaluation, all in containers
#    (containers/compose_up.py starts the services in depends_on order); the serving profile's export and online
#    server then score a raw record on 127.0.0.1:8080 and stop on SIGTERM with exit 0; then the job again,
#    killing server 1 during training: the driver must stop the other roles within 30 s, restart the job whole
#    (one line naming ps-1) and the restarted job must finish and be evaluated; `down` must leave no container,
#    network or volume; then containers/tls_check.sh: the job with ps.tls on and off side by side (captures on the
#    job network, a client without the job's certificate, examples/s);
# 5. pushes the image to a registry on loopback (Debian's docker-registry), GPG-signed by podman at push and with
#    a sigstore signature attached (containers/sigstore.py); a policy.json requiring the GPG signature must
#    accept it and refuse an unsigned and a re-tagged image; the Kubeflow compile writes the sigstore admission
#    policy (k8s/image-policy.yaml) beside its other manifests.
#
# Work files, logs, the evaluation report and the measurements go to build/containers/. Images stay (later runs
# take seconds); nothing keeps running. The last line holds the test AUC; the exit status is non-zero on any failure.
# Environment: CHECK_BASE_IMAGE (use this base, skip the pull), DEBIAN_MIRROR (default: the one apt uses).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
WORK=$ROOT/build/containers
LOGS=$WORK/logs
PROJECT=ctr-ps
IMAGE=paddle-ps-pipelines:0.1.0
OFFICIAL_BASE=docker.io/paddlepaddle/paddle:2.6.2
DEBIAN_BASE=localhost/ctr-ps-base:bookworm
HOST_PY=/usr/bin/python3  # Debian's: podman-compose's PyYAML, python3-nacl and python3-cryptography live there
COMPOSE=$WORK/compose/docker-compose.yaml
MIN_AUC_RATIO=0.95        # of the Bayes-optimal AUC on the default synthetic data
FAULT_LIMIT_S=30          # the workers must be stopped this long after a server died
REGISTRY_PID=

say() { printf '\n== %s\n' "$*"; }
fail() { printf '\ncontainers FAILED: %s\n' "$*" >&2; exit 1; }
since() { echo $(( $(date +%s) - $1 )); }
record() { printf '%s=%s\n' "$1" "$2" >> "$WORK/measurements.env"; }

# The compose file's networks (components/train/backends/docker_compose.py compose_networks), as podman names them.
project_networks() { printf '%s\n' "${PROJECT}_job" "${PROJECT}_serving" "${PROJECT}_store"; }

project_down() {
    podman-compose -p "$PROJECT" -f "$COMPOSE" down -v -t 5 > "$LOGS/down.log" 2>&1 || true
    # podman-compose 1.0 removes containers and (with -v) volumes, but leaves the project's networks.
    project_networks | xargs podman network rm -f >> "$LOGS/down.log" 2>&1 || true
}

assert_nothing_left() {
    local left
    left=$(podman ps -a --filter "label=io.podman.compose.project=$PROJECT" --format '{{.Names}}')
    left+=$(podman volume ls --filter "label=io.podman.compose.project=$PROJECT" --format ' volume {{.Name}}')
    left+=$(podman network ls --format '{{.Name}}' | grep -xF "$(project_networks)" | sed 's/^/ network /' || true)
    [ -z "$left" ] || fail "down left behind:$left"
    echo "down: no container, volume or network of $PROJECT left"
}

sweep() {  # whatever an interrupted earlier run left, found by the project's labels and names
    podman ps -aq --filter "label=io.podman.compose.project=$PROJECT" | xargs -r podman rm -f > /dev/null
    podman volume ls -q --filter "label=io.podman.compose.project=$PROJECT" | xargs -r podman volume rm > /dev/null
    project_networks | xargs podman network rm -f > /dev/null 2>&1 || true
}

cleanup() {
    [ -n "$REGISTRY_PID" ] && kill "$REGISTRY_PID" 2>/dev/null && wait "$REGISTRY_PID" 2>/dev/null
    [ -d "${GNUPGHOME:-}" ] && gpgconf --kill all  # podman's GPG signing started a gpg-agent
    [ -f "$COMPOSE" ] && command -v podman-compose >/dev/null && project_down
    return 0
}
trap cleanup EXIT

[ "$(id -u)" = 0 ] || fail "run as root: it installs packages and runs rootful podman"
command -v apt-get >/dev/null || fail "needs apt-get (a Debian/Ubuntu host)"
rm -rf "$WORK" && mkdir -p "$LOGS"
START=$(date +%s)

# -- 1. tools --------------------------------------------------------------------------------------------------
say "tools"
# Installed without recommends, podman lacks catatonit (the init of the services' `init: true`) and takes CNI without
# name resolution for its networks: netavark with aardvark-dns resolves the services by name.
# tcpdump: the TLS check captures the job's network (containers/tls_check.sh).
needed=(podman podman-compose runc catatonit netavark aardvark-dns iptables debootstrap docker-registry gnupg curl
        python3-pip python3-yaml python3-nacl python3-cryptography tcpdump)
missing=()
for package in "${needed[@]}"; do
    # Installed, not merely known: a removed package's configuration keeps `dpkg -s` answering yes.
    [ "$(dpkg-query -W -f='${Status}' "$package" 2>/dev/null)" = "install ok installed" ] || missing+=("$package")
done
if [ ${#missing[@]} -gt 0 ]; then
    t0=$(date +%s)
    apt-get update > "$LOGS/apt.log" 2>&1 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
        "${missing[@]}" >> "$LOGS/apt.log" 2>&1 || fail "apt-get install failed: see $LOGS/apt.log"
    echo "apt-get install ${missing[*]}: $(since "$t0") s"
    record apt_seconds "$(since "$t0")"
fi
podman --version
# No change under /etc: runc (crun refuses hybrid cgroups), ulimits within this sandbox's hard limits (no
# CAP_SYS_RESOURCE for podman's defaults), logs and events in files (no journald or syslog in a CI container),
# netavark even where an earlier podman set up CNI (which leaves the services unable to resolve each other).
cat > "$WORK/containers.conf" <<EOF
[containers]
default_ulimits = ["nofile=$(ulimit -Hn):$(ulimit -Hn)", "nproc=4096:4096"]
log_driver = "k8s-file"
[network]
network_backend = "netavark"
[engine]
runtime = "runc"
events_logger = "file"
EOF
export CONTAINERS_CONF=$WORK/containers.conf
sweep

# -- 2. base image ---------------------------------------------------------------------------------------------
say "base image"
PIP_NO_INDEX=0
if [ -n "${CHECK_BASE_IMAGE:-}" ]; then
    BASE=$CHECK_BASE_IMAGE
elif podman image exists "$OFFICIAL_BASE" || timeout 900 podman pull -q "$OFFICIAL_BASE" > "$LOGS/pull.log" 2>&1; then
    BASE=$OFFICIAL_BASE
else
    echo "cannot pull $OFFICIAL_BASE ($(tail -1 "$LOGS/pull.log")): building a Debian bookworm base"
    BASE=$DEBIAN_BASE
    if ! podman image exists "$DEBIAN_BASE"; then
        mirror=${DEBIAN_MIRROR:-$(sed -n 's/^URIs: *\([^ ]*debian\)\/\{0,1\}$/\1/p' /etc/apt/sources.list.d/debian.sources \
                                  2>/dev/null | head -1)}
        mirror=${mirror:-$(awk '$1 == "deb" && $2 ~ /debian\/?$/ {print $2; exit}' /etc/apt/sources.list 2>/dev/null)}
        [ -n "$mirror" ] || fail "no Debian mirror found in apt's sources: set DEBIAN_MIRROR=http://..."
        t0=$(date +%s)
        rootfs=$(mktemp -d /var/tmp/ctr-ps-rootfs.XXXXXX)
        debootstrap --variant=minbase --include=python3 bookworm "$rootfs" "$mirror" > "$LOGS/debootstrap.log" 2>&1 \
            || { rm -rf "$rootfs"; fail "debootstrap from $mirror failed: see $LOGS/debootstrap.log"; }
        rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/*
        tar -C "$rootfs" -c . | podman import -q - "$DEBIAN_BASE" > /dev/null
        rm -rf "$rootfs"
        echo "debootstrap $mirror + podman import: $(since "$t0") s"
        record base_seconds "$(since "$t0")"
    fi
    # The image's pip installs from wheels made here, for the base's Python.
    PIP_NO_INDEX=1
    base_python=$(podman run --rm "$BASE" python3 -c 'import sys; print("%d.%d" % sys.version_info[:2])')
    host_python=$($HOST_PY -c 'import sys; print("%d.%d" % sys.version_info[:2])')
    [ "$base_python" = "$host_python" ] || fail "the base has Python $base_python, $HOST_PY is $host_python: \
the wheels for the image must be built by the same version"
    requirements=$($HOST_PY -c 'import tomllib; print("\n".join(tomllib.load(open("pyproject.toml", "rb"))["project"]["dependencies"]))')
    # setuptools and wheel: the image builds this package in an isolated build environment, from these wheels too.
    if ! printf '%s\n' "$requirements" | cmp -s - containers/wheels/.requirements \
            || ! ls containers/wheels/paddlepaddle-*.whl > /dev/null 2>&1; then
        t0=$(date +%s)
        printf '%s\n' "$requirements" > "$WORK/requirements.txt"
        $HOST_PY -m pip wheel -q -w containers/wheels -r "$WORK/requirements.txt" "setuptools>=69" wheel \
            > "$LOGS/wheels.log" 2>&1 || fail "pip wheel failed: see $LOGS/wheels.log"
        printf '%s\n' "$requirements" > containers/wheels/.requirements
        echo "wheels for Python $host_python: $(since "$t0") s"
        record wheels_seconds "$(since "$t0")"
    fi
fi
echo "base: $BASE"

# -- 3. image and compose file ---------------------------------------------------------------------------------
say "build $IMAGE"
previous=$(podman image inspect --format '{{.Id}}' "$IMAGE" 2>/dev/null || true)
t0=$(date +%s)
podman build -f containers/Dockerfile --build-arg FLAVOR=cpu --build-arg CPU_BASE="$BASE" --build-arg GPU_BASE="$BASE" \
    --build-arg PIP_NO_INDEX=$PIP_NO_INDEX -t "$IMAGE" . > "$LOGS/build.log" 2>&1 \
    || { tail -30 "$LOGS/build.log"; fail "podman build failed: see $LOGS/build.log"; }
build_s=$(since "$t0")
# The image this build replaced, now untagged (kept only while a container or another tag uses it).
[ -n "$previous" ] && [ "$previous" != "$(podman image inspect --format '{{.Id}}' "$IMAGE")" ] \
    && podman rmi "$previous" > /dev/null 2>&1 || true
image_bytes=$(podman image inspect --format '{{.Size}}' "$IMAGE")
image_gb=$(awk -v b="$image_bytes" 'BEGIN {printf "%.2f", b / 1e9}')
echo "built in ${build_s} s, ${image_gb} GB"
record build_seconds "$build_s"
record image_bytes "$image_bytes"

mkdir -p "$(dirname "$COMPOSE")"
podman run --rm --user 0 -v "$(dirname "$COMPOSE"):/out" "$IMAGE" \
    python -m components.train.backends.docker_compose --out "/out/$(basename "$COMPOSE")" \
    || fail "the image's compose generator failed"
echo "generated $COMPOSE and its job spec $(ls "$(dirname "$COMPOSE")" | grep job-spec)"

# -- 4. the cluster --------------------------------------------------------------------------------------------
# The driver's output, full in the log; here the lines that tell the story.
story() { grep --line-buffered -E '@epoch|@checkpoint|@done|dataset ready|evaluation:|healthy|^ctr-ps:|Error|Traceback' \
          | cut -c1-240 || true; }

say "run: data prep, 2 servers + 2 workers, evaluation"
t0=$(date +%s)
set +e
$HOST_PY containers/compose_up.py "$COMPOSE" --timeout 3600 2>&1 | tee "$LOGS/run.log" | story
run_rc=${PIPESTATUS[0]}
set -e
run_s=$(since "$t0")
[ "$run_rc" = 0 ] || { tail -40 "$LOGS/run.log"; fail "the compose run failed (exit $run_rc): see $LOGS/run.log"; }
evaluation=$(podman volume inspect --format '{{.Mountpoint}}' "${PROJECT}_evaluation")
checkpoints=$(podman volume inspect --format '{{.Mountpoint}}' "${PROJECT}_checkpoints")
cp -r "$evaluation" "$WORK/evaluation"
[ -f "$checkpoints/LATEST" ] || fail "no checkpoint committed to the checkpoints volume"
echo "checkpoint volume: LATEST -> $(grep -o '[0-9]\{8\}T[0-9]*Z-e[0-9]*-s[0-9]*' "$checkpoints/LATEST"); report: $WORK/evaluation/report.html"
read -r auc bayes ratio logloss <<< "$($HOST_PY -c '
import json, sys
m = json.load(open(sys.argv[1]))
print(m["auc"], m["bayes_auc"], m["auc_ratio_to_bayes"], m["logloss"])' "$WORK/evaluation/metrics.json")"
awk -v r="$ratio" -v min="$MIN_AUC_RATIO" 'BEGIN {exit !(r >= min)}' \
    || fail "test AUC $auc is $ratio x Bayes ($bayes), under $MIN_AUC_RATIO"
epoch_s=$(grep -m1 'worker-0 | @epoch' "$LOGS/run.log" | sed 's/.*"seconds": \([0-9.]*\).*/\1/')
record run_seconds "$run_s"
record epoch_seconds "$epoch_s"
record test_auc "$auc"

say "serving: export the evaluated checkpoint, serve it, score a raw record, stop it with SIGTERM"
# podman-compose 1.0.x creates every service's container, those of the serving profile too (it ignores profiles);
# compose_up.py started only the job's.
for service in export serving; do
    podman container exists "${PROJECT}_${service}_1" || fail "no ${PROJECT}_${service}_1 container: this \
podman-compose did not create the serving profile's services"
done
t0=$(date +%s)
podman start -a "${PROJECT}_export_1" > "$LOGS/export.log" 2>&1 || { tail -20 "$LOGS/export.log"; fail "the export \
service failed: see $LOGS/export.log"; }
grep -m1 'serving model:' "$LOGS/export.log" | cut -c1-240
podman start "${PROJECT}_serving_1" > /dev/null
ready=
for _ in $(seq 120); do
    curl -sf http://127.0.0.1:8080/v2/health/ready > /dev/null && { ready=1; break; }
    sleep 0.5
done
[ -n "$ready" ] || { podman logs "${PROJECT}_serving_1" 2>&1 | tail -20; fail "the online server was not ready in 60 s"; }
record serving_ready_seconds "$(since "$t0")"
# One raw record of the job's synthetic data (Criteo TSV), without its label, as a KServe v1 instance.
podman run --rm "$IMAGE" sh -c 'python -m components.data_prep.synthetic --rows 4 --seed 9 --out /scratch/r.tsv \
    > /dev/null && head -1 /scratch/r.tsv' > "$WORK/record.tsv"
cut -f2- "$WORK/record.tsv" | $HOST_PY -c 'import json, sys
print(json.dumps({"instances": [sys.stdin.read().rstrip("\n").split("\t")]}))' > "$WORK/request.json"
status=$(curl -s -o "$WORK/response.json" -w '%{http_code}' -H 'Content-Type: application/json' \
    -d @"$WORK/request.json" http://127.0.0.1:8080/v1/models/ctr:predict) || status="no answer"
[ "$status" = 200 ] || { podman logs "${PROJECT}_serving_1" 2>&1 | tail -20; fail "the online server answered a raw \
record with $status: $(cat "$WORK/response.json" 2>/dev/null)"; }
prediction=$($HOST_PY -c 'import json, sys
body = json.load(open(sys.argv[1]))
(p,) = body["predictions"]
assert 0 < p < 1 and body["model_version"] == "1", body
print(p)' "$WORK/response.json") || fail "unexpected answer: $(cat "$WORK/response.json")"
echo "served version 1: a raw record scores $prediction"
podman stop --time 20 "${PROJECT}_serving_1" > /dev/null 2>&1
serving_rc=$(podman inspect --format '{{.State.ExitCode}}' "${PROJECT}_serving_1")
[ "$serving_rc" = 0 ] || { podman logs "${PROJECT}_serving_1" 2>&1 | tail -20; fail "the online server exited \
$serving_rc on SIGTERM (expected 0)"; }
echo "the online server stopped on SIGTERM with exit 0"
project_down
assert_nothing_left

say "fault: kill server 1 during training: the driver restarts the job whole, which finishes"
set +e
$HOST_PY containers/compose_up.py "$COMPOSE" --timeout 900 > "$LOGS/fault.log" 2>&1 &
driver=$!
set -e
for _ in $(seq 600); do
    grep -q 'worker-0 | @progress' "$LOGS/fault.log" && break
    kill -0 "$driver" 2>/dev/null || break
    sleep 0.5
done
grep -q 'worker-0 | @progress' "$LOGS/fault.log" || fail "the workers never trained: see $LOGS/fault.log"
podman kill "${PROJECT}_ps-1_1" > "$LOGS/kill.log" 2>&1
fault_rc=0
wait "$driver" || fault_rc=$?
grep -E '^ctr-ps:|evaluate +\| evaluation:' "$LOGS/fault.log" | cut -c1-240
[ "$fault_rc" = 0 ] || fail "the job did not finish after server 1 was killed (exit $fault_rc): see $LOGS/fault.log"
grep -q "^ctr-ps: restart 1 of [0-9]*: ps-1 exited with code 137" "$LOGS/fault.log" \
    || fail "no restart line naming ps-1: see $LOGS/fault.log"
grep -q "^ctr-ps: every service exited 0 (after 1 restarts)" "$LOGS/fault.log" \
    || fail "the restarted job did not end with every service exited 0: see $LOGS/fault.log"
for worker in worker-0 worker-1; do
    after=$(sed -n "s/^ctr-ps:   $worker: stopped \([0-9.]*\)s after the failure.*/\1/p" "$LOGS/fault.log" | head -1)
    [ -n "$after" ] || fail "no line says when $worker was stopped for the restart: see $LOGS/fault.log"
    awk -v a="$after" -v limit="$FAULT_LIMIT_S" 'BEGIN {exit !(a <= limit)}' \
        || fail "$worker ran on ${after} s after ps-1 died (limit ${FAULT_LIMIT_S} s)"
    echo "$worker stopped ${after} s after ps-1 died"
done
project_down
assert_nothing_left

# The jobs above ran with ps.tls=auto (on in compose). What TLS keeps off the job's network, and what it costs.
say "tls: the compose job with ps.tls=on and off (containers/tls_check.sh)"
tls_rc=0
TLS_CHECK_WORK=$WORK/tls containers/tls_check.sh "$IMAGE" > "$LOGS/tls.log" 2>&1 || tls_rc=$?
grep -E '^(# ps.tls|tls:)' "$LOGS/tls.log" || true
# Exit 3: only the cost missed issue 35's target (0.85x); said, and measured in measurements.env, not a failure.
[ "$tls_rc" = 0 ] || [ "$tls_rc" = 3 ] || { tail -20 "$LOGS/tls.log"; fail "the TLS check failed: see $LOGS/tls.log"; }
[ "$tls_rc" = 0 ] || tail -1 "$LOGS/tls.log"
cat "$WORK/tls/tls.env" >> "$WORK/measurements.env"

# -- 5. signed images ------------------------------------------------------------------------------------------
say "signing: a registry on loopback, GPG (podman, at push) and sigstore signatures, policy.json"
SIGNING=$WORK/signing
mkdir -p -m 700 "$SIGNING/gnupg"
mkdir -p "$SIGNING/registry" "$SIGNING/home/.config/containers/registries.d"
port=$($HOST_PY -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
REGISTRY=127.0.0.1:$port
REPO=$REGISTRY/paddle-ps-pipelines
cat > "$SIGNING/registry.yml" <<EOF
version: 0.1
log: {level: warn}
storage: {filesystem: {rootdirectory: $SIGNING/registry}}
http: {addr: $REGISTRY}
EOF
docker-registry serve "$SIGNING/registry.yml" > "$LOGS/registry.log" 2>&1 &
REGISTRY_PID=$!
for _ in $(seq 50); do curl -sf "http://$REGISTRY/v2/" > /dev/null && break; sleep 0.2; done
curl -sf "http://$REGISTRY/v2/" > /dev/null || fail "docker-registry did not start: see $LOGS/registry.log"
echo "registry: http://$REGISTRY (docker-registry $(dpkg-query -W -f '${Version}' docker-registry))"

# podman reads registries.d from $HOME/.config first: the signature store, and sigstore attachments, for this
# registry only, without touching /etc.
cat > "$SIGNING/home/.config/containers/registries.d/$PROJECT.yaml" <<EOF
docker:
  $REGISTRY:
    lookaside: file://$SIGNING/lookaside
    lookaside-staging: file://$SIGNING/lookaside
    use-sigstore-attachments: true
EOF
export GNUPGHOME=$SIGNING/gnupg
gpg --batch --passphrase '' --quick-gen-key "ctr-ps image signing <ctr-ps@localhost>" ed25519 sign never \
    > "$LOGS/gpg.log" 2>&1
fingerprint=$(gpg --list-secret-keys --with-colons 2>> "$LOGS/gpg.log" | awk -F: '/^fpr/ {print $10; exit}')
gpg --export --armor "$fingerprint" > "$SIGNING/gpg.pub" 2>> "$LOGS/gpg.log"
$HOST_PY containers/sigstore.py keygen "$SIGNING" > /dev/null
reg_podman() { HOME=$SIGNING/home podman "$@"; }

reg_podman push -q --tls-verify=false --sign-by "$fingerprint" "$IMAGE" "$REPO:0.1.0" > "$LOGS/push.log" 2>&1 \
    || fail "signed push failed: see $LOGS/push.log"
echo "pushed $REPO:0.1.0, GPG-signed at push by $fingerprint"
$HOST_PY containers/sigstore.py sign "$SIGNING/cosign.key" "$SIGNING/cosign.password" "$REPO:0.1.0"
# Unsigned: another image (one label more, the same layers). Re-tagged: the signed manifest under a new tag.
mkdir "$SIGNING/unsigned"
printf 'FROM %s\nLABEL org.opencontainers.image.description="not signed"\n' "$IMAGE" > "$SIGNING/unsigned/Containerfile"
podman build -q -t "$REPO:unsigned" "$SIGNING/unsigned" > /dev/null
reg_podman push -q --tls-verify=false "$REPO:unsigned" >> "$LOGS/push.log" 2>&1 || fail "unsigned push failed"
podman rmi -f "$REPO:unsigned" > /dev/null
media_type=$(curl -sf -o "$SIGNING/manifest.json" -w '%{content_type}' \
             -H 'Accept: application/vnd.oci.image.manifest.v1+json, application/vnd.docker.distribution.manifest.v2+json' \
             "http://$REGISTRY/v2/paddle-ps-pipelines/manifests/0.1.0")
curl -sf -X PUT -H "Content-Type: $media_type" --data-binary "@$SIGNING/manifest.json" \
    "http://$REGISTRY/v2/paddle-ps-pipelines/manifests/retagged" > /dev/null || fail "re-tag failed"
echo "pushed $REPO:unsigned (no signature) and $REPO:retagged (the signed manifest under another tag)"

cat > "$SIGNING/policy.json" <<EOF
{
  "default": [{"type": "reject"}],
  "transports": {
    "docker": {
      "$REPO": [{"type": "signedBy", "keyType": "GPGKeys", "keyPath": "$SIGNING/gpg.pub",
                 "signedIdentity": {"type": "matchRepoDigestOrExact"}}]
    }
  }
}
EOF
echo "policy.json ($SIGNING/policy.json): images of $REPO need a GPG signature of $fingerprint for their exact name"
pull() {  # tag, expected outcome (accepted | refused)
    local out
    if out=$(reg_podman pull -q --tls-verify=false --signature-policy "$SIGNING/policy.json" "$REPO:$1" 2>&1); then
        podman rmi -f "$REPO:$1" > /dev/null
        [ "$2" = accepted ] || fail "policy.json accepted $REPO:$1"
        echo "  accepted: $REPO:$1"
    else
        [ "$2" = refused ] || fail "policy.json refused $REPO:$1: $out"
        echo "  refused:  $REPO:$1: ${out##*Error: }"
    fi
}
pull 0.1.0 accepted
pull unsigned refused
pull retagged refused
echo "sigstore signature (what the admission policy checks; Debian's podman has sigstore compiled out):"
$HOST_PY containers/sigstore.py verify "$SIGNING/cosign.pub" "$REPO:0.1.0" | sed 's/^/  /'
if $HOST_PY containers/sigstore.py verify "$SIGNING/cosign.pub" "$REPO:unsigned" > "$SIGNING/verify.txt"; then
    fail "the unsigned image verified"
fi
sed 's/^/  /' "$SIGNING/verify.txt"

# The Kubeflow compile (in the image) writes the admission policy beside the other manifests.
podman run --rm --user 0 -v "$SIGNING:/signing" "$IMAGE" python -m pipelines.ctr +cluster=prod cluster.submit=false \
    checkpoint.uri=s3://ctr/checkpoints cluster.image_signing_key=/signing/cosign.pub \
    cluster.pipeline_image.name="$REPO:0.1.0" cluster.servers.image.name="$REPO:0.1.0" \
    cluster.workers.image.name="$REPO:0.1.0-gpu" hydra.run.dir=/signing/kubeflow > "$LOGS/compile.log" 2>&1 \
    || fail "the Kubeflow compile failed: see $LOGS/compile.log"
cp -r "$SIGNING/kubeflow/k8s" "$WORK/k8s"
grep -q "kind: ClusterImagePolicy" "$WORK/k8s/image-policy.yaml" || fail "no ClusterImagePolicy in k8s/image-policy.yaml"
echo "admission policy: $WORK/k8s/image-policy.yaml (beside $(ls "$WORK/k8s" | grep -v image-policy | paste -sd ' '))"
kill "$REGISTRY_PID" && wait "$REGISTRY_PID" 2>/dev/null || true
REGISTRY_PID=
gpgconf --kill all

say "measured"
cat "$WORK/measurements.env"
total_s=$(since "$START")
echo "check: ${total_s} s"
printf 'containers ok: test auc=%.4f (%.3f x Bayes %.4f) logloss=%.4f; image %s GB built in %s s; job %s s (epoch %.1f s) in containers\n' \
    "$auc" "$ratio" "$bayes" "$logloss" "$image_gb" "$build_s" "$run_s" "$epoch_s"
