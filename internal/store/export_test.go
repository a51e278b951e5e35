package store

// The fenced transaction's statements, for the plan tests of package store_test.
var (
	SQLLockLease             = sqlLockLease
	SQLCompleteLockedChecked = sqlCompleteLockedChecked
)

// SQLLockLeaseChecked is the lock of a fenced transaction sent as one pipeline.
var SQLLockLeaseChecked = sqlLockLeaseChecked
