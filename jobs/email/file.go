package email

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"sync"
)

// FileMailer appends one JSON line per message to a file: for local runs and demos,
// where a developer reads the "sent" mail with tail or jq. Each line is the Message as
// JSON, with From filled in. It is safe for concurrent use: lines never interleave.
type FileMailer struct {
	// From is used for messages that set none. Defaults to "fenceq@localhost".
	From string

	mu   sync.Mutex
	w    io.Writer // nil once closed
	f    *os.File  // nil when writing to stdout
	path string
}

var _ Mailer = (*FileMailer)(nil)

// NewFileMailer opens path for appending, creating it if needed. The path "-" writes to
// standard output.
func NewFileMailer(path string) (*FileMailer, error) {
	if path == "" {
		return nil, fmt.Errorf("file mailer: path: required (use - for standard output)")
	}
	m := &FileMailer{From: "fenceq@localhost", path: path}
	if path == "-" {
		m.w = os.Stdout
		return m, nil
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		return nil, fmt.Errorf("file mailer: %w", err)
	}
	m.w, m.f = f, f
	return m, nil
}

// Send appends the message as one JSON line and syncs the file, so a message reported
// sent is on disk.
func (fm *FileMailer) Send(ctx context.Context, m Message) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("file mailer: %w", err)
	}
	if m.From == "" {
		m.From = fm.From
	}
	if err := m.Validate(); err != nil {
		return &PermanentError{Err: err}
	}
	line, err := json.Marshal(m)
	if err != nil {
		return &PermanentError{Err: fmt.Errorf("encode message: %w", err)}
	}
	line = append(line, '\n')
	fm.mu.Lock()
	defer fm.mu.Unlock()
	if fm.w == nil {
		return fmt.Errorf("file mailer %s: closed", fm.path)
	}
	if _, err := fm.w.Write(line); err != nil {
		return fmt.Errorf("file mailer %s: write: %w", fm.path, err)
	}
	if fm.f != nil {
		if err := fm.f.Sync(); err != nil {
			return fmt.Errorf("file mailer %s: sync: %w", fm.path, err)
		}
	}
	return nil
}

// Close closes the file.
func (fm *FileMailer) Close() error {
	fm.mu.Lock()
	defer fm.mu.Unlock()
	fm.w = nil
	if fm.f == nil {
		return nil
	}
	err := fm.f.Close()
	fm.f = nil
	if err != nil {
		return fmt.Errorf("file mailer %s: close: %w", fm.path, err)
	}
	return nil
}
