package store

// The hot set and history (migration 000014). fenceq_jobs_hot holds the jobs that are
// not finished, and the finished jobs that still hold their unique key; fenceq_jobs_history
// holds every other finished job, each row written once. The engine's writes name the
// tables; fenceq_jobs, a view of both, is what reads of any job use.

import (
	"fmt"
	"slices"
	"strings"
)

const (
	// hotTable holds the jobs the engine works: every claim, heartbeat, completion,
	// revocation and promotion touches only it.
	hotTable = "fenceq_jobs_hot"
	// historyTable holds finished jobs, inserted by the statement that finishes them.
	historyTable = "fenceq_jobs_history"
)

// storedColumns are the columns of both tables, in their order.
var storedColumns = []string{"id", "queue", "kind", "args", "state", "priority", "run_at", "attempt",
	"max_attempts", "lease_gen", "leased_by", "heartbeat_at", "lease_expires_at", "attempted_at", "unique_key",
	"errors", "created_at", "finished_at", "metadata", "output", "unique_states", "tags",
	// Migration 000016: the job's end runs the flow triggers (dependents, batches, waits).
	"flow_hook", "debounce_key", "flow_key"}

// keepsKey is the SQL of whether a hot row (its columns unqualified) holds its unique key
// in state, an SQL expression: such a row stays in the hot set, where the unique index
// is, even when state is final.
func keepsKey(state string) string {
	return `(unique_key IS NOT NULL AND fenceq_state_in_mask(` + state + `, unique_states))`
}

// keepsFinal is the predicate of fenceq_jobs_hot_keeps_idx: the rows that hold their
// unique key in some final state, the only ones a finishing write may update in place.
// Spelled out in the update arm of every finish so that its scan uses that index, which
// is empty unless jobs keep keys once finished, instead of looking up every row of the
// batch again after the delete arm took them.
var keepsFinal = fmt.Sprintf(`unique_key IS NOT NULL AND (unique_states::integer & %d) <> 0`, MaskOf(finalStates[:]...))

// finalSQL are the final states as SQL literals (sqlCompleted, …), the new state of a
// finish that always ends its rows.
var finalSQL = []string{sqlCompleted, sqlDiscarded, sqlCancelled}

// movesOut is the SQL of whether a hot row whose new state is state leaves for history.
func movesOut(state string) string {
	return `((` + state + `) IN ` + sqlFinal + ` AND NOT ` + keepsKey(state) + `)`
}

// finish is a write to hot rows that may end them. It is spelled as three CTEs over the
// same rows: name_del deletes the rows that leave for history and name_ins inserts them
// there with the new values, and name_upd updates the rows that stay in place (the new
// state is not final, or the row holds its unique key in it). The conditions of the two
// arms exclude each other on columns no concurrent write changes (unique_key,
// unique_states) or on values both arms compute alike, so each row goes one way. name
// is then the rows written, one row each with returning.
type finish struct {
	name string
	// using are the FROM items the condition joins (a DELETE's USING, an UPDATE's
	// FROM), and usingCols the columns of them that set reads, returned by the delete
	// so that the insert can read them. Their names must differ from the job columns'.
	using, usingCols string
	// where selects the hot rows (alias j; job columns may be unqualified).
	where string
	// state is the SQL of the new state, over the row's old columns.
	state string
	// set are the new values, column and SQL over the row's old columns (unqualified)
	// and usingCols; state is set from the field of that name.
	set [][2]string
	// returning is what each written row returns, over its new columns (unqualified).
	returning string
}

// ctes returns the CTEs of the write, comma-separated, the last one named f.name.
func (f finish) ctes() string { return f.writeCTEs(true) }

// movingCTEs is ctes for rows known to keep no unique key in the new state, which
// always moves them to history: it leaves out name_upd, which would update no row of
// theirs, and whose UPDATE would still open every index of the hot set at each
// execution.
func (f finish) movingCTEs() string { return f.writeCTEs(false) }

