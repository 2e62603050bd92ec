#!/usr/bin/env bash
# A real single-node Kubernetes cluster on this machine, entirely inside a network namespace of its
# own: etcd, kube-apiserver, kube-controller-manager, kube-scheduler, containerd + runc, kubelet, a
# CNI bridge, kube-proxy (iptables), CoreDNS and an in-memory image registry (crane). No address the
# cluster uses exists outside that namespace; its iptables rules and ip_forward live in it. Needs
# root, the binaries of scripts/build-control-plane.sh and scripts/build-cluster-tools.sh, and the
# Debian packages containerd, runc, containernetworking-plugins, iptables, conntrack, busybox-static.
#
#   scripts/cluster.sh up             start it (cleaning up whatever an earlier run left first)
#   scripts/cluster.sh down           stop everything and remove all its state
#                                     (`up` and `run` hold the machine-wide lock
#                                     /run/flagd-proxy-cluster.lock until the cluster is down:
#                                     a second cluster waits for the first to finish)
#   scripts/cluster.sh run            up, print "READY <dir>", wait for EOF on stdin, down
#                                     (the test harness, testkit/src/cluster.rs, uses this)
#   scripts/cluster.sh restart-apiserver   stop the API server and start it again
#   scripts/cluster.sh kubectl ARGS   kubectl as cluster admin, from inside the namespace
#   scripts/cluster.sh exec CMD ARGS  any command inside the namespace (curl to a pod IP, ...)
#   scripts/cluster.sh load TAR       import an OCI image archive into the node's containerd
#   scripts/cluster.sh tag SRC DST    give an image in the node's containerd another name
#   scripts/cluster.sh push TAR REF   push an OCI image archive to the registry (REF: name:tag;
#                                     pods pull it as 10.99.0.1:5000/name:tag)
#
# State: $FLAGD_PROXY_CLUSTER_DIR (default /var/lib/flagd-proxy-cluster): PKI, kubeconfigs
# (admin.kubeconfig), logs/, etcd, containerd and kubelet data. Network namespace:
# flagd-proxy-cluster; node IP 10.99.0.1, pods 10.88.0.0/16, Services 10.96.0.0/16, DNS 10.96.0.10.
set -euo pipefail

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cache_dir="${FLAGD_PROXY_CACHE:-$HOME/.cache/flagd-proxy}"
bin="${FLAGD_PROXY_KUBE_BIN_DIR:-$cache_dir/bin}"
D="${FLAGD_PROXY_CLUSTER_DIR:-/var/lib/flagd-proxy-cluster}"
R=/run/flagd-proxy-cluster
NS=flagd-proxy-cluster
NODE=node1
NODE_IP=10.99.0.1
POD_CIDR=10.88.0.0/16
SVC_CIDR=10.96.0.0/16
DNS_IP=10.96.0.10
REGISTRY="$NODE_IP:5000"
LOCK=/run/flagd-proxy-cluster.lock
# The process that holds $LOCK for a cluster started by `up` (it outlives this script).
LOCK_HOLDER=/run/flagd-proxy-cluster.lock-holder
SOCK="$R/containerd/containerd.sock"
# kubelet's cgroup root: every pod and container of the cluster lives under it, in every cgroup
# hierarchy, and nothing else does (the machine's own pods, if it is a node, are elsewhere).
CGROUP_ROOT=flagd-proxy-cluster

log() { printf '[cluster %s] %s\n' "$(date +%T)" "$*" >&2; }
die() { log "error: $*"; exit 1; }
in_ns() { nsenter --net="/run/netns/$NS" "$@"; }
kc() { in_ns "$bin/kubectl" --kubeconfig "$D/admin.kubeconfig" "$@"; }
ctr_() { in_ns ctr --address "$SOCK" -n k8s.io "$@"; }

