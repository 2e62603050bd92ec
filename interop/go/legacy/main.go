// Interop client: an old release of the Go flagd provider
// (github.com/open-feature/go-sdk-contrib/providers/flagd v0.1.x), whose in-process resolver
// syncs over the legacy `sync.v1` protocol (flagd/core's gRPC sync client of that time) and
// so depends on the server marking full snapshots SYNC_STATE_ALL.
//
// The environment and the stdout protocol are those of ../stdio; provider events are logged
// on stderr as `interop-go-legacy: event <type>: <message>`.
package main

import (
	"context"
	"sync"

	"flagd-proxy/interop/go/stdio"

	"github.com/go-logr/logr/funcr"
	flagd "github.com/open-feature/go-sdk-contrib/providers/flagd/pkg"
	"github.com/open-feature/go-sdk/openfeature"
)

func main() {
	process := stdio.New("interop-go-legacy")
	env := process.ReadEnv()
	stdio.ExitAtEndOfStdin()

	options := []flagd.ProviderOption{
		flagd.WithInProcessResolver(),
		flagd.WithHost(env.Host),
		flagd.WithPort(env.Port),
		flagd.WithSelector(env.Selector),
		flagd.WithLogger(funcr.New(process.ProviderLog, funcr.Options{Verbosity: stdio.Verbosity()})),
	}
	if env.TLS {
		options = append(options, flagd.WithTLS(env.CertPath))
	}
	provider := flagd.NewProvider(options...)

	ready := make(chan struct{})
	var once sync.Once
	handler := func(eventType openfeature.EventType) openfeature.EventCallback {
		callback := func(details openfeature.EventDetails) {
			process.Logf("event %s: %s", eventType, details.Message)
			if eventType == openfeature.ProviderReady {
				once.Do(func() { close(ready) })
			}
		}
		return &callback
	}
	for _, eventType := range []openfeature.EventType{
		openfeature.ProviderReady,
		openfeature.ProviderError,
		openfeature.ProviderStale,
		openfeature.ProviderConfigChange,
	} {
		openfeature.AddHandler(eventType, handler(eventType))
	}

	// Initialisation runs in the background; PROVIDER_READY follows the first sync.
	if err := openfeature.SetProvider(provider); err != nil {
		process.Fail("setting the provider: %v", err)
	}
	<-ready
	process.Emit("READY")

	client := openfeature.NewClient("interop")
	process.Watch(env.FlagKey, func() (string, error) {
		return client.StringValue(context.Background(), env.FlagKey, stdio.DefaultValue, openfeature.EvaluationContext{})
	})
}
