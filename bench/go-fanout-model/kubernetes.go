// The Kubernetes path of the model: core.openfeature.dev/<namespace>/<name> selectors, shaped
// after the Go flagd-proxy v0.9.x with flagd core v0.15.x (core/pkg/sync/builder/syncbuilder.go,
// core/pkg/sync/kubernetes/kubernetes_sync.go, flagd-proxy/pkg/service/subscriptions/manager.go
// in open-feature/flagd) and FeatureFlag v1beta1 as open-feature-operator api v0.2.47 defines it.
//
// Reproduced:
//
//   - one sync per selector, built when the selector's first subscriber arrives: a fresh REST
//     config from the KUBECONFIG file (clientcmd, no context or master override) or, without
//     KUBECONFIG, the in-cluster config, and a fresh dynamic client (client-go defaults: JSON,
//     5 QPS / burst 10 client-side limit, transports shared through client-go's TLS cache);
//   - one dynamic shared informer per selector, on featureflags.core.openfeature.dev/v1beta1,
//     scoped to the selector's namespace (every FeatureFlag in that namespace, no field or label
//     selector), resync period one minute, run directly (informer.Run) by the sync;
//   - the sync's start: an initial fetch (the informer store is still empty, so a GET through
//     the dynamic client) sent on the multiplexer's unbuffered channel, then two goroutines
//     joined by a one-slot channel: the informer's event handlers and a watcher;
//   - event handlers, for every object of the namespace: an info log line, a conversion of the
//     whole object to the typed FeatureFlag (apimachinery's unstructured converter), an
//     apiVersion check, and a notification only when the name matches: add -> created,
//     update -> modified if the resourceVersion changed (resyncs are dropped), delete
//     (tombstones unwrapped) -> deleted;
//   - the watcher: on created/modified it fetches again, from the informer store by
//     "<namespace>/<name>" (not the event's object: a burst can yield the same latest version
//     several times), converts, marshals and sends on the multiplexer's unbuffered channel,
//     blocking until the fan-out goroutine takes it; on deleted nothing is sent (subscribers
//     keep the last configuration); ready only sets a flag;
//   - the flag configuration is encoding/json of the typed spec.flagSpec: {"flags":{...}} plus
//     "metadata" and "$evaluators" when set; per flag "state", "variants", "defaultVariant"
//     always, "targeting" and "metadata" when set; any other field is dropped, map keys come
//     out sorted, HTML characters escaped;
//   - a subscriber joining a selector whose sync is already built gets a resync on its own
//     channel from a goroutine that read-locks the manager for the whole fetch and blocking
//     send (which does not watch for the stream ending first); one joining before the sync is
//     built gets nothing until the next push (the initial fetch reaches it through the fan-out
//     if it is registered by then);
//   - a failure to build, initialise or start the sync (bad kubeconfig, bad selector, missing
//     resource, RBAC) is sent without blocking to the subscribers' error channels (ending the
//     streams that were waiting), and the multiplexer is then dropped, so the next subscriber
//     starts over.
//
// Left out: the idle-multiplexer reaper (every 5 s, stopping the sync of a selector without
// subscribers), FetchAllFlags, the zap logger (log.Printf stands in for info lines; debug
// lines, off by default, are not written), OpenTelemetry metrics, and adding the typed
// FeatureFlag to client-go's kubernetes scheme (the scheme and its built-in types are still
// linked and registered at start-up, through dynamicinformer, as in the real binary). The model
// builds against client-go v0.34 where flagd core v0.15 requires v0.33; both have the same
// informer feature-gate defaults (watch-list off).
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"log"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/dynamic/dynamicinformer"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"
)

const (
	kubePrefix            = "core.openfeature.dev/"
	featureFlagAPIVersion = "core.openfeature.dev/v1beta1"
	kubeResyncPeriod      = time.Minute
)

var featureFlagResource = schema.GroupVersionResource{
	Group:    "core.openfeature.dev",
	Version:  "v1beta1",
	Resource: "featureflags",
}

// featureFlag has the JSON shape of the operator's typed FeatureFlag: converting into it keeps
// only the fields below.
type featureFlag struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   featureFlagSpec `json:"spec,omitempty"`
	Status struct{}        `json:"status,omitempty"`
}

type featureFlagSpec struct {
	FlagSpec flagSpec `json:"flagSpec,omitempty"`
}

type flagSpec struct {
	Flags      map[string]flagDefinition `json:"flags"`
	Metadata   json.RawMessage           `json:"metadata,omitempty"`
	Evaluators json.RawMessage           `json:"$evaluators,omitempty"`
}

type flagDefinition struct {
	State          string          `json:"state"`
	Variants       json.RawMessage `json:"variants"`
	DefaultVariant string          `json:"defaultVariant"`
	Targeting      json.RawMessage `json:"targeting,omitempty"`
	Metadata       json.RawMessage `json:"metadata,omitempty"`
}

