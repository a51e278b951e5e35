package store

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/fenceq/fenceq/queue"
)

// SQL of fenceq_audit (migration 000018).
const (
	sqlInsertAudit = `
INSERT INTO fenceq_audit (actor, action, job_ids, names, filter, matched, detail)
VALUES ($1, $2, $3, $4, $5, $6, $7)`
	sqlListAudit = `
SELECT id, at, actor, action, job_ids, names, filter, matched, detail FROM fenceq_audit
WHERE ($1::bigint = 0 OR job_ids @> ARRAY[$1::bigint]) AND ($2::bigint = 0 OR id < $2)
ORDER BY id DESC LIMIT $3`
)

// maxAuditActorLen bounds the actor recorded; a longer one is cut.
const maxAuditActorLen = 200

// WriteAudit records one operator action. Call it in the action's transaction, so that
// the record commits with the action or not at all.
func WriteAudit(ctx context.Context, db queue.DBTX, r *queue.AuditRecord) error {
	var filter []byte
	if r.Filter != nil {
		var err error
		if filter, err = json.Marshal(r.Filter); err != nil {
			return fmt.Errorf("audit %s: encode the filter: %w", r.Action, err)
		}
	}
	ids, names := r.JobIDs, r.Names
	if ids == nil {
		ids = []int64{}
	}
	if names == nil {
		names = []string{}
	}
	actor := queue.StorableText(r.Actor, maxAuditActorLen)
	if _, err := db.Exec(ctx, sqlInsertAudit, actor, string(r.Action), ids, names, filter, r.Matched,
		queue.StorableText(r.Detail, 4096)); err != nil {
		return fmt.Errorf("audit %s: %w", r.Action, explainMissingAudit(err))
	}
	return nil
}

// explainMissingAudit names the step to take when fenceq_audit does not exist: the
// schema predates version 18.
func explainMissingAudit(err error) error {
	var pe *pgconn.PgError
	if errors.As(err, &pe) && pe.Code == "42P01" {
		return fmt.Errorf("%w (fenceq_audit is missing: run `fenceq migrate up` to reach core schema version 18)", err)
	}
	return err
}

// ListAudit returns audit records, newest first.
func ListAudit(ctx context.Context, db queue.DBTX, p queue.AuditParams) ([]queue.AuditRecord, error) {
	if p.JobID < 0 {
		return nil, invalid("job_id", "%d is negative", p.JobID)
	}
	if p.BeforeID < 0 {
		return nil, invalid("before_id", "%d is negative", p.BeforeID)
	}
	if p.Limit <= 0 {
		p.Limit = 100
	}
	if p.Limit > 1000 {
		return nil, invalid("limit", "%d is more than 1000", p.Limit)
	}
	rows, err := db.Query(ctx, sqlListAudit, p.JobID, p.BeforeID, p.Limit)
	if err != nil {
		return nil, fmt.Errorf("list audit records: %w", explainMissingAudit(err))
	}
	out, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (queue.AuditRecord, error) {
		var r queue.AuditRecord
		var action string
		var filter []byte
		if err := row.Scan(&r.ID, &r.At, &r.Actor, &action, &r.JobIDs, &r.Names, &filter, &r.Matched, &r.Detail); err != nil {
			return r, err
		}
		r.Action = queue.AuditAction(action)
		if filter != nil {
			r.Filter = new(queue.JobFilter)
			if err := json.Unmarshal(filter, r.Filter); err != nil {
				return r, fmt.Errorf("audit record %d: decode its filter: %w", r.ID, err)
			}
		}
		return r, nil
	})
	if err != nil {
		return nil, fmt.Errorf("list audit records: %w", err)
	}
	return out, nil
}
