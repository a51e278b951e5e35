package email

import (
	"context"
	"errors"
	"fmt"
	"net/textproto"
)

// Mailer sends one message. Implementations must be safe for concurrent use. Send
// returns nil only once the message was handed over (the SMTP server accepted DATA, the
// file line was written); a *PermanentError when no retry can succeed (IsPermanent);
// any other error is retried by the relay with backoff.
//
// How to implement one:
//  1. Honour ctx: return promptly when it is done.
//  2. Send m.MessageID and m.IdempotencyKey unchanged (as headers, or the
//     receiver's own idempotency field): they are the same on every attempt.
//  3. Classify errors: wrap rejections that will not change on retry in PermanentError.
type Mailer interface {
	Send(ctx context.Context, m Message) error
}

// PermanentError is a delivery error that no retry can fix: an SMTP 5xx reply (unknown
// recipient, message refused), or a message that is invalid. The relay marks the outbox
// row failed with the error as its reason.
type PermanentError struct {
	// Code is the SMTP reply code, 0 when the error did not come from the server.
	Code int
	// Err is the underlying failure.
	Err error
}

// Error implements error, with the SMTP reply code when there is one.
func (e *PermanentError) Error() string {
	if e.Code != 0 {
		return fmt.Sprintf("permanent failure (SMTP %d): %v", e.Code, e.Err)
	}
	return fmt.Sprintf("permanent failure: %v", e.Err)
}

// Unwrap returns Err, for errors.Is and errors.As.
func (e *PermanentError) Unwrap() error { return e.Err }

// Permanent reports true, so that outbox.IsPermanent recognizes the error.
func (e *PermanentError) Permanent() bool { return true }

// IsPermanent reports whether err is a permanent delivery failure: a *PermanentError,
// or an SMTP reply with a 5xx code anywhere in its chain.
func IsPermanent(err error) bool {
	var pe *PermanentError
	if errors.As(err, &pe) {
		return true
	}
	var te *textproto.Error
	return errors.As(err, &te) && te.Code >= 500 && te.Code <= 599
}

// classify wraps an SMTP reply error with a 5xx code in a PermanentError; other errors
// (4xx replies, network errors, timeouts) stay transient.
func classify(op string, err error) error {
	if err == nil {
		return nil
	}
	var te *textproto.Error
	if errors.As(err, &te) && te.Code >= 500 && te.Code <= 599 {
		return &PermanentError{Code: te.Code, Err: fmt.Errorf("%s: %w", op, err)}
	}
	return fmt.Errorf("%s: %w", op, err)
}
