package fenceqtest_test

import (
	"fmt"
	"runtime"
	"sync"
	"testing"

	"go.uber.org/goleak"

	"github.com/fenceq/fenceq/fenceqtest"
)

// TestMain stops the throwaway cluster, if the tests started one, and fails the package
// if a test leaves a goroutine behind: Work and StartWorker stop what they start.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(fenceqtest.WrapM(m))
}

// fakeT stands in for a test to see how a helper fails it: the failure is recorded, and
// Fatal ends the goroutine as testing.T's does. Everything else (Cleanup, Helper, Logf)
// goes to the real test.
type fakeT struct {
	testing.TB
	mu     sync.Mutex
	failed []string
}

func (f *fakeT) record(msg string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.failed = append(f.failed, msg)
}

func (f *fakeT) Errorf(format string, args ...any) { f.record(fmt.Sprintf(format, args...)) }
func (f *fakeT) Error(args ...any)                 { f.record(fmt.Sprint(args...)) }
func (f *fakeT) Fatalf(format string, args ...any) {
	f.record(fmt.Sprintf(format, args...))
	runtime.Goexit()
}
func (f *fakeT) Fatal(args ...any) { f.record(fmt.Sprint(args...)); runtime.Goexit() }
func (f *fakeT) FailNow()          { f.record("FailNow"); runtime.Goexit() }

// failure runs fn with a fakeT on a goroutine of its own and returns the first failure
// it reported, "" when it reported none.
func failure(t *testing.T, fn func(tb testing.TB)) string {
	t.Helper()
	f := &fakeT{TB: t}
	done := make(chan struct{})
	go func() {
		defer close(done)
		fn(f)
	}()
	<-done
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.failed) == 0 {
		return ""
	}
	return f.failed[0]
}

// mustFail is failure for a fn that must fail the test: it returns the message.
func mustFail(t *testing.T, fn func(tb testing.TB)) string {
	t.Helper()
	msg := failure(t, fn)
	if msg == "" {
		t.Fatal("the helper did not fail the test")
	}
	return msg
}
