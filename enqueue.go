package fenceq

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/fenceq/fenceq/internal/store"
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
		if !opts.Debounce.IsZero() {
			o.Debounce = opts.Debounce
		}
		if len(opts.Tags) > 0 {
			o.Tags = append(slices.Clip(o.Tags), opts.Tags...) // duplicates are dropped by the engine
		}
		if !opts.Flow.IsZero() {
			o.Flow = opts.Flow
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
func insertParams(args JobArgs, o InsertOpts) (store.InsertParams, error) {
	if args == nil {
		return store.InsertParams{}, &queue.ValidationError{Field: "args", Reason: "nil; want a JobArgs value"}
	}
	raw, err := json.Marshal(args)
	if err != nil {
		return store.InsertParams{}, fmt.Errorf("encode %s args: %w", args.Kind(), err)
	}
	var meta []byte
	if len(o.Metadata) > 0 {
		if meta, err = json.Marshal(o.Metadata); err != nil {
			return store.InsertParams{}, fmt.Errorf("encode %s metadata: %w", args.Kind(), err)
		}
	}
	unique := o.Unique
	if unique.ByArgs && len(unique.ArgsFields) == 0 {
		unique.ArgsFields = uniqueFields(args)
	}
	flowKey, err := flowKeyOf(o.Flow, raw)
	if err != nil {
		return store.InsertParams{}, err
	}
	return store.InsertParams{Queue: o.Queue, Kind: args.Kind(), Args: raw, Priority: o.Priority,
		RunAt: o.RunAt, RunIn: o.RunIn, MaxAttempts: o.MaxAttempts, UniqueKey: o.UniqueKey, Unique: unique,
		Tags: o.Tags, Metadata: meta, FlowKey: flowKey, Debounce: o.Debounce}, nil
}

// flowKeyOf returns the flow key of a job with args raw under o ("" for none): the
// partition is o.Partition, or the values of the args fields o.PartitionBy names, as
// JSON, joined with ",".
func flowKeyOf(o queue.FlowOpts, raw []byte) (string, error) {
	if o.IsZero() {
		return "", nil
	}
	partition := o.Partition
	if len(o.PartitionBy) > 0 {
		var fields map[string]json.RawMessage
		if err := json.Unmarshal(raw, &fields); err != nil {
			return "", &queue.ValidationError{Field: "flow.partition_by", Reason: "the args are not a JSON object: " + err.Error()}
		}
		parts := make([]string, len(o.PartitionBy))
		for i, f := range o.PartitionBy {
			v, ok := fields[f]
			if !ok {
				v = json.RawMessage("null")
			}
			var buf bytes.Buffer
			if err := json.Compact(&buf, v); err != nil {
				return "", fmt.Errorf("flow partition field %q: %w", f, err)
			}
			parts[i] = strings.Trim(buf.String(), `"`)
		}
		partition = strings.Join(parts, ",")
	}
	if err := o.Validate(partition); err != nil {
		return "", err
	}
	return o.Key(partition), nil
}

// Enqueue inserts one job. Pass a pgx.Tx as db to make the job part of your
// transaction: invisible until it commits, gone if it rolls back.
//
// The enqueue goes through the insert middleware of the Inserter ctx carries: inside a
// running handler, the worker's (Config.InsertMiddleware); elsewhere, the one given to
// WithInserter, if any.
func Enqueue(ctx context.Context, db queue.DBTX, args JobArgs, opts *InsertOpts) (*queue.InsertResult, error) {
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
func EnqueueMany(ctx context.Context, db queue.Beginner, items []EnqueueItem) (int64, error) {
	return inserterFrom(ctx).EnqueueMany(ctx, db, items)
}

// enqueueMany encodes n jobs, job k given by get, and inserts them with COPY.
func enqueueMany(ctx context.Context, db queue.Beginner, n int, get func(k int) (JobArgs, InsertOpts)) (int64, error) {
	ps := make([]store.InsertParams, n)
	for k := range ps {
		p, err := insertParams(get(k))
		if err != nil {
			return 0, fmt.Errorf("job %d of %d: %w", k+1, n, err)
		}
		ps[k] = p
	}
	return store.InsertMany(ctx, db, ps)
}

// RawArgs are job args given as encoded JSON rather than as a Go type: for tools that
// enqueue kinds they have no Go type for (the fenceq CLI, a bridge from another
// language). Their JSON is stored as given, and must be a JSON object.
type RawArgs struct {
	// KindName names the kind, and so the handler that runs the job.
	KindName string
	// JSON is the args object; empty means {}.
	JSON json.RawMessage
}

// Kind implements JobArgs.
func (a RawArgs) Kind() string { return a.KindName }

// MarshalJSON returns the args as given ({} when empty).
func (a RawArgs) MarshalJSON() ([]byte, error) {
	if len(a.JSON) == 0 {
		return []byte("{}"), nil
	}
	return a.JSON, nil
}

// UnmarshalJSON keeps the encoded args as they are, for a handler added with
// AddRawHandler.
func (a *RawArgs) UnmarshalJSON(b []byte) error {
	a.JSON = append(a.JSON[:0], b...)
	return nil
}

// ValidateEnqueue checks one job as Enqueue would, without touching the database, so that
// a caller can reject bad input before it connects: the kind, the args, the queue,
// priority, attempts, unique key, tags and metadata. Errors match queue.ErrInvalid and
// name the field.
func ValidateEnqueue(args JobArgs, opts *InsertOpts) error {
	p, err := insertParams(args, mergeOpts(args, opts, false))
	if err != nil {
		return err
	}
	return store.ValidateInsert(p)
}