# wait_for SECONDS WHAT CMD...: runs CMD every half second until it succeeds.
wait_for() {
  local secs="$1" what="$2"
  shift 2
  local deadline=$((SECONDS + secs))
  until "$@" >/dev/null 2>&1; do
    if ((SECONDS >= deadline)); then
      log "timed out after ${secs}s waiting for $what"
      return 1
    fi
    sleep 0.5
  done
}

preflight() {
  [[ "$(id -u)" == 0 ]] || die "must run as root (it creates a network namespace, mounts and cgroups)"
  local missing=()
  for cmd in containerd containerd-shim-runc-v2 runc ctr iptables conntrack nsenter openssl /bin/busybox; do
    command -v "$cmd" >/dev/null 2>&1 || missing+=("$cmd")
  done
  [[ -x /usr/lib/cni/bridge && -x /usr/lib/cni/host-local && -x /usr/lib/cni/loopback ]] || missing+=("/usr/lib/cni/{bridge,host-local,loopback}")
  for b in etcd kube-apiserver kube-controller-manager kube-scheduler kubelet kube-proxy kubectl coredns; do
    [[ -x "$bin/$b" ]] || missing+=("$bin/$b")
  done
  [[ -e /proc/sys/net/bridge/bridge-nf-call-iptables ]] || missing+=("kernel module br_netfilter")
  [[ -d /sys/fs/cgroup/memory || -f /sys/fs/cgroup/cgroup.controllers ]] || missing+=("cgroup memory controller")
  if ((${#missing[@]})); then
    die "missing: ${missing[*]} (scripts/build-control-plane.sh, scripts/build-cluster-tools.sh)"
  fi
}

# ---------------------------------------------------------------------------------------------
# teardown: idempotent, safe to run when nothing (or half of it) is there.
#
# It touches only what the cluster made: the processes in its network namespace, the processes in
# its own cgroup root ($CGROUP_ROOT, in each hierarchy), the mounts under its own directories ($D,
# $R: pod network namespaces are mounted under $R too) and its namespace $NS. Nothing is found by
# a name pattern another program could share (kubepods, cni-*).
down() {
  if [[ -e "/run/netns/$NS" ]]; then
    # Every process in the namespace was started by this script (or by containerd for it).
    local pids
    pids="$(ip netns pids "$NS" 2>/dev/null || true)"
    [[ -n "$pids" ]] && kill -TERM $pids 2>/dev/null || true
  fi
  # Container processes live in pod namespaces; the cluster's cgroup root holds exactly them.
  kill_cgroup_procs KILL
  local deadline=$((SECONDS + 10))
  while ((SECONDS < deadline)); do
    local left=""
    [[ -e "/run/netns/$NS" ]] && left="$(ip netns pids "$NS" 2>/dev/null || true)"
    [[ -z "$left" ]] && break
    sleep 0.5
  done
  if [[ -e "/run/netns/$NS" ]]; then
    pids="$(ip netns pids "$NS" 2>/dev/null || true)"
    [[ -n "$pids" ]] && kill -KILL $pids 2>/dev/null || true
  fi
  kill_cgroup_procs KILL
  # Mounts of kubelet volumes, container root filesystems and pod network namespaces (containerd
  # mounts those under its state directory, in $R), deepest first.
  local m
  for _ in 1 2 3; do
    for m in $(awk -v d="$D" -v r="$R" 'index($2, d) == 1 || index($2, r) == 1 { print $2 }' /proc/mounts | sort -r); do
      umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || true
    done
  done
  if [[ -e "/run/netns/$NS" ]]; then
    ip netns del "$NS" 2>/dev/null || true
  fi
  # The cluster's cgroups, deepest first.
  local h
  for h in $(cgroup_roots); do
    [[ -d "$h" ]] && find "$h" -depth -type d -exec rmdir {} \; 2>/dev/null || true
  done
  # Kernel settings kubelet changes machine-wide, back to what they were before `up`.
  if [[ -f "$D/sysctl.saved" ]]; then
    sysctl -q -p "$D/sysctl.saved" >/dev/null 2>&1 || true
  fi
  # The logs of the last cluster stay for a post-mortem.
  if [[ -d "$D/logs" ]]; then
    rm -rf "$D.logs"
    mv "$D/logs" "$D.logs"
  fi
  rm -rf "$D" "$R"
}

# The cluster's cgroup root in each mounted cgroup hierarchy (v1: one per controller; v2: one).
cgroup_roots() {
  awk -v root="$CGROUP_ROOT" '$3 == "cgroup" || $3 == "cgroup2" { print $2 "/" root }' /proc/mounts | sort -u
}

# Creates the cluster's cgroup root in every hierarchy (kubelet requires it to exist).
make_cgroup_roots() {
  local h parent
  for h in $(cgroup_roots); do
    mkdir -p "$h"
    parent="$(dirname "$h")"
    # A v1 cpuset cgroup takes no process until it has CPUs and memory nodes of its own.
    if [[ -f "$h/cpuset.cpus" && -z "$(cat "$h/cpuset.cpus")" ]]; then
      cat "$parent/cpuset.cpus" >"$h/cpuset.cpus"
      cat "$parent/cpuset.mems" >"$h/cpuset.mems"
    fi
  done
}

kill_cgroup_procs() {
  local sig="$1" h
  for h in $(cgroup_roots); do
    [[ -d "$h" ]] || continue
    # Cgroups go away while they are read (their processes die): `find` then fails, which under
    # `set -e` and `pipefail` would end the whole teardown here.
    { find "$h" -name cgroup.procs -exec cat {} + 2>/dev/null || true; } | sort -u | while read -r pid; do
      kill "-$sig" "$pid" 2>/dev/null || true
    done
  done
}

# ---------------------------------------------------------------------------------------------
pki() {
  local p="$D/pki"
  mkdir -p "$p"
  (
    cd "$p"
    openssl ecparam -name prime256v1 -genkey -noout -out ca.key 2>/dev/null
    openssl req -x509 -new -key ca.key -subj "/CN=flagd-proxy-cluster-ca" -days 30 -out ca.crt 2>/dev/null
    # cert NAME CN O EKU [SANS]
    cert() {
      local name="$1" cn="$2" o="$3" eku="$4" sans="${5:-}"
      openssl ecparam -name prime256v1 -genkey -noout -out "$name.key" 2>/dev/null
      local subj="/CN=$cn"
      [[ -n "$o" ]] && subj="/O=$o/CN=$cn"
      {
        echo "basicConstraints=CA:FALSE"
        echo "keyUsage=critical,digitalSignature,keyEncipherment"
        echo "extendedKeyUsage=$eku"
        [[ -n "$sans" ]] && echo "subjectAltName=$sans"
      } >"$name.ext"
      openssl req -new -key "$name.key" -subj "$subj" 2>/dev/null |
        openssl x509 -req -CA ca.crt -CAkey ca.key -CAcreateserial -days 30 -extfile "$name.ext" -out "$name.crt" 2>/dev/null
    }
    cert apiserver kube-apiserver "" serverAuth \
      "DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local,DNS:localhost,IP:127.0.0.1,IP:$NODE_IP,IP:10.96.0.1"
    cert kubelet "system:node:$NODE" system:nodes serverAuth,clientAuth "DNS:$NODE,IP:$NODE_IP"
    cert apiserver-kubelet-client kube-apiserver-kubelet-client system:masters clientAuth
    cert admin cluster-admin system:masters clientAuth
    cert controller-manager system:kube-controller-manager "" clientAuth
    cert scheduler system:kube-scheduler "" clientAuth
    cert kube-proxy system:kube-proxy "" clientAuth
    openssl ecparam -name prime256v1 -genkey -noout -out sa.key 2>/dev/null
    openssl ec -in sa.key -pubout -out sa.pub 2>/dev/null
  )
  local name
  for name in admin kubelet controller-manager scheduler kube-proxy; do
    cat >"$D/$name.kubeconfig" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: cluster
  cluster: {certificate-authority: $p/ca.crt, server: "https://$NODE_IP:6443"}
users:
- name: $name
  user: {client-certificate: $p/$name.crt, client-key: $p/$name.key}
contexts:
- name: default
  context: {cluster: cluster, user: $name}
current-context: default
EOF
  done
}

network() {
  ip netns add "$NS"
  ip -n "$NS" link set lo up
  ip -n "$NS" link add kn0 type veth peer name kn1
  ip -n "$NS" link set kn0 up
  ip -n "$NS" link set kn1 up
  ip -n "$NS" addr add "$NODE_IP/24" dev kn0
  # Traffic to a Service address from the node itself needs a route before kube-proxy's DNAT.
  ip -n "$NS" route add "$SVC_CIDR" dev kn0
  in_ns sysctl -qw net.ipv4.ip_forward=1 net.bridge.bridge-nf-call-iptables=1
}

configs() {
  mkdir -p "$D/etc" "$D/cni/net.d" "$D/logs" "$R"
  cat >"$D/cni/net.d/10-bridge.conflist" <<EOF
{"cniVersion": "0.4.0", "name": "flagd-proxy-cluster", "plugins": [
  {"type": "bridge", "bridge": "cni0", "isGateway": true, "ipMasq": false, "hairpinMode": true,
   "ipam": {"type": "host-local", "dataDir": "$D/cni/ipam", "ranges": [[{"subnet": "$POD_CIDR"}]],
            "routes": [{"dst": "0.0.0.0/0"}]}},
  {"type": "portmap", "capabilities": {"portMappings": true}}]}
EOF
  cat >"$D/etc/containerd.toml" <<EOF
version = 2
root = "$D/containerd"
state = "$R/containerd"
[grpc]
  address = "$SOCK"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "localhost/pause:1"
  enable_selinux = false
  # The VM lacks CAP_SYS_RESOURCE: a negative oom_score_adj would be refused.
  restrict_oom_score_adj = true
  # Pod network namespaces are mounted under the state directory ($R), not /run/netns, where
  # other programs' namespaces live: the teardown finds exactly the cluster's.
  netns_mounts_under_state_dir = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "$D/cni/net.d"
  [plugins."io.containerd.grpc.v1.cri".registry.mirrors."$REGISTRY"]
    endpoint = ["http://$REGISTRY"]
[plugins."io.containerd.internal.v1.opt"]
  path = "$D/containerd/opt"
EOF
  printf 'nameserver %s\n' "$DNS_IP" >"$D/etc/resolv.conf"
  cat >"$D/etc/kubelet.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: $NODE_IP
port: 10250
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: 10248
tlsCertFile: $D/pki/kubelet.crt
tlsPrivateKeyFile: $D/pki/kubelet.key
cgroupDriver: cgroupfs
cgroupRoot: /$CGROUP_ROOT
containerRuntimeEndpoint: unix://$SOCK
failSwapOn: false
failCgroupV1: false
cgroupsPerQOS: true
enforceNodeAllocatable: ["pods"]
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: $D/pki/ca.crt}
authorization: {mode: Webhook}
clusterDomain: cluster.local
clusterDNS: ["$DNS_IP"]
resolvConf: $D/etc/resolv.conf
podLogsDir: $D/pod-logs
serializeImagePulls: false
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
syncFrequency: 10s
fileCheckFrequency: 5s
evictionHard: {memory.available: "100Mi", nodefs.available: "1%", imagefs.available: "1%", nodefs.inodesFree: "1%"}
EOF
  cat >"$D/etc/kube-proxy.yaml" <<EOF
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
mode: iptables
clientConnection: {kubeconfig: $D/kube-proxy.kubeconfig}
hostnameOverride: $NODE
clusterCIDR: $POD_CIDR
bindAddress: $NODE_IP
healthzBindAddress: 127.0.0.1:10256
metricsBindAddress: 127.0.0.1:10249
nodePortAddresses: ["$NODE_IP/32"]
conntrack: {maxPerCore: 0, tcpEstablishedTimeout: 0s, tcpCloseWaitTimeout: 0s}
EOF
}

# start NAME CMD...: runs CMD inside the namespace in the background, logging to logs/NAME.log.
start() {
  local name="$1"
  shift
  # Components do not inherit the lock (fd 8): a component left by a killed run must not keep it.
  setsid nsenter --net="/run/netns/$NS" "$@" >>"$D/logs/$name.log" 2>&1 </dev/null 8>&- &
  echo $! >"$D/$name.pid"
}

alive() { kill -0 "$(cat "$D/$1.pid")" 2>/dev/null; }

# Ensures component NAME is still running; else shows its log and fails.
check_alive() {
  alive "$1" && return 0
  log "$1 exited; the end of its log:"
  tail -n 30 "$D/logs/$1.log" >&2
  return 1
}

images() {
  local dir="$D/images"
  mkdir -p "$dir"
  mkdir -p "$dir/pause-rootfs"
  install -m 0755 /bin/busybox "$dir/pause-rootfs/busybox"
  "$repo_root/scripts/oci-archive.sh" "$dir/pause-rootfs" "$dir/pause.tar" localhost/pause:1 \
    '["/busybox","sleep","2147483647"]' >/dev/null
  "$repo_root/scripts/image-rootfs.sh" "$(readlink -f "$bin/coredns")" "$dir/coredns-rootfs"
  "$repo_root/scripts/oci-archive.sh" "$dir/coredns-rootfs" "$dir/coredns.tar" localhost/coredns:1 \
    '["/coredns"]' >/dev/null
  ctr_ images import "$dir/pause.tar" >/dev/null
  ctr_ images import "$dir/coredns.tar" >/dev/null
  rm -rf "$dir"
}

coredns() {
  kc apply -f - >/dev/null <<EOF
apiVersion: v1
kind: ServiceAccount
metadata: {name: coredns, namespace: kube-system}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: "system:coredns"}
rules:
- {apiGroups: [""], resources: [endpoints, services, pods, namespaces], verbs: [list, watch]}
- {apiGroups: [discovery.k8s.io], resources: [endpointslices], verbs: [list, watch]}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: "system:coredns"}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: "system:coredns"}
subjects: [{kind: ServiceAccount, name: coredns, namespace: kube-system}]
---
apiVersion: v1
kind: ConfigMap
metadata: {name: coredns, namespace: kube-system}
data:
  Corefile: |
    .:53 {
        errors
        health :8080
        ready :8181
        kubernetes cluster.local in-addr.arpa ip6.arpa {
            pods insecure
        }
        cache 5
    }
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: coredns, namespace: kube-system, labels: {k8s-app: kube-dns}}
spec:
  replicas: 1
  selector: {matchLabels: {k8s-app: kube-dns}}
  template:
    metadata: {labels: {k8s-app: kube-dns}}
    spec:
      serviceAccountName: coredns
      dnsPolicy: Default
      containers:
      - name: coredns
        image: localhost/coredns:1
        imagePullPolicy: Never
        args: ["-conf", "/etc/coredns/Corefile"]
        volumeMounts: [{name: config, mountPath: /etc/coredns, readOnly: true}]
        ports:
        - {name: dns, containerPort: 53, protocol: UDP}
        - {name: dns-tcp, containerPort: 53, protocol: TCP}
        readinessProbe: {httpGet: {path: /ready, port: 8181}, periodSeconds: 2}
        livenessProbe: {httpGet: {path: /health, port: 8080}, periodSeconds: 10}
      volumes:
      - name: config
        configMap: {name: coredns}