// asFeatureFlag converts an informer or client object (or a delete tombstone holding one).
func asFeatureFlag(obj any) (*featureFlag, error) {
	if tombstone, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = tombstone.Obj
	}
	u, ok := obj.(*unstructured.Unstructured)
	if !ok {
		return nil, fmt.Errorf("provided value is not of type *unstructured.Unstructured")
	}
	ff := &featureFlag{}
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, ff); err != nil {
		return nil, fmt.Errorf("unable to convert unstructured to FeatureFlag: %w", err)
	}
	return ff, nil
}

// flagConfiguration is what subscribers receive: the typed spec.flagSpec as JSON.
func flagConfiguration(ff *featureFlag) (string, error) {
	b, err := json.Marshal(ff.Spec.FlagSpec)
	if err != nil {
		return "", fmt.Errorf("failed to marshal FlagSpec: %w", err)
	}
	return string(b), nil
}

// kubeRestConfig reads KUBECONFIG if set, else the pod's service account.
func kubeRestConfig() (*rest.Config, error) {
	if path := os.Getenv("KUBECONFIG"); path != "" {
		cfg, err := clientcmd.BuildConfigFromFlags("", path)
		if err != nil {
			return nil, fmt.Errorf("error building cluster config from flags: %w", err)
		}
		return cfg, nil
	}
	cfg, err := rest.InClusterConfig()
	if err != nil {
		return nil, fmt.Errorf("error fetching cluster config: %w", err)
	}
	return cfg, nil
}

type kubeEvent int

const (
	kubeCreated kubeEvent = iota
	kubeModified
	kubeDeleted
	kubeReady
)

// kubeSync follows one FeatureFlag; uri is "<namespace>/<name>", the informer store's key.
type kubeSync struct {
	uri       string
	namespace string
	name      string
	client    dynamic.Interface
	informer  cache.SharedIndexInformer
	ready     atomic.Bool
}

// newKubeSync builds the selector's own client.
func newKubeSync(uri string) (*kubeSync, error) {
	cfg, err := kubeRestConfig()
	if err != nil {
		return nil, fmt.Errorf("error creating kubernetes clients: %w", err)
	}
	client, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("error creating kubernetes clients: unable to create dynamicClient: %w", err)
	}
	return &kubeSync{uri: uri, client: client}, nil
}

// init parses the selector and creates (does not start) the namespace's informer.
func (k *kubeSync) init() error {
	parts := strings.Split(k.uri, "/")
	if len(parts) != 2 || parts[0] == "" || parts[1] == "" {
		return fmt.Errorf("unable to parse uri %s: invalid resource uri format, expected <namespace>/<crdName> but got: %s", k.uri, k.uri)
	}
	k.namespace, k.name = parts[0], parts[1]
	factory := dynamicinformer.NewFilteredDynamicSharedInformerFactory(k.client, kubeResyncPeriod, k.namespace, nil)
	k.informer = factory.ForResource(featureFlagResource).Informer()
	return nil
}

// fetch reads the resource from the informer store, or from the API server on a miss.
func (k *kubeSync) fetch(ctx context.Context) (string, error) {
	item, exists, err := k.informer.GetStore().GetByKey(k.uri)
	if err != nil {
		return "", fmt.Errorf("unable to get %s from store: %w", k.uri, err)
	}
	if exists {
		ff, err := asFeatureFlag(item)
		if err != nil {
			return "", err
		}
		return flagConfiguration(ff)
	}
	obj, err := k.client.Resource(featureFlagResource).Namespace(k.namespace).Get(ctx, k.name, metav1.GetOptions{})
	if err != nil {
		return "", fmt.Errorf("unable to fetch FeatureFlag %s/%s: %w", k.namespace, k.name, err)
	}
	ff, err := asFeatureFlag(obj)
	if err != nil {
		return "", fmt.Errorf("unable to convert object %s/%s to FeatureFlag: %w", k.namespace, k.name, err)
	}
	return flagConfiguration(ff)
}

// resync sends the current configuration on one subscriber's channel, blocking.
func (k *kubeSync) resync(ctx context.Context, out chan<- string) error {
	data, err := k.fetch(ctx)
	if err != nil {
		return fmt.Errorf("unable to fetch flag configuration: %w", err)
	}
	out <- data
	return nil
}

// run pushes the initial configuration, then every change, until ctx ends.
func (k *kubeSync) run(ctx context.Context, out chan<- string) error {
	log.Printf("starting sync from %s", k.uri)
	data, err := k.fetch(ctx)
	if err != nil {
		err = fmt.Errorf("error with the initial fetch: %w", err)
		log.Print(err)
		return err
	}
	out <- data

	notifies := make(chan kubeEvent, 1)
	var wg sync.WaitGroup
	wg.Add(2)
	go func() {
		defer wg.Done()
		k.watch(ctx, notifies, out)
	}()
	go func() {
		defer wg.Done()
		k.notify(ctx, notifies)
	}()
	wg.Wait()
	return nil
}

