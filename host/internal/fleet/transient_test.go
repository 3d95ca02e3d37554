package fleet

import (
	"errors"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"
)

// Only a refusal that was not the plugin's doing is tried again.
func TestTransientLoad(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		err  error
		want bool
	}{
		{&pgconn.PgError{Code: "57P01", Message: "terminating connection due to administrator command"}, true},
		{&pgconn.PgError{Code: "57P03", Message: "the database system is starting up"}, true},
		{&pgconn.PgError{Code: "53300", Message: "too many connections for role"}, true},
		{&pgconn.PgError{Code: "08006", Message: "connection failure"}, true},
		{&pgconn.PgError{Code: "42501", Message: "permission denied"}, false},
		{&pgconn.PgError{Code: "42P01", Message: "relation does not exist"}, false},
		{errors.New("the binary's SHA-256 is not the manifest's"), false},
	} {
		err := fmt.Errorf("host: load plugin from manifest m.json: check role r's privileges: %w", c.err)
		require.Equal(t, c.want, transientLoad(err), "%v", c.err)
	}
}
