package watch

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"sync"

	"k8s.io/client-go/dynamic"
)

// ManagerOptions configures a Manager.
type ManagerOptions struct {
	// Client reaches the source cluster.
	Client dynamic.Interface
	// Render produces the declared form of an object.
	Render Render
	// Emit receives every change of every stream. It must not block for long: it is called from
	// the informers' handlers.
	Emit   func(Change)
	Logger *slog.Logger
}

// Manager runs the streams a set of owners (WatchRules) want. Streams are shared: two owners
// wanting the same (target, resource, namespace) share one stream whose operations are the union.
type Manager struct {
	opts ManagerOptions

	mu      sync.Mutex
	ctx     context.Context
	owners  map[string][]StreamSpec
	streams map[string]*stream
}

// NewManager returns a Manager; streams start once Start was called.
func NewManager(opts ManagerOptions) (*Manager, error) {
	switch {
	case opts.Client == nil:
		return nil, errors.New("watch: ManagerOptions.Client is required")
	case opts.Render == nil:
		return nil, errors.New("watch: ManagerOptions.Render is required")
	case opts.Emit == nil:
		return nil, errors.New("watch: ManagerOptions.Emit is required")
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	return &Manager{opts: opts, owners: map[string][]StreamSpec{}, streams: map[string]*stream{}}, nil
}

// Start makes the manager run streams under ctx; streams set before Start begin now.
func (m *Manager) Start(ctx context.Context) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.ctx = ctx
	m.reconcileLocked()
}

// Set declares the streams owner wants, replacing what it wanted before.
func (m *Manager) Set(owner string, specs []StreamSpec) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.owners[owner] = specs
	m.reconcileLocked()
}

// Remove forgets owner; streams nobody else wants stop.
func (m *Manager) Remove(owner string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.owners, owner)
	m.reconcileLocked()
}

// Status reports whether every stream owner wants has finished its initial list, and the first
// watch error among them.
func (m *Manager) Status(owner string) (synced bool, err error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	synced = true
	for _, spec := range m.owners[owner] {
		s, ok := m.streams[spec.key()]
		if !ok {
			return false, nil
		}
		ok, serr := s.status()
		synced = synced && ok
		if err == nil {
			err = serr
		}
	}
	return synced, err
}

// Stop stops every stream and waits for them.
func (m *Manager) Stop() {
	m.mu.Lock()
	defer m.mu.Unlock()
	for k, s := range m.streams {
		s.stop()
		delete(m.streams, k)
	}
	m.owners = map[string][]StreamSpec{}
}

func (m *Manager) reconcileLocked() {
	if m.ctx == nil {
		return
	}
	want := map[string]StreamSpec{}
	for _, specs := range m.owners {
		for _, spec := range specs {
			k := spec.key()
			if prev, ok := want[k]; ok {
				spec.Operations = unionOps(prev.Operations, spec.Operations)
			}
			want[k] = spec
		}
	}
	for k, s := range m.streams {
		if _, ok := want[k]; !ok {
			s.stop()
			delete(m.streams, k)
			m.opts.Logger.Info("stopped watch", "target", s.spec.Target.String(), "resource", s.spec.GVR.String(), "namespace", s.spec.Namespace)
		}
	}
	for k, spec := range want {
		if s, ok := m.streams[k]; ok {
			s.setOperations(spec.Operations)
			continue
		}
		s := newStream(m.opts.Client, spec, m.opts.Render, m.opts.Emit, m.opts.Logger)
		s.run(m.ctx)
		m.streams[k] = s
		m.opts.Logger.Info("started watch", "target", spec.Target.String(), "resource", spec.GVR.String(), "namespace", spec.Namespace)
	}
}

// unionOps merges two operation sets; empty means all and absorbs the other.
func unionOps(a, b []Op) []Op {
	if len(a) == 0 || len(b) == 0 {
		return nil
	}
	out := slices.Clone(a)
	for _, op := range b {
		if !slices.Contains(out, op) {
			out = append(out, op)
		}
	}
	slices.Sort(out)
	return out
}