func (k *kubeSync) watch(ctx context.Context, notifies <-chan kubeEvent, out chan<- string) {
	for {
		select {
		case <-ctx.Done():
			return
		case ev := <-notifies:
			switch ev {
			case kubeCreated, kubeModified:
				data, err := k.fetch(ctx)
				if err != nil {
					log.Printf("error fetching after notification: %v", err)
					continue
				}
				out <- data
			case kubeDeleted:
				// Subscribers keep what they have.
			case kubeReady:
				k.ready.Store(true)
			}
		}
	}
}

// notify registers the event handlers, reports ready and runs the informer until ctx ends.
func (k *kubeSync) notify(ctx context.Context, c chan<- kubeEvent) {
	_, err := k.informer.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: func(obj any) {
			log.Printf("kube sync notifier event: add: %s %s", k.namespace, k.name)
			if err := k.notifyIfNamed(obj, kubeCreated, c); err != nil {
				log.Print(err)
			}
		},
		UpdateFunc: func(oldObj, newObj any) {
			log.Printf("kube sync notifier event: update: %s %s", k.namespace, k.name)
			if err := k.notifyIfChanged(oldObj, newObj, c); err != nil {
				log.Print(err)
			}
		},
		DeleteFunc: func(obj any) {
			log.Printf("kube sync notifier event: delete: %s %s", k.namespace, k.name)
			if err := k.notifyIfNamed(obj, kubeDeleted, c); err != nil {
				log.Print(err)
			}
		},
	})
	if err != nil {
		log.Fatal(err)
	}
	c <- kubeReady
	k.informer.Run(ctx.Done())
}

func checkAPIVersion(ff *featureFlag) error {
	if ff.APIVersion != featureFlagAPIVersion {
		return fmt.Errorf("invalid api version %s, expected %s", ff.APIVersion, featureFlagAPIVersion)
	}
	return nil
}

func (k *kubeSync) notifyIfNamed(obj any, ev kubeEvent, c chan<- kubeEvent) error {
	ff, err := asFeatureFlag(obj)
	if err != nil {
		return err
	}
	if err := checkAPIVersion(ff); err != nil {
		return err
	}
	if ff.Name == k.name {
		c <- ev
	}
	return nil
}

func (k *kubeSync) notifyIfChanged(oldObj, newObj any, c chan<- kubeEvent) error {
	before, err := asFeatureFlag(oldObj)
	if err != nil {
		return err
	}
	if err := checkAPIVersion(before); err != nil {
		return err
	}
	after, err := asFeatureFlag(newObj)
	if err != nil {
		return err
	}
	if err := checkAPIVersion(after); err != nil {
		return err
	}
	if after.Name == k.name && before.ResourceVersion != after.ResourceVersion {
		c <- kubeModified
	}
	return nil
}

// registerKube adds a subscriber to the selector's multiplexer, creating it (and starting its
// sync) for the first one.
func (s *manager) registerKube(target string, key *int, sub subscriber) func() {
	s.mu.Lock()
	defer s.mu.Unlock()
	m, ok := s.muxs[target]
	if !ok {
		m = &multiplexer{subs: map[*int]subscriber{key: sub}, dataSync: make(chan string)}
		s.muxs[target] = m
		go s.watchKube(target, m)
	} else {
		m.mu.Lock()
		m.subs[key] = sub
		m.mu.Unlock()
		if ks := m.kube.Load(); ks != nil {
			go func() {
				s.mu.RLock()
				defer s.mu.RUnlock()
				if _, ok := s.muxs[target]; ok {
					if err := ks.resync(context.Background(), sub.data); err != nil {
						sub.errs <- err
					}
				}
			}()
		}
	}
	return func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		if current := s.muxs[target]; current != nil {
			current.mu.Lock()
			delete(current.subs, key)
			current.mu.Unlock()
		}
	}
}

// watchKube runs the selector's fan-out and sync; when the sync fails the error goes to the
// subscribers and the multiplexer is dropped.
func (s *manager) watchKube(target string, m *multiplexer) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		<-ctx.Done()
		s.mu.Lock()
		delete(s.muxs, target)
		s.mu.Unlock()
	}()
	go func() {
		for {
			select {
			case <-ctx.Done():
				return
			case d := <-m.dataSync:
				m.broadcast(d)
			}
		}
	}()
	ks, err := newKubeSync(strings.TrimPrefix(target, kubePrefix))
	if err != nil {
		log.Printf("unable to build sync from URI for target %s: %v", target, err)
		m.broadcastError(err)
		return
	}
	if err := ks.init(); err != nil {
		log.Printf("unable to initiate sync for target %s: %v", target, err)
		m.broadcastError(err)
		return
	}
	m.kube.Store(ks)
	if err := ks.run(ctx, m.dataSync); err != nil {
		log.Printf("error from sync for target %s: %v", target, err)
		m.broadcastError(err)
	}
}