---
apiVersion: v1
kind: Service
metadata: {name: kube-dns, namespace: kube-system, labels: {k8s-app: kube-dns}}
spec:
  clusterIP: $DNS_IP
  selector: {k8s-app: kube-dns}
  ports:
  - {name: dns, port: 53, protocol: UDP}
  - {name: dns-tcp, port: 53, protocol: TCP}
EOF
}

start_apiserver() {
  local p="$D/pki"
  start kube-apiserver "$bin/kube-apiserver" --etcd-servers=http://127.0.0.1:2379 \
    --bind-address=0.0.0.0 --advertise-address="$NODE_IP" --secure-port=6443 \
    --tls-cert-file="$p/apiserver.crt" --tls-private-key-file="$p/apiserver.key" --client-ca-file="$p/ca.crt" \
    --service-account-key-file="$p/sa.pub" --service-account-signing-key-file="$p/sa.key" \
    --service-account-issuer=https://kubernetes.default.svc.cluster.local \
    --authorization-mode=Node,RBAC --allow-privileged=true --service-cluster-ip-range="$SVC_CIDR" \
    --kubelet-client-certificate="$p/apiserver-kubelet-client.crt" --kubelet-client-key="$p/apiserver-kubelet-client.key" \
    --kubelet-certificate-authority="$p/ca.crt" --kubelet-preferred-address-types=InternalIP \
    --enable-admission-plugins=NodeRestriction --profiling=false
}