// writeCTEs is ctes, without name_upd unless inPlace.
func (f finish) writeCTEs(inPlace bool) string {
	set := append([][2]string{{"state", f.state}}, f.set...)
	value := func(col string) string {
		for _, s := range set {
			if s[0] == col {
				return s[1]
			}
		}
		return col
	}
	using, usingDel, usingCols := "", "", ""
	if f.using != "" {
		using, usingDel = "\n    FROM "+f.using, "\n    USING "+f.using
	}
	if f.usingCols != "" {
		usingCols = ", " + f.usingCols
	}
	vals := make([]string, len(storedColumns))
	for i, c := range storedColumns {
		vals[i] = value(c)
	}
	assign := make([]string, len(set))
	for i, s := range set {
		assign[i] = s[0] + " = " + s[1]
	}
	// A write whose new state is always final updates in place only the rows that keep
	// their key: say so in the index's terms.
	keeps := ""
	if slices.Contains(finalSQL, f.state) {
		keeps = " AND " + keepsFinal
	}
	n := f.name
	moves := `
` + n + `_del AS (
    DELETE FROM ` + hotTable + ` j` + usingDel + `
    WHERE ` + f.where + ` AND ` + movesOut(f.state) + `
    RETURNING j.*` + usingCols + `),
` + n + `_ins AS (
    INSERT INTO ` + historyTable + ` (` + strings.Join(storedColumns, ", ") + `)
    SELECT ` + strings.Join(vals, ", ") + ` FROM ` + n + `_del
    RETURNING ` + f.returning + `)`
	if !inPlace {
		return moves + `,
` + n + ` AS (
    SELECT * FROM ` + n + `_ins)`
	}
	return moves + `,
` + n + `_upd AS (
    UPDATE ` + hotTable + ` j SET ` + strings.Join(assign, ", ") + using + `
    WHERE ` + f.where + keeps + ` AND NOT ` + movesOut(f.state) + `
    RETURNING ` + f.returning + `),
` + n + ` AS (
    SELECT * FROM ` + n + `_ins UNION ALL SELECT * FROM ` + n + `_upd)`
}

// fromHistory returns the CTEs that move the job with id (an SQL expression) from history
// back to the hot set with the new values of set (column and SQL over its old columns),
// the last named name and returning jobColumns.
func fromHistory(name, id string, set [][2]string) string {
	vals := make([]string, len(storedColumns))
	for i, c := range storedColumns {
		vals[i] = c
		for _, s := range set {
			if s[0] == c {
				vals[i] = s[1]
			}
		}
	}
	return name + `_del AS (
    DELETE FROM ` + historyTable + ` WHERE id = ` + id + ` RETURNING *),
` + name + ` AS (
    INSERT INTO ` + hotTable + ` (` + strings.Join(storedColumns, ", ") + `) OVERRIDING SYSTEM VALUE
    SELECT ` + strings.Join(vals, ", ") + ` FROM ` + name + `_del
    RETURNING ` + jobColumns + `)`
}

// inPlace is the write as one UPDATE of the hot set, named f.name: the form a Citus
// coordinator routes whole to the node holding the schema (a DELETE and an INSERT in
// one statement are planned in steps there and committed in two phases). The rows it
// finishes stay in the hot set until MoveFinished moves them to history.
func (f finish) inPlace() string {
	set := append([][2]string{{"state", f.state}}, f.set...)
	assign := make([]string, len(set))
	for i, s := range set {
		assign[i] = s[0] + " = " + s[1]
	}
	using := ""
	if f.using != "" {
		using = "\n    FROM " + f.using
	}
	return `
` + f.name + ` AS (
    UPDATE ` + hotTable + ` j SET ` + strings.Join(assign, ", ") + using + `
    WHERE ` + f.where + `
    RETURNING ` + f.returning + `)`
}

// sqlMoveFinished moves up to $1 finished jobs that hold no unique key in their final
// state from the hot set to history, oldest first: the jobs a Citus connection finished in
// place (see finish.inPlace), and any a direct write to the hot set left there. It returns how many it moved.
var sqlMoveFinished = `
WITH m AS (
    SELECT id AS mid FROM ` + hotTable + `
    WHERE finished_at IS NOT NULL AND state IN ` + sqlFinal + ` AND NOT ` + keepsKey("state") + `
    ORDER BY finished_at
    LIMIT $1
    FOR UPDATE SKIP LOCKED),
d AS (
    DELETE FROM ` + hotTable + ` j USING m WHERE j.id = m.mid RETURNING j.*),
ins AS (
    INSERT INTO ` + historyTable + ` (` + strings.Join(storedColumns, ", ") + `)
    SELECT ` + strings.Join(storedColumns, ", ") + ` FROM d RETURNING 1)
SELECT count(*) FROM ins`
