package store

// The fenced transaction's statements, for the plan tests of package store_test.
var (
	SQLLockLease             = sqlLockLease
	SQLCompleteLockedChecked = sqlCompleteLockedChecked
)

// SQLLockLeaseChecked is the lock of a fenced transaction sent as one pipeline.
var SQLLockLeaseChecked = sqlLockLeaseChecked

// SQLClaimManyKinds is the claim of many queues with kinds, for its plan test.
var SQLClaimManyKinds = sqlClaimManyKinds

// SelfNotify reads, once per connection, whether completions announce the jobs they
// make available themselves: the round trip tests take it before they count.
var SelfNotify = selfNotify
