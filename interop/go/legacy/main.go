// Interop client: an old release of the Go flagd provider
// (github.com/open-feature/go-sdk-contrib/providers/flagd v0.1.x), whose in-process resolver
// syncs over the legacy `sync.v1` protocol (flagd/core's gRPC sync client of that time) and
// so depends on the server marking full snapshots SYNC_STATE_ALL.
//
// Same environment and stdout protocol as ../main.go: `READY`, then `VALUE <value>` on every
// change; provider events on stderr as `interop-go-legacy: event <type>: <message>`; exits
// when stdin reaches EOF.
package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr/funcr"
	flagd "github.com/open-feature/go-sdk-contrib/providers/flagd/pkg"
	"github.com/open-feature/go-sdk/openfeature"
)

const (
	defaultValue = "<default>"
	pollInterval = 100 * time.Millisecond
)

var stdout = bufio.NewWriter(os.Stdout)

func fail(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "interop-go-legacy: "+format+"\n", args...)
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
	if _, err := stdout.WriteString(line + "\n"); err != nil {
		os.Exit(0)
	}
	if err := stdout.Flush(); err != nil {
		os.Exit(0)
	}
}

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
	if tls && certPath != "" {
		if _, err := os.Stat(certPath); err != nil {
			fail("FLAGD_SERVER_CERT_PATH does not exist: %s", certPath)
		}
	}

	go func() {
		_, _ = io.Copy(io.Discard, os.Stdin)
		os.Exit(0)
	}()

	verbosity := 0
	if os.Getenv("INTEROP_DEBUG") != "" {
		verbosity = 10
	}
	options := []flagd.ProviderOption{
		flagd.WithInProcessResolver(),
		flagd.WithHost(host),
		flagd.WithPort(uint16(port)),
		flagd.WithSelector(selector),
		flagd.WithLogger(funcr.New(func(prefix, args string) {
			fmt.Fprintf(os.Stderr, "interop-go-legacy [provider] %s %s\n", prefix, args)
		}, funcr.Options{Verbosity: verbosity})),
	}
	if tls {
		options = append(options, flagd.WithTLS(certPath))
	}
	provider := flagd.NewProvider(options...)

	ready := make(chan struct{})
	var once sync.Once
	handler := func(eventType openfeature.EventType) openfeature.EventCallback {
		callback := func(details openfeature.EventDetails) {
			fmt.Fprintf(os.Stderr, "interop-go-legacy: event %s: %s\n", eventType, details.Message)
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
		fail("setting the provider: %v", err)
	}
	<-ready
	emit("READY")

	client := openfeature.NewClient("interop")
	last := ""
	printed := false
	lastError := ""
	for {
		value, err := client.StringValue(context.Background(), flagKey, defaultValue, openfeature.EvaluationContext{})
		if err != nil {
			if text := err.Error(); text != lastError {
				fmt.Fprintf(os.Stderr, "interop-go-legacy: evaluation of %s failed: %s\n", flagKey, text)
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
