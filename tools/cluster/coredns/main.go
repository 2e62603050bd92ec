// Command coredns is a CoreDNS build for the test cluster's kube-dns Service: it answers for
// cluster.local from the Kubernetes API and nothing else. It has no `forward` plugin, so no query
// ever leaves the cluster's network namespace.
package main

import (
	"github.com/coredns/coredns/core/dnsserver"
	"github.com/coredns/coredns/coremain"

	_ "github.com/coredns/coredns/plugin/cache"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/health"
	_ "github.com/coredns/coredns/plugin/kubernetes"
	_ "github.com/coredns/coredns/plugin/ready"
)

func init() {
	// The order plugins run in; it follows CoreDNS's own plugin.cfg.
	dnsserver.Directives = []string{"ready", "health", "errors", "cache", "kubernetes"}
}

func main() { coremain.Run() }
