// Differential client: the published Go flagd provider
// (github.com/open-feature/go-sdk-contrib/providers/flagd) evaluating every flag of a corpus of
// flag configuration documents, each document either read from a file (the provider's offline
// file mode) or synced from flagd-proxy (its in-process gRPC sync mode).
//
// The protocol (job file, output lines) is described in interop/differential.md. In short:
// INTEROP_DIFF_JOB names a JSON job file; one JSON line per document is written to stdout and
// every log line goes to stderr. INTEROP_DEBUG (any value) turns on provider debug logging.
//
// The provider's defaults are kept, including its initialisation deadline (500 ms); the
// provider reads FLAGD_DEADLINE_MS and its other FLAGD_* environment variables as usual, and
// the options set here (resolver, host, port, selector, file path) take precedence over them.
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"runtime/debug"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"
	flagd "github.com/open-feature/go-sdk-contrib/providers/flagd/pkg"
	"github.com/open-feature/go-sdk/openfeature"
)

const (
	// How long to wait for a provider's first READY or ERROR event.
	hangGuard = 15 * time.Second
	// How long to wait for a provider to shut down before moving on.
	shutdownGuard = 10 * time.Second
	// How many documents are handled at once: one. Every new provider registers flagd's
	// JsonLogic operators in the library's process-wide table (flagd/core's NewResolver calls
	// jsonlogic.AddOperator), which is not safe while another provider evaluates: the Go
	// runtime stops the process on the concurrent map access.
	parallelism = 1

	stringDefault = "<default>"
	floatDefault  = -1.0
)

func objectDefault() map[string]any { return map[string]any{"default": true} }

type job struct {
	Mode      string           `json:"mode"`
	Host      string           `json:"host"`
	Port      json.Number      `json:"port"`
	Contexts  []map[string]any `json:"contexts"`
	Documents []document       `json:"documents"`
}

type document struct {
	ID       string   `json:"id"`
	Path     string   `json:"path"`
	Selector string   `json:"selector"`
	Flags    []string `json:"flags"`
	Served   *bool    `json:"served"`
}

// answer is one evaluation's details as the SDK reports them.
type answer struct {
	Value     any     `json:"value"`
	Variant   *string `json:"variant"`
	Reason    *string `json:"reason"`
	ErrorCode *string `json:"errorCode"`
}

type readyLine struct {
	ID      string                `json:"id"`
	Ready   bool                  `json:"ready"`
	Answers map[string][][]answer `json:"answers"`
}

type notReadyLine struct {
	ID     string `json:"id"`
	Ready  bool   `json:"ready"`
	Event  string `json:"event"`
	Detail string `json:"detail,omitempty"`
}

var (
	// The real standard output, kept for the protocol lines; os.Stdout is pointed at stderr so
	// that nothing else can write to it.
	protocolOut = os.Stdout
	outMu       sync.Mutex
	debugOn     = os.Getenv("INTEROP_DEBUG") != ""
)

func logf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "interop-go-diff: "+format+"\n", args...)
}

// encode writes a value as one JSON line (with `<`, `>` and `&` as they are).
func encode(value any) ([]byte, error) {
	var buffer bytes.Buffer
	encoder := json.NewEncoder(&buffer)
	encoder.SetEscapeHTML(false)
	if err := encoder.Encode(value); err != nil {
		return nil, err
	}
	return buffer.Bytes(), nil
}

func emit(line any) {
	data, err := encode(line)
	if err != nil {
		id := ""
		switch l := line.(type) {
		case readyLine:
			id = l.ID
		case notReadyLine:
			id = l.ID
		}
		data, _ = encode(notReadyLine{ID: id, Event: "client error",
			Detail: "cannot write the answers as JSON: " + err.Error()})
	}
	outMu.Lock()
	defer outMu.Unlock()
	if _, err := protocolOut.Write(data); err != nil {
		logf("writing to stdout: %v", err)
	}
}

func providerLogger() logr.Logger {
	verbosity := 0
	if debugOn {
		verbosity = 10
	}
	return funcr.New(func(prefix, args string) {
		fmt.Fprintf(os.Stderr, "interop-go-diff [provider] %s %s\n", prefix, args)
	}, funcr.Options{Verbosity: verbosity})
}

