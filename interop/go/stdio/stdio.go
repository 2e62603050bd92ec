// Package stdio is the process protocol the Go interop clients (../main.go and
// ../legacy/main.go) share, whatever provider release they are built with:
//
//   - the environment: FLAGD_HOST, FLAGD_PORT, FLAGD_SOURCE_SELECTOR, FLAGD_TLS (true/false),
//     FLAGD_SERVER_CERT_PATH (CA file, TLS only), INTEROP_FLAG_KEY (a string flag) and
//     INTEROP_DEBUG (any value: provider debug logging on stderr);
//   - stdout: `READY` once the provider is ready, then `VALUE <value>` each time the evaluated
//     value differs from the last printed one (and whatever else a client emits);
//   - stderr: every log line, prefixed with the client's name;
//   - the process exits when stdin reaches EOF, and with status 2 on a configuration error.
//
// It depends on the standard library only, so each client keeps the provider release it pins.
package stdio

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"
)

// DefaultValue is the value a client evaluates its flag with: the one printed while the flag
// cannot be evaluated.
const DefaultValue = "<default>"

// pollInterval is how often Watch evaluates the flag.
const pollInterval = 100 * time.Millisecond

// Process is one client's stdout and stderr.
type Process struct {
	name string
	mu   sync.Mutex
	out  *bufio.Writer
}

// New returns the process protocol of the client called name (the prefix of its stderr lines).
func New(name string) *Process {
	return &Process{name: name, out: bufio.NewWriter(os.Stdout)}
}

// Logf writes one line on stderr.
func (p *Process) Logf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, p.name+": "+format+"\n", args...)
}

// Fail writes the error on stderr and exits with status 2.
func (p *Process) Fail(format string, args ...any) {
	p.Logf(format, args...)
	os.Exit(2)
}

// Emit writes one line on stdout; the process exits once nobody reads it.
func (p *Process) Emit(line string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if _, err := p.out.WriteString(line + "\n"); err != nil {
		os.Exit(0)
	}
	if err := p.out.Flush(); err != nil {
		os.Exit(0)
	}
}

// ProviderLog writes one line of the provider's logger on stderr.
func (p *Process) ProviderLog(prefix, args string) {
	fmt.Fprintf(os.Stderr, "%s [provider] %s %s\n", p.name, prefix, args)
}

// Verbosity is the provider logger's verbosity: 10 with INTEROP_DEBUG, otherwise 0.
func Verbosity() int {
	if os.Getenv("INTEROP_DEBUG") != "" {
		return 10
	}
	return 0
}

// Env is the environment every client reads.
type Env struct {
	Host     string
	Port     uint16
	Selector string
	TLS      bool
	CertPath string
	FlagKey  string
}

// Required is the value of the environment variable name; the process fails without one.
func (p *Process) Required(name string) string {
	value := os.Getenv(name)
	if value == "" {
		p.Fail("environment variable %s is required", name)
	}
	return value
}

// ReadEnv reads the environment, failing on a missing or malformed entry.
func (p *Process) ReadEnv() Env {
	env := Env{
		Host:     p.Required("FLAGD_HOST"),
		Selector: os.Getenv("FLAGD_SOURCE_SELECTOR"),
		TLS:      strings.EqualFold(strings.TrimSpace(os.Getenv("FLAGD_TLS")), "true"),
		CertPath: os.Getenv("FLAGD_SERVER_CERT_PATH"),
	}
	portText := p.Required("FLAGD_PORT")
	port, err := strconv.ParseUint(portText, 10, 16)
	if err != nil || port == 0 {
		p.Fail("FLAGD_PORT is not a port: %s", portText)
	}
	env.Port = uint16(port)
	env.FlagKey = p.Required("INTEROP_FLAG_KEY")
	// A provider falls back to insecure credentials when it cannot load the CA file; refuse
	// that here so a wrong path is not mistaken for a server problem.
	if env.TLS && env.CertPath != "" {
		if _, err := os.Stat(env.CertPath); err != nil {
			p.Fail("FLAGD_SERVER_CERT_PATH does not exist: %s", env.CertPath)
		}
	}
	return env
}

// ExitAtEndOfStdin exits the process as soon as stdin reaches EOF, so that a parent that goes
// away takes the client down.
func ExitAtEndOfStdin() {
	go func() {
		_, _ = io.Copy(io.Discard, os.Stdin)
		os.Exit(0)
	}()
}

// Watch evaluates the flag every 100 ms, for ever: `VALUE <value>` on stdout for the first
// value and each change, an evaluation error on stderr once until it changes.
func (p *Process) Watch(flagKey string, evaluate func() (string, error)) {
	last := ""
	printed := false
	lastError := ""
	for {
		value, err := evaluate()
		if err != nil {
			if text := err.Error(); text != lastError {
				p.Logf("evaluation of %s failed: %s", flagKey, text)
				lastError = text
			}
		} else {
			lastError = ""
		}
		if !printed || value != last {
			p.Emit("VALUE " + value)
			last = value
			printed = true
		}
		time.Sleep(pollInterval)
	}
}
