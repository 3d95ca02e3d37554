package guard

import (
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"
)

// Only a plain statement's write is prepared, and then runs without a
// gate check after it: never one that could end or outlast a transaction.
func TestNotable(t *testing.T) {
	t.Parallel()
	for tag, want := range map[string]bool{
		"INSERT 0 1": true, "UPDATE 2": true, "DELETE 0": true, "SELECT 1": true, "MERGE 1": true,
		"CALL": false, "DO": false, "SET": false, "PREPARE": false, "DEALLOCATE": false,
		"DECLARE CURSOR": false, "COPY 3": false, "COMMIT": false, "ROLLBACK": false, "SAVEPOINT": false,
	} {
		require.Equal(t, want, notable(pgconn.NewCommandTag(tag)), tag)
	}
}
