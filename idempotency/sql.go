package idempotency

import "strings"

// lit renders a string as an SQL literal: the key states, for predicates the planner
// must match against the partial index on finished keys, and the settings SET LOCAL
// takes (it takes no parameter).
func lit[T ~string](s T) string { return "'" + strings.ReplaceAll(string(s), "'", "''") + "'" }

var (
	sqlInFlight = lit(StateInFlight)
	sqlFinished = lit(StateFinished)
)

// SQL for fenceq_idempotency_keys. Expiry is decided by the database's clock (now()).

const idemColumns = `scope, key, request_hash, state, lease_gen, resource_id, response_status,
	response, created_at, finished_at, expires_at, expires_at < now()`

// idemWritten are the columns the writes return. Each of them has just set expires_at
// to now() plus a positive TTL, so the key is not expired: false, spelled without now(),
// which a RETURNING list on Citus may not call.
const idemWritten = `scope, key, request_hash, state, lease_gen, resource_id, response_status,
	response, created_at, finished_at, expires_at, false`

// sqlIdemProbe sees only committed rows: run just before the claiming insert, it tells
// whether the key was already settled or still held by an uncommitted owner.
const sqlIdemProbe = `SELECT EXISTS (SELECT 1 FROM fenceq_idempotency_keys WHERE scope = $1 AND key = $2)`

// sqlIdemInsert is the atomic conditional write that decides ownership. A concurrent
// owner's uncommitted insert of the same key makes it wait for that commit (conflict:
// no row returned) or rollback (inserted: this transaction owns the key).
// $4 TTL (µs).
const sqlIdemInsert = `
INSERT INTO fenceq_idempotency_keys (scope, key, request_hash, expires_at)
VALUES ($1, $2, $3, now() + $4::bigint * interval '1 microsecond')
ON CONFLICT (scope, key) DO NOTHING
RETURNING ` + idemWritten

const sqlIdemGet = `SELECT ` + idemColumns + ` FROM fenceq_idempotency_keys WHERE scope = $1 AND key = $2`

// sqlIdemTakeOver makes an expired key new again for this request, bumping the
// generation so that a previous in-flight owner can no longer finish it. The WHERE is
// re-checked on the newest row version, so of two takeovers only one wins.
// $3 request hash, $4 TTL (µs).
var sqlIdemTakeOver = `
UPDATE fenceq_idempotency_keys SET
    request_hash = $3, state = ` + sqlInFlight + `, lease_gen = lease_gen + 1,
    resource_id = NULL, response_status = NULL, response = NULL,
    created_at = now(), finished_at = NULL,
    expires_at = now() + $4::bigint * interval '1 microsecond'
WHERE scope = $1 AND key = $2 AND expires_at < now()
RETURNING ` + idemWritten

// sqlIdemFinish stores the result of the owner's work; the TTL restarts from now.
// $3 generation, $4 resource id, $5 status, $6 response.
var sqlIdemFinish = `
UPDATE fenceq_idempotency_keys SET
    state = ` + sqlFinished + `, resource_id = $4, response_status = $5, response = $6,
    finished_at = now(),
    -- now() + (expires_at - created_at), with IMMUTABLE functions over the columns
    -- (timestamptz + interval is STABLE, which Citus refuses next to a column).
    expires_at = ((now() AT TIME ZONE 'UTC') + (expires_at - created_at)) AT TIME ZONE 'UTC'
WHERE scope = $1 AND key = $2 AND lease_gen = $3 AND state = ` + sqlInFlight + `
RETURNING ` + idemWritten

// sqlIdemRelease gives up an in-flight key its owner could not finish. $3 generation.
var sqlIdemRelease = `
DELETE FROM fenceq_idempotency_keys
WHERE scope = $1 AND key = $2 AND lease_gen = $3 AND state = ` + sqlInFlight + ``

// sqlIdemDeleteExpired deletes up to $1 finished keys whose TTL passed. In-flight keys
// are never candidates; rows locked by a concurrent takeover are skipped, and the outer
// WHERE re-checks the condition on the row version it deletes. The CTE is materialized
// so that LIMIT bounds the whole batch (a rescanned subquery would apply it per rescan).
var sqlIdemDeleteExpired = `
WITH d AS MATERIALIZED (
    SELECT scope, key FROM fenceq_idempotency_keys
    WHERE state = ` + sqlFinished + ` AND expires_at < now()
    ORDER BY expires_at
    LIMIT $1
    FOR UPDATE SKIP LOCKED)
DELETE FROM fenceq_idempotency_keys k
USING d
WHERE k.scope = d.scope AND k.key = d.key AND k.state = ` + sqlFinished + ` AND k.expires_at < now()`

// Setting lock_timeout for a claim and restoring the transaction's previous value; the
// previous value is kept in a transaction-local custom setting, so all three statements
// go in one batch.
const (
	sqlSaveLockTimeout    = `SELECT set_config('fenceq.saved_lock_timeout', current_setting('lock_timeout'), true)`
	sqlSetLockTimeout     = `SELECT set_config('lock_timeout', $1, true)`
	sqlRestoreLockTimeout = `SELECT set_config('lock_timeout', current_setting('fenceq.saved_lock_timeout'), true)`
	// On Citus: the values SET LOCAL restores afterwards.
	sqlReadCitusSettings = `SELECT current_setting('lock_timeout'), current_setting('citus.propagate_set_commands')`
)