# Takes the machine-wide cluster lock on fd 8, waiting for as long as another cluster lives
# (one cluster per machine: a CI run or a test elsewhere on this machine takes the same lock).
# Prints "LOCKED" on stdout once held (tests/support/cluster.rs reads it).
lock() {
  exec 8>"$LOCK"
  if ! flock -n 8; then
    log "waiting for another cluster on this machine to finish ($LOCK)"
    echo "WAITING"
    flock 8
  fi
  echo "LOCKED"
}

# Ends the process that holds the lock for a cluster started by `up`, if there is one.
release_up_lock() {
  if [[ -f "$LOCK_HOLDER" ]]; then
    kill "$(cat "$LOCK_HOLDER")" 2>/dev/null || true
    rm -f "$LOCK_HOLDER"
  fi
}

up() {
  preflight
  local t0=$SECONDS
  down
  mkdir -p "$D" "$R"
  # kubelet sets these machine-wide kernel settings; `down` puts them back.
  sysctl vm.overcommit_memory kernel.panic kernel.panic_on_oops 2>/dev/null | sed 's/ //g' >"$D/sysctl.saved"
  pki
  network
  configs
  log "network namespace $NS, node $NODE_IP"

  start containerd containerd --config "$D/etc/containerd.toml"
  wait_for 30 containerd ctr_ version || { check_alive containerd; return 1; }
  images

  start etcd "$bin/etcd" --name node --data-dir "$D/etcd" \
    --listen-client-urls http://127.0.0.1:2379 --advertise-client-urls http://127.0.0.1:2379 \
    --listen-peer-urls http://127.0.0.1:2380 --initial-advertise-peer-urls http://127.0.0.1:2380 \
    --initial-cluster node=http://127.0.0.1:2380 --listen-metrics-urls http://127.0.0.1:2381 \
    --unsafe-no-fsync
  local p="$D/pki"
  start_apiserver
  wait_for 120 "the API server" kc get --raw /readyz || { check_alive etcd; check_alive kube-apiserver; return 1; }
  log "API server ready (+$((SECONDS - t0))s)"

  start kube-controller-manager "$bin/kube-controller-manager" --kubeconfig="$D/controller-manager.kubeconfig" \
    --authentication-kubeconfig="$D/controller-manager.kubeconfig" --authorization-kubeconfig="$D/controller-manager.kubeconfig" \
    --bind-address=127.0.0.1 --leader-elect=false --service-account-private-key-file="$p/sa.key" \
    --root-ca-file="$p/ca.crt" --use-service-account-credentials=true \
    --cluster-signing-cert-file="$p/ca.crt" --cluster-signing-key-file="$p/ca.key" \
    --service-cluster-ip-range="$SVC_CIDR" --allocate-node-cidrs=false --controllers='*,-nodeipam'
  start kube-scheduler "$bin/kube-scheduler" --kubeconfig="$D/scheduler.kubeconfig" \
    --authentication-kubeconfig="$D/scheduler.kubeconfig" --authorization-kubeconfig="$D/scheduler.kubeconfig" \
    --bind-address=127.0.0.1 --leader-elect=false
  make_cgroup_roots
  start kubelet "$bin/kubelet" --config="$D/etc/kubelet.yaml" --kubeconfig="$D/kubelet.kubeconfig" \
    --root-dir="$D/kubelet" --hostname-override="$NODE" --node-ip="$NODE_IP"
  start kube-proxy "$bin/kube-proxy" --config="$D/etc/kube-proxy.yaml"
  if [[ -x "$bin/crane" ]]; then
    start registry "$bin/crane" registry serve --address "$REGISTRY"
  fi

  wait_for 120 "node $NODE Ready" kc wait --for=condition=Ready "node/$NODE" --timeout=2s ||
    { check_alive kubelet; return 1; }
  log "node Ready (+$((SECONDS - t0))s)"
  wait_for 60 "the default service account" kc get serviceaccount default
  coredns
  wait_for 120 "CoreDNS" kc -n kube-system rollout status deploy/coredns --timeout=2s ||
    { kc -n kube-system get pods -o wide >&2; return 1; }
  log "cluster up in $((SECONDS - t0))s; KUBECONFIG=$D/admin.kubeconfig inside netns $NS"
}

