package syncbuf

import (
	"strings"
	"sync"
	"testing"
)

// Writers and a reader at once: every write lands whole (run with -race).
func TestConcurrentWritesAndReads(t *testing.T) {
	var b Buffer
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 100 {
				_, _ = b.Write([]byte("ab\n"))
				_ = b.String()
			}
		}()
	}
	wg.Wait()
	if b.Len() != 8*100*3 || strings.Count(b.String(), "ab\n") != 800 {
		t.Fatalf("%d bytes, %d lines; want 2400 and 800", b.Len(), strings.Count(b.String(), "ab\n"))
	}
}
