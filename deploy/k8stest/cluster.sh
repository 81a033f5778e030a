#!/usr/bin/env bash
# cluster.sh: a real two-node Kubernetes cluster for gpuwarden's end-to-end
# tests, built from source and run inside a network namespace of its own.
#
#   cluster.sh build         build Kubernetes and containerd into the cache (once per version)
#   cluster.sh run CMD...    build, bring the cluster up, run CMD, tear it all down
#
# Knobs (environment):
#   GPUWARDEN_K8S_CACHE  where built binaries are kept between runs
#                        (default /var/cache/gpuwarden-k8s)
#   GPUWARDEN_K8S_STATE  the cluster's working directory for one run, absent or
#                        empty; it is removed at teardown (default: a new
#                        directory under /tmp)
#   GPUWARDEN_K8S_KEEP=1 keep the state directory (logs) after teardown
#   GO                   the go command (default go)
#
# The Kubernetes version is the one deploy/k8stest/kubernetes/go.mod requires
# (a module of its own, for the build alone: the tests' module has Helm's
# newer dependency tree); etcd is the one that version's module graph holds.
# containerd (2.x, for CDI: the kubelet hands DRA devices to the runtime as
# CDI names) is the one deploy/k8stest/containerd/go.mod requires, built the
# same way; runc and the CNI plugins are Debian's.
#
# Node 1 (gpuwarden-k8s) runs the control plane's pods and the tests' GPU
# pods. Node 2 (gpuwarden-k8s-2), brought up once node 1 is Ready, is a node
# without GPUs, for remote GPUs: its pods use a GPU of node 1 over the
# network through gpuwarden's relay. It has its own containerd (pod subnet,
# CNI bridge and directories under $S/node2) and its own kubelet (ports,
# certificate, root directory, pod-resources socket and a cgroup root,
# /gpuwarden-node2, of its own), at node 1's address in the same namespace.
# It is labelled and tainted gpuwarden.io/remote-client=true (NoSchedule):
# pods that do not tolerate the taint, which is every pod of the tests
# before it, never land there. The kubelet's device-plugins directory is
# fixed in its code and emptied by its device manager at start, so node 2's
# kubelet runs in a mount namespace of its own where $S/node2/device-plugins
# is mounted over it; its root directory is a shared mount, so that the
# volumes it mounts for pods reach containerd in the host's namespace.
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
GO=${GO:-go}
# required MODDIR MODULE: the version of MODULE that MODDIR/go.mod requires,
# in a require block or on a require line of its own.
required() {
    awk -v m="$2" '$1 == "require" { $1 = ""; $0 = $0 } $1 == m { print $2; exit }' "$1/go.mod"
}
K8S_MOD=$HERE/kubernetes
K8S_VERSION=$(required "$K8S_MOD" k8s.io/kubernetes)
CTRD_MOD=$HERE/containerd
CTRD_VERSION=$(required "$CTRD_MOD" github.com/containerd/containerd/v2)
CACHE_ROOT=${GPUWARDEN_K8S_CACHE:-/var/cache/gpuwarden-k8s}
CACHE=$CACHE_ROOT/$K8S_VERSION
CTRD_CACHE=$CACHE_ROOT/containerd-$CTRD_VERSION

log() { echo "k8stest: $*" >&2; }
die() { log "$*"; exit 1; }

# gobuild MOD DIR WHAT COLD ARGS...: one `go build ARGS` (its flags, then
# its packages) in the module MOD, into DIR/bin. A stamp names the inputs
# (go.sum, which changes with any version or replacement, and ARGS), so a
# changed module graph rebuilds and an unchanged one costs nothing. COLD
# says how long a build with an empty Go build cache takes. nice: these
# machines are shared with timing tests.
gobuild() {
    local mod=$1 dir=$2 what=$3 cold=$4; shift 4
    local stamp tmp
    stamp=$(cat "$mod/go.sum" <(echo "$*") | sha256sum | cut -d' ' -f1)
    if [ -f "$dir/bin/.stamp" ] && [ "$(cat "$dir/bin/.stamp")" = "$stamp" ]; then
        return
    fi
    log "building $what into $dir/bin (cold: $cold)"
    mkdir -p "$dir"
    tmp=$(mktemp -d "$dir/bin.XXXXXX")
    (cd "$mod" && CGO_ENABLED=0 nice -n 19 "$GO" build -trimpath -o "$tmp/" "$@") ||
        { rm -rf "$tmp"; die "building $what failed"; }
    # go names etcd's main package after its module's last element.
    [ ! -e "$tmp/server" ] || mv "$tmp/server" "$tmp/etcd"
    echo "$stamp" >"$tmp/.stamp"
    rm -rf "$dir/bin" && mv "$tmp" "$dir/bin"
}