// evaluationContext turns a job context into an OpenFeature one: `targetingKey` (a string) is
// the targeting key, every other entry an attribute. Each evaluation gets a context of its own,
// built from a deep copy: the provider's evaluation adds to the context's maps, and documents
// are evaluated concurrently.
func evaluationContext(shared map[string]any) openfeature.EvaluationContext {
	raw := map[string]any{}
	if encoded, err := json.Marshal(shared); err == nil {
		_ = json.Unmarshal(encoded, &raw)
	}
	attributes := make(map[string]any, len(raw))
	targetingKey := ""
	for key, value := range raw {
		if key == openfeature.TargetingKey {
			if text, ok := value.(string); ok {
				targetingKey = text
				continue
			}
		}
		attributes[key] = value
	}
	return openfeature.NewEvaluationContext(targetingKey, attributes)
}

func optional[T ~string](value T) *string {
	if value == "" {
		return nil
	}
	text := string(value)
	return &text
}

func details(value any, resolution openfeature.ResolutionDetail) answer {
	return answer{
		Value:     value,
		Variant:   optional(resolution.Variant),
		Reason:    optional(resolution.Reason),
		ErrorCode: optional(resolution.ErrorCode),
	}
}

// evaluate evaluates a flag in a context as a boolean, a string, a number and an object.
func evaluate(client *openfeature.Client, id, flag string, evalCtx openfeature.EvaluationContext) []answer {
	ctx := context.Background()
	note := func(kind string, err error) {
		if err != nil && debugOn {
			logf("%s: %s as %s: %v", id, flag, kind, err)
		}
	}
	b, err := client.BooleanValueDetails(ctx, flag, false, evalCtx)
	note("boolean", err)
	s, err := client.StringValueDetails(ctx, flag, stringDefault, evalCtx)
	note("string", err)
	n, err := client.FloatValueDetails(ctx, flag, floatDefault, evalCtx)
	note("number", err)
	o, err := client.ObjectValueDetails(ctx, flag, objectDefault(), evalCtx)
	note("object", err)
	return []answer{
		details(b.Value, b.ResolutionDetail),
		details(s.Value, s.ResolutionDetail),
		details(n.Value, n.ResolutionDetail),
		details(o.Value, o.ResolutionDetail),
	}
}

// firstEvent waits for the domain's first READY or ERROR event. The handlers are added after
// the provider is set: the SDK then either runs them on the initialisation event or, when
// initialisation is already over, at once with the domain's state.
func firstEvent(client *openfeature.Client) (event, detail string) {
	type outcome struct{ event, detail string }
	first := make(chan outcome, 2)
	onReady := openfeature.EventCallback(new(func(openfeature.EventDetails)))
	onError := openfeature.EventCallback(new(func(openfeature.EventDetails)))
	*onReady = func(d openfeature.EventDetails) {
		first <- outcome{"READY", d.Message}
	}
	*onError = func(d openfeature.EventDetails) {
		first <- outcome{"ERROR", d.Message}
	}
	client.AddHandler(openfeature.ProviderReady, onReady)
	client.AddHandler(openfeature.ProviderError, onError)
	defer client.RemoveHandler(openfeature.ProviderReady, onReady)
	defer client.RemoveHandler(openfeature.ProviderError, onError)

	timer := time.NewTimer(hangGuard)
	defer timer.Stop()
	select {
	case o := <-first:
		return o.event, o.detail
	case <-timer.C:
		return "timeout", fmt.Sprintf("no READY or ERROR event within %s", hangGuard)
	}
}

func shutdown(id string, provider *flagd.Provider) {
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer func() {
			if r := recover(); r != nil {
				logf("%s: the provider's shutdown panicked: %v", id, r)
			}
		}()
		provider.Shutdown()
	}()
	select {
	case <-done:
	case <-time.After(shutdownGuard):
		logf("%s: the provider did not shut down within %s; moving on", id, shutdownGuard)
	}
}