case "${1:-}" in
  up)
    # A cluster an earlier `up` left is replaced: its lock goes with it.
    release_up_lock
    lock >/dev/null
    if ! up; then
      down
      exit 1
    fi
    # Holds the lock (fd 8, inherited) until `down`.
    setsid sleep infinity </dev/null >/dev/null 2>&1 &
    echo $! >"$LOCK_HOLDER"
    ;;
  down)
    down
    release_up_lock
    log "down"
    ;;
  run)
    lock
    if ! up; then
      down
      exit 1
    fi
    echo "READY $D"
    # Nothing more for the caller, who stops reading when it exits: whatever the teardown prints
    # goes to the log, and neither a closed pipe nor a signal from the caller's end stops it.
    exec >&2
    trap '' HUP INT TERM PIPE
    # Held open by the caller; EOF (the caller exited, however it exited) means tear down.
    cat >/dev/null || true
    log "tearing down"
    down
    log "down"
    ;;
  restart-apiserver)
    pid="$(cat "$D/kube-apiserver.pid")"
    # Stopped means gone or a zombie (its parent, the `run` process, does not reap it). A graceful
    # stop waits up to a minute for long-running requests: after 10 s it is killed.
    stopped() { [[ ! -e /proc/$1 ]] || grep -q '^State:.*Z' "/proc/$1/status"; }
    kill "$pid" 2>/dev/null || true
    for _ in $(seq 20); do stopped "$pid" && break; sleep 0.5; done
    stopped "$pid" || kill -KILL "$pid"
    for _ in $(seq 20); do stopped "$pid" && break; sleep 0.5; done
    start_apiserver
    wait_for 120 "the API server" kc get --raw /readyz || { check_alive kube-apiserver; exit 1; }
    log "API server restarted"
    ;;
  kubectl)
    shift
    kc "$@"
    ;;
  exec)
    shift
    in_ns "$@"
    ;;
  load)
    ctr_ images import "${2:?usage: $0 load TAR}" >/dev/null
    ;;
  tag)
    ctr_ images tag --force "${2:?usage: $0 tag SRC DST}" "${3:?missing DST}" >/dev/null
    ;;
  push)
    layout="$(mktemp -d)"
    trap 'rm -rf "$layout"' EXIT
    tar -C "$layout" -xf "${2:?usage: $0 push TAR REF}"
    in_ns "$bin/crane" push --insecure "$layout" "$REGISTRY/${3:?missing REF}" >&2
    ;;
  *)
    sed -n '2,26p' "$0" >&2
    exit 2
    ;;
esac
