package fenceq

import (
	"context"

	"github.com/fenceq/fenceq/internal/store"
	"github.com/fenceq/fenceq/queue"
)

// ErrFlowUnsupported is returned by SetFlowLimit (and by a worker's Start with
// Config.FlowLimits) on a schema whose tables cannot carry the triggers that count
// leases out: a Citus distributed one. Compare with errors.Is.
var ErrFlowUnsupported = store.ErrFlowUnsupported

// SetFlowLimit creates or changes a flow limit (queue.FlowLimit). The change applies to
// the next claim of every worker; jobs already running keep running. Jobs are put under
// a limit with InsertOpts.Flow, and a worker can define its limits in Config.FlowLimits.
func SetFlowLimit(ctx context.Context, db queue.DBTX, l queue.FlowLimit) error {
	return store.SetFlowLimit(ctx, db, l)
}

// DeleteFlowLimit removes a flow limit and its partitions. It returns queue.ErrNotFound
// for a limit that is not set, and queue.ErrWrongState while unfinished jobs are under it.
func DeleteFlowLimit(ctx context.Context, db queue.DBTX, name string) error {
	return store.DeleteFlowLimit(ctx, db, name)
}

// ListFlowLimits returns every flow limit, by name.
func ListFlowLimits(ctx context.Context, db queue.DBTX) ([]queue.FlowLimit, error) {
	return store.ListFlowLimits(ctx, db)
}

// FlowPartitions returns the partitions of a flow limit (of every limit when limit is
// empty), busiest first, at most max: what runs under each, the starts in the rate's
// period, the next start a rate allows, and how many jobs wait.
func FlowPartitions(ctx context.Context, db queue.DBTX, limit string, max int) ([]queue.FlowPartition, error) {
	return store.FlowPartitions(ctx, db, limit, max)
}

// FlowPartitionOf returns the state of a flow key (queue.JobRow.FlowKey), or
// queue.ErrNotFound.
func FlowPartitionOf(ctx context.Context, db queue.DBTX, key string) (*queue.FlowPartition, error) {
	return store.FlowPartition(ctx, db, key)
}