# build: the server binaries, kubectl and etcd into $CACHE/bin; containerd,
# its runc shim and ctr into $CTRD_CACHE/bin. Each with its version linked
# in, as its own release build does; containerd without cgo, and so
# without the btrfs, devmapper and zfs snapshotters (overlayfs is used).
build() {
    local minor=${K8S_VERSION#v1.}; minor=${minor%%.*}
    local ldflags="-s -w" pkg
    for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
        ldflags+=" -X $pkg.gitVersion=$K8S_VERSION -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor -X $pkg.gitTreeState=clean"
    done
    gobuild "$K8S_MOD" "$CACHE" "Kubernetes $K8S_VERSION" "about 15 minutes on two cores" -ldflags "$ldflags" \
        k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager \
        k8s.io/kubernetes/cmd/kube-scheduler k8s.io/kubernetes/cmd/kubelet k8s.io/kubernetes/cmd/kubectl \
        go.etcd.io/etcd/server/v3
    pkg=github.com/containerd/containerd/v2
    gobuild "$CTRD_MOD" "$CTRD_CACHE" "containerd $CTRD_VERSION" "about 3 minutes on two cores" \
        -tags "no_btrfs no_devmapper no_zfs" \
        -ldflags "-s -w -X $pkg/version.Version=$CTRD_VERSION -X $pkg/version.Package=$pkg" \
        $pkg/cmd/containerd $pkg/cmd/containerd-shim-runc-v2 $pkg/cmd/ctr
}

# The cluster's fixed names and addresses. They exist only inside the
# network namespace, so they cannot collide with the host or other runs.
NODE=gpuwarden-k8s
NODE_IP=10.213.0.1  # the veth inside the namespace: the node's InternalIP
POD_CIDR=10.214.0.0/24
SERVICE_CIDR=10.96.0.0/24
# The kubelet changes these kernel settings at start; teardown puts them back.
SYSCTLS=(vm/overcommit_memory vm/panic_on_oom kernel/panic kernel/panic_on_oops
    kernel/keys/root_maxkeys kernel/keys/root_maxbytes)
# Host paths that the kubelet and containerd use whatever their root
# directories say; teardown removes those that were not there before.
HOST_PATHS=(/var/lib/kubelet /var/lib/kubelet/device-plugins /var/lib/cni /var/log/containers
    /var/log/pods /run/containerd /run/netns)
DEVICE_PLUGINS=/var/lib/kubelet/device-plugins # the kubelet's, fixed in its code
# Node 2, without GPUs: the same address (both kubelets are in the one
# namespace), its own kubelet ports, pod subnet and cgroup root, its label
# and taint (key=value:effect).
NODE2=gpuwarden-k8s-2
NODE2_PORT=11250 NODE2_HEALTHZ_PORT=11248 # node 1's are the defaults, 10250 and 10248
POD_CIDR2=10.214.1.0/24
CGROUP_ROOT2=/gpuwarden-node2
NODE2_TAINT=gpuwarden.io/remote-client=true:NoSchedule

S= NS= CMD_GROUP= PIDS=() NAMES=()

# start NAME CMD...: a component inside the namespace, logging to $S/log/NAME.log.
# nsenter execs the command, so $! is the component's own PID.
start() {
    local name=$1; shift
    nsenter --net="/run/netns/$NS" "$@" >"$S/log/$name.log" 2>&1 &
    PIDS+=($!) NAMES+=("$name")
}

kctl() { nsenter --net="/run/netns/$NS" "$CACHE/bin/kubectl" --kubeconfig "$S/admin.kubeconfig" "$@"; }

# wait_for WHAT SECONDS CMD...: retry CMD until it succeeds, or fail naming
# WHAT and the logs to read. Timeouts are generous: the machines are shared.
wait_for() {
    local what=$1 secs=$2; shift 2
    local end=$((SECONDS + secs))
    until "$@" >/dev/null 2>&1; do
        [ $SECONDS -lt $end ] || die "$what: not within ${secs}s (logs in $S/log)"
        local i
        for i in "${!PIDS[@]}"; do
            kill -0 "${PIDS[$i]}" 2>/dev/null || die "$what: ${NAMES[$i]} exited (see $S/log/${NAMES[$i]}.log)"
        done
        sleep 0.5
    done
}

# cert NAME SUBJECT [SANS]: a key and a certificate signed by the cluster CA.
cert() {
    local name=$1 subj=$2 sans=${3:-}
    local ext="extendedKeyUsage=serverAuth,clientAuth"
    [ -z "$sans" ] || ext+=$'\n'"subjectAltName=$sans"
    openssl req -new -newkey rsa:2048 -nodes -keyout "$S/pki/$name.key" -subj "$subj" 2>/dev/null |
        openssl x509 -req -CA "$S/pki/ca.crt" -CAkey "$S/pki/ca.key" -CAcreateserial -days 2 \
            -extfile <(printf '%s\n' "$ext") -out "$S/pki/$name.crt" 2>/dev/null
}

kubeconfig() { # kubeconfig FILE CERTNAME
    cat >"$1" <<EOK
apiVersion: v1
kind: Config
clusters:
- name: local
  cluster: {server: "https://127.0.0.1:6443", certificate-authority: "$S/pki/ca.crt"}
users:
- name: user
  user: {client-certificate: "$S/pki/$2.crt", client-key: "$S/pki/$2.key"}
contexts:
- name: local
  context: {cluster: local, user: user}
current-context: local
EOK
}

# image NAME ROOTFS [ENTRYPOINT]: a docker-archive tar of one layer, which
# `ctr images import` reads; nothing is pulled.
image() {
    local name=$1 root=$2 entry=${3:-null} dir
    dir=$(mktemp -d "$S/images/tar.XXXXXX")
    tar -C "$root" --numeric-owner -cf "$dir/layer.tar" .
    local diff
    diff=$(sha256sum "$dir/layer.tar" | cut -d' ' -f1)
    printf '{"architecture":"amd64","os":"linux","config":{"Env":["PATH=/bin"],"Entrypoint":%s},"rootfs":{"type":"layers","diff_ids":["sha256:%s"]}}' \
        "$entry" "$diff" >"$dir/config.json"
    printf '[{"Config":"config.json","RepoTags":["%s"],"Layers":["layer.tar"]}]' "$name" >"$dir/manifest.json"
    tar -C "$dir" -cf "$S/images/$(basename "$root").tar" manifest.json config.json layer.tar
    rm -rf "$dir"
}

# containerd_up NODE LOG DIR CDI CNI BRIDGE SUBNET: a node's containerd,
# logging to $S/log/LOG.log, with its root, state, sockets and config
# under DIR, its CDI specs read from CDI alone, its pods on BRIDGE in
# SUBNET (CNI's config and IP leases under CNI), a pod's hostPorts mapped
# at the node's address by the portmap plugin (iptables rules inside the
# namespace: node 2's remote GPU clients dial node 1's agent there), and
# the pause and busybox images imported. Config version 4 (2.3's: the sockets are the server
# plugins' settings). restrict_oom_score_adj: root here lacks
# CAP_SYS_RESOURCE, and runc fails to lower oom_score_adj. The pause image
# is the imported one, pinned (never pulled, never collected). CDI is
# always on in containerd 2.x. NRI is off: its socket would be a host path
# (/var/run/nri).
containerd_up() {
    local node=$1 log=$2 dir=$3 cdi=$4 cni=$5 bridge=$6 subnet=$7
    mkdir -p "$dir" "$cdi" "$cni/net.d" "$cni/ipam"
    cat >"$dir/config.toml" <<EOC
version = 4
root = "$dir/root"
state = "$dir/state"
[plugins.'io.containerd.server.v1.grpc']
  address = "$dir/containerd.sock"
[plugins.'io.containerd.server.v1.ttrpc']
  address = "$dir/containerd.sock.ttrpc"
[plugins.'io.containerd.internal.v1.opt']
  path = "$dir/opt"
[plugins.'io.containerd.nri.v1.nri']
  disable = true
[plugins.'io.containerd.cri.v1.images'.pinned_images]
  sandbox = "gpuwarden.test/pause:1"
[plugins.'io.containerd.cri.v1.runtime']
  restrict_oom_score_adj = true
  cdi_spec_dirs = ["$cdi"]
  [plugins.'io.containerd.cri.v1.runtime'.containerd]
    default_runtime_name = "runc"
    [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
  [plugins.'io.containerd.cri.v1.runtime'.cni]
    bin_dirs = ["/usr/lib/cni"]
    conf_dir = "$cni/net.d"
EOC
    cat >"$cni/net.d/10-gpuwarden.conflist" <<EOC
{"cniVersion": "1.0.0", "name": "$node", "plugins": [
  {"type": "bridge", "bridge": "$bridge", "isGateway": true, "ipMasq": false,
   "ipam": {"type": "host-local", "dataDir": "$cni/ipam", "ranges": [[{"subnet": "$subnet"}]],
            "routes": [{"dst": "0.0.0.0/0"}]}},
  {"type": "portmap", "capabilities": {"portMappings": true}}]}
EOC
    # containerd starts its shims from PATH: the built one comes first.
    start "$log" env PATH="$CTRD_CACHE/bin:$PATH" "$CTRD_CACHE/bin/containerd" --config "$dir/config.toml"
    # ctr warns on every call that containerd deprecates cgroup v1;
    # deploy/README.md says so once.
    local ctr=(env CONTAINERD_SUPPRESS_DEPRECATION_WARNINGS=1
        "$CTRD_CACHE/bin/ctr" --address "$dir/containerd.sock" -n k8s.io)
    wait_for "$log" 60 "${ctr[@]}" version
    "${ctr[@]}" images import "$S/images/pause.tar" >/dev/null
    "${ctr[@]}" images import "$S/images/busybox.tar" >/dev/null
}

# kubelet_config FILE CERT CONTAINERD PODLOGS [EXTRA]: a kubelet's
# configuration in FILE: serving with $S/pki/CERT.{crt,key}, its runtime
# the containerd at the socket CONTAINERD, pod logs in PODLOGS, and EXTRA's
# YAML lines last.
kubelet_config() {
    cat >"$1" <<EOC
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: $NODE_IP
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: "$S/pki/ca.crt"}
authorization: {mode: Webhook}
tlsCertFile: "$S/pki/$2.crt"
tlsPrivateKeyFile: "$S/pki/$2.key"
containerRuntimeEndpoint: "unix://$3"
cgroupDriver: cgroupfs
# The host's cgroups are hybrid (v1 controllers, v2 at /sys/fs/cgroup/unified),
# which the kubelet counts as cgroup v1 and refuses by default.
failCgroupV1: false
failSwapOn: false
podLogsDir: "$4"
# A shared test machine: never evict or collect images for disk or memory.
evictionHard: {memory.available: "1Mi", nodefs.available: "0%", imagefs.available: "0%", nodefs.inodesFree: "0%"}
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
${5:-}
EOC
}

up() {
    mkdir -p "$S"/{log,pki,host,images,etcd,kubelet,containerd,cdi,cni/net.d,cni/ipam,pod-logs}

    # What the host had before, for teardown.
    local p
    for p in "${SYSCTLS[@]}"; do echo "$p $(cat "/proc/sys/$p")"; done >"$S/host/sysctl"
    for p in "${HOST_PATHS[@]}"; do [ -e "$p" ] || echo "$p"; done >"$S/host/absent"
    ls -d /run/netns/cni-* >"$S/host/netns-before" 2>/dev/null || true

    # The network namespace: loopback, and a veth pair whose two ends both
    # stay inside it. The default route points at the veth, so anything not
    # local to the namespace goes nowhere.
    ip netns add "gpuwarden-k8s-$$"
    NS=gpuwarden-k8s-$$
    local in=(nsenter --net="/run/netns/$NS")
    "${in[@]}" ip link set lo up
    "${in[@]}" ip link add gwk0 type veth peer name gwk1
    "${in[@]}" ip addr add "$NODE_IP/24" dev gwk0
    "${in[@]}" ip link set gwk0 up
    "${in[@]}" ip link set gwk1 up
    "${in[@]}" ip route add default dev gwk0

    # Certificates: one CA; the API server's serving certificate; clients.
    openssl req -x509 -newkey rsa:2048 -nodes -keyout "$S/pki/ca.key" -subj /CN=gpuwarden-k8s-ca \
        -days 2 -out "$S/pki/ca.crt" 2>/dev/null
    cert apiserver /CN=kube-apiserver \
        "IP:127.0.0.1,IP:$NODE_IP,IP:${SERVICE_CIDR%0/*}1,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc"
    cert admin "/O=system:masters/CN=admin"
    cert apiserver-kubelet "/O=system:masters/CN=kube-apiserver-kubelet-client"
    cert kubelet "/O=system:nodes/CN=system:node:$NODE" "IP:$NODE_IP,DNS:$NODE"
    cert kubelet-2 "/O=system:nodes/CN=system:node:$NODE2" "IP:$NODE_IP,DNS:$NODE2"
    openssl genrsa -out "$S/pki/sa.key" 2048 2>/dev/null
    openssl rsa -in "$S/pki/sa.key" -pubout -out "$S/pki/sa.pub" 2>/dev/null
    kubeconfig "$S/admin.kubeconfig" admin
    kubeconfig "$S/kubelet.kubeconfig" kubelet
    kubeconfig "$S/kubelet-2.kubeconfig" kubelet-2

    # Images: a static pause and busybox, imported into containerd below.
    mkdir -p "$S/images/pause" "$S/images/busybox/bin"
    printf '%s\n' '#include <signal.h>' '#include <unistd.h>' \
        'static void stop(int s) { (void)s; _exit(0); }' \
        'int main(void) { signal(SIGCHLD, SIG_IGN); signal(SIGTERM, stop); signal(SIGINT, stop); for (;;) pause(); }' |
        gcc -static -O2 -x c -o "$S/images/pause/pause" -
    cp /bin/busybox "$S/images/busybox/bin/busybox"
    local applet
    for applet in $(busybox --list); do
        [ "$applet" = busybox ] || ln -s busybox "$S/images/busybox/bin/$applet"
    done
    image gpuwarden.test/pause:1 "$S/images/pause" '["/pause"]'
    image gpuwarden.test/busybox:1 "$S/images/busybox"

    start etcd "$CACHE/bin/etcd" --name default --data-dir "$S/etcd" --unsafe-no-fsync \
        --listen-client-urls http://127.0.0.1:2379 --advertise-client-urls http://127.0.0.1:2379 \
        --listen-peer-urls http://127.0.0.1:2380 --initial-advertise-peer-urls http://127.0.0.1:2380 \
        --initial-cluster default=http://127.0.0.1:2380 --log-level warn

    start kube-apiserver "$CACHE/bin/kube-apiserver" --etcd-servers http://127.0.0.1:2379 \
        --advertise-address "$NODE_IP" --secure-port 6443 --service-cluster-ip-range "$SERVICE_CIDR" \
        --tls-cert-file "$S/pki/apiserver.crt" --tls-private-key-file "$S/pki/apiserver.key" \
        --client-ca-file "$S/pki/ca.crt" --authorization-mode Node,RBAC --enable-admission-plugins NodeRestriction \
        --service-account-issuer https://kubernetes.default.svc --service-account-key-file "$S/pki/sa.pub" \
        --service-account-signing-key-file "$S/pki/sa.key" --allow-privileged \
        --kubelet-client-certificate "$S/pki/apiserver-kubelet.crt" --kubelet-client-key "$S/pki/apiserver-kubelet.key" \
        --kubelet-preferred-address-types InternalIP --cert-dir "$S/pki/apiserver" --profiling=false
    wait_for "the API server" 180 kctl get --raw /readyz

    start kube-controller-manager "$CACHE/bin/kube-controller-manager" --kubeconfig "$S/admin.kubeconfig" \
        --authentication-kubeconfig "$S/admin.kubeconfig" --authorization-kubeconfig "$S/admin.kubeconfig" \
        --bind-address 127.0.0.1 --leader-elect=false --root-ca-file "$S/pki/ca.crt" \
        --service-account-private-key-file "$S/pki/sa.key" --use-service-account-credentials=false \
        --cert-dir "$S/pki/controller-manager" --profiling=false
    start kube-scheduler "$CACHE/bin/kube-scheduler" --kubeconfig "$S/admin.kubeconfig" \
        --authentication-kubeconfig "$S/admin.kubeconfig" --authorization-kubeconfig "$S/admin.kubeconfig" \
        --bind-address 127.0.0.1 --leader-elect=false --profiling=false

    # Node 1: its containerd and kubelet, with everything under $S.
    containerd_up "$NODE" containerd "$S/containerd" "$S/cdi" "$S/cni" gwkbr0 "$POD_CIDR"
    kubelet_config "$S/kubelet/config.yaml" kubelet "$S/containerd/containerd.sock" "$S/pod-logs"
    start kubelet "$CACHE/bin/kubelet" --config "$S/kubelet/config.yaml" --kubeconfig "$S/kubelet.kubeconfig" \
        --root-dir "$S/kubelet" --cert-dir "$S/kubelet/pki" --hostname-override "$NODE" --node-ip "$NODE_IP"
    wait_for "node $NODE Ready" 240 kctl wait --for=condition=Ready "node/$NODE" --timeout=5s
    # Pods are refused until the namespace's service account exists.
    wait_for "the default service account" 120 kctl get serviceaccount default
    up_node2
}

# up_node2: node 2, a node without GPUs, once node 1 is Ready: its own
# containerd, and its own kubelet with everything under $S/node2.
up_node2() {
    local n2=$S/node2 m c
    mkdir -p "$n2"/{kubelet,device-plugins,pod-logs}
    containerd_up "$NODE2" containerd-2 "$n2/containerd" "$n2/cdi" "$n2/cni" gwkbr1 "$POD_CIDR2"

    # Its pods' cgroups under a root of its own in every hierarchy, never in
    # node 1's kubepods. The kubelet wants the root to exist, with the
    # controllers it needs: a v1 cpuset cgroup starts with no CPUs and no
    # memory nodes, and a v2 cgroup has the controllers its parent enables.
    for m in $(cgroup_mounts); do
        mkdir -p "$m$CGROUP_ROOT2"
        if [ -f "$m/cpuset.cpus" ]; then
            cat "$m/cpuset.cpus" >"$m$CGROUP_ROOT2/cpuset.cpus"
            cat "$m/cpuset.mems" >"$m$CGROUP_ROOT2/cpuset.mems"
        fi
        if [ -f "$m/cgroup.subtree_control" ]; then
            for c in $(cat "$m/cgroup.controllers"); do
                echo "+$c" >"$m/cgroup.subtree_control" 2>/dev/null || true
                echo "+$c" >"$m$CGROUP_ROOT2/cgroup.subtree_control" 2>/dev/null || true
            done
        fi
    done

    local taint=${NODE2_TAINT%:*}
    kubelet_config "$n2/config.yaml" kubelet-2 "$n2/containerd/containerd.sock" "$n2/pod-logs" "$(cat <<EOC
port: $NODE2_PORT
healthzPort: $NODE2_HEALTHZ_PORT
cgroupRoot: $CGROUP_ROOT2
registerWithTaints: [{key: "${taint%%=*}", value: "${taint#*=}", effect: "${NODE2_TAINT##*:}"}]
EOC
)"

    # The kubelet's device-plugins directory is fixed in its code, and its
    # device manager empties it at start: node 2's kubelet runs in a mount
    # namespace of its own where $n2/device-plugins is mounted over it,
    # leaving node 1's kubelet.sock alone. The mounts it makes for pods
    # (service-account tokens are tmpfs mounts) must reach containerd in
    # the host's namespace: its root directory is a shared mount made here,
    # which the new namespace's copy stays a peer of. The device-plugins
    # mount must not come back: inside, the mount it lands on is made
    # private first (a no-op where / is already private).
    mkdir -p "$DEVICE_PLUGINS"
    mount --bind "$n2/kubelet" "$n2/kubelet"
    mount --make-shared "$n2/kubelet"
    # shellcheck disable=SC2016 # the inner sh expands them
    start kubelet-2 unshare --mount --propagation unchanged sh -ec '
        mount --make-private "$(findmnt -n -o TARGET -T "$2")"
        mount --bind "$1" "$2"
        shift 2
        exec "$@"' sh "$n2/device-plugins" "$DEVICE_PLUGINS" \
        "$CACHE/bin/kubelet" --config "$n2/config.yaml" --kubeconfig "$S/kubelet-2.kubeconfig" \
        --root-dir "$n2/kubelet" --cert-dir "$n2/kubelet/pki" --hostname-override "$NODE2" --node-ip "$NODE_IP" \
        --node-labels "${NODE2_TAINT%:*}"
    wait_for "node $NODE2 Ready" 240 kctl wait --for=condition=Ready "node/$NODE2" --timeout=5s
}

