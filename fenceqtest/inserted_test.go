package fenceqtest_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/fenceq/fenceq"
	"github.com/fenceq/fenceq/fenceqtest"
	"github.com/fenceq/fenceq/queue"
)

type otherArgs struct{}

func (otherArgs) Kind() string { return "other" }

// What a transaction enqueued is visible to RequireInsertedTx before it commits, and to
// nobody else; after the commit, RequireInserted on the pool finds it too.
func TestRequireInsertedTx(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	db := fenceqtest.New(t, &fenceqtest.Options{MaxConns: 4})
	tx, err := db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	res, err := fenceq.Enqueue(ctx, tx, GreetArgs{Name: "ada"}, &fenceq.InsertOpts{Queue: "mail", Priority: new(3), UniqueKey: "greet:ada"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := fenceq.Enqueue(ctx, tx, otherArgs{}, nil); err != nil {
		t.Fatal(err)
	}

	job := fenceqtest.RequireInsertedTx[GreetArgs](ctx, t, tx, nil)
	if job.ID != res.Job.ID || job.Args.Name != "ada" || job.Queue != "mail" || job.State != queue.StateAvailable {
		t.Fatalf("found %+v with args %+v, want job %d for ada in mail", job.JobRow, job.Args, res.Job.ID)
	}
	fenceqtest.RequireInsertedTx[GreetArgs](ctx, t, tx, &fenceqtest.RequireInsertedOpts{Queue: "mail", Priority: new(3), UniqueKey: "greet:ada"})
	fenceqtest.RequireNotInserted[GreetArgs](ctx, t, db.Pool, nil) // not committed: invisible to the pool

	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if got := fenceqtest.RequireInserted[GreetArgs](ctx, t, db.Pool, nil); got.ID != res.Job.ID {
		t.Fatalf("after commit: job %d, want %d", got.ID, res.Job.ID)
	}
}

func TestRequireManyInserted(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	db := fenceqtest.New(t, &fenceqtest.Options{MaxConns: 2})
	names := []string{"a", "b", "c"}
	for _, n := range names {
		if _, err := fenceq.Enqueue(ctx, db.Pool, GreetArgs{Name: n}, nil); err != nil {
			t.Fatal(err)
		}
	}
	jobs := fenceqtest.RequireManyInserted[GreetArgs](ctx, t, db.Pool, 3, nil)
	for i, j := range jobs {
		if j.Args.Name != names[i] {
			t.Fatalf("job %d has %q, want %q: jobs come in the order they were enqueued", i, j.Args.Name, names[i])
		}
	}
	// A finished job is not counted: complete the first one.
	if _, err := fenceqtest.WorkJob(ctx, t, db.Pool, fenceq.Config{Handlers: okHandlers(), Logger: fenceqtest.QuietLogger()}, jobs[0].ID); err != nil {
		t.Fatal(err)
	}
	if left := fenceqtest.RequireManyInserted[GreetArgs](ctx, t, db.Pool, 2, nil); left[0].Args.Name != "b" {
		t.Fatalf("first unfinished job %q, want b", left[0].Args.Name)
	}
}

func okHandlers() *fenceq.Handlers {
	hs := fenceq.NewHandlers()
	fenceq.AddHandler(hs, func(context.Context, *fenceq.Job[GreetArgs]) error { return nil }, nil)
	return hs
}

// The failures say what was wanted and what was found.
func TestRequireInsertedFailures(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	db := fenceqtest.New(t, &fenceqtest.Options{MaxConns: 2})
	if _, err := fenceq.Enqueue(ctx, db.Pool, otherArgs{}, nil); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name string
		fn   func(tb testing.TB)
		want []string
	}{
		{"None", func(tb testing.TB) { fenceqtest.RequireInserted[GreetArgs](ctx, tb, db.Pool, nil) },
			[]string{"RequireInserted: want 1 unfinished greet job, found 0", "by kind: other 1"}},
		{"Many", func(tb testing.TB) {
			for range 2 {
				if _, err := fenceq.Enqueue(ctx, db.Pool, GreetArgs{Name: "twice"}, nil); err != nil {
					tb.Fatal(err)
				}
			}
			fenceqtest.RequireInserted[GreetArgs](ctx, tb, db.Pool, nil)
		}, []string{"want 1 unfinished greet job, found 2 (jobs "}},
		{"Mismatch", func(tb testing.TB) {
			fenceqtest.RequireManyInserted[GreetArgs](ctx, tb, db.Pool, 2, &fenceqtest.RequireInsertedOpts{Queue: "mail", Priority: new(0), UniqueKey: "u"})
		}, []string{`want 2 unfinished greet jobs with queue "mail", priority 0, unique key "u", found 0; not matching: job `,
			`is in queue "default" and has priority 1 and has no unique key`}},
		{"Present", func(tb testing.TB) { fenceqtest.RequireNotInserted[otherArgs](ctx, tb, db.Pool, nil) },
			[]string{"RequireNotInserted: want 0 unfinished other jobs, found 1"}},
		{"BadCount", func(tb testing.TB) { fenceqtest.RequireManyInserted[GreetArgs](ctx, tb, db.Pool, 0, nil) },
			[]string{"n is 0"}},
		{"Undecodable", func(tb testing.TB) {
			if _, err := db.Pool.Exec(ctx, `UPDATE fenceq_jobs SET args = '{"name": 7}' WHERE kind = 'other'`); err != nil {
				tb.Fatal(err)
			}
			fenceqtest.RequireInserted[badOtherArgs](ctx, tb, db.Pool, nil)
		}, []string{"decode other args"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			msg := mustFail(t, c.fn)
			for _, w := range c.want {
				if !strings.Contains(msg, w) {
					t.Errorf("failure %q lacks %q", msg, w)
				}
			}
		})
	}
}

// badOtherArgs reads other jobs with a name that must be a string.
type badOtherArgs struct {
	Name string `json:"name"`
}

func (badOtherArgs) Kind() string { return "other" }
