package queue

// The fenced transaction's statements, for the plan tests of package queue_test.
var (
	SQLLockLease             = sqlLockLease
	SQLCompleteLockedChecked = sqlCompleteLockedChecked
)
