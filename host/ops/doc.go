// Package ops is the operator's read layer: what `host inspect` prints and
// what the console shows come from these functions, so the two never
// disagree. It reads Postgres and Redis and writes nothing; HumanDuration
// and Attempt are how both print a duration and an attempt.
package ops
