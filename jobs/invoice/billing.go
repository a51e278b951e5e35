package invoice

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"

	"github.com/jackc/pgx/v5"

	"github.com/fenceq/fenceq"
	"github.com/fenceq/fenceq/queue"
)

// BillingBatchSize is how many invoice jobs a billing run enqueues per COPY batch.
const BillingBatchSize = 1000

// RunBilling enqueues one invoice job per customer for period (YYYY-MM), with unique key
// invoice:<customer>:<period>, in COPY batches, all in one transaction. It is
// idempotent: customers that already have an invoice for the period, or an invoice job
// for it that is unfinished or completed, are skipped, so running it again — even
// concurrently from another process — enqueues nothing new. It returns how many jobs
// it enqueued.
func RunBilling(ctx context.Context, db queue.Beginner, period string) (int64, error) {
	if err := ValidatePeriod(period); err != nil {
		return 0, fmt.Errorf("billing run: %w", err)
	}
	tx, err := db.Begin(ctx)
	if err != nil {
		return 0, fmt.Errorf("billing run %s: begin: %w", period, err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	if _, err := tx.Exec(ctx, sqlLockBillingRun, period); err != nil {
		return 0, fmt.Errorf("billing run %s: lock: %w", period, err)
	}
	rows, err := tx.Query(ctx, sqlCustomersToBill, period)
	if err != nil {
		return 0, fmt.Errorf("billing run %s: list customers: %w", period, err)
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		return 0, fmt.Errorf("billing run %s: list customers: %w", period, err)
	}
	var enqueued int64
	for batch := range slices.Chunk(ids, BillingBatchSize) {
		// Args.InsertOpts gives each job its queue and unique key.
		items := make([]fenceq.EnqueueItem, len(batch))
		for i, id := range batch {
			a := Args{CustomerID: id, Period: period}
			if err := a.Validate(); err != nil {
				return 0, fmt.Errorf("billing run %s: %w", period, err)
			}
			items[i].Args = a
		}
		n, err := fenceq.EnqueueMany(ctx, tx, items)
		if err != nil {
			return 0, fmt.Errorf("billing run %s: enqueue %d invoice jobs: %w", period, len(items), err)
		}
		enqueued += n
	}
	if err := tx.Commit(ctx); err != nil {
		return 0, fmt.Errorf("billing run %s: commit: %w", period, err)
	}
	return enqueued, nil
}

// Enqueue validates a and enqueues its invoice job with the unique key of its customer
// and period (an unfinished job for them is returned as Existing instead). Pass a
// pgx.Tx as db to make the job part of a transaction.
func Enqueue(ctx context.Context, db queue.DBTX, a Args) (*queue.InsertResult, error) {
	if err := a.Validate(); err != nil {
		return nil, fmt.Errorf("enqueue invoice: %w", err)
	}
	return fenceq.Enqueue(ctx, db, a, nil)
}

// SeedCountries are the countries SeedCustomers cycles through.
var SeedCountries = []string{"US", "DE", "FR", "GB", "JP", "CA", "NL", "CH"}

type seedSKU struct {
	sku, description string
	unitPriceCents   int64
	maxQuantity      int64
}

var seedSKUs = []seedSKU{
	{"api-calls", "API calls (per 1,000)", 37, 50_000},
	{"storage-gb", "Storage (GB-month)", 23, 20_000},
	{"seats", "Seats", 1_500, 400},
	{"support-hours", "Premium support (hours)", 12_000, 40},
}

// SeedCustomers creates n customers (countries cycling through SeedCountries) and, for
// period, 1–4 usage records each with deterministic pseudo-random quantities, for demos
// and tests. It returns the new customers' ids.
func SeedCustomers(ctx context.Context, db queue.Beginner, n int, period string) ([]int64, error) {
	if err := ValidatePeriod(period); err != nil {
		return nil, fmt.Errorf("seed customers: %w", err)
	}
	if n < 1 || n > 1_000_000 {
		return nil, fmt.Errorf("seed customers: n %d must be 1–1000000", n)
	}
	tx, err := db.Begin(ctx)
	if err != nil {
		return nil, fmt.Errorf("seed customers: begin: %w", err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	rows, err := tx.Query(ctx, sqlSeedCustomers, n, SeedCountries)
	if err != nil {
		return nil, fmt.Errorf("seed customers: insert: %w", err)
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		return nil, fmt.Errorf("seed customers: insert: %w", err)
	}
	var usage [][]any
	for _, id := range ids {
		rng := rand.New(rand.NewPCG(uint64(id), 0x5eed))
		k := 1 + rng.IntN(len(seedSKUs))
		for _, s := range seedSKUs[:k] {
			usage = append(usage, []any{id, period, s.sku, s.description, 1 + rng.Int64N(s.maxQuantity), s.unitPriceCents})
		}
	}
	_, err = tx.CopyFrom(ctx, pgx.Identifier{"usage_records"},
		[]string{"customer_id", "period", "sku", "description", "quantity", "unit_price_cents"}, pgx.CopyFromRows(usage))
	if err != nil {
		return nil, fmt.Errorf("seed customers: copy %d usage records: %w", len(usage), err)
	}
	if err := tx.Commit(ctx); err != nil {
		return nil, fmt.Errorf("seed customers: commit: %w", err)
	}
	return ids, nil
}
