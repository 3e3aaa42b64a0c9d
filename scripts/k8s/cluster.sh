#!/usr/bin/env bash
# A real one-node Kubernetes for `make k8s-test`: kube-apiserver,
# kube-controller-manager, kube-scheduler, kubelet and kubectl built from
# source (the Go module proxy), with Debian's etcd, containerd, runc and CNI
# plugins, all run by hand as background processes (no systemd, no kubeadm).
#
#   cluster.sh build            build the five binaries (and the pause binary) once;
#                               cached in $STRATAD_K8S_CACHE/<version>/bin (default
#                               ~/.cache/stratad-k8s/v1.34.4/bin); a second run takes ~0 s
#   cluster.sh up               start etcd, containerd, the control plane and the kubelet
#                               (idempotent); wait until the node is Ready and the default
#                               service account exists; last line: export KUBECONFIG=...
#   cluster.sh load-image REF...  docker save REF | ctr (our containerd) images import:
#                               pods with imagePullPolicy IfNotPresent/Never use it
#   cluster.sh kubectl ARGS...  the built kubectl with the admin kubeconfig
#   cluster.sh node-ip          the node's InternalIP; pods reach host processes that
#                               listen on 0.0.0.0 (or on this IP) there
#   cluster.sh status           exit 0 if the API server answers
#   cluster.sh recycle-pvs      make Released PersistentVolumes Available again (wipes them)
#   cluster.sh down             stop everything `up` started (pods, shims included), unmount,
#                               remove the state directory; keep the binary cache
#
# Paths and settings:
#   STRATAD_K8S_STATE   state directory, default /var/tmp/stratad-k8s: logs/ (one log per
#                       process), run/ (pid files), pki/, etcd/, containerd/, kubelet/, pv/
#   $STATE/kubeconfig   the admin kubeconfig (O=system:masters)
#   STRATAD_K8S_CACHE   binary cache, default ~/.cache/stratad-k8s (Go's build cache for
#                       these binaries is $STRATAD_K8S_CACHE/go-build)
#   STRATAD_K8S_NODE_IP the node IP; default: the source address of the default route, else
#                       a dummy interface stratad-k8s0 with 10.250.0.1
#   STRATAD_K8S_PVS     how many hostPath PersistentVolumes `up` creates (default 12)
#   STRATAD_K8S_PV_SIZE their nominal capacity (default 10Gi, what deploy/ asks for;
#                       hostPath enforces no size)
#   STRATAD_K8S_TIMEOUT seconds `up` waits for each step (default 180)
#   Logs: $STATE/logs/NAME.log; `up` prints the end of the relevant ones on a failure.
#
# What the cluster is: one node named stratad-k8s, pod network 10.244.0.0/24 on the
# bridge stratad-cni0 (CNI bridge + host-local + portmap + firewall), services
# 10.0.0.0/24, the API server on https://<node IP>:6443, etcd on 127.0.0.1:2379.
# There is no kube-proxy and no CoreDNS: Service ClusterIPs and cluster DNS names do
# not resolve or route; reach pods by pod IP and the host by the node IP. Storage:
# StorageClass "standard" (the default; kubernetes.io/no-provisioner,
# WaitForFirstConsumer) backed by pre-created hostPath PersistentVolumes pv-0..pv-N
# (10Gi nominal, ReadWriteOnce, Retain, under $STATE/pv/, owned by 10001:10001 and
# mode 0777 since hostPath ignores fsGroup; `recycle-pvs` frees Released ones).
# Sandbox image: registry.k8s.io/pause:3.10.1, built from Kubernetes' pause.c (no
# registry is needed or reachable). Images come only from `load-image`.
#
# Why v1.34: the test machines run cgroup v1, which the kubelet refuses by default
# from v1.35 on; v1.34.4 is the newest patch of the newest minor that runs there
# (native sidecars are GA). STRATAD_K8S_VERSION overrides it (untested).
# See docs/k8s-test-cluster.md.
set -euo pipefail

