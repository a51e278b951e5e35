// Package fenceqweb is fenceq's web dashboard: an http.Handler that shows queues, jobs,
// workers, the outbox and idempotency keys, and above all the lease mechanism itself —
// every generation of a job's lease, who held it, when it was revoked, and every stale
// write the database rejected — with the operator actions of the CLI.
//
// # Mounting
//
// The handler serves every page under its own root, and its links are relative, so it
// works under any prefix:
//
//	h, err := fenceqweb.New(fenceqweb.Config{DB: pool})
//	if err != nil { … }
//	mux.Handle("/fenceq/", http.StripPrefix("/fenceq", h))
//
// `fenceq ui` serves it alone, and `fenceq worker --ui-addr` beside a worker.
//
// # Pages
//
// Overview (jobs per queue and state, an hour of throughput and failures as a chart,
// the alert conditions of package health, the latest lease events), Jobs (filters and
// keyset pages), a job (args, metadata, attempts, errors with traces and its lease
// timeline), Queues (pause, resume), Workers (heartbeat age, leases held), Outbox
// (backlog, retry) and Idempotency keys (look-up). Each page refreshes its live part
// every RefreshInterval without a reload (a small script of its own fetches the part
// again); without JavaScript the pages work and show the state when they were loaded.
//
// # Reads
//
// Every read is bounded, so pages stay fast with millions of jobs: keyset pages on the
// id (never OFFSET), filters that no index serves applied to a bounded window of the
// newest jobs (fenceq.ListJobs), unfinished jobs counted in the hot set through the
// partial indexes of their states, and finished jobs, the throughput chart and the
// errors per kind read from the job counters (fenceq.CountJobs, fenceq.JobThroughput,
// fenceq.CountErrorsByKind), never from history. Workers roll the counters up; a page
// that reads them rolls them up itself when no roll-up ran lately
// (fenceq.RollupJobCounts).
//
// # Actions and security
//
// Retry, cancel and requeue a job, pause and resume a queue, retry an outbox row: each
// a POST form that calls the same function as the CLI (fenceq.RetryJob, CancelJob,
// RequeueJob, SetQueuePaused, outbox.Retry). Destructive ones ask for confirmation on a
// page of their own (no script needed). Every POST must carry a token tied to the
// browser session (an HMAC of the session cookie under a server secret; cookies are
// SameSite=Strict and HttpOnly) and pass net/http's cross-origin check, or it gets 403
// and changes nothing. ReadOnly hides the forms and refuses every POST.
//
// Auth, when configured, is HTTP basic auth or a bearer token of at least
// MinCredentialLen bytes; Listen refuses an address that is not loopback without it.
// After LoginFailureLimit failed logins within LoginFailureWindow a client address gets
// 429 with Retry-After until the window ends. Pages are html/template with every value
// escaped, under a Content-Security-Policy that allows only the dashboard's own script
// and stylesheet (no inline script or style).
//
// # Exposing it safely
//
// Every request whose Host header the dashboard does not answer to gets 421 before
// anything else. Without Auth it answers only to loopback names (localhost,
// *.localhost, 127.0.0.0/8, ::1) and Config.AllowedHosts: a page of another site whose
// DNS name is rebound to 127.0.0.1 cannot drive it from an operator's browser. With Auth
// and no AllowedHosts any host is allowed (such a page has no credentials), and
// AllowedHosts, when set, is always enforced. An application that serves the handler
// under its own name without Auth sets AllowedHosts to that name, or to "*" when it
// checks Host itself.
//
// Three ways to reach it from elsewhere: keep it on loopback and forward a port; put it
// behind a reverse proxy that terminates TLS, with Auth, TrustProxy (X-Forwarded-Proto
// and the last X-Forwarded-For entry are then believed) and AllowedHosts naming the
// proxy's host; or serve TLS itself with Config.TLS and Auth. Over HTTPS the session
// cookie is Secure and named with the __Host- prefix. ReadOnly suits people who only
// look.
package fenceqweb