func run(j *job, index int, doc document, contexts []map[string]any, portErr error, port uint16) any {
	if j.Mode == "sync" && doc.Served != nil && !*doc.Served {
		return notReadyLine{ID: doc.ID, Event: "not served"}
	}

	options := []flagd.ProviderOption{flagd.WithLogger(providerLogger())}
	switch j.Mode {
	case "file":
		options = append(options, flagd.WithFileResolver(), flagd.WithOfflineFilePath(doc.Path))
	case "sync":
		if portErr != nil {
			return notReadyLine{ID: doc.ID, Event: "client error", Detail: portErr.Error()}
		}
		options = append(options,
			flagd.WithInProcessResolver(),
			flagd.WithHost(j.Host),
			flagd.WithPort(port),
			flagd.WithSelector(doc.Selector))
	default:
		return notReadyLine{ID: doc.ID, Event: "client error",
			Detail: fmt.Sprintf("the job's mode is file or sync, not %q", j.Mode)}
	}

	provider, err := flagd.NewProvider(options...)
	if err != nil {
		return notReadyLine{ID: doc.ID, Event: "ERROR", Detail: "creating the provider: " + err.Error()}
	}
	defer shutdown(doc.ID, provider)

	domain := fmt.Sprintf("interop-diff-%d-%s", index, doc.ID)
	if err := openfeature.SetNamedProvider(domain, provider); err != nil {
		return notReadyLine{ID: doc.ID, Event: "ERROR", Detail: "setting the provider: " + err.Error()}
	}
	client := openfeature.NewClient(domain)

	event, detail := firstEvent(client)
	logf("%s: event %s: %s", doc.ID, event, detail)
	if event != "READY" {
		return notReadyLine{ID: doc.ID, Event: event, Detail: detail}
	}

	answers := make(map[string][][]answer, len(doc.Flags))
	for _, flag := range doc.Flags {
		perContext := make([][]answer, 0, len(contexts))
		for _, raw := range contexts {
			perContext = append(perContext, evaluate(client, doc.ID, flag, evaluationContext(raw)))
		}
		answers[flag] = perContext
	}
	return readyLine{ID: doc.ID, Ready: true, Answers: answers}
}

// handle runs one document and always writes its line, whatever goes wrong.
func handle(j *job, index int, doc document, contexts []map[string]any, portErr error, port uint16) {
	var line any
	func() {
		defer func() {
			if r := recover(); r != nil {
				logf("%s: panic: %v\n%s", doc.ID, r, debug.Stack())
				line = notReadyLine{ID: doc.ID, Event: "client error", Detail: fmt.Sprintf("panic: %v", r)}
			}
		}()
		line = run(j, index, doc, contexts, portErr, port)
	}()
	emit(line)
}

func parsePort(j *job) (uint16, error) {
	if j.Port == "" {
		return 0, errors.New("the job has no port")
	}
	port, err := j.Port.Int64()
	if err != nil || port < 1 || port > 65535 {
		return 0, fmt.Errorf("the job's port is not a port: %s", j.Port)
	}
	return uint16(port), nil
}

func readJob() (*job, error) {
	path := os.Getenv("INTEROP_DIFF_JOB")
	if path == "" {
		return nil, errors.New("environment variable INTEROP_DIFF_JOB is required")
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("reading the job file: %w", err)
	}
	var j job
	if err := json.Unmarshal(data, &j); err != nil {
		return nil, fmt.Errorf("parsing the job file %s: %w", path, err)
	}
	return &j, nil
}

func main() {
	os.Stdout = os.Stderr

	j, err := readJob()
	if err != nil {
		logf("%v", err)
		os.Exit(2)
	}

	contexts := j.Contexts
	port, portErr := uint16(0), error(nil)
	if j.Mode == "sync" {
		port, portErr = parsePort(j)
	}

	slots := make(chan struct{}, parallelism)
	var wg sync.WaitGroup
	for index, doc := range j.Documents {
		wg.Add(1)
		slots <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-slots }()
			handle(j, index, doc, contexts, portErr, port)
		}()
	}
	wg.Wait()
	logf("%d documents done", len(j.Documents))
}
