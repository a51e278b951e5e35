// Package testhooks connects package fenceqtest to the worker's unexported execution
// machinery. Being internal, it is reachable only from this module: applications reach
// the machinery through fenceqtest.Work, never through a hook on the public Worker.
//
// Package fenceq sets the variables below in an init function; they are nil in a
// program that does not link package fenceq.
package testhooks

import (
	"context"
	"time"

	"github.com/fenceq/fenceq/queue"
)

// RunClaimed runs one job that was claimed under a lease, synchronously, as one of the
// worker's execution goroutines would: w must be a *fenceq.Worker made by
// fenceq.NewWorker and never started, and row the claimed job (its lease generation and
// holder set by the claim, sent the monotonic time the claim was sent). The handler
// registered for the job's kind runs with a fenced execution (Job.Commit and
// Job.WithLease work, its leases are heartbeated while it runs), and its outcome is
// written with the worker's own fenced writes: completion, failure with backoff, snooze,
// cancel or discard. It returns the handler's error (nil on success) as handlerErr; err
// reports a job that could not be run (w is not a fresh worker, the worker could not be
// registered). The job's row afterwards is in the database.
var RunClaimed func(ctx context.Context, w any, row *queue.JobRow, sent time.Time) (handlerErr, err error)