K8S_VERSION=${STRATAD_K8S_VERSION:-v1.34.4}
# k8s.io/kubernetes v1.X.Y publishes its staging modules (k8s.io/api, ...) as v0.X.Y.
STAGING_VERSION=v0.${K8S_VERSION#v1.}
PAUSE_VERSION=3.10.1   # cmd/kubeadm/app/constants PauseVersion of v1.34
PAUSE_IMAGE=registry.k8s.io/pause:$PAUSE_VERSION

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
CACHE=${STRATAD_K8S_CACHE:-$HOME/.cache/stratad-k8s}
BIN=$CACHE/$K8S_VERSION/bin
STATE=${STRATAD_K8S_STATE:-/var/tmp/stratad-k8s}
TIMEOUT=${STRATAD_K8S_TIMEOUT:-180}
NPVS=${STRATAD_K8S_PVS:-12}
PV_SIZE=${STRATAD_K8S_PV_SIZE:-10Gi}

NODE_NAME=stratad-k8s
POD_CIDR=10.244.0.0/24
SERVICE_CIDR=10.0.0.0/24
SERVICE_IP=10.0.0.1
CNI_BRIDGE=stratad-cni0
DUMMY_IF=stratad-k8s0
DUMMY_IP=10.250.0.1
API_PORT=6443
ETCD_CLIENT=127.0.0.1:2379
ETCD_PEER=127.0.0.1:2380

CTR_SOCK=$STATE/containerd/containerd.sock
LOGS=$STATE/logs
RUN=$STATE/run
PKI=$STATE/pki
KUBECONFIG_ADMIN=$STATE/kubeconfig
COMPONENTS=(etcd containerd kube-apiserver kube-controller-manager kube-scheduler kubelet)

log() { printf 'cluster.sh: %s\n' "$*" >&2; }
die() { printf 'cluster.sh: %s\n' "$*" >&2; exit 1; }

usage() {
    sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "$0" >&2
    exit 2
}

# Step timing: `step NAME` starts a step, `step_done` prints its duration.
STEP_NAME='' STEP_START=0
step() { STEP_NAME=$1; STEP_START=$(date +%s.%N); log "$1 ..."; }
step_done() {
    log "$STEP_NAME: done in $(awk -v a="$STEP_START" -v b="$(date +%s.%N)" 'BEGIN{printf "%.1f", b-a}') s"
}

as_root() { if [[ $(id -u) -eq 0 ]]; then "$@"; else sudo "$@"; fi; }

apt_install() {  # PACKAGE... (Debian package names)
    log "installing Debian packages: $*"
    as_root apt-get update -qq
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@" >/dev/null
}

# ---------------------------------------------------------------------------
# build
# ---------------------------------------------------------------------------

find_go() {
    if command -v go >/dev/null 2>&1; then command -v go
    elif [[ -x /usr/local/go/bin/go ]]; then echo /usr/local/go/bin/go
    else die "no Go toolchain: put go (>= 1.24) on PATH (or install it in /usr/local/go)"
    fi
}

binaries_current() {
    local b
    for b in kube-apiserver kube-controller-manager kube-scheduler kubelet kubectl pause; do
        [[ -x $BIN/$b ]] || return 1
    done
    [[ $("$BIN/kubelet" --version 2>/dev/null) == "Kubernetes $K8S_VERSION" ]]
}

cmd_build() {
    local t0=$SECONDS
    if binaries_current; then
        log "Kubernetes $K8S_VERSION is built: $BIN (0 s)"
        return
    fi
    local go goversion
    go=$(find_go)
    goversion=$("$go" env GOVERSION)
    # Kubernetes 1.34 needs Go >= 1.24: use the installed Go when it is recent
    # enough (GOTOOLCHAIN=local), else let Go fetch one from the proxy (auto).
    if [[ -z ${GOTOOLCHAIN:-} ]]; then
        if printf '%s\n' go1.24 "$goversion" | sort -V -C; then
            export GOTOOLCHAIN=local
        else
            export GOTOOLCHAIN=auto
        fi
    fi
    if ! command -v gcc >/dev/null || ! compgen -G '/usr/lib/*/libc.a' >/dev/null; then
        apt_install gcc libc6-dev   # pause.c is linked statically
    fi
    export GOFLAGS="-mod=mod -modcacherw -buildvcs=false"
    export GOCACHE=${STRATAD_K8S_GOCACHE:-$CACHE/go-build}
    export CGO_ENABLED=0
    local work=$CACHE/$K8S_VERSION/mod
    mkdir -p "$work" "$GOCACHE"
    log "building Kubernetes $K8S_VERSION with $goversion (GOTOOLCHAIN=$GOTOOLCHAIN) into $BIN"

    step "download k8s.io/kubernetes@$K8S_VERSION"
    local info gomod moddir
    info=$(cd "$work" && GOFLAGS=-modcacherw "$go" mod download -json "k8s.io/kubernetes@$K8S_VERSION") ||
        die "go mod download failed: $info"
    gomod=$(printf '%s\n' "$info" | sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",\{0,1\}$/\1/p')
    moddir=$(printf '%s\n' "$info" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",\{0,1\}$/\1/p')
    [[ -f $gomod && -d $moddir ]] || die "no go.mod/module directory in: $info"
    step_done

    # `go install k8s.io/kubernetes/cmd/...@v` is refused (its go.mod has replace
    # directives pointing at ./staging). A throwaway main module that requires it
    # and replaces each staging module (k8s.io/xxx v0.0.0) by its published
    # release of the same version builds the same code.
    local staging
    staging=$(sed -n 's/^[[:space:]]*\(k8s\.io\/[A-Za-z0-9._-]*\) v0\.0\.0$/\1/p' "$gomod" | sort -u)
    [[ -n $staging ]] || die "no k8s.io/* v0.0.0 requirements in $gomod"
    {
        echo "// Generated by scripts/k8s/cluster.sh build: builds Kubernetes $K8S_VERSION."
        echo "module stratad.invalid/k8s-build"
        echo
        echo "go 1.24.0"
        echo
        echo "godebug default=go1.24"
        echo
        echo "require k8s.io/kubernetes $K8S_VERSION"
        echo
        echo "replace ("
        local m
        for m in $staging; do echo "	$m => $m $STAGING_VERSION"; done
        echo ")"
    } >"$work/go.mod.new"
    if ! cmp -s "$work/go.mod.new" "$work/go.mod"; then
        mv "$work/go.mod.new" "$work/go.mod"
        rm -f "$work/go.sum"
    else
        rm -f "$work/go.mod.new"
    fi

    local major minor
    major=${K8S_VERSION#v}; major=${major%%.*}
    minor=${K8S_VERSION#v*.}; minor=${minor%%.*}
    local ldflags="-s -w" kv pkg
    for kv in "gitVersion=$K8S_VERSION" "gitMajor=$major" "gitMinor=$minor" \
              "gitTreeState=clean" "buildDate=$(date -u +%Y-%m-%dT%H:%M:%SZ)"; do
        for pkg in k8s.io/client-go/pkg/version k8s.io/component-base/version; do
            ldflags+=" -X $pkg.$kv"
        done
    done

    step "go build (download dependencies, compile; all five binaries in one go build)"
    rm -rf "$BIN.tmp"
    mkdir -p "$BIN.tmp"
    (cd "$work" && "$go" build -trimpath -tags=selinux,notest,grpcnotrace -ldflags="$ldflags" \
        -o "$BIN.tmp/" \
        k8s.io/kubernetes/cmd/kube-apiserver \
        k8s.io/kubernetes/cmd/kube-controller-manager \
        k8s.io/kubernetes/cmd/kube-scheduler \
        k8s.io/kubernetes/cmd/kubelet \
        k8s.io/kubernetes/cmd/kubectl) || die "go build failed"
    step_done

    step "gcc pause (the sandbox image's only binary, from build/pause/linux/pause.c)"
    gcc -Os -Wall -static -DVERSION="v$PAUSE_VERSION-stratad" -o "$BIN.tmp/pause" \
        "$moddir/build/pause/linux/pause.c"
    step_done

    rm -rf "$BIN"
    mv "$BIN.tmp" "$BIN"
    binaries_current || die "the built kubelet does not report $K8S_VERSION"
    log "Kubernetes $K8S_VERSION built in $((SECONDS - t0)) s: $(cd "$BIN" && echo *) in $BIN"
}

# ---------------------------------------------------------------------------
# processes
# ---------------------------------------------------------------------------

# True when pid file $RUN/NAME.pid names a live process whose executable is NAME.
running() {
    local name=$1 pid
    pid=$(cat "$RUN/$name.pid" 2>/dev/null) || return 1
    [[ -n $pid ]] && kill -0 "$pid" 2>/dev/null || return 1
    [[ $(readlink "/proc/$pid/exe" 2>/dev/null) == */"$name" ]]
}

# start NAME EXECUTABLE ARGS...: in its own session (it must outlive the
# make/pytest process that ran `up`), log in $LOGS/NAME.log, pid in $RUN/NAME.pid.
start() {
    local name=$1
    shift
    if running "$name"; then
        return
    fi
    log "starting $name (log: $LOGS/$name.log)"
    setsid "$@" >>"$LOGS/$name.log" 2>&1 </dev/null &
    local pid=$! i
    echo "$pid" >"$RUN/$name.pid"
    # Until setsid has exec'd the program, /proc/PID/exe names setsid.
    for ((i = 0; i < 50; i++)); do
        [[ $(readlink "/proc/$pid/exe" 2>/dev/null) == */setsid ]] || break
        sleep 0.02
    done
}

any_running() {
    local name
    for name in "${COMPONENTS[@]}"; do
        running "$name" && return 0
    done
    return 1
}

# stop NAME [SECONDS]: SIGTERM, wait, SIGKILL.
stop() {
    local name=$1 wait=${2:-20} pid i
    running "$name" || { rm -f "$RUN/$name.pid"; return 0; }
    pid=$(cat "$RUN/$name.pid")
    kill -TERM "$pid" 2>/dev/null || true
    for ((i = 0; i < wait * 10; i++)); do
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.1
    done
    if ((i >= 20)); then
        log "$name took $((i / 10)).$((i % 10)) s to stop"
    fi
    if kill -0 "$pid" 2>/dev/null; then
        log "$name ($pid) ignored SIGTERM for ${wait}s: SIGKILL"
        kill -KILL "$pid" 2>/dev/null || true
        sleep 0.2
    fi
    rm -f "$RUN/$name.pid"
}

# wait_for DESCRIPTION COMMAND...: retry COMMAND every 0.5 s for $TIMEOUT s;
# give up at once if a process named in $WATCH has exited.
WATCH=''
wait_for() {
    local what=$1 deadline=$((SECONDS + TIMEOUT)) name
    shift
    until "$@" >/dev/null 2>&1; do
        for name in $WATCH; do
            running "$name" || { log "$name exited while waiting for $what"; return 1; }
        done
        if ((SECONDS >= deadline)); then
            log "timed out after ${TIMEOUT}s waiting for $what"
            return 1
        fi
        sleep 0.5
    done
}

# dump_logs NAME...: the end of each log (after a failed wait).
dump_logs() {
    local name
    for name in "$@"; do
        [[ -f $LOGS/$name.log ]] || continue
        printf '\n----- end of %s -----\n' "$LOGS/$name.log" >&2
        tail -n 25 "$LOGS/$name.log" >&2
    done
    return 1
}

kc() { "$BIN/kubectl" --kubeconfig "$KUBECONFIG_ADMIN" "$@"; }
ctr_() { ctr --address "$CTR_SOCK" -n k8s.io "$@"; }

# ---------------------------------------------------------------------------
# up
# ---------------------------------------------------------------------------

ensure_packages() {
    local missing=() cmd pkg
    for cmd in etcd:etcd-server containerd:containerd ctr:containerd runc:runc \
               iptables:iptables conntrack:conntrack socat:socat openssl:openssl ip:iproute2 \
               curl:curl; do
        command -v "${cmd%%:*}" >/dev/null || missing+=("${cmd#*:}")
    done
    for pkg in bridge host-local loopback portmap firewall; do
        [[ -x /usr/lib/cni/$pkg ]] || { missing+=(containernetworking-plugins); break; }
    done
    if ((${#missing[@]})); then
        # shellcheck disable=SC2046
        apt_install $(printf '%s\n' "${missing[@]}" | sort -u)
    fi
}

# The node IP: STRATAD_K8S_NODE_IP, else the source address of the default
# route, else a dummy interface's address. `up` keeps it in $STATE/node-ip.
detect_node_ip() {
    local ip=${STRATAD_K8S_NODE_IP:-}
    if [[ -z $ip ]]; then
        ip=$(ip -4 -o route get 1.0.0.1 2>/dev/null | sed -n 's/.* src \([0-9.]*\).*/\1/p') || ip=''

    fi
    if [[ -z $ip || $ip == 127.* ]]; then
        if ! ip link show "$DUMMY_IF" >/dev/null 2>&1; then
            as_root ip link add "$DUMMY_IF" type dummy
        fi
        as_root ip addr replace "$DUMMY_IP/32" dev "$DUMMY_IF"
        as_root ip link set "$DUMMY_IF" up
        ip=$DUMMY_IP
    fi
    echo "$ip"
}

# PKI: one CA signs every certificate (ECDSA P-256).
cert() {  # NAME SUBJECT EXTENSIONS
    local name=$1 subj=$2 ext=$3
    [[ -f $PKI/$name.crt ]] && return
    openssl req -new -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes \
        -keyout "$PKI/$name.key" -subj "$subj" -out "$PKI/$name.csr" 2>/dev/null
    openssl x509 -req -in "$PKI/$name.csr" -CA "$PKI/ca.crt" -CAkey "$PKI/ca.key" \
        -CAcreateserial -days 3650 -sha256 -out "$PKI/$name.crt" \
        -extfile <(printf '%s\n' "basicConstraints=critical,CA:FALSE" \
                       "keyUsage=critical,digitalSignature,keyEncipherment" "$ext") 2>/dev/null
    rm -f "$PKI/$name.csr"
    chmod 600 "$PKI/$name.key"
}

make_pki() {
    local ip=$1
    mkdir -p "$PKI"
    chmod 700 "$PKI"
    if [[ ! -f $PKI/ca.crt ]]; then
        openssl req -x509 -new -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes \
            -keyout "$PKI/ca.key" -out "$PKI/ca.crt" -days 3650 -subj "/CN=stratad-k8s-ca" \
            -addext "basicConstraints=critical,CA:TRUE" \
            -addext "keyUsage=critical,keyCertSign,cRLSign,digitalSignature" 2>/dev/null
        chmod 600 "$PKI/ca.key"
    fi
    local client="extendedKeyUsage=clientAuth"
    cert apiserver "/CN=kube-apiserver" "extendedKeyUsage=serverAuth
subjectAltName=DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local,DNS:localhost,DNS:$NODE_NAME,IP:$ip,IP:127.0.0.1,IP:$SERVICE_IP"
    cert apiserver-kubelet-client "/O=system:masters/CN=kube-apiserver-kubelet-client" "$client"
    cert admin "/O=system:masters/CN=stratad-k8s-admin" "$client"
    cert kube-controller-manager "/CN=system:kube-controller-manager" "$client"
    cert kube-scheduler "/CN=system:kube-scheduler" "$client"
    cert kubelet-client "/O=system:nodes/CN=system:node:$NODE_NAME" "$client"
    cert kubelet "/CN=$NODE_NAME" "extendedKeyUsage=serverAuth
subjectAltName=DNS:$NODE_NAME,DNS:localhost,IP:$ip,IP:127.0.0.1"
    if [[ ! -f $PKI/sa.key ]]; then
        openssl ecparam -name prime256v1 -genkey -noout 2>/dev/null |
            openssl pkcs8 -topk8 -nocrypt -out "$PKI/sa.key"
        openssl ec -in "$PKI/sa.key" -pubout -out "$PKI/sa.pub" 2>/dev/null
        chmod 600 "$PKI/sa.key"
    fi
}

kubeconfig() {  # FILE CERT-NAME SERVER
    local file=$1 name=$2 server=$3
    [[ -f $file ]] && return
    cat >"$file" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: stratad-k8s
  cluster:
    server: $server
    certificate-authority-data: $(base64 -w0 "$PKI/ca.crt")
users:
- name: $name
  user:
    client-certificate-data: $(base64 -w0 "$PKI/$name.crt")
    client-key-data: $(base64 -w0 "$PKI/$name.key")
contexts:
- name: stratad-k8s
  context:
    cluster: stratad-k8s
    user: $name
    namespace: default
current-context: stratad-k8s
EOF
    chmod 600 "$file"
}

write_containerd_config() {
    mkdir -p "$STATE/containerd" "$STATE/cni/net.d"
    cat >"$STATE/containerd/config.toml" <<EOF
# Written by scripts/k8s/cluster.sh: the kubelet's containerd, separate from
# the Docker engine's (own root, state and socket).
version = 2
root = "$STATE/containerd/root"
state = "$STATE/containerd/state"
oom_score = 0
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs",
                    "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.zfs",
                    "io.containerd.tracing.processor.v1.otlp", "io.containerd.internal.v1.tracing"]

[grpc]
  address = "$CTR_SOCK"

[ttrpc]
  address = "$STATE/containerd/containerd.sock.ttrpc"

[debug]
  address = ""

[metrics]
  address = ""

[plugins."io.containerd.internal.v1.opt"]
  path = "$STATE/containerd/opt"

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "$PAUSE_IMAGE"
  # root here lacks CAP_SYS_RESOURCE: never ask runc to lower an oom_score_adj.
  restrict_oom_score_adj = true
  enable_selinux = false
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "$STATE/cni/net.d"
EOF
    # bridge: pods on $CNI_BRIDGE, its address the pods' gateway; firewall: lets
    # the pods' traffic through the FORWARD chain, whose policy the Docker
    # engine sets to DROP (bridged frames go through iptables: br_netfilter).
    cat >"$STATE/cni/net.d/10-stratad-k8s.conflist" <<EOF
{
  "cniVersion": "1.0.0",
  "name": "stratad-k8s",
  "plugins": [
    {
      "type": "bridge",
      "bridge": "$CNI_BRIDGE",
      "isGateway": true,
      "ipMasq": false,
      "hairpinMode": true,
      "ipam": {
        "type": "host-local",
        "ranges": [[{"subnet": "$POD_CIDR"}]],
        "routes": [{"dst": "0.0.0.0/0"}],
        "dataDir": "$STATE/cni/ipam"
      }
    },
    {"type": "portmap", "capabilities": {"portMappings": true}},
    {"type": "firewall", "backend": "iptables"}
  ]
}
EOF
}

write_kubelet_config() {
    local ip=$1
    mkdir -p "$STATE/kubelet"
    cat >"$STATE/kubelet/config.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: $ip
port: 10250
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: 10248
tlsCertFile: $PKI/kubelet.crt
tlsPrivateKeyFile: $PKI/kubelet.key
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: $PKI/ca.crt}
authorization:
  mode: Webhook
cgroupDriver: cgroupfs
containerRuntimeEndpoint: unix://$CTR_SOCK
failSwapOn: false
resolvConf: /etc/resolv.conf
podLogsDir: $STATE/pod-logs
# No kube-proxy, no CoreDNS: no clusterDNS (pods use the host's resolv.conf).
# A test machine's disk may be fuller than the defaults allow: evict late and
# never garbage-collect images (they come from load-image, not a registry).
evictionHard:
  memory.available: 100Mi
  nodefs.available: 1%
  nodefs.inodesFree: 1%
  imagefs.available: 1%
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
serializeImagePulls: false
shutdownGracePeriod: 0s
EOF
}

# Sysctls that the kubelet sets on start (vm.overcommit_memory, kernel.panic,
# ...): saved before its first start so that `down` puts them back.
KUBELET_SYSCTLS=(vm/overcommit_memory vm/panic_on_oom kernel/panic kernel/panic_on_oops
                 kernel/keys/root_maxkeys kernel/keys/root_maxbytes)
save_sysctls() {
    [[ -f $STATE/sysctl.saved ]] && return
    local s
    for s in "${KUBELET_SYSCTLS[@]}"; do
        echo "$s $(cat "/proc/sys/$s")"
    done >"$STATE/sysctl.saved"
}
restore_sysctls() {
    [[ -f $STATE/sysctl.saved ]] || return 0
    local s v
    while read -r s v; do
        echo "$v" >"/proc/sys/$s" 2>/dev/null || true
    done <"$STATE/sysctl.saved"
}

# A one-file image (docker save format) that `ctr images import` reads: no registry needed.
# image_tar REF ROOTFS-DIR ENTRYPOINT OUT.tar
image_tar() {
    local ref=$1 rootfs=$2 entrypoint=$3 out=$4 tmp diffid cfg cfgid
    tmp=$(mktemp -d)
    tar --numeric-owner --owner=0 --group=0 -C "$rootfs" -cf "$tmp/layer.tar" .
    diffid=$(sha256sum "$tmp/layer.tar" | cut -d' ' -f1)
    cfg=$(printf '{"architecture":"amd64","os":"linux","config":{"Entrypoint":["%s"],"Env":["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"]},"rootfs":{"type":"layers","diff_ids":["sha256:%s"]}}' \
        "$entrypoint" "$diffid")
    cfgid=$(printf '%s' "$cfg" | sha256sum | cut -d' ' -f1)
    printf '%s' "$cfg" >"$tmp/$cfgid.json"
    mkdir "$tmp/$diffid"
    mv "$tmp/layer.tar" "$tmp/$diffid/layer.tar"
    printf '[{"Config":"%s.json","RepoTags":["%s"],"Layers":["%s/layer.tar"]}]' \
        "$cfgid" "$ref" "$diffid" >"$tmp/manifest.json"
    tar -C "$tmp" -cf "$out" manifest.json "$cfgid.json" "$diffid"
    rm -rf "$tmp"
}

load_pause_image() {
    if ctr_ images ls -q 2>/dev/null | grep -qxF "$PAUSE_IMAGE"; then
        return
    fi
    local tmp
    tmp=$(mktemp -d)
    mkdir "$tmp/rootfs"
    cp "$BIN/pause" "$tmp/rootfs/pause"
    image_tar "$PAUSE_IMAGE" "$tmp/rootfs" /pause "$tmp/pause.tar"
    ctr_ images import "$tmp/pause.tar" >/dev/null
    rm -rf "$tmp"
}

apply_storage() {
    local i manifest=$STATE/storage.yaml
    {
        cat <<EOF
apiVersion: storage.k8s.io/v1
kind: StorageClass
metadata:
  name: standard
  annotations:
    storageclass.kubernetes.io/is-default-class: "true"
provisioner: kubernetes.io/no-provisioner
volumeBindingMode: WaitForFirstConsumer
reclaimPolicy: Retain
EOF
        for ((i = 0; i < NPVS; i++)); do
            pv_dir "$i"
            cat <<EOF
---
apiVersion: v1
kind: PersistentVolume
metadata:
  name: pv-$i
  labels: {stratad-k8s/pv: "true"}
spec:
  capacity: {storage: $PV_SIZE}
  accessModes: [ReadWriteOnce]
  persistentVolumeReclaimPolicy: Retain
  storageClassName: standard
  hostPath: {path: $STATE/pv/$i, type: Directory}
EOF
        done
    } >"$manifest"
    kc apply -f "$manifest" >/dev/null
}

pv_dir() {
    mkdir -p "$STATE/pv/$1"
    chown 10001:10001 "$STATE/pv/$1"
    chmod 0777 "$STATE/pv/$1"
}

# shellcheck disable=SC2329  # called through wait_for
node_ready() {
    [[ $(kc get node "$NODE_NAME" -o 'jsonpath={.status.conditions[?(@.type=="Ready")].status}') == True ]]
}

cmd_up() {
    local t0=$SECONDS
    binaries_current || die "no Kubernetes $K8S_VERSION binaries in $BIN: run \`$0 build\` first"
    step "packages, node IP, PKI, configuration"
    ensure_packages
    local ip
    ip=$(detect_node_ip)
    if [[ -s $STATE/node-ip && $(cat "$STATE/node-ip") != "$ip" ]]; then
        # A state directory from another boot or network: the certificates and
        # the node name no longer fit. Start afresh.
        log "the node IP changed ($(cat "$STATE/node-ip") -> $ip): removing the old cluster"
        cmd_down
    elif [[ -d $STATE ]] && ! any_running; then
        # Left by a run whose processes are gone (a reboot, an ended session):
        # start afresh rather than revive half-dead containers and mounts.
        log "$STATE is left from an earlier run whose processes are gone: removing it"
        cmd_down
    fi
    mkdir -p "$STATE" "$LOGS" "$RUN"
    echo "$ip" >"$STATE/node-ip"
    make_pki "$ip"
    local server=https://$ip:$API_PORT
    kubeconfig "$KUBECONFIG_ADMIN" admin "$server"
    kubeconfig "$STATE/kube-controller-manager.kubeconfig" kube-controller-manager "$server"
    kubeconfig "$STATE/kube-scheduler.kubeconfig" kube-scheduler "$server"
    kubeconfig "$STATE/kubelet.kubeconfig" kubelet-client "$server"
    write_containerd_config
    write_kubelet_config "$ip"
    step_done

    step "etcd and containerd"
    start etcd etcd --name stratad-k8s --data-dir "$STATE/etcd" \
        --listen-client-urls "http://$ETCD_CLIENT" --advertise-client-urls "http://$ETCD_CLIENT" \
        --listen-peer-urls "http://$ETCD_PEER" --initial-advertise-peer-urls "http://$ETCD_PEER" \
        --initial-cluster "stratad-k8s=http://$ETCD_PEER" \
        --quota-backend-bytes 2147483648 --snapshot-count 10000
    start containerd containerd --config "$STATE/containerd/config.toml"
    WATCH="etcd containerd"
    wait_for "etcd" etcd_health || dump_logs etcd || die "etcd did not start"
    wait_for "containerd" ctr_ version || dump_logs containerd || die "containerd did not start"
    load_pause_image
    step_done

    step "kube-apiserver"
    start kube-apiserver "$BIN/kube-apiserver" \
        --bind-address="$ip" --advertise-address="$ip" --secure-port="$API_PORT" \
        --etcd-servers="http://$ETCD_CLIENT" \
        --service-cluster-ip-range="$SERVICE_CIDR" \
        --client-ca-file="$PKI/ca.crt" \
        --tls-cert-file="$PKI/apiserver.crt" --tls-private-key-file="$PKI/apiserver.key" \
        --kubelet-client-certificate="$PKI/apiserver-kubelet-client.crt" \
        --kubelet-client-key="$PKI/apiserver-kubelet-client.key" \
        --kubelet-certificate-authority="$PKI/ca.crt" \
        --kubelet-preferred-address-types=InternalIP \
        --service-account-issuer=https://kubernetes.default.svc.cluster.local \
        --service-account-key-file="$PKI/sa.pub" \
        --service-account-signing-key-file="$PKI/sa.key" \
        --authorization-mode=Node,RBAC \
        --enable-admission-plugins=NodeRestriction \
        --allow-privileged=true \
        --profiling=false \
        --event-ttl=1h
    WATCH="etcd kube-apiserver"
    wait_for "the API server" kc get --raw /readyz ||
        dump_logs kube-apiserver || die "kube-apiserver did not become ready"
    step_done

    step "kube-controller-manager, kube-scheduler, kubelet"
    start kube-controller-manager "$BIN/kube-controller-manager" \
        --kubeconfig="$STATE/kube-controller-manager.kubeconfig" \
        --authentication-kubeconfig="$STATE/kube-controller-manager.kubeconfig" \
        --authorization-kubeconfig="$STATE/kube-controller-manager.kubeconfig" \
        --bind-address=127.0.0.1 \
        --leader-elect=false \
        --cluster-name=stratad-k8s \
        --service-cluster-ip-range="$SERVICE_CIDR" \
        --root-ca-file="$PKI/ca.crt" \
        --service-account-private-key-file="$PKI/sa.key" \
        --use-service-account-credentials=true \
        --cluster-signing-cert-file="$PKI/ca.crt" --cluster-signing-key-file="$PKI/ca.key" \
        --controllers='*' \
        --profiling=false
    start kube-scheduler "$BIN/kube-scheduler" \
        --kubeconfig="$STATE/kube-scheduler.kubeconfig" \
        --authentication-kubeconfig="$STATE/kube-scheduler.kubeconfig" \
        --authorization-kubeconfig="$STATE/kube-scheduler.kubeconfig" \
        --bind-address=127.0.0.1 \
        --leader-elect=false \
        --profiling=false
    save_sysctls
    start kubelet "$BIN/kubelet" \
        --config="$STATE/kubelet/config.yaml" \
        --kubeconfig="$STATE/kubelet.kubeconfig" \
        --root-dir="$STATE/kubelet" \
        --hostname-override="$NODE_NAME" \
        --node-ip="$ip"
    WATCH="etcd containerd kube-apiserver kube-controller-manager kube-scheduler kubelet"
    wait_for "node $NODE_NAME to be Ready" node_ready ||
        dump_logs kubelet containerd kube-controller-manager || die "the node did not become Ready"
    wait_for "the default service account" kc -n default get serviceaccount default ||
        dump_logs kube-controller-manager || die "no default service account"
    step_done

    step "storage: StorageClass standard, $NPVS hostPath PersistentVolumes of $PV_SIZE"
    apply_storage
    step_done
    log "cluster up in $((SECONDS - t0)) s: node $NODE_NAME ($ip), API https://$ip:$API_PORT"
    echo "export KUBECONFIG=$KUBECONFIG_ADMIN"
}

# shellcheck disable=SC2329  # called through wait_for
etcd_health() {
    # etcd answers /health on its client URL.
    [[ $(curl -fsS "http://$ETCD_CLIENT/health" 2>/dev/null) == *'"health":"true"'* ]]
}

# ---------------------------------------------------------------------------
# down
# ---------------------------------------------------------------------------

# Processes in the kubelet's pod cgroups (cgroupfs driver: /kubepods/...).
pod_pids() {
    local d
    for d in /sys/fs/cgroup/pids/kubepods /sys/fs/cgroup/memory/kubepods /sys/fs/cgroup/unified/kubepods /sys/fs/cgroup/kubepods; do
        if [[ -d $d ]]; then find "$d" -name cgroup.procs -exec cat {} + 2>/dev/null || true; fi
    done | sort -un
}

# The containerd shims of our containerd (their command line names our socket).
our_shims() {
    local p
    for p in /proc/[0-9]*; do
        [[ $(readlink "$p/exe" 2>/dev/null) == */containerd-shim-runc-v2 ]] || continue
        if tr '\0' ' ' <"$p/cmdline" 2>/dev/null | grep -qF -- "-address $CTR_SOCK "; then
            echo "${p#/proc/}"
        fi
    done
}

cmd_down() {
    local t0=$SECONDS
    if [[ ! -d $STATE ]]; then
        log "nothing to stop ($STATE does not exist)"
        return
    fi
    # Let the kubelet stop the pods (so CNI tears their networks down) before
    # stopping it: controllers first, so nothing recreates them.
    stop kube-controller-manager
    stop kube-scheduler
    if running kube-apiserver && running kubelet && running containerd; then
        step "delete all pods"
        kc delete pods --all --all-namespaces --grace-period=1 --wait=false >/dev/null 2>&1 || true
        local deadline=$((SECONDS + 30))
        while ((SECONDS < deadline)); do
            [[ -z $(ctr_ tasks ls -q 2>/dev/null) ]] && break
            sleep 0.5
        done
        step_done
    fi
    stop kubelet
    stop kube-apiserver
    stop etcd
    # Whatever is left in pods: kill it, then delete the tasks and the sandboxes' netns.
    local pids netns
    pids=$(pod_pids)
    if [[ -n $pids ]]; then
        log "killing leftover pod processes: ${pids//$'\n'/ }"
        # shellcheck disable=SC2086
        kill -KILL $pids 2>/dev/null || true
    fi
    if running containerd; then
        netns=$(ctr_ containers ls -q 2>/dev/null | while read -r c; do
            ctr_ containers info "$c" 2>/dev/null | grep -o '/var/run/netns/cni-[0-9a-f-]*\|/run/netns/cni-[0-9a-f-]*' || true
        done | sort -u) || netns=''

        local t
        for t in $(ctr_ tasks ls -q 2>/dev/null); do
            ctr_ tasks kill -a -s SIGKILL "$t" >/dev/null 2>&1 || true
        done
        sleep 0.5
        for t in $(ctr_ tasks ls -q 2>/dev/null); do
            ctr_ tasks delete -f "$t" >/dev/null 2>&1 || true
        done
        local n
        for n in $netns; do
            umount "$n" 2>/dev/null || true
            rm -f "$n"
        done
    fi
    stop containerd
    local shims
    shims=$(our_shims)
    if [[ -n $shims ]]; then
        log "killing leftover containerd shims: ${shims//$'\n'/ }"
        # shellcheck disable=SC2086
        kill -KILL $shims 2>/dev/null || true
        sleep 0.2
    fi
    restore_sysctls
    # Unmount everything under $STATE, deepest first (kubelet volumes, overlay
    # snapshots, sandbox shm).
    local m
    awk -v s="$STATE/" 'index($2, s) == 1 {print $2}' /proc/self/mounts | sort -r |
        while read -r m; do
            umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || log "could not unmount $m"
        done
    # The pod cgroups the kubelet made (empty now).
    local c
    for c in /sys/fs/cgroup/*/kubepods; do
        [[ -d $c ]] && find "$c" -depth -type d -exec rmdir {} + 2>/dev/null || true
    done
    # Network: the pods' bridge, the dummy interface, CNI's iptables chains.
    ip link del "$CNI_BRIDGE" 2>/dev/null || true
    ip link del "$DUMMY_IF" 2>/dev/null || true
    cleanup_cni_iptables
    # The kubelet's links to the container logs (/var/log/containers is fixed).
    local l
    for l in /var/log/containers/*.log; do
        [[ -L $l && $(readlink "$l") == "$STATE/"* ]] && rm -f "$l"
    done
    rm -rf "$STATE"
    log "down in $((SECONDS - t0)) s"
}

# Remove the chains that the CNI firewall and portmap plugins added (they leave
# the shared ones behind after the last pod).
cleanup_cni_iptables() {
    local table chain rule
    for table in filter nat; do
        { iptables -t "$table" -S 2>/dev/null | grep -- '-j CNI-' | grep -v '^-N' || true; } |
            while read -r rule; do
                # The rule as iptables -S prints it, shell-quoted (comments have spaces).
                eval "iptables -t $table ${rule/-A/-D}" 2>/dev/null || true
            done
        for chain in $(iptables -t "$table" -S 2>/dev/null | sed -n 's/^-N \(CNI-[A-Za-z0-9_-]*\)$/\1/p'); do
            iptables -t "$table" -F "$chain" 2>/dev/null || true
        done
        for chain in $(iptables -t "$table" -S 2>/dev/null | sed -n 's/^-N \(CNI-[A-Za-z0-9_-]*\)$/\1/p'); do
            iptables -t "$table" -X "$chain" 2>/dev/null || true
        done
    done
}

# ---------------------------------------------------------------------------
# the other commands
# ---------------------------------------------------------------------------

cmd_load_image() {
    (($#)) || die "usage: $0 load-image REF..."
    running containerd || die "our containerd is not running: run \`$0 up\` first"
    if ! { command -v docker >/dev/null && docker info >/dev/null 2>&1; }; then
        bash "$ROOT/scripts/docker/engine.sh"   # installs and starts the Docker engine
    fi
    local ref t
    for ref in "$@"; do
        t=$(date +%s.%N)
        docker save "$ref" | ctr_ images import - >/dev/null || die "could not load $ref"
        log "loaded $ref into containerd in $(awk -v a="$t" -v b="$(date +%s.%N)" 'BEGIN{printf "%.1f", b-a}') s"
    done
}

cmd_recycle_pvs() {
    local pv
    for pv in $(kc get pv -l stratad-k8s/pv=true \
                -o 'jsonpath={range .items[?(@.status.phase=="Released")]}{.metadata.name}{"\n"}{end}'); do
        kc delete pv "$pv" --ignore-not-found --wait=true --timeout=60s >/dev/null
        rm -rf "${STATE:?}/pv/${pv#pv-}"
        log "recycled $pv"
    done
    apply_storage
}

main() {
    local cmd=${1:-}
    (($#)) && shift
    case $cmd in
        build) cmd_build ;;
        up) cmd_up ;;
        down) cmd_down ;;
        load-image) cmd_load_image "$@" ;;
        kubectl) exec "$BIN/kubectl" --kubeconfig "$KUBECONFIG_ADMIN" "$@" ;;
        node-ip) [[ -s $STATE/node-ip ]] || die "the cluster is not up ($STATE/node-ip is missing)"
                 cat "$STATE/node-ip" ;;
        status) [[ -f $KUBECONFIG_ADMIN && -x $BIN/kubectl ]] &&
                    kc get --raw /readyz --request-timeout=5s >/dev/null 2>&1 ;;
        recycle-pvs) cmd_recycle_pvs ;;
        -h|--help|help) usage ;;
        *) usage ;;
    esac
}

# One line: bash reads a script as it runs it, and this file may be replaced meanwhile.
main "$@"; exit $?
