package fenceq_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/fenceq/fenceq"
	"github.com/fenceq/fenceq/fenceqtest"
)

type taggedArgs struct{}

func (taggedArgs) Kind() string { return "tagged" }

// InsertOpts names the kind's default metadata.
func (taggedArgs) InsertOpts() fenceq.InsertOpts {
	return fenceq.InsertOpts{Metadata: map[string]any{"team": "billing", "origin": "kind"}}
}

// Metadata given to Enqueue is added to the kind's, key by key, and comes back with the
// job.
func TestEnqueueMergesMetadata(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	db := fenceqtest.New(t, nil)
	res, err := fenceq.Enqueue(ctx, db.Pool, taggedArgs{}, &fenceq.InsertOpts{Metadata: map[string]any{"origin": "caller", "n": 1}})
	if err != nil {
		t.Fatal(err)
	}
	var got map[string]any
	if err := json.Unmarshal(res.Job.Metadata, &got); err != nil {
		t.Fatal(err)
	}
	if got["team"] != "billing" || got["origin"] != "caller" || got["n"] != float64(1) || len(got) != 3 {
		t.Fatalf("metadata %v, want the kind's team with the caller's origin and n", got)
	}
}
