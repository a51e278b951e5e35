// Package citustest runs fenceq on a Citus cluster with schema-based sharding: a
// coordinator and two worker nodes started as throwaway clusters (internal/pgcluster),
// each fenceq schema a distributed schema that lives whole on one node, applications
// connected to the coordinator.
//
// Its one test checks that two fenceq schemas land on two different nodes, runs the
// demo in each, runs a chaos run with the terminate and kill faults, and runs the core
// test suite (the root package, queue, outbox, idempotency, migrations and the built-in
// jobs) a second time against the coordinator. It needs the citus extension in the
// machine's PostgreSQL (.ci/ensure-citus builds it); without it the test fails, naming
// how to build it, unless test.sh found no Citus source and said so (it sets
// FENCEQ_CITUS_NOT_BUILT to the reason): then the test skips, naming the reason, and
// test.sh reports it as not run. In CI (FENCEQ_CI=1) its absence always fails the test.
package citustest
