package guard

// For the external tests (package guard_test, which may import hosttest).

type JobTx = jobTx

var BeginWith = beginWith

// Last is a statement for JobTx.Commit to send before COMMIT.
func Last(sql string, args ...string) lastStatement {
	l := lastStatement{sql: sql}
	for _, a := range args {
		l.args = append(l.args, []byte(a))
	}
	return l
}
