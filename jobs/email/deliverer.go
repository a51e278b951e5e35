package email

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/fenceq/fenceq"
	"github.com/fenceq/fenceq/outbox"
)

// DelivererConfig configures the email deliverer.
type DelivererConfig struct {
	// Mailer sends the messages. Required.
	Mailer Mailer
	// MessageIDDomain is the right-hand side of derived Message-IDs. Defaults to
	// DefaultMessageIDDomain. Changing it changes the Message-ID of rows not yet
	// delivered: keep it fixed.
	MessageIDDomain string
}

// Deliverer is the outbox deliverer of topic TopicEmail: it decodes a row's payload as a
// Message, stamps it with the headers derived from the row's dedupe key and creation
// time, and sends it through its Mailer.
type Deliverer struct {
	cfg DelivererConfig
}

var _ outbox.Deliverer = (*Deliverer)(nil)

// NewDeliverer checks cfg and returns the email deliverer.
func NewDeliverer(cfg DelivererConfig) (*Deliverer, error) {
	if cfg.Mailer == nil {
		return nil, errors.New("email deliverer: Mailer: required")
	}
	if cfg.MessageIDDomain == "" {
		cfg.MessageIDDomain = DefaultMessageIDDomain
	}
	if !printableASCII(cfg.MessageIDDomain, false) {
		return nil, fmt.Errorf("email deliverer: MessageIDDomain %q: must be printable ASCII without spaces", cfg.MessageIDDomain)
	}
	return &Deliverer{cfg: cfg}, nil
}

// Register adds an email deliverer built from cfg to the relay, for topic TopicEmail.
func Register(r *outbox.Relay, cfg DelivererConfig) error {
	d, err := NewDeliverer(cfg)
	if err != nil {
		return err
	}
	return r.Handle(TopicEmail, d)
}

// RegisterRelay builds an outbox relay from rc with the email deliverer of dc as the
// deliverer of topic TopicEmail, and registers it on hs. Add other topics to the
// returned relay before the worker starts.
func RegisterRelay(hs *fenceq.Handlers, rc outbox.RelayConfig, dc DelivererConfig) (*outbox.Relay, error) {
	r, err := outbox.NewRelay(rc)
	if err != nil {
		return nil, err
	}
	if err := Register(r, dc); err != nil {
		return nil, err
	}
	if err := r.Register(hs); err != nil {
		return nil, fmt.Errorf("register the outbox relay: %w", err)
	}
	return r, nil
}

// Deliver implements outbox.Deliverer. A payload that is not a valid Message is a
// permanent failure, as is an SMTP 5xx reply.
func (d *Deliverer) Deliver(ctx context.Context, dl *outbox.Delivery) error {
	msg, err := d.Message(dl.Row)
	if err != nil {
		return outbox.Permanent(err)
	}
	if err := d.cfg.Mailer.Send(ctx, msg); err != nil {
		if IsPermanent(err) && !outbox.IsPermanent(err) { // a bare SMTP 5xx reply
			return outbox.Permanent(err)
		}
		return err
	}
	return nil
}

// Message decodes a row's payload and stamps it with the headers derived from the dedupe
// key and the row's creation time, as every delivery attempt sends it.
func (d *Deliverer) Message(row *outbox.Row) (Message, error) {
	if row.Topic != TopicEmail {
		return Message{}, fmt.Errorf("outbox topic %q: this deliverer delivers only %q", row.Topic, TopicEmail)
	}
	var m Message
	if err := json.Unmarshal(row.Payload, &m); err != nil {
		return Message{}, fmt.Errorf("decode email payload: %w", err)
	}
	m.MessageID = MessageIDFor(row.DedupeKey, d.cfg.MessageIDDomain)
	m.IdempotencyKey = outbox.DeliveryKey(row.DedupeKey)
	m.Date = row.CreatedAt
	if err := m.Validate(); err != nil {
		return Message{}, err
	}
	return m, nil
}
