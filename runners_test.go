package fenceq

import (
	"sync/atomic"
	"testing"
	"time"
)

// waitParked waits until n runners are parked.
func waitParked(t *testing.T, r *runners, n int) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		r.mu.Lock()
		got := len(r.parked)
		r.mu.Unlock()
		if got == n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d runners parked, want %d", got, n)
		}
		time.Sleep(time.Millisecond)
	}
}

func TestRunnersReuseParkedGoroutine(t *testing.T) {
	r := newRunners(time.Hour)
	defer r.stop(true)
	started := make(chan struct{}, 2)
	r.run(func() { started <- struct{}{} })
	<-started
	waitParked(t, r, 1)
	r.run(func() { started <- struct{}{} })
	<-started
	waitParked(t, r, 1)
	// Two jobs at once: the parked runner takes one, a new goroutine the other.
	release := make(chan struct{})
	running := make(chan struct{}, 2)
	for range 2 {
		r.run(func() { running <- struct{}{}; <-release })
	}
	<-running
	<-running
	r.mu.Lock()
	parked := len(r.parked)
	r.mu.Unlock()
	if parked != 0 {
		t.Fatalf("%d runners parked while both run, want 0", parked)
	}
	close(release)
	waitParked(t, r, 2)
}

func TestRunnersRetireIdleOnes(t *testing.T) {
	// exited reports whether every runner of r has exited within d.
	exited := func(r *runners, d time.Duration) bool {
		done := make(chan struct{})
		go func() { r.wg.Wait(); close(done) }()
		select {
		case <-done:
			return true
		case <-time.After(d):
			return false
		}
	}
	// A runner parked for idleFor exits without a stop: its exit is awaited, the bound
	// only turns a runner that never exits into a failure instead of a hung test.
	short := newRunners(20 * time.Millisecond)
	defer short.stop(true)
	short.run(func() {})
	if !exited(short, time.Minute) {
		t.Fatal("the parked runner did not exit after idleFor")
	}
	ran := make(chan struct{})
	short.run(func() { close(ran) })
	<-ran
	// With a long idleFor it stays parked until stop.
	long := newRunners(time.Hour)
	long.run(func() {})
	if exited(long, time.Second) {
		t.Fatal("the runner exited before idleFor")
	}
	long.stop(true)
}

func TestRunnersStopWaitsForBusyOnes(t *testing.T) {
	r := newRunners(time.Hour)
	release := make(chan struct{})
	var finished atomic.Bool
	r.run(func() { <-release; finished.Store(true) })
	r.run(func() {})
	waitParked(t, r, 1)
	stopped := make(chan struct{})
	go func() { r.stop(true); close(stopped) }()
	select {
	case <-stopped:
		t.Fatal("stop returned while a runner was busy")
	case <-time.After(50 * time.Millisecond):
	}
	close(release)
	<-stopped
	if !finished.Load() {
		t.Fatal("stop returned before the busy runner finished")
	}
	// The busy runner exited after its execution instead of parking.
	if len(r.parked) != 0 {
		t.Fatalf("%d runners parked after stop", len(r.parked))
	}
}
