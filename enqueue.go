package fenceq

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"slices"

	"github.com/fenceq/fenceq/queue"
)

func insertParams(args JobArgs, opts *InsertOpts) (queue.InsertParams, error) {
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
		if len(opts.Metadata) > 0 {
			merged := make(map[string]any, len(o.Metadata)+len(opts.Metadata))
			maps.Copy(merged, o.Metadata)
			maps.Copy(merged, opts.Metadata)
			o.Metadata = merged
		}
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
func Enqueue(ctx context.Context, db DBTX, args JobArgs, opts *InsertOpts) (*InsertResult, error) {
	p, err := insertParams(args, opts)
	if err != nil {
		return nil, err
	}
	return queue.Insert(ctx, db, p)
}

// EnqueueItem is one job of a batch.
type EnqueueItem struct {
	Args JobArgs
	Opts *InsertOpts
}

// EnqueueMany inserts a batch with COPY and returns how many rows were inserted (jobs
// whose unique key is held by another job, or by an earlier job of the batch, are
// skipped). One invalid job fails the
// whole batch before anything is written.
func EnqueueMany(ctx context.Context, db Beginner, items []EnqueueItem) (int64, error) {
	ps := make([]queue.InsertParams, len(items))
	for i, it := range items {
		p, err := insertParams(it.Args, it.Opts)
		if err != nil {
			return 0, fmt.Errorf("job %d of %d: %w", i+1, len(items), err)
		}
		ps[i] = p
	}
	return queue.InsertMany(ctx, db, ps)
}
