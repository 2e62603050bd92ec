// Interop client: the published Go flagd provider
// (github.com/open-feature/go-sdk-contrib/providers/flagd), by default with the in-process
// resolver syncing from flagd-proxy over gRPC, or in RPC mode evaluating through a flagd.
//
// Environment: that of ./stdio, and
//
//	INTEROP_RESOLVER (in-process, the default, or rpc: flagd's evaluation API at
//	FLAGD_HOST:FLAGD_PORT; FLAGD_SOURCE_SELECTOR is not used),
//	INTEROP_TOKEN_PATH (in-process only: a file, e.g. a projected service-account token,
//	read again for every call and sent as `authorization: Bearer <token>`),
//	INTEROP_SOCKET_PATH (in-process only: a unix socket to sync from instead of
//	FLAGD_HOST:FLAGD_PORT. The provider's WithSocketPath serves its RPC resolver only, and
//	WithTargetUri takes envoy, dns, uds and xds targets only; the in-process sync reaches a
//	socket through WithGrpcDialOptionsOverride with a dialer that connects to it),
//	INTEROP_EVENTS (`1`: also print every provider event on stdout, see below, and set the
//	retry grace period (10 s) and the retry backoff's maximum (5,000 ms) explicitly: this
//	provider version defaults to 5 s and 12,000 ms, and has no stream deadline option).
//
// Stdout protocol: that of ./stdio (`READY`, then `VALUE <value>` on every change); with
// INTEROP_EVENTS=1, also `EVENT <READY|STALE|ERROR|CHANGED> <unix millis>` for every provider
// event as it is emitted. Provider events are logged on stderr as
// `interop-go: event <type>: <message>`.
package main

import (
	"context"
	"fmt"
	"net"
	"os"
	"strings"
	"sync"
	"time"

	"flagd-proxy/interop/go/stdio"

	"github.com/go-logr/logr/funcr"
	flagd "github.com/open-feature/go-sdk-contrib/providers/flagd/pkg"
	"github.com/open-feature/go-sdk/openfeature"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
)

// The names of provider events in `EVENT` lines.
var eventNames = map[openfeature.EventType]string{
	openfeature.ProviderReady:        "READY",
	openfeature.ProviderStale:        "STALE",
	openfeature.ProviderError:        "ERROR",
	openfeature.ProviderConfigChange: "CHANGED",
}

// fileToken sends the token in a file as a bearer token, reading the file for every call so
// that a rotated (projected) token is picked up.
type fileToken struct {
	path   string
	secure bool
}

func (t fileToken) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	token, err := os.ReadFile(t.path)
	if err != nil {
		return nil, fmt.Errorf("reading INTEROP_TOKEN_PATH: %w", err)
	}
	return map[string]string{"authorization": "Bearer " + strings.TrimSpace(string(token))}, nil
}

func (t fileToken) RequireTransportSecurity() bool { return t.secure }

func main() {
	process := stdio.New("interop-go")
	fail := process.Fail
	env := process.ReadEnv()
	resolver := os.Getenv("INTEROP_RESOLVER")
	tokenPath := os.Getenv("INTEROP_TOKEN_PATH")
	socketPath := os.Getenv("INTEROP_SOCKET_PATH")
	if resolver != "" && resolver != "in-process" && resolver != "rpc" {
		fail("INTEROP_RESOLVER is in-process or rpc, not %s", resolver)
	}
	if resolver == "rpc" && tokenPath != "" {
		fail("INTEROP_TOKEN_PATH is for the in-process resolver (flagd-proxy checks tokens; flagd does not)")
	}
	if resolver == "rpc" && socketPath != "" {
		fail("INTEROP_SOCKET_PATH is for the in-process resolver")
	}

	stdio.ExitAtEndOfStdin()

	options := []flagd.ProviderOption{
		flagd.WithHost(env.Host),
		flagd.WithPort(env.Port),
		flagd.WithLogger(funcr.New(process.ProviderLog, funcr.Options{Verbosity: stdio.Verbosity()})),
	}
	if resolver == "rpc" {
		options = append(options, flagd.WithRPCResolver())
	} else {
		options = append(options, flagd.WithInProcessResolver(), flagd.WithSelector(env.Selector))
	}
	events := os.Getenv("INTEROP_EVENTS") == "1"
	if events {
		options = append(options, flagd.WithRetryGracePeriod(10), flagd.WithRetryBackoffMaxMs(5000))
	}
	if env.TLS {
		options = append(options, flagd.WithTLS(env.CertPath))
	}
	if tokenPath != "" || socketPath != "" {
		// The override replaces the provider's own dial options (WithTLS included).
		transport := insecure.NewCredentials()
		if env.TLS {
			creds, err := credentials.NewClientTLSFromFile(env.CertPath, "")
			if err != nil {
				fail("loading FLAGD_SERVER_CERT_PATH: %v", err)
			}
			transport = creds
		}
		dialOptions := []grpc.DialOption{grpc.WithTransportCredentials(transport)}
		if tokenPath != "" {
			dialOptions = append(dialOptions, grpc.WithPerRPCCredentials(fileToken{path: tokenPath, secure: env.TLS}))
		}
		if socketPath != "" {
			// The target stays FLAGD_HOST:FLAGD_PORT (and the `:authority` with it); every
			// connection goes to the socket.
			dialOptions = append(dialOptions, grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) {
				var dialer net.Dialer
				return dialer.DialContext(ctx, "unix", socketPath)
			}))
		}
		options = append(options, flagd.WithGrpcDialOptionsOverride(dialOptions))
	}
	provider, err := flagd.NewProvider(options...)
	if err != nil {
		fail("creating the provider: %v", err)
	}

	ready := make(chan struct{})
	var once sync.Once
	markReady := func() { once.Do(func() { close(ready) }) }
	// Handlers are registered by pointer; keep one function per event type.
	handler := func(eventType openfeature.EventType) openfeature.EventCallback {
		callback := func(details openfeature.EventDetails) {
			process.Logf("event %s: %s", eventType, details.Message)
			if events {
				process.Emit(fmt.Sprintf("EVENT %s %d", eventNames[eventType], time.Now().UnixMilli()))
			}
			if eventType == openfeature.ProviderReady {
				markReady()
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

	// Initialisation may fail while the server is not up yet; the provider keeps
	// retrying and emits PROVIDER_READY once it has synced.
	if err := openfeature.SetProviderAndWait(provider); err != nil {
		process.Logf("initial connection failed, the provider keeps retrying: %v", err)
	} else {
		markReady()
	}
	<-ready
	process.Emit("READY")

	client := openfeature.NewDefaultClient()
	process.Watch(env.FlagKey, func() (string, error) {
		return client.StringValue(context.Background(), env.FlagKey, stdio.DefaultValue, openfeature.EvaluationContext{})
	})
}
