//! The configuration files of the cluster's components, and the CoreDNS manifests.

use std::path::Path;

use super::names::{CGROUP_ROOT, DNS_IP, NODE, NODE_IP, POD_CIDR, REGISTRY};

/// The bridge CNI network: pods get addresses of [`POD_CIDR`], nothing is masqueraded.
pub(super) fn cni(state: &Path) -> String {
    let ipam_dir = state.join("cni/ipam");
    format!(
        r#"{{"cniVersion": "0.4.0", "name": "flagd-proxy-cluster", "plugins": [
  {{"type": "bridge", "bridge": "cni0", "isGateway": true, "ipMasq": false, "hairpinMode": true,
   "ipam": {{"type": "host-local", "dataDir": "{ipam}", "ranges": [[{{"subnet": "{POD_CIDR}"}}]],
            "routes": [{{"dst": "0.0.0.0/0"}}]}}}},
  {{"type": "portmap", "capabilities": {{"portMappings": true}}}}]}}
"#,
        ipam = ipam_dir.display()
    )
}

/// containerd: its data under `state`, its runtime state (sockets, mounts, pod network
/// namespaces) under `run`.
pub(super) fn containerd(state: &Path, run: &Path, socket: &Path) -> String {
    let (state, run, socket) = (state.display(), run.display(), socket.display());
    format!(
        r#"version = 2
root = "{state}/containerd"
state = "{run}/containerd"
[grpc]
  address = "{socket}"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "localhost/pause:1"
  enable_selinux = false
  # The VM lacks CAP_SYS_RESOURCE: a negative oom_score_adj would be refused.
  restrict_oom_score_adj = true
  # Pod network namespaces are mounted under the state directory, not /run/netns, where other
  # programs' namespaces live: the teardown finds exactly the cluster's.
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
    conf_dir = "{state}/cni/net.d"
  [plugins."io.containerd.grpc.v1.cri".registry.mirrors."{REGISTRY}"]
    endpoint = ["http://{REGISTRY}"]
[plugins."io.containerd.internal.v1.opt"]
  path = "{state}/containerd/opt"
"#
    )
}

/// The kubelet: cgroupfs under [`CGROUP_ROOT`], serving on the node address with the cluster's
/// certificate, images never collected.
pub(super) fn kubelet(state: &Path, socket: &Path) -> String {
    let (state, socket) = (state.display(), socket.display());
    format!(
        r#"apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: {NODE_IP}
port: 10250
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: 10248
tlsCertFile: {state}/pki/kubelet.crt
tlsPrivateKeyFile: {state}/pki/kubelet.key
cgroupDriver: cgroupfs
cgroupRoot: /{CGROUP_ROOT}
containerRuntimeEndpoint: unix://{socket}
failSwapOn: false
failCgroupV1: false
cgroupsPerQOS: true
enforceNodeAllocatable: ["pods"]
authentication:
  anonymous: {{enabled: false}}
  webhook: {{enabled: true}}
  x509: {{clientCAFile: {state}/pki/ca.crt}}
authorization: {{mode: Webhook}}
clusterDomain: cluster.local
clusterDNS: ["{DNS_IP}"]
resolvConf: {state}/etc/resolv.conf
podLogsDir: {state}/pod-logs
serializeImagePulls: false
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
syncFrequency: 10s
fileCheckFrequency: 5s
evictionHard: {{memory.available: "100Mi", nodefs.available: "1%", imagefs.available: "1%", nodefs.inodesFree: "1%"}}
"#
    )
}

/// kube-proxy in iptables mode, for the node address only.
pub(super) fn kube_proxy(state: &Path) -> String {
    let state = state.display();
    format!(
        r#"apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
mode: iptables
clientConnection: {{kubeconfig: {state}/kube-proxy.kubeconfig}}
hostnameOverride: {NODE}
clusterCIDR: {POD_CIDR}
bindAddress: {NODE_IP}
healthzBindAddress: 127.0.0.1:10256
metricsBindAddress: 127.0.0.1:10249
nodePortAddresses: ["{NODE_IP}/32"]
conntrack: {{maxPerCore: 0, tcpEstablishedTimeout: 0s, tcpCloseWaitTimeout: 0s}}
"#
    )
}

/// Pods' resolver: the cluster's DNS Service.
pub(super) fn resolv_conf() -> String {
    format!("nameserver {DNS_IP}\n")
}

/// CoreDNS for Service names only (no `forward`: no query leaves the machine), as the
/// `kube-dns` Service at [`DNS_IP`].
pub(super) fn coredns() -> String {
    format!(
        r#"apiVersion: v1
kind: ServiceAccount
metadata: {{name: coredns, namespace: kube-system}}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {{name: "system:coredns"}}
rules:
- {{apiGroups: [""], resources: [endpoints, services, pods, namespaces], verbs: [list, watch]}}
- {{apiGroups: [discovery.k8s.io], resources: [endpointslices], verbs: [list, watch]}}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {{name: "system:coredns"}}
roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: "system:coredns"}}
subjects: [{{kind: ServiceAccount, name: coredns, namespace: kube-system}}]
---
apiVersion: v1
kind: ConfigMap
metadata: {{name: coredns, namespace: kube-system}}
data:
  Corefile: |
    .:53 {{
        errors
        health :8080
        ready :8181
        kubernetes cluster.local in-addr.arpa ip6.arpa {{
            pods insecure
        }}
        cache 5
    }}
---
apiVersion: apps/v1
kind: Deployment
metadata: {{name: coredns, namespace: kube-system, labels: {{k8s-app: kube-dns}}}}
spec:
  replicas: 1
  selector: {{matchLabels: {{k8s-app: kube-dns}}}}
  template:
    metadata: {{labels: {{k8s-app: kube-dns}}}}
    spec:
      serviceAccountName: coredns
      dnsPolicy: Default
      containers:
      - name: coredns
        image: localhost/coredns:1
        imagePullPolicy: Never
        args: ["-conf", "/etc/coredns/Corefile"]
        volumeMounts: [{{name: config, mountPath: /etc/coredns, readOnly: true}}]
        ports:
        - {{name: dns, containerPort: 53, protocol: UDP}}
        - {{name: dns-tcp, containerPort: 53, protocol: TCP}}
        readinessProbe: {{httpGet: {{path: /ready, port: 8181}}, periodSeconds: 2}}
        livenessProbe: {{httpGet: {{path: /health, port: 8080}}, periodSeconds: 10}}
      volumes:
      - name: config
        configMap: {{name: coredns}}
---
apiVersion: v1
kind: Service
metadata: {{name: kube-dns, namespace: kube-system, labels: {{k8s-app: kube-dns}}}}
spec:
  clusterIP: {DNS_IP}
  selector: {{k8s-app: kube-dns}}
  ports:
  - {{name: dns, port: 53, protocol: UDP}}
  - {{name: dns-tcp, port: 53, protocol: TCP}}
"#
    )
}
