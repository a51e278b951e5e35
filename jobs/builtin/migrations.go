// Package builtin gathers what the built-in jobs (invoice, order, email, housekeeping,
// diag) need from a deployment that runs them all, as the fenceq command does: their
// migration sets (Migrations), a description of each kind with its queue and args
// checks (Kinds), and one call that registers every handler (Register).
package builtin

import (
	"github.com/fenceq/fenceq/jobs/invoice"
	"github.com/fenceq/fenceq/jobs/order"
	"github.com/fenceq/fenceq/migrations"
)

// Migrations returns the migration sets a schema needs for the built-in jobs, in the
// order they apply: the core's, then the business tables of each job.
func Migrations() []migrations.Set {
	return []migrations.Set{migrations.Core(), invoice.Migrations(), order.Migrations()}
}
