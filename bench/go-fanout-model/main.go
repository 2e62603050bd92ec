// Command go-fanout-model reproduces, for benchmarking only, the fan-out design of the Go
// flagd-proxy v0.9.7 (open-feature/flagd, folder flagd-proxy) when the real binary cannot be
// installed. It is NOT the Go flagd-proxy: it has the same shape where the benchmark looks:
//
//   - grpc-go server; flagd.sync.v1 FlagSyncService/SyncFlags; selector from the request body;
//   - one "multiplexer" per selector with a map of subscribers, each an unbuffered channel that
//     the stream's goroutine selects on;
//   - fan-out by non-blocking send under a read lock: a subscriber whose goroutine is busy
//     (still sending the previous message) misses the update, and an error is logged for it;
//   - every stream marshals its own SyncFlagsResponse per message;
//   - file: selectors read a file watched with fsnotify; an event reads the file and pushes the
//     content through the multiplexer (create/write: send; remove: re-add the watch, send);
//   - a new subscriber on a watched selector gets the current file by a re-read sent on its own
//     channel (blocking); the first subscriber gets the watch's initial push through the
//     non-blocking fan-out;
//   - core.openfeature.dev/<namespace>/<name> selectors read FeatureFlag resources through the
//     Kubernetes API (KUBECONFIG, else in-cluster); see kubernetes.go for what that path
//     reproduces and what it leaves out.
//
// Usage: go-fanout-model start --port P --management-port M
package main

import (
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"log"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/fsnotify/fsnotify"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/status"
)

// rawCodec passes messages as bytes; the handler does the protobuf work itself.
type rawCodec struct{}

func (rawCodec) Marshal(v any) ([]byte, error) { return *(v.(*[]byte)), nil }
func (rawCodec) Unmarshal(data []byte, v any) error {
	*(v.(*[]byte)) = append([]byte(nil), data...)
	return nil
}
func (rawCodec) Name() string { return "proto" }

var _ encoding.Codec = rawCodec{}

// field2 returns protobuf field 2 (length-delimited) of msg: SyncFlagsRequest.selector.
func field2(msg []byte) string {
	for len(msg) > 0 {
		key, n := binary.Uvarint(msg)
		if n <= 0 {
			return ""
		}
		msg = msg[n:]
		switch key & 7 {
		case 0:
			_, m := binary.Uvarint(msg)
			if m <= 0 {
				return ""
			}
			msg = msg[m:]
		case 2:
			l, m := binary.Uvarint(msg)
			if m <= 0 || int(l) > len(msg)-m {
				return ""
			}
			if key>>3 == 2 {
				return string(msg[m : m+int(l)])
			}
			msg = msg[m+int(l):]
		default:
			return ""
		}
	}
	return ""
}

// response marshals SyncFlagsResponse{flag_configuration: data}.
func response(data string) []byte {
	out := make([]byte, 0, len(data)+11)
	out = append(out, 0x0a)
	out = binary.AppendUvarint(out, uint64(len(data)))
	return append(out, data...)
}

// subscriber is one stream's pair of unbuffered channels: flag configurations and a terminal
// error (only the Kubernetes path sends errors).
type subscriber struct {
	data chan string
	errs chan error
}

type multiplexer struct {
	mu       sync.RWMutex
	subs     map[*int]subscriber
	dataSync chan string
	path     string
	// kube is the selector's Kubernetes sync once it is built and initialised (nil before,
	// and always nil for file: selectors).
	kube atomic.Pointer[kubeSync]
}

func (m *multiplexer) broadcast(data string) {
	m.mu.RLock()
	defer m.mu.RUnlock()
	for k, sub := range m.subs {
		select {
		case sub.data <- data:
		default:
			log.Printf("unable to write data to channel for key %p", k)
		}
	}
}

func (m *multiplexer) broadcastError(err error) {
	m.mu.RLock()
	defer m.mu.RUnlock()
	for k, sub := range m.subs {
		select {
		case sub.errs <- err:
		default:
			log.Printf("unable to write error to channel for key %p", k)
		}
	}
}

type manager struct {
	// mu guards muxs. The file: path only locks it exclusively; the Kubernetes path also
	// read-locks it while a new subscriber's resync runs.
	mu   sync.RWMutex
	muxs map[string]*multiplexer
}

