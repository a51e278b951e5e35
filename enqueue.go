package fenceq

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"slices"

	"github.com/fenceq/fenceq/queue"
)

// mergeOpts returns the options a job is inserted with: opts over the kind's
// InsertOpts. For insert middleware (own) the queue is resolved and Metadata is a map
// of the job's own, never nil, so that middleware can add to it without touching the
// caller's map or the kind's.
func mergeOpts(args JobArgs, opts *InsertOpts, own bool) InsertOpts {
	o := InsertOpts{}
	if withOpts, ok := args.(JobArgsWithInsertOpts); ok {
		o = withOpts.InsertOpts()
	}
	if opts != nil {
		if opts.Queue != "" {
			o.Queue = opts.Queue
		}
		if opts.Priority != nil {
			o.Priority = opts.Priority
		}
		if !opts.RunAt.IsZero() {
			o.RunAt = opts.RunAt
		}
		if opts.RunIn != 0 {
			o.RunIn = opts.RunIn
		}
		if opts.MaxAttempts != 0 {
			o.MaxAttempts = opts.MaxAttempts
		}
		if opts.UniqueKey != "" {
			o.UniqueKey = opts.UniqueKey
		}
		if !opts.Unique.IsZero() {
			o.Unique = opts.Unique
		}
		if len(opts.Tags) > 0 {
			o.Tags = append(slices.Clip(o.Tags), opts.Tags...) // duplicates are dropped by the engine
		}
	}
	switch {
	case own:
		o.Tags = slices.Clone(o.Tags) // the job's own, like Metadata
		merged := make(map[string]any, len(o.Metadata)+1)
		maps.Copy(merged, o.Metadata)
		if opts != nil {
			maps.Copy(merged, opts.Metadata)
		}
		o.Metadata = merged
		if o.Queue == "" {
			o.Queue = queue.DefaultQueue
		}
	case opts != nil && len(opts.Metadata) > 0:
		merged := make(map[string]any, len(o.Metadata)+len(opts.Metadata))
		maps.Copy(merged, o.Metadata)
		maps.Copy(merged, opts.Metadata)
		o.Metadata = merged
	}
	return o
}

// insertParams encodes one job's args and merged options for the engine.
func insertParams(args JobArgs, o InsertOpts) (queue.InsertParams, error) {
	if args == nil {
		return queue.InsertParams{}, &queue.ValidationError{Field: "args", Reason: "nil; want a JobArgs value"}
	}
	raw, err := json.Marshal(args)
	if err != nil {
		return queue.InsertParams{}, fmt.Errorf("encode %s args: %w", args.Kind(), err)
	}
	var meta []byte
	if len(o.Metadata) > 0 {
		if meta, err = json.Marshal(o.Metadata); err != nil {
			return queue.InsertParams{}, fmt.Errorf("encode %s metadata: %w", args.Kind(), err)
		}
	}
	unique := o.Unique
	if unique.ByArgs && len(unique.ArgsFields) == 0 {
		unique.ArgsFields = uniqueFields(args)
	}
	return queue.InsertParams{Queue: o.Queue, Kind: args.Kind(), Args: raw, Priority: o.Priority,
		RunAt: o.RunAt, RunIn: o.RunIn, MaxAttempts: o.MaxAttempts, UniqueKey: o.UniqueKey, Unique: unique,
		Tags: o.Tags, Metadata: meta}, nil
}

// Enqueue inserts one job. Pass a pgx.Tx as db to make the job part of your
// transaction: invisible until it commits, gone if it rolls back.
//
// The enqueue goes through the insert middleware of the Inserter ctx carries: inside a
// running handler, the worker's (Config.InsertMiddleware); elsewhere, the one given to
// WithInserter, if any.
func Enqueue(ctx context.Context, db DBTX, args JobArgs, opts *InsertOpts) (*InsertResult, error) {
	return inserterFrom(ctx).Enqueue(ctx, db, args, opts)
}

// EnqueueItem is one job of a batch.
type EnqueueItem struct {
	Args JobArgs
	Opts *InsertOpts
}

// EnqueueMany inserts a batch with COPY and returns how many rows were inserted (jobs
// whose unique key is held by another job, or by an earlier job of the batch, are
// skipped). One invalid job fails the whole batch before anything is written. Like
// Enqueue, it goes through the insert middleware of the Inserter ctx carries, which sees
// the batch in one call.
func EnqueueMany(ctx context.Context, db Beginner, items []EnqueueItem) (int64, error) {
	return inserterFrom(ctx).EnqueueMany(ctx, db, items)
}

// enqueueMany encodes n jobs, job k given by get, and inserts them with COPY.
func enqueueMany(ctx context.Context, db Beginner, n int, get func(k int) (JobArgs, InsertOpts)) (int64, error) {
	ps := make([]queue.InsertParams, n)
	for k := range ps {
		p, err := insertParams(get(k))
		if err != nil {
			return 0, fmt.Errorf("job %d of %d: %w", k+1, n, err)
		}
		ps[k] = p
	}
	return queue.InsertMany(ctx, db, ps)
}
