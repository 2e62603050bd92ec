// Interop client: the published Go flagd provider
// (github.com/open-feature/go-sdk-contrib/providers/flagd), by default with the in-process
// resolver syncing from flagd-proxy over gRPC, or in RPC mode evaluating through a flagd.
//
// Environment:
//
//	FLAGD_HOST, FLAGD_PORT, FLAGD_SOURCE_SELECTOR, FLAGD_TLS (true/false),
//	FLAGD_SERVER_CERT_PATH (CA file, TLS only), INTEROP_FLAG_KEY (a string flag),
//	INTEROP_DEBUG (any value: provider debug logging on stderr),
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
// Stdout protocol: `READY` once the provider is ready, then `VALUE <value>` each time
// the evaluated value differs from the last printed one; with INTEROP_EVENTS=1, also
// `EVENT <READY|STALE|ERROR|CHANGED> <unix millis>` for every provider event as it is
// emitted. Provider events are logged on stderr as `interop-go: event <type>: <message>`.
// The process exits when stdin reaches EOF.
package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"
	flagd "github.com/open-feature/go-sdk-contrib/providers/flagd/pkg"
	"github.com/open-feature/go-sdk/openfeature"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
)

const (
	defaultValue = "<default>"
	pollInterval = 100 * time.Millisecond
)

// The names of provider events in `EVENT` lines.
var eventNames = map[openfeature.EventType]string{
	openfeature.ProviderReady:        "READY",
	openfeature.ProviderStale:        "STALE",
	openfeature.ProviderError:        "ERROR",
	openfeature.ProviderConfigChange: "CHANGED",
}

var stdout = bufio.NewWriter(os.Stdout)
var stdoutMu sync.Mutex

func fail(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "interop-go: "+format+"\n", args...)
	os.Exit(2)
}

func required(name string) string {
	value := os.Getenv(name)
	if value == "" {
		fail("environment variable %s is required", name)
	}
	return value
}

func emit(line string) {
	stdoutMu.Lock()
	defer stdoutMu.Unlock()
	if _, err := stdout.WriteString(line + "\n"); err != nil {
		os.Exit(0)
	}
	if err := stdout.Flush(); err != nil {
		os.Exit(0)
	}
}

func logger() logr.Logger {
	verbosity := 0
	if os.Getenv("INTEROP_DEBUG") != "" {
		verbosity = 10
	}
	return funcr.New(func(prefix, args string) {
		fmt.Fprintf(os.Stderr, "interop-go [provider] %s %s\n", prefix, args)
	}, funcr.Options{Verbosity: verbosity})
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
	host := required("FLAGD_HOST")
	portText := required("FLAGD_PORT")
	port, err := strconv.ParseUint(portText, 10, 16)
	if err != nil || port == 0 {
		fail("FLAGD_PORT is not a port: %s", portText)
	}
	selector := os.Getenv("FLAGD_SOURCE_SELECTOR")
	tls := strings.EqualFold(strings.TrimSpace(os.Getenv("FLAGD_TLS")), "true")
	certPath := os.Getenv("FLAGD_SERVER_CERT_PATH")
	flagKey := required("INTEROP_FLAG_KEY")
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

	// The provider falls back to insecure credentials when it cannot load the CA file;
	// refuse that here so a wrong path is not mistaken for a server problem.
	if tls && certPath != "" {
		if _, err := os.Stat(certPath); err != nil {
			fail("FLAGD_SERVER_CERT_PATH does not exist: %s", certPath)
		}
	}

	// Exit as soon as stdin reaches EOF, so a parent that goes away takes us down.
	go func() {
		_, _ = io.Copy(io.Discard, os.Stdin)
		os.Exit(0)
	}()

	options := []flagd.ProviderOption{
		flagd.WithHost(host),
		flagd.WithPort(uint16(port)),
		flagd.WithLogger(logger()),
	}
	if resolver == "rpc" {
		options = append(options, flagd.WithRPCResolver())
	} else {
		options = append(options, flagd.WithInProcessResolver(), flagd.WithSelector(selector))
	}
	events := os.Getenv("INTEROP_EVENTS") == "1"
	if events {
		options = append(options, flagd.WithRetryGracePeriod(10), flagd.WithRetryBackoffMaxMs(5000))
	}
	if tls {
		options = append(options, flagd.WithTLS(certPath))
	}
	if tokenPath != "" || socketPath != "" {
		// The override replaces the provider's own dial options (WithTLS included).
		transport := insecure.NewCredentials()
		if tls {
			creds, err := credentials.NewClientTLSFromFile(certPath, "")
			if err != nil {
				fail("loading FLAGD_SERVER_CERT_PATH: %v", err)
			}
			transport = creds
		}
		dialOptions := []grpc.DialOption{grpc.WithTransportCredentials(transport)}
		if tokenPath != "" {
			dialOptions = append(dialOptions, grpc.WithPerRPCCredentials(fileToken{path: tokenPath, secure: tls}))
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
			fmt.Fprintf(os.Stderr, "interop-go: event %s: %s\n", eventType, details.Message)
			if events {
				emit(fmt.Sprintf("EVENT %s %d", eventNames[eventType], time.Now().UnixMilli()))
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
		fmt.Fprintf(os.Stderr, "interop-go: initial connection failed, the provider keeps retrying: %v\n", err)
	} else {
		markReady()
	}
	<-ready
	emit("READY")

	client := openfeature.NewDefaultClient()
	last := ""
	printed := false
	lastError := ""
	for {
		value, err := client.StringValue(context.Background(), flagKey, defaultValue, openfeature.EvaluationContext{})
		if err != nil {
			if text := err.Error(); text != lastError {
				fmt.Fprintf(os.Stderr, "interop-go: evaluation of %s failed: %s\n", flagKey, text)
				lastError = text
			}
		} else {
			lastError = ""
		}
		if !printed || value != last {
			emit("VALUE " + value)
			last = value
			printed = true
		}
		time.Sleep(pollInterval)
	}
}
