package email_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/fenceq/fenceq/jobs/email"
)

func TestFileMailerWritesOneJSONLinePerMessageConcurrently(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "mail.jsonl")
	fm, err := email.NewFileMailer(path)
	if err != nil {
		t.Fatal(err)
	}
	const n = 200
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			m := email.Message{To: []string{fmt.Sprintf("c%d@example.com", i)}, Subject: "s",
				Text: "line one\nline two", MessageID: email.MessageIDFor(fmt.Sprintf("k:%d", i), ""),
				IdempotencyKey: fmt.Sprintf("k:%d", i)}
			if err := fm.Send(context.Background(), m); err != nil {
				t.Errorf("send %d: %v", i, err)
			}
		}()
	}
	wg.Wait()
	// Checked while the mailer is open: after Close every send fails anyway.
	if err := fm.Send(context.Background(), email.Message{}); !email.IsPermanent(err) {
		t.Fatalf("invalid message: %v, want a permanent rejection", err)
	}
	if err := fm.Close(); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	seen := map[string]bool{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		var m email.Message
		if err := json.Unmarshal(sc.Bytes(), &m); err != nil {
			t.Fatalf("line %d is not one JSON message: %v: %q", len(seen)+1, err, sc.Text())
		}
		if m.From != "fenceq@localhost" || m.MessageID == "" || m.IdempotencyKey == "" || m.Text != "line one\nline two" {
			t.Fatalf("line: %+v", m)
		}
		seen[m.IdempotencyKey] = true
	}
	if len(seen) != n {
		t.Fatalf("%d distinct messages in the file, want %d", len(seen), n)
	}
	if err := fm.Send(context.Background(), email.Message{To: []string{"a@example.com"}}); err == nil {
		t.Fatal("send after close succeeded")
	}
}
