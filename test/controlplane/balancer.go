package controlplane

import (
	"errors"
	"io"
	"net"
	"net/http"
	"sync"
	"time"
)

// Balancer stands in for a Kubernetes Service in front of several kubescribe replicas, as
// kube-proxy makes one: it accepts TCP connections on one address and hands each to one ready
// backend, round robin, passing the bytes through untouched (TLS ends at the backend). A
// backend is ready while its readiness URL answers 200 (checked every ReadyEvery, as a kubelet
// probe and the EndpointSlice controller would, only faster); a connection made while it was
// ready stays with it until either side closes it, as conntrack keeps it. Without a ready
// backend a connection is closed at once.
type Balancer struct {
	ln   net.Listener
	logf func(string, ...any)

	mu       sync.Mutex
	backends []*balancerBackend
	next     int
	conns    map[net.Conn]struct{}
	closed   bool
	done     chan struct{}
	wg       sync.WaitGroup
	check    *http.Client
	interval time.Duration
}

// Backend is one replica behind a Balancer: where it listens, and its readiness URL.
type Backend struct {
	Addr, ReadyURL string
}

type balancerBackend struct {
	Backend
	ready bool
}

// ReadyEvery is how often a Balancer checks its backends' readiness.
const ReadyEvery = 200 * time.Millisecond

// StartBalancer listens on addr ("127.0.0.1:port") for the backends SetBackends names.
func StartBalancer(addr string, logf func(string, ...any)) (*Balancer, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	if logf == nil {
		logf = func(string, ...any) {}
	}
	b := &Balancer{ln: ln, logf: logf, conns: map[net.Conn]struct{}{}, done: make(chan struct{}),
		check: &http.Client{Timeout: time.Second}, interval: ReadyEvery}
	b.wg.Add(2)
	go b.accept()
	go b.probe()
	return b, nil
}

// Addr is where the balancer listens.
func (b *Balancer) Addr() string { return b.ln.Addr().String() }

// SetBackends replaces the backends; one named again keeps its readiness.
func (b *Balancer) SetBackends(backends ...Backend) {
	b.mu.Lock()
	defer b.mu.Unlock()
	old := map[string]*balancerBackend{}
	for _, be := range b.backends {
		old[be.Addr] = be
	}
	b.backends = nil
	for _, be := range backends {
		if o, ok := old[be.Addr]; ok && o.ReadyURL == be.ReadyURL {
			b.backends = append(b.backends, o)
			continue
		}
		b.backends = append(b.backends, &balancerBackend{Backend: be})
	}
}

// Ready returns the addresses of the backends found ready at the last check.
func (b *Balancer) Ready() []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	var out []string
	for _, be := range b.backends {
		if be.ready {
			out = append(out, be.Addr)
		}
	}
	return out
}

// IsReady reports whether the backend at addr was ready at the last check.
func (b *Balancer) IsReady(addr string) bool {
	for _, a := range b.Ready() {
		if a == addr {
			return true
		}
	}
	return false
}

// Close stops accepting and closes every connection.
func (b *Balancer) Close() error {
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return nil
	}
	b.closed = true
	close(b.done)
	for c := range b.conns {
		_ = c.Close()
	}
	b.mu.Unlock()
	err := b.ln.Close()
	b.wg.Wait()
	return err
}

func (b *Balancer) probe() {
	defer b.wg.Done()
	t := time.NewTicker(b.interval)
	defer t.Stop()
	for {
		b.mu.Lock()
		backends := append([]*balancerBackend(nil), b.backends...)
		b.mu.Unlock()
		for _, be := range backends {
			ready := false
			if resp, err := b.check.Get(be.ReadyURL); err == nil {
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				ready = resp.StatusCode == http.StatusOK
			}
			b.mu.Lock()
			if be.ready != ready {
				b.logf("balancer %s: backend %s ready=%v", b.Addr(), be.Addr, ready)
			}
			be.ready = ready
			b.mu.Unlock()
		}
		select {
		case <-b.done:
			return
		case <-t.C:
		}
	}
}

func (b *Balancer) accept() {
	defer b.wg.Done()
	for {
		c, err := b.ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			continue
		}
		b.wg.Add(1)
		go func() { defer b.wg.Done(); b.forward(c) }()
	}
}

// pick returns the next ready backend after the last one picked, skipping those in tried.
func (b *Balancer) pick(tried map[string]bool) (string, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for i := range b.backends {
		be := b.backends[(b.next+i)%len(b.backends)]
		if be.ready && !tried[be.Addr] {
			b.next = (b.next + i + 1) % len(b.backends)
			return be.Addr, true
		}
	}
	return "", false
}

func (b *Balancer) track(c net.Conn, add bool) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if add {
		if b.closed {
			return false
		}
		b.conns[c] = struct{}{}
	} else {
		delete(b.conns, c)
	}
	return true
}

func (b *Balancer) forward(client net.Conn) {
	defer client.Close()
	if !b.track(client, true) {
		return
	}
	defer b.track(client, false)
	tried := map[string]bool{}
	var server net.Conn
	for server == nil {
		addr, ok := b.pick(tried)
		if !ok {
			return // no ready backend: refused, as by a Service without endpoints
		}
		tried[addr] = true
		var err error
		if server, err = net.DialTimeout("tcp", addr, time.Second); err != nil {
			server = nil
		}
	}
	defer server.Close()
	if !b.track(server, true) {
		return
	}
	defer b.track(server, false)
	done := make(chan struct{}, 2)
	pipe := func(dst, src net.Conn) {
		_, _ = io.Copy(dst, src)
		if tc, ok := dst.(*net.TCPConn); ok {
			_ = tc.CloseWrite()
		}
		done <- struct{}{}
	}
	go pipe(server, client)
	go pipe(client, server)
	<-done
	<-done
}
