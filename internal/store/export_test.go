package store

import (
	"context"

	"github.com/fenceq/fenceq/queue"
)

// The fenced transaction's statements, for the plan tests of package store_test.
var (
	SQLLockLease             = sqlLockLease
	SQLCompleteLockedChecked = sqlCompleteLockedChecked
)

// SQLLockLeaseChecked is the lock of a fenced transaction sent as one pipeline.
var SQLLockLeaseChecked = sqlLockLeaseChecked

// SQLListQueues is ListQueues' statement, for its plan test.
var SQLListQueues = sqlListQueues

// SQLClaimManyKinds is the claim of many queues with kinds, for its plan test.
var SQLClaimManyKinds = sqlClaimManyKinds

// SelfNotify reads, once per connection, whether completions announce the jobs they
// make available themselves: the round trip tests take it before they count.
var SelfNotify = selfNotify

// ExplainList returns the plan (EXPLAIN, FORMAT JSON) of the statement ListJobsPage
// sends for p, planned for its arguments as ListJobsPage's is.
func ExplainList(ctx context.Context, db queue.DBTX, p queue.ListParams) (string, error) {
	if err := validateList(&p); err != nil {
		return "", err
	}
	sql, args := listSQL(&p)
	var plan string
	err := db.QueryRow(ctx, "EXPLAIN (FORMAT JSON) "+sql, args...).Scan(&plan)
	return plan, err
}