# stop PID NAME: SIGTERM, then SIGKILL after 30 seconds. A negative PID
# is a process group.
stop() {
    local pid=$1 i
    kill -TERM -- "$pid" 2>/dev/null || return 0
    for i in $(seq 60); do
        kill -0 -- "$pid" 2>/dev/null || return 0
        sleep 0.5
    done
    log "$2 ($pid) did not stop on SIGTERM; killing it"
    kill -KILL -- "$pid" 2>/dev/null || true
}

# cgroup_mounts: the host's cgroup hierarchies, v1 and v2.
cgroup_mounts() {
    awk '$9 == "cgroup" || $9 == "cgroup2" { print $5 }' /proc/self/mountinfo
}

# cgroup_dirs: the kubelets' pod cgroups in every hierarchy, deepest first:
# node 1's kubepods, and node 2's cgroup root with its kubepods.
cgroup_dirs() {
    local m d
    for m in $(cgroup_mounts); do
        for d in "$m/kubepods" "$m$CGROUP_ROOT2"; do
            [ ! -d "$d" ] || find "$d" -depth -type d
        done
    done
}

# teardown: undo up, whatever state it reached, and say what could not be
# undone. Every step runs even when one before it failed.
teardown() {
    set +e
    local failed=0 t0=$SECONDS i pid m d p v
    case "$S" in /?*/?*) ;; *) return 0 ;; esac # nothing of ours to find without it
    # The command first, with whatever it left running (its process
    # group), when a signal ended the run or it left children behind.
    if [ -n "$CMD_GROUP" ] && kill -0 -- "-$CMD_GROUP" 2>/dev/null; then
        stop "-$CMD_GROUP" "the command's process group"
    fi
    if [ ${#PIDS[@]} -gt 0 ]; then
        # Pods first, through the kubelet, so sandboxes and their network go cleanly.
        kctl delete pods --all --all-namespaces --grace-period=1 --timeout=60s >/dev/null 2>&1
    fi
    # Components in the reverse order of their start, each by its own PID.
    for ((i = ${#PIDS[@]} - 1; i >= 0; i--)); do
        stop "${PIDS[$i]}" "${NAMES[$i]}"
        wait "${PIDS[$i]}" 2>/dev/null
    done
    # What outlives them: the containerds' shims (named by their sockets)
    # and any process left in a pod cgroup.
    for pid in $(grep -lsF -e "$S/containerd/containerd.sock" -e "$S/node2/containerd/containerd.sock" \
        /proc/[0-9]*/cmdline | cut -d/ -f3); do
        kill -KILL "$pid" 2>/dev/null
    done
    for pid in $(cgroup_dirs | sed 's|$|/cgroup.procs|' | xargs -r cat 2>/dev/null | sort -u); do
        kill -KILL "$pid" 2>/dev/null
    done
    # Mounts under the state directory (node 2's kubelet root among them),
    # and the pods' network namespaces that containerd made, deepest first.
    for m in $(awk -v s="$S/" 'index($5, s) == 1 { print $5 }' /proc/self/mountinfo | sort -r) \
        $(ls -d /run/netns/cni-* 2>/dev/null | grep -vxF -f "$S/host/netns-before"); do
        if grep -q " $m " /proc/self/mountinfo; then
            umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || { log "could not unmount $m"; failed=1; }
        fi
        case "$m" in /run/netns/cni-*) rm -f "$m" ;; esac
    done
    for d in $(cgroup_dirs); do
        for i in $(seq 20); do rmdir "$d" 2>/dev/null && break; sleep 0.5; done
        [ ! -d "$d" ] || { log "could not remove cgroup $d"; failed=1; }
    done
    if [ -f "$S/host/sysctl" ]; then
        while read -r p v; do
            [ "$(cat "/proc/sys/$p")" = "$v" ] || echo "$v" >"/proc/sys/$p" || { log "could not restore $p"; failed=1; }
        done <"$S/host/sysctl"
    fi
    if [ -n "$NS" ]; then
        ip netns delete "$NS" || { log "could not delete network namespace $NS"; failed=1; }
    fi
    if [ -f "$S/host/absent" ]; then
        while read -r p; do
            case "$p" in
            # ip netns makes this directory a bind mount of itself; others may
            # have made namespaces in it since.
            /run/netns) [ -n "$(ls -A "$p" 2>/dev/null)" ] || { umount "$p" 2>/dev/null; rmdir "$p" 2>/dev/null; } ;;
            *) rm -rf "$p" ;;
            esac
        done <"$S/host/absent"
    fi
    if [ "${GPUWARDEN_K8S_KEEP:-}" != 1 ]; then
        rm -rf "$S" || { log "could not remove $S"; failed=1; }
    else
        log "state and logs kept in $S"
    fi
    log "teardown took $((SECONDS - t0))s"
    [ $failed -eq 0 ] || log "teardown was incomplete (above)"
    return $failed
}

# unable REASON: this host cannot run a cluster. Under
# GPUWARDEN_REQUIRE_PRIVILEGED=1 (CI) that fails the run; elsewhere the
# suite is skipped, as the repository's other privileged tests are.
unable() {
    if [ "${GPUWARDEN_REQUIRE_PRIVILEGED:-}" = 1 ]; then
        die "this host cannot run a cluster: $*; GPUWARDEN_REQUIRE_PRIVILEGED=1 forbids skipping"
    fi
    log "skipping the end-to-end suite: this host cannot run a cluster: $*"
    exit 0
}

# preflight: what a cluster needs of the host, checked before anything is
# built or changed.
preflight() {
    [ "$(id -u)" -eq 0 ] || unable "it needs root"
    local cmd
    for cmd in nsenter unshare mount findmnt ip iptables runc openssl gcc busybox flock; do
        command -v "$cmd" >/dev/null || unable "$cmd is not installed"
    done
    [ -x /usr/lib/cni/bridge ] && [ -x /usr/lib/cni/host-local ] && [ -x /usr/lib/cni/portmap ] ||
        unable "the CNI plugins are not in /usr/lib/cni"
    grep -qs ' /sys/fs/cgroup' /proc/self/mountinfo || unable "no cgroup filesystem is mounted"
    local probe=gpuwarden-k8s-probe-$$
    ip netns add "$probe" 2>/dev/null || unable "network namespaces cannot be made (ip netns add)"
    ip netns delete "$probe"
    # The kubelet's device-plugins directory is fixed in its code, and
    # teardown kills whatever is left in kubepods (and $CGROUP_ROOT2)
    # cgroups: a kubelet of the host's own rules a cluster out.
    [ ! -S "$DEVICE_PLUGINS/kubelet.sock" ] || unable "$DEVICE_PLUGINS/kubelet.sock exists: a kubelet runs on this host"
    [ -z "$(cgroup_dirs)" ] || unable "kubepods or $CGROUP_ROOT2 cgroups exist: another kubelet's pods run on this host"
}

# run CMD...: one cluster for CMD, run inside the namespace with
# KUBECONFIG and the GPUWARDEN_K8S_* paths below in its environment; its
# exit status is CMD's, or 1 when CMD passed and teardown was incomplete.
run() {
    [ $# -gt 0 ] || die "usage: cluster.sh run CMD..."
    preflight
    build
    # One cluster at a time, whatever its version: the kubelet's
    # device-plugins directory is fixed. Checked again once the lock is
    # held, since the cluster that held it is gone only now.
    exec 9>"$CACHE_ROOT/lock"
    flock -w 1800 9 || die "another cluster has held $CACHE_ROOT/lock for 30 minutes"
    preflight
    S=$(realpath -m "${GPUWARDEN_K8S_STATE:-$(mktemp -d /tmp/gpuwarden-k8s.XXXXXX)}")
    # Teardown removes it: never a directory that holds anything else.
    [ -z "$(ls -A "$S" 2>/dev/null)" ] || die "$S is not empty"
    trap 'exit 130' INT TERM
    trap 'rc=$?; trap - EXIT; teardown || { [ $rc -ne 0 ] || rc=1; }; exit $rc' EXIT
    local t0=$SECONDS status=0
    log "cluster state in $S"
    up
    log "nodes $NODE and $NODE2 Ready after $((SECONDS - t0))s"
    KUBECONFIG=$S/admin.kubeconfig \
        GPUWARDEN_K8S_STATE=$S \
        GPUWARDEN_K8S_NODE=$NODE \
        GPUWARDEN_K8S_KUBECTL=$CACHE/bin/kubectl \
        GPUWARDEN_K8S_DEVICE_PLUGINS=$DEVICE_PLUGINS \
        GPUWARDEN_K8S_POD_RESOURCES_SOCKET=$S/kubelet/pod-resources/kubelet.sock \
        GPUWARDEN_K8S_CONTAINERD=$S/containerd/containerd.sock \
        GPUWARDEN_K8S_CTR=$CTRD_CACHE/bin/ctr \
        GPUWARDEN_K8S_CDI_DIR=$S/cdi \
        GPUWARDEN_K8S_NODE2=$NODE2 \
        GPUWARDEN_K8S_NODE2_CONTAINERD=$S/node2/containerd/containerd.sock \
        GPUWARDEN_K8S_NODE2_CDI_DIR=$S/node2/cdi \
        GPUWARDEN_K8S_NODE2_KUBELET_DIR=$S/node2/kubelet \
        GPUWARDEN_K8S_NODE2_POD_RESOURCES_SOCKET=$S/node2/kubelet/pod-resources/kubelet.sock \
        GPUWARDEN_K8S_NODE2_DEVICE_PLUGINS=$S/node2/device-plugins \
        setsid nsenter --net="/run/netns/$NS" "$@" <&0 9>&- &
    # In the background, so that a signal to this script ends the wait at
    # once; in a process group of its own (setsid), so that teardown stops
    # it and everything it started; without the lock's descriptor, so that
    # nothing it leaves behind holds the lock.
    CMD_GROUP=$!
    wait "$CMD_GROUP" || status=$?
    exit $status
}

main() {
    case "${1:-}" in
    build) build ;;
    run) shift; run "$@" ;;
    *) die "usage: cluster.sh build | run CMD..." ;;
    esac
}

# One line, so that bash has read the exit before main runs: a script
# edited while it runs must not go on with the new text.
main "$@"; exit