func readFile(path string) string {
	data, err := os.ReadFile(path)
	if err != nil || len(data) == 0 {
		return "{}"
	}
	return string(data)
}

func (m *multiplexer) watch() {
	go func() {
		for d := range m.dataSync {
			m.broadcast(d)
		}
	}()
	w, err := fsnotify.NewWatcher()
	if err != nil {
		log.Printf("watcher: %v", err)
		return
	}
	if err := w.Add(m.path); err != nil {
		log.Printf("watch %s: %v", m.path, err)
	}
	m.dataSync <- readFile(m.path)
	for {
		select {
		case ev, ok := <-w.Events:
			if !ok {
				return
			}
			log.Printf("filepath event: %s %s", ev.Name, ev.Op.String())
			switch {
			case ev.Has(fsnotify.Create) || ev.Has(fsnotify.Write):
				m.dataSync <- readFile(m.path)
			case ev.Has(fsnotify.Remove):
				_ = w.Add(m.path)
				m.dataSync <- readFile(m.path)
			case ev.Has(fsnotify.Chmod):
				if _, err := os.Stat(m.path); errors.Is(err, os.ErrNotExist) {
					m.dataSync <- readFile(m.path)
				}
			}
		case err, ok := <-w.Errors:
			if !ok {
				return
			}
			log.Printf("watcher error: %v", err)
		}
	}
}

func (s *manager) register(target string, key *int, sub subscriber) (func(), error) {
	if strings.HasPrefix(target, kubePrefix) {
		return s.registerKube(target, key, sub), nil
	}
	path, ok := strings.CutPrefix(target, "file:")
	if !ok {
		return nil, status.Error(codes.Unknown, "only file: and core.openfeature.dev/ selectors are modelled")
	}
	ch := sub.data
	s.mu.Lock()
	defer s.mu.Unlock()
	m, ok := s.muxs[target]
	if !ok {
		m = &multiplexer{subs: map[*int]subscriber{key: sub}, dataSync: make(chan string), path: path}
		s.muxs[target] = m
		go m.watch()
	} else {
		m.mu.Lock()
		m.subs[key] = sub
		m.mu.Unlock()
		go func() { ch <- readFile(path) }()
	}
	return func() {
		m.mu.Lock()
		delete(m.subs, key)
		m.mu.Unlock()
	}, nil
}

func main() {
	if len(os.Args) < 2 || os.Args[1] != "start" {
		fmt.Fprintln(os.Stderr, "usage: go-fanout-model start --port P --management-port M")
		os.Exit(2)
	}
	flags := flag.NewFlagSet("start", flag.ExitOnError)
	port := flags.Int("port", 8015, "sync port")
	mgmt := flags.Int("management-port", 8016, "management port")
	_ = flags.Parse(os.Args[2:])

	mgr := &manager{muxs: map[string]*multiplexer{}}
	handler := func(_ any, stream grpc.ServerStream) error {
		var req []byte
		if err := stream.RecvMsg(&req); err != nil {
			return err
		}
		key := new(int)
		sub := subscriber{data: make(chan string), errs: make(chan error)}
		unregister, err := mgr.register(field2(req), key, sub)
		if err != nil {
			return err
		}
		defer unregister()
		for {
			select {
			case err := <-sub.errs:
				return err
			case d := <-sub.data:
				msg := response(d)
				if err := stream.SendMsg(&msg); err != nil {
					return err
				}
			case <-stream.Context().Done():
				return nil
			}
		}
	}
	server := grpc.NewServer(grpc.ForceServerCodec(rawCodec{}))
	server.RegisterService(&grpc.ServiceDesc{
		ServiceName: "flagd.sync.v1.FlagSyncService",
		HandlerType: (*any)(nil),
		Streams: []grpc.StreamDesc{{
			StreamName:    "SyncFlags",
			Handler:       handler,
			ServerStreams: true,
		}},
	}, struct{}{})
	go func() {
		mux := http.NewServeMux()
		mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(200) })
		_ = http.ListenAndServe(fmt.Sprintf(":%d", *mgmt), mux)
	}()
	lis, err := net.Listen("tcp", fmt.Sprintf(":%d", *port))
	if err != nil {
		log.Fatal(err)
	}
	log.Printf("listening for connections on %d", *port)
	log.Fatal(server.Serve(lis))
}
